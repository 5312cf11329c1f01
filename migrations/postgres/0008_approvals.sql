-- Calls waiting for a person's approval (a session's policy.approval). A node looks for its own
-- at start-up (to expire those whose wait ended while it was down, and to time the others), and
-- for a session's when it takes the session over, closes or rewinds it, or counts what waits in
-- it; the bulk of invocations never waits, so these indexes hold only those that do.
CREATE INDEX invocations_pending_node ON invocations (node) WHERE status = 'pending_approval';
CREATE INDEX invocations_pending_session ON invocations (session_id) WHERE status = 'pending_approval';
