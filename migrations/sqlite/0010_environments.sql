-- The OCI image a session runs in (issue 26): `{"image", "digest", "name"?}` as JSON text, NULL
-- for a session that sees the host's /usr and /etc. Forks, rewinds and replays run in its
-- digest.
ALTER TABLE sessions ADD COLUMN environment TEXT;
