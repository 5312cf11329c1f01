//! A session's todos: the steps of its plan (`update_plan`) and its tasks (`TaskCreate`,
//! `TaskUpdate`), as the log records them — `todo.created`, `todo.updated` and `todo.deleted`
//! events — and as the log folds into the current list ([`Todos::apply`]). The tools and the
//! API read the same fold, so a session's list is what its log says, on any node and after a
//! replay.
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::event::{Event, EventKind};

/// Where a todo came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum TodoSource {
    /// A step of `update_plan`'s plan.
    Plan,
    /// A task of `TaskCreate`.
    Task,
}

/// A todo's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum TodoStatus {
    Pending,
    InProgress,
    Completed,
}

impl TodoStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            TodoStatus::Pending => "pending",
            TodoStatus::InProgress => "in_progress",
            TodoStatus::Completed => "completed",
        }
    }
}

/// One todo, as the current list shows it (and as `todo.created` and `todo.updated` carry it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Todo {
    /// `t1`, `t2`, … in the order they were created; never reused in a session.
    pub id: String,
    pub source: TodoSource,
    /// A task's subject, or a plan step's text.
    pub subject: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// How the task is shown while in progress ("Running the tests").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub active_form: Option<String>,
    pub status: TodoStatus,
    /// A task's key/value notes, in order: each a `[key, value]` pair.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schema(value_type = Vec<Vec<String>>)]
    pub metadata: Vec<(String, String)>,
    /// A plan step's place in the plan, from 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub position: Option<usize>,
}

/// The payload of a `todo.deleted` event.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct TodoDeleted {
    pub id: String,
}

/// A session's todos, in the order they were created (plan steps in plan order).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Todos {
    pub items: Vec<Todo>,
    /// The number the next todo's id gets.
    pub next: u64,
}

impl Todos {
    /// Folds one logged event into the list (events of other kinds are ignored).
    pub fn apply(&mut self, event: &Event) {
        match event.kind {
            EventKind::TodoCreated | EventKind::TodoUpdated => {
                let Ok(todo) = serde_json::from_value::<Todo>(event.data.clone()) else {
                    return;
                };
                if let Some(n) = todo
                    .id
                    .strip_prefix('t')
                    .and_then(|n| n.parse::<u64>().ok())
                {
                    self.next = self.next.max(n + 1);
                }
                self.put(todo);
            }
            EventKind::TodoDeleted => {
                if let Ok(d) = serde_json::from_value::<TodoDeleted>(event.data.clone()) {
                    self.items.retain(|t| t.id != d.id);
                }
            }
            _ => {}
        }
    }

    /// Adds a todo, or replaces the one with its id.
    pub fn put(&mut self, todo: Todo) {
        match self.items.iter_mut().find(|t| t.id == todo.id) {
            Some(t) => *t = todo,
            None => self.items.push(todo),
        }
        self.sort_plan();
    }

    /// A new todo id.
    pub fn next_id(&mut self) -> String {
        self.next = self.next.max(1);
        let id = format!("t{}", self.next);
        self.next += 1;
        id
    }

    pub fn get(&self, id: &str) -> Option<&Todo> {
        self.items.iter().find(|t| t.id == id)
    }

    pub fn remove(&mut self, id: &str) -> Option<Todo> {
        let at = self.items.iter().position(|t| t.id == id)?;
        Some(self.items.remove(at))
    }

    /// The plan's steps, in plan order.
    pub fn plan(&self) -> impl Iterator<Item = &Todo> {
        self.items.iter().filter(|t| t.source == TodoSource::Plan)
    }

    /// The tasks, in the order they were created.
    pub fn tasks(&self) -> impl Iterator<Item = &Todo> {
        self.items.iter().filter(|t| t.source == TodoSource::Task)
    }

    fn sort_plan(&mut self) {
        // Plan steps first in plan order, then tasks as created (a stable sort keeps their order).
        self.items.sort_by_key(|t| match t.source {
            TodoSource::Plan => (0, t.position.unwrap_or(usize::MAX)),
            TodoSource::Task => (1, 0),
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use uuid::Uuid;

    fn event(seq: i64, kind: EventKind, data: serde_json::Value) -> Event {
        Event {
            session_id: Uuid::nil(),
            seq,
            kind,
            invocation_id: None,
            data,
            created_at: chrono::Utc::now(),
            truncated: None,
        }
    }

    #[test]
    fn the_log_folds_into_the_current_list_and_ids_are_never_reused() {
        let mut todos = Todos::default();
        for e in [
            event(
                1,
                EventKind::TodoCreated,
                json!({"id": "t1", "source": "task", "subject": "a", "status": "pending"}),
            ),
            event(
                2,
                EventKind::TodoCreated,
                json!({"id": "t2", "source": "plan", "subject": "s", "status": "pending", "position": 0}),
            ),
            event(
                3,
                EventKind::TodoUpdated,
                json!({"id": "t1", "source": "task", "subject": "a", "status": "completed"}),
            ),
            event(4, EventKind::TodoDeleted, json!({"id": "t2"})),
            event(5, EventKind::FileCreated, json!({})),
        ] {
            todos.apply(&e);
        }
        assert_eq!(todos.items.len(), 1);
        assert_eq!(todos.items[0].status, TodoStatus::Completed);
        assert_eq!(todos.next_id(), "t3");
    }
}
