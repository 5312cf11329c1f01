//! Fresh databases for tests: a Postgres database per test, dropped when its guard is, and a
//! SQLite file in a temporary directory. Tests never share state through a database.
//!
//! Postgres is required: when it cannot be reached the helpers panic with the reason, so that the
//! suite fails instead of silently skipping half of itself.
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::Arc;

use sqlx::sqlite::SqliteConnectOptions;
use sqlx::{AssertSqlSafe, ConnectOptions, Connection, PgConnection};
use toolexec_store::Store;
use toolexec_store::postgres::PgStore;
use toolexec_store::sqlite::SqliteStore;

/// Where tests find a Postgres superuser (trust auth), unless `TOOLEXEC_TEST_DATABASE_URL` says.
pub const DEFAULT_ADMIN_URL: &str = "postgres://postgres@127.0.0.1:5432/postgres";

/// Connections per test store: tests run in parallel, each with its own pool, and must stay well
/// under the server's `max_connections` (100 by default).
const TEST_POOL_SIZE: u32 = 8;

fn admin_url() -> String {
    std::env::var("TOOLEXEC_TEST_DATABASE_URL").unwrap_or_else(|_| DEFAULT_ADMIN_URL.to_owned())
}

/// `url` with its database name replaced by `name` (keeping any `?query`).
fn with_database(url: &str, name: &str) -> String {
    let (base, query) = match url.split_once('?') {
        Some((base, query)) => (base, format!("?{query}")),
        None => (url, String::new()),
    };
    let authority_start = base.find("://").map_or(0, |i| i + 3);
    let root = match base[authority_start..].find('/') {
        Some(slash) => &base[..authority_start + slash],
        None => base,
    };
    format!("{root}/{name}{query}")
}

async fn admin_connection(admin_url: &str) -> PgConnection {
    PgConnection::connect(admin_url).await.unwrap_or_else(|e| {
        panic!(
            "cannot reach Postgres at {admin_url}: {e}\n\
             The store tests need a running Postgres; point TOOLEXEC_TEST_DATABASE_URL at a \
             superuser connection (default {DEFAULT_ADMIN_URL})."
        )
    })
}

/// A Postgres database of its own, migrated, dropped (`WITH (FORCE)`) when this is dropped.
#[derive(Debug)]
pub struct TestPgDatabase {
    admin_url: String,
    name: String,
    url: String,
}

impl TestPgDatabase {
    pub async fn create() -> Self {
        let admin_url = admin_url();
        let name = format!("toolexec_test_{}", uuid::Uuid::new_v4().simple());
        let mut admin = admin_connection(&admin_url).await;
        // The name is ours (a fixed prefix and hex), so formatting it into SQL is safe.
        sqlx::query(AssertSqlSafe(format!("CREATE DATABASE {name}")))
            .execute(&mut admin)
            .await
            .unwrap_or_else(|e| panic!("cannot create test database {name}: {e}"));
        let _ = admin.close().await;
        let db = Self {
            url: with_database(&admin_url, &name),
            admin_url,
            name,
        };
        db.store().await.migrate().await.unwrap_or_else(|e| {
            panic!("migrating test database {}: {e}", db.name);
        });
        db
    }

    /// The URL of this database, for a server's configuration.
    pub fn url(&self) -> &str {
        &self.url
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// A store on this database with a small pool.
    pub async fn store(&self) -> PgStore {
        self.store_with(TEST_POOL_SIZE).await
    }

    pub async fn store_with(&self, max_connections: u32) -> PgStore {
        PgStore::connect(&self.url, max_connections)
            .await
            .unwrap_or_else(|e| panic!("cannot connect to test database {}: {e}", self.name))
    }
}

impl Drop for TestPgDatabase {
    fn drop(&mut self) {
        // Drop runs inside the test's runtime, which cannot be blocked on; a thread with its own
        // small runtime does the work while this one waits for it.
        let admin_url = self.admin_url.clone();
        let name = self.name.clone();
        let dropped = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| e.to_string())?;
            runtime.block_on(async {
                let mut admin = PgConnection::connect(&admin_url)
                    .await
                    .map_err(|e| e.to_string())?;
                sqlx::query(AssertSqlSafe(format!(
                    "DROP DATABASE IF EXISTS {name} WITH (FORCE)"
                )))
                .execute(&mut admin)
                .await
                .map_err(|e| e.to_string())?;
                let _ = admin.close().await;
                Ok::<(), String>(())
            })
        })
        .join();
        // No panic here: a panic while the test is already unwinding would abort the process.
        match dropped {
            Ok(Ok(())) => {}
            Ok(Err(e)) => eprintln!("could not drop test database {}: {e}", self.name),
            Err(_) => eprintln!(
                "could not drop test database {}: the dropper panicked",
                self.name
            ),
        }
    }
}

