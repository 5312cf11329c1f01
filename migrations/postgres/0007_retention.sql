-- Retention (`toolexec retention`, docs/operator.md "Retention and backup") deletes closed
-- sessions' logs. Events stay append-only for everything else: a DELETE of an event is refused
-- unless its session is listed in `sessions_expiring`, which only retention writes, inside the
-- transaction that deletes the session (and empties it again before committing).
CREATE TABLE sessions_expiring (
    session_id uuid PRIMARY KEY
);

CREATE OR REPLACE FUNCTION events_refuse_change() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE'
       AND EXISTS (SELECT 1 FROM sessions_expiring x WHERE x.session_id = OLD.session_id) THEN
        RETURN OLD;
    END IF;
    RAISE EXCEPTION 'events are append-only: % refused', TG_OP
        USING ERRCODE = 'restrict_violation';
END;
$$;

-- Which sessions closed before a cutoff, and the replays of a session being deleted.
CREATE INDEX sessions_closed_at ON sessions (closed_at) WHERE status = 'closed';
CREATE INDEX replays_session ON replays (session_id);
