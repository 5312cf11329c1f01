//! The migrations of both backends, embedded in the binary from the top-level `migrations/`.
//!
//! Listed by hand rather than with `sqlx::migrate!`, which needs sqlx's `macros` feature; a test
//! checks that every file of the folders is listed, so a new migration cannot be forgotten.
//! Versions and descriptions are the ones `sqlx::migrate!` would derive from the file names.
use sqlx::SqlSafeStr;
use sqlx::migrate::{Migration, MigrationType, Migrator};

/// `(version, description, sql)`.
type Embedded = (i64, &'static str, &'static str);

pub(crate) const POSTGRES: &[Embedded] = &[
    (
        1,
        "init",
        include_str!("../../../migrations/postgres/0001_init.sql"),
    ),
    (
        2,
        "lookups",
        include_str!("../../../migrations/postgres/0002_lookups.sql"),
    ),
    (
        3,
        "time travel",
        include_str!("../../../migrations/postgres/0003_time_travel.sql"),
    ),
    (
        4,
        "cluster",
        include_str!("../../../migrations/postgres/0004_cluster.sql"),
    ),
    (
        5,
        "todos",
        include_str!("../../../migrations/postgres/0005_todos.sql"),
    ),
    (
        6,
        "blob objects",
        include_str!("../../../migrations/postgres/0006_blob_objects.sql"),
    ),
    (
        7,
        "retention",
        include_str!("../../../migrations/postgres/0007_retention.sql"),
    ),
    (
        8,
        "approvals",
        include_str!("../../../migrations/postgres/0008_approvals.sql"),
    ),
    (
        9,
        "reads",
        include_str!("../../../migrations/postgres/0009_reads.sql"),
    ),
    (
        10,
        "environments",
        include_str!("../../../migrations/postgres/0010_environments.sql"),
    ),
];

pub(crate) const SQLITE: &[Embedded] = &[
    (
        1,
        "init",
        include_str!("../../../migrations/sqlite/0001_init.sql"),
    ),
    (
        2,
        "lookups",
        include_str!("../../../migrations/sqlite/0002_lookups.sql"),
    ),
    (
        3,
        "time travel",
        include_str!("../../../migrations/sqlite/0003_time_travel.sql"),
    ),
    (
        4,
        "cluster",
        include_str!("../../../migrations/sqlite/0004_cluster.sql"),
    ),
    (
        5,
        "todos",
        include_str!("../../../migrations/sqlite/0005_todos.sql"),
    ),
    (
        6,
        "blob objects",
        include_str!("../../../migrations/sqlite/0006_blob_objects.sql"),
    ),
    (
        7,
        "retention",
        include_str!("../../../migrations/sqlite/0007_retention.sql"),
    ),
    (
        8,
        "approvals",
        include_str!("../../../migrations/sqlite/0008_approvals.sql"),
    ),
    (
        9,
        "reads",
        include_str!("../../../migrations/sqlite/0009_reads.sql"),
    ),
    (
        10,
        "environments",
        include_str!("../../../migrations/sqlite/0010_environments.sql"),
    ),
];

pub(crate) fn migrator(migrations: &[Embedded]) -> Migrator {
    Migrator::with_migrations(
        migrations
            .iter()
            .map(|&(version, description, sql)| {
                Migration::new(
                    version,
                    description.into(),
                    MigrationType::Simple,
                    sql.into_sql_str(),
                    false,
                )
            })
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    fn assert_embedded(folder: &str, embedded: &[Embedded]) {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../migrations")
            .join(folder);
        let mut files: Vec<(i64, String, String)> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|entry| {
                let path = entry.unwrap().path();
                let stem = path.file_stem().unwrap().to_str().unwrap().to_owned();
                let (version, description) = stem.split_once('_').unwrap();
                (
                    version.parse().unwrap(),
                    description.replace('_', " "),
                    std::fs::read_to_string(&path).unwrap(),
                )
            })
            .collect();
        files.sort();
        let listed: Vec<(i64, String, String)> = embedded
            .iter()
            .map(|&(v, d, sql)| (v, d.to_owned(), sql.to_owned()))
            .collect();
        assert_eq!(
            files, listed,
            "migrations/{folder} and the list in crates/toolexec-store/src/migrations.rs differ"
        );
    }

    #[test]
    fn every_postgres_migration_file_is_embedded() {
        assert_embedded("postgres", POSTGRES);
    }

    #[test]
    fn every_sqlite_migration_file_is_embedded() {
        assert_embedded("sqlite", SQLITE);
    }
}
