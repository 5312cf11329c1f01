//! `update_plan`: the session's plan (a todo list the model keeps for itself), replaced whole on
//! every call and recorded as a `plan.updated` event.
use async_trait::async_trait;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::json;
use toolexec_core::todo::{Todo, TodoSource, TodoStatus};
use toolexec_core::{EventKind, OutputLimit, ToolSpec, TruncationMode};

use crate::{Tool, ToolContext, ToolEvent, ToolOutput, parse_args};

/// Most steps in a plan: a plan longer than this is a backlog, not a plan.
pub const MAX_STEPS: usize = 100;

const DESCRIPTION: &str = "\
Replaces your plan for this task: an ordered list of steps, each `pending`, `in_progress` or \
`completed`. The plan is recorded in the session's log, so whoever reviews the session sees what \
you intended and how far you got.

Use it for work of three or more steps: write the plan first, then update it as you go — mark a \
step `in_progress` when you start it and `completed` as soon as it is done, add steps you \
discover, and say why in `explanation` when the plan changes. Do not use it for a single quick \
action. At most one step may be `in_progress` at a time.

Example: {\"plan\": [{\"step\": \"Find every caller of parse()\", \"status\": \"completed\"}, \
{\"step\": \"Rename parse() to parse_config()\", \"status\": \"in_progress\"}, \
{\"step\": \"Run the tests\", \"status\": \"pending\"}], \"explanation\": \"callers found in 3 files\"}

Limits: at most 100 steps; each step at most 500 characters. The whole plan is sent every time \
(it replaces the previous one).";

pub struct UpdatePlan {
    spec: ToolSpec,
}

impl Default for UpdatePlan {
    fn default() -> Self {
        Self::new()
    }
}

impl UpdatePlan {
    pub fn new() -> Self {
        Self {
            spec: ToolSpec {
                name: "update_plan".to_owned(),
                description: DESCRIPTION.to_owned(),
                input_schema: crate::schema::arguments_schema::<Args>(),
                // Not a workspace change, but it replaces session state: it runs alone and in
                // order, so two updates in one batch land in the order they were sent.
                read_only: false,
                capabilities: vec![],
                output_limit: OutputLimit::new(50_000, TruncationMode::HeadTail),
            },
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
enum Status {
    Pending,
    InProgress,
    Completed,
}

/// One step of the plan.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct Step {
    /// What the step is, in a few words.
    #[schemars(length(min = 1, max = 500))]
    step: String,
    status: Status,
}

/// `update_plan`'s arguments.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct Args {
    /// The whole plan, in order.
    #[schemars(length(max = MAX_STEPS))]
    plan: Vec<Step>,
    /// Why the plan changed (optional).
    #[schemars(length(max = 2000))]
    explanation: Option<String>,
}

#[async_trait]
impl Tool for UpdatePlan {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    async fn run(&self, ctx: &ToolContext, args: serde_json::Value) -> ToolOutput {
        let args: Args = match parse_args(args) {
            Ok(args) => args,
            Err(out) => return out,
        };
        let mut seen = std::collections::HashSet::new();
        if let Some(dup) = args.plan.iter().find(|s| !seen.insert(s.step.as_str())) {
            return ToolOutput::error(format!(
                "The plan has the step {:?} twice; each step's text must be unique (steps are matched by their text). Merge or rename them and send the plan again.",
                dup.step
            ));
        }
        let count = |s: Status| args.plan.iter().filter(|p| p.status == s).count();
        let (done, doing, todo) = (
            count(Status::Completed),
            count(Status::InProgress),
            count(Status::Pending),
        );
        if doing > 1 {
            return ToolOutput::error(format!(
                "The plan has {doing} steps in_progress; at most one may be. Mark the others pending or completed and send the plan again."
            ));
        }
        let mut text =
            format!("Plan updated: {done} completed, {doing} in progress, {todo} pending.\n");
        for (i, s) in args.plan.iter().enumerate() {
            let mark = match s.status {
                Status::Completed => "[x]",
                Status::InProgress => "[~]",
                Status::Pending => "[ ]",
            };
            text.push_str(&format!("{mark} {}. {}\n", i + 1, s.step));
        }
        let mut out = ToolOutput::ok(text);
        out.events.extend(reconcile(ctx, &args.plan));
        out.events.push(ToolEvent {
            blob: None,
            kind: EventKind::PlanUpdated,
            data: json!({
                "plan": args.plan,
                "explanation": args.explanation,
                "completed": done,
                "in_progress": doing,
                "pending": todo,
            }),
        });
        out
    }
}

/// The plan's steps as todos: each new step matched to the current one with the same text
/// (updated if its status or place changed), the others created, and current steps missing
/// from the new plan deleted. The session's todos are changed to match; the events say how.
fn reconcile(ctx: &ToolContext, plan: &[Step]) -> Vec<ToolEvent> {
    let mut todos = ctx
        .todos
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let current: Vec<Todo> = todos.plan().cloned().collect();
    let mut events = Vec::new();
    for old in &current {
        if !plan.iter().any(|s| s.step == old.subject) {
            todos.remove(&old.id);
            events.push(ToolEvent::new(
                EventKind::TodoDeleted,
                json!({"id": old.id}),
            ));
        }
    }
    for (i, step) in plan.iter().enumerate() {
        let status = match step.status {
            Status::Pending => TodoStatus::Pending,
            Status::InProgress => TodoStatus::InProgress,
            Status::Completed => TodoStatus::Completed,
        };
        let (kind, todo) = match current.iter().find(|t| t.subject == step.step) {
            Some(old) if old.status == status && old.position == Some(i) => continue,
            Some(old) => (
                EventKind::TodoUpdated,
                Todo {
                    status,
                    position: Some(i),
                    ..old.clone()
                },
            ),
            None => (
                EventKind::TodoCreated,
                Todo {
                    id: todos.next_id(),
                    source: TodoSource::Plan,
                    subject: step.step.clone(),
                    description: None,
                    active_form: None,
                    status,
                    metadata: Vec::new(),
                    position: Some(i),
                },
            ),
        };
        events.push(ToolEvent::new(
            kind,
            serde_json::to_value(&todo).unwrap_or_default(),
        ));
        todos.put(todo);
    }
    events
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::Workspace;

    fn ctx() -> (tempfile::TempDir, ToolContext) {
        let dir = tempfile::tempdir().unwrap();
        let ws = Arc::new(Workspace::open(dir.path()).unwrap());
        (dir, ToolContext::new(uuid::Uuid::now_v7(), ws))
    }

    #[tokio::test]
    async fn a_plan_is_rendered_and_recorded_as_one_event() {
        let (_d, ctx) = ctx();
        let out = UpdatePlan::new()
            .run(
                &ctx,
                json!({"plan": [
                    {"step": "find callers", "status": "completed"},
                    {"step": "rename", "status": "in_progress"},
                    {"step": "test", "status": "pending"}
                ], "explanation": "found 3"}),
            )
            .await;
        assert_eq!(out.status, toolexec_core::CallStatus::Ok);
        assert!(
            out.content
                .contains("1 completed, 1 in progress, 1 pending")
        );
        assert!(out.content.contains("[~] 2. rename"));
        // A todo per step, then the plan as a whole.
        assert_eq!(out.events.len(), 4);
        assert!(
            out.events[..3]
                .iter()
                .all(|e| e.kind == EventKind::TodoCreated)
        );
        let plan = &out.events[3];
        assert_eq!(plan.kind, EventKind::PlanUpdated);
        assert_eq!(plan.data["plan"][1]["status"], "in_progress");
        assert_eq!(plan.data["explanation"], "found 3");
        // Sent again with one step done, one gone and one new: matched by text.
        let out = UpdatePlan::new()
            .run(
                &ctx,
                json!({"plan": [
                    {"step": "find callers", "status": "completed"},
                    {"step": "rename", "status": "completed"},
                    {"step": "document", "status": "in_progress"}
                ]}),
            )
            .await;
        let kinds: Vec<(EventKind, String)> = out
            .events
            .iter()
            .map(|e| (e.kind, e.data["id"].as_str().unwrap_or("").to_owned()))
            .collect();
        assert_eq!(
            kinds,
            [
                (EventKind::TodoDeleted, "t3".into()),
                (EventKind::TodoUpdated, "t2".into()),
                (EventKind::TodoCreated, "t4".into()),
                (EventKind::PlanUpdated, String::new()),
            ]
        );
        let todos = ctx.todos.lock().unwrap();
        let plan: Vec<&str> = todos.plan().map(|t| t.subject.as_str()).collect();
        assert_eq!(plan, ["find callers", "rename", "document"]);
    }

    #[tokio::test]
    async fn two_steps_in_progress_are_refused_with_what_to_do() {
        let (_d, ctx) = ctx();
        let out = UpdatePlan::new()
            .run(
                &ctx,
                json!({"plan": [
                    {"step": "a", "status": "in_progress"},
                    {"step": "b", "status": "in_progress"}
                ]}),
            )
            .await;
        assert!(out.status.is_error());
        assert!(out.content.contains("at most one"));
        assert!(out.events.is_empty());
    }
}
