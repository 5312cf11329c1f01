//! Postgres backend (being written).
