-- As on Postgres: the todo.* events of a session without walking its log.
CREATE INDEX events_todos ON events (session_id, seq)
    WHERE kind IN ('todo.created', 'todo.updated', 'todo.deleted');
