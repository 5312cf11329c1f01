-- Calls waiting for a person's approval (a session's policy.approval). A node looks for its own
-- at start-up, to expire those whose wait ended while it was down and to time the others; the
-- bulk of invocations never waits, so the index holds only those that do.
CREATE INDEX invocations_pending_node ON invocations (node) WHERE status = 'pending_approval';
