//! `TaskCreate`, `TaskUpdate`, `TaskGet`, `TaskList`: the session's shared task list, as agent
//! loops for Anthropic models keep it (Fabro's profile). Tasks live in the session's todos
//! ([`toolexec_core::todo`]), with `update_plan`'s steps; every change is a `todo.*` event, so
//! the list is the log's, on any node and after a replay.
use async_trait::async_trait;
use schemars::JsonSchema;
use serde::Deserialize;
use toolexec_core::todo::{Todo, TodoDeleted, TodoSource, TodoStatus};
use toolexec_core::{EventKind, OutputLimit, ToolSpec, TruncationMode};

use crate::{Tool, ToolContext, ToolEvent, ToolOutput, parse_args};

/// Most tasks one session keeps: a list longer than this is a backlog, not a task list.
pub const MAX_TASKS: usize = 200;

/// One key/value note of a task (strict tool schemas take no free-form objects, so metadata is
/// a list of pairs).
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct Note {
    #[schemars(length(min = 1, max = 100))]
    key: String,
    #[schemars(length(max = 1000))]
    value: String,
}

fn notes(metadata: Option<Vec<Note>>) -> Vec<(String, String)> {
    metadata
        .unwrap_or_default()
        .into_iter()
        .map(|n| (n.key, n.value))
        .collect()
}

fn spec(name: &str, description: &str, schema: serde_json::Value, read_only: bool) -> ToolSpec {
    ToolSpec {
        name: name.to_owned(),
        description: description.to_owned(),
        input_schema: schema,
        // Changing the list runs alone and in order, like update_plan.
        read_only,
        capabilities: vec![],
        output_limit: OutputLimit::new(50_000, TruncationMode::HeadTail),
    }
}

fn event(kind: EventKind, data: serde_json::Value) -> ToolEvent {
    ToolEvent::new(kind, data)
}

fn shown(t: &Todo) -> String {
    let mut s = format!("{} [{}] {}", t.id, t.status.as_str(), t.subject);
    if t.source == TodoSource::Plan {
        s.push_str(" (plan step)");
    }
    s
}

// --- TaskCreate ---

const CREATE: &str = "\
Creates a task in this session's shared task list: a `subject` (a short imperative title), a \
`description` (what done looks like), optionally an `activeForm` (how it reads while in progress, \
\"Running the tests\") and `metadata` notes. It starts `pending`; the result gives its id (`t3`).

Use it to track multi-step work: create the tasks up front, set each `in_progress` with \
TaskUpdate when you start it and `completed` when done. Tasks are recorded in the session's log.