/// A SQLite store in a fresh temporary directory, migrated. Keep the `TempDir` alive as long as
/// the store.
pub async fn sqlite_store() -> (tempfile::TempDir, PathBuf, SqliteStore) {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("cannot create a temp dir: {e}"));
    let path = dir.path().join("toolexec.db");
    let store = SqliteStore::open(&path)
        .await
        .unwrap_or_else(|e| panic!("cannot open SQLite at {}: {e}", path.display()));
    store
        .migrate()
        .await
        .unwrap_or_else(|e| panic!("migrating SQLite at {}: {e}", path.display()));
    (dir, path, store)
}

/// A migrated store of either backend, for suites that run the same bodies on both.
pub struct TestStore {
    pub store: Arc<dyn Store>,
    backend: Backend,
}

enum Backend {
    // Fields drop in order: the pool before the database, whose drop also FORCE-closes any
    // connection still open.
    Postgres {
        pool: sqlx::PgPool,
        pg: Arc<PgStore>,
        _db: TestPgDatabase,
    },
    Sqlite {
        path: PathBuf,
        _dir: tempfile::TempDir,
    },
}

impl TestStore {
    pub async fn postgres() -> Self {
        let db = TestPgDatabase::create().await;
        let store = Arc::new(db.store().await);
        Self {
            backend: Backend::Postgres {
                pool: store.pool().clone(),
                pg: store.clone(),
                _db: db,
            },
            store,
        }
    }

    pub async fn sqlite() -> Self {
        let (dir, path, store) = sqlite_store().await;
        Self {
            store: Arc::new(store),
            backend: Backend::Sqlite { path, _dir: dir },
        }
    }

    /// Runs raw SQL against the database behind the store, for what the `Store` trait does not
    /// offer (revoking a key, trying to rewrite the log).
    pub async fn execute(&self, sql: &str) -> Result<u64, sqlx::Error> {
        let sql = AssertSqlSafe(sql.to_owned());
        match &self.backend {
            Backend::Postgres { pool, .. } => {
                Ok(sqlx::query(sql).execute(pool).await?.rows_affected())
            }
            Backend::Sqlite { path, .. } => {
                let mut conn = sqlite_connection(path).await?;
                Ok(sqlx::query(sql).execute(&mut conn).await?.rows_affected())
            }
        }
    }

    /// On Postgres, how many group commits took the locked path instead of the one statement
    /// from cached state ([`PgStore::locked_commits`]); `None` on SQLite, which has one path.
    pub fn locked_commits(&self) -> Option<u64> {
        match &self.backend {
            Backend::Postgres { pg, .. } => Some(pg.locked_commits()),
            Backend::Sqlite { .. } => None,
        }
    }

    /// One integer from raw SQL (`SELECT COUNT(*) …`).
    pub async fn scalar(&self, sql: &str) -> Result<i64, sqlx::Error> {
        let sql = AssertSqlSafe(sql.to_owned());
        match &self.backend {
            Backend::Postgres { pool, .. } => sqlx::query_scalar(sql).fetch_one(pool).await,
            Backend::Sqlite { path, .. } => {
                let mut conn = sqlite_connection(path).await?;
                sqlx::query_scalar(sql).fetch_one(&mut conn).await
            }
        }
    }
}

async fn sqlite_connection(path: &Path) -> Result<sqlx::SqliteConnection, sqlx::Error> {
    SqliteConnectOptions::from_str("sqlite:")?
        .filename(path)
        .connect()
        .await
}

#[cfg(test)]
mod tests {
    use super::with_database;

    #[test]
    fn the_test_database_replaces_the_admin_database_in_the_url() {
        assert_eq!(
            with_database("postgres://postgres@127.0.0.1:5432/postgres", "t1"),
            "postgres://postgres@127.0.0.1:5432/t1"
        );
        assert_eq!(
            with_database("postgres://u:p@h/postgres?sslmode=disable", "t1"),
            "postgres://u:p@h/t1?sslmode=disable"
        );
        assert_eq!(
            with_database("postgres://h:5432", "t1"),
            "postgres://h:5432/t1"
        );
    }
}
