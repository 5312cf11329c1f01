-- A session's plan and tasks are folded from its todo.* events when a node loads the session.
-- This partial index makes that one probe of the few todo events, however long the log is; it
-- costs nothing on the other events' appends.
CREATE INDEX events_todos ON events (session_id, seq)
    WHERE kind IN ('todo.created', 'todo.updated', 'todo.deleted');