Example: {\"subject\": \"Fix the failing parser test\", \"description\": \"tests/parse.rs passes\", \
\"activeForm\": \"Fixing the parser test\"}";

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct CreateArgs {
    /// A short, imperative title.
    #[schemars(length(min = 1, max = 500))]
    subject: String,
    /// What the task is and what done looks like.
    #[schemars(length(max = 5000))]
    description: String,
    /// How the task reads while in progress ("Running the tests").
    #[schemars(length(min = 1, max = 500))]
    active_form: Option<String>,
    /// Key/value notes.
    #[schemars(length(max = 20))]
    metadata: Option<Vec<Note>>,
}

pub struct TaskCreate {
    spec: ToolSpec,
}

impl Default for TaskCreate {
    fn default() -> Self {
        Self::new()
    }
}

impl TaskCreate {
    pub fn new() -> Self {
        Self {
            spec: spec(
                "TaskCreate",
                CREATE,
                crate::schema::arguments_schema::<CreateArgs>(),
                false,
            ),
        }
    }
}

#[async_trait]
impl Tool for TaskCreate {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    async fn run(&self, ctx: &ToolContext, args: serde_json::Value) -> ToolOutput {
        let args: CreateArgs = match parse_args(args) {
            Ok(a) => a,
            Err(out) => return out,
        };
        let mut todos = ctx
            .todos
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if todos.tasks().count() >= MAX_TASKS {
            return ToolOutput::error(format!(
                "The task list already has {MAX_TASKS} tasks, the most a session keeps. Delete tasks that are done (TaskUpdate with status \"deleted\") first."
            ));
        }
        let todo = Todo {
            id: todos.next_id(),
            source: TodoSource::Task,
            subject: args.subject,
            description: Some(args.description),
            active_form: args.active_form,
            status: TodoStatus::Pending,
            metadata: notes(args.metadata),
            position: None,
        };
        let mut out = ToolOutput::ok(format!("Task {} created: {}", todo.id, todo.subject));
        out.events.push(event(
            EventKind::TodoCreated,
            serde_json::to_value(&todo).unwrap_or_default(),
        ));
        todos.put(todo);
        out
    }
}

// --- TaskUpdate ---

const UPDATE: &str = "\
Changes a task of this session's task list by its id (`taskId`, from TaskCreate or TaskList): \
its `status` (`pending`, `in_progress`, `completed`, or `deleted` to remove it), `subject`, \
`description`, `activeForm` or `metadata` (replaced whole). Fields left out (or null) stay as they \
are.

Set a task `in_progress` when you start it and `completed` as soon as it is done.

Example: {\"taskId\": \"t3\", \"status\": \"completed\"}";

/// A task's status as TaskUpdate sets it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
enum NewStatus {
    Pending,
    InProgress,
    Completed,
    Deleted,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct UpdateArgs {
    /// The task's id (`t3`).
    #[schemars(length(min = 1, max = 32))]
    task_id: String,
    /// Its new status; `deleted` removes it from the list.
    status: Option<NewStatus>,
    #[schemars(length(min = 1, max = 500))]
    subject: Option<String>,
    #[schemars(length(max = 5000))]
    description: Option<String>,
    #[schemars(length(min = 1, max = 500))]
    active_form: Option<String>,
    /// Key/value notes (replace the task's).
    #[schemars(length(max = 20))]
    metadata: Option<Vec<Note>>,
}

pub struct TaskUpdate {
    spec: ToolSpec,
}

impl Default for TaskUpdate {
    fn default() -> Self {
        Self::new()
    }
}

impl TaskUpdate {
    pub fn new() -> Self {
        Self {
            spec: spec(
                "TaskUpdate",
                UPDATE,
                crate::schema::arguments_schema::<UpdateArgs>(),
                false,
            ),
        }
    }
}

#[async_trait]
impl Tool for TaskUpdate {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    async fn run(&self, ctx: &ToolContext, args: serde_json::Value) -> ToolOutput {
        let args: UpdateArgs = match parse_args(args) {
            Ok(a) => a,
            Err(out) => return out,
        };
        let mut todos = ctx
            .todos
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let Some(current) = todos
            .get(&args.task_id)
            .filter(|t| t.source == TodoSource::Task)
            .cloned()
        else {
            return ToolOutput::error(format!(
                "There is no task {:?} in this session. TaskList shows the tasks and their ids.",
                args.task_id
            ));
        };
        if args.status == Some(NewStatus::Deleted) {
            todos.remove(&current.id);
            let mut out = ToolOutput::ok(format!("Task {} deleted.", current.id));
            out.events.push(event(
                EventKind::TodoDeleted,
                serde_json::to_value(TodoDeleted { id: current.id }).unwrap_or_default(),
            ));
            return out;
        }
        let mut todo = current.clone();
        if let Some(s) = args.status {
            todo.status = match s {
                NewStatus::Pending => TodoStatus::Pending,
                NewStatus::InProgress => TodoStatus::InProgress,
                _ => TodoStatus::Completed,
            };
        }
        if let Some(s) = args.subject {
            todo.subject = s;
        }
        if let Some(d) = args.description {
            todo.description = Some(d);
        }
        if let Some(a) = args.active_form {
            todo.active_form = Some(a);
        }
        if let Some(m) = args.metadata {
            todo.metadata = notes(Some(m));
        }
        if todo == current {
            return ToolOutput::ok(format!("Task {} is already so: {}", todo.id, shown(&todo)));
        }
        let mut out = ToolOutput::ok(format!("Task updated: {}", shown(&todo)));
        out.events.push(event(
            EventKind::TodoUpdated,
            serde_json::to_value(&todo).unwrap_or_default(),
        ));
        todos.put(todo);
        out
    }
}

// --- TaskGet ---

const GET: &str = "\
Shows one task of this session's task list in full (subject, status, description, active form, \
metadata) by its id. Example: {\"taskId\": \"t3\"}";

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct GetArgs {
    /// The task's id (`t3`).
    #[schemars(length(min = 1, max = 32))]
    task_id: String,
}

pub struct TaskGet {
    spec: ToolSpec,
}

impl Default for TaskGet {
    fn default() -> Self {
        Self::new()
    }
}

impl TaskGet {
    pub fn new() -> Self {
        Self {
            spec: spec(
                "TaskGet",
                GET,
                crate::schema::arguments_schema::<GetArgs>(),
                true,
            ),
        }
    }
}

#[async_trait]
impl Tool for TaskGet {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    async fn run(&self, ctx: &ToolContext, args: serde_json::Value) -> ToolOutput {
        let args: GetArgs = match parse_args(args) {
            Ok(a) => a,
            Err(out) => return out,
        };
        let todos = ctx
            .todos
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let Some(t) = todos.get(&args.task_id) else {
            return ToolOutput::error(format!(
                "There is no task {:?} in this session. TaskList shows the tasks and their ids.",
                args.task_id
            ));
        };
        let mut text = format!("{}\n", shown(t));
        if let Some(d) = &t.description {
            text.push_str(&format!("Description: {d}\n"));
        }
        if let Some(a) = &t.active_form {
            text.push_str(&format!("Active form: {a}\n"));
        }
        for (k, v) in &t.metadata {
            text.push_str(&format!("{k}: {v}\n"));
        }
        ToolOutput::ok(text)
    }
}

// --- TaskList ---

const LIST: &str = "\
Lists this session's tasks with their ids and status (and the steps of the plan, if update_plan \
made one). Example: {}";

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct ListArgs {}

pub struct TaskList {
    spec: ToolSpec,
}

impl Default for TaskList {
    fn default() -> Self {
        Self::new()
    }
}

impl TaskList {
    pub fn new() -> Self {
        Self {
            spec: spec(
                "TaskList",
                LIST,
                crate::schema::arguments_schema::<ListArgs>(),
                true,
            ),
        }
    }
}

#[async_trait]
impl Tool for TaskList {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    async fn run(&self, ctx: &ToolContext, args: serde_json::Value) -> ToolOutput {
        if let Err(out) = parse_args::<ListArgs>(args) {
            return out;
        }
        let todos = ctx
            .todos
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if todos.items.is_empty() {
            return ToolOutput::ok("No tasks yet. TaskCreate adds one.");
        }
        let lines: Vec<String> = todos.items.iter().map(shown).collect();
        ToolOutput::ok(format!("{}\n", lines.join("\n")))
    }
}
