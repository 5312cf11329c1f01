//! A real toolexec server on port 0 over a fresh Postgres database (or SQLite), driven over HTTP.
//! Test-only code: panicking on a failed setup is the point, so unwrap/expect are allowed.
#![allow(clippy::unwrap_used, clippy::expect_used)]
use std::sync::Arc;

use serde_json::{Value, json};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use toolexec_server::Config;

use crate::db::TestPgDatabase;

pub struct TestApp {
    pub base: String,
    pub http: reqwest::Client,
    pub config: Config,
    pub data: Arc<tempfile::TempDir>,
    pub db: Option<Arc<TestPgDatabase>>,
    pub state: Arc<toolexec_api::AppState>,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<anyhow::Result<()>>>,
}

/// The real sandbox, as the service runs it (its built-in static init).
pub fn sandbox_config() -> toolexec_sandbox::SandboxConfig {
    toolexec_sandbox::SandboxConfig::default()
}

/// A data directory the sandbox user can traverse (tempdir makes it 0700).
pub fn data_dir() -> Arc<tempfile::TempDir> {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755))
        .expect("chmod data dir");
    Arc::new(dir)
}

/// A server on a fresh Postgres database, single local tenant.
pub async fn spawn_app() -> TestApp {
    spawn_app_with(|_| {}).await
}

/// Like [`spawn_app`], with the configuration adjusted first.
pub async fn spawn_app_with(adjust: impl FnOnce(&mut Config)) -> TestApp {
    let db = Arc::new(TestPgDatabase::create().await);
    let data = data_dir();
    let mut config = Config {
        bind: "127.0.0.1:0".into(),
        database_url: Some(db.url().to_owned()),
        data_dir: data.path().to_owned(),
        node: Some("test-node".into()),
        log_format: "text".into(),
        max_db_connections: 8,
        sandbox: sandbox_config(),
        ..Config::default()
    };
    adjust(&mut config);
    TestApp::start(config, data, Some(db)).await
}

/// A server on the embedded SQLite store, the zero-configuration default.
pub async fn spawn_sqlite_app() -> TestApp {
    spawn_sqlite_app_with(|_| {}).await
}

/// Like [`spawn_sqlite_app`], with the configuration adjusted first.
pub async fn spawn_sqlite_app_with(adjust: impl FnOnce(&mut Config)) -> TestApp {
    let data = data_dir();
    let mut config = Config {
        bind: "127.0.0.1:0".into(),
        data_dir: data.path().to_owned(),
        node: Some("test-node".into()),
        log_format: "text".into(),
        sandbox: sandbox_config(),
        ..Config::default()
    };
    adjust(&mut config);
    TestApp::start(config, data, None).await
}

/// Which store a test's service runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Postgres,
    Sqlite,
}

impl Backend {
    /// A server on this store (a fresh Postgres database, or a fresh SQLite file).
    pub async fn spawn(self) -> TestApp {
        self.spawn_with(|_| {}).await
    }

    /// Like [`Backend::spawn`], with the configuration adjusted first.
    pub async fn spawn_with(self, adjust: impl FnOnce(&mut Config)) -> TestApp {
        match self {
            Backend::Postgres => spawn_app_with(adjust).await,
            Backend::Sqlite => spawn_sqlite_app_with(adjust).await,
        }
    }
}

impl TestApp {
    pub async fn start(
        config: Config,
        data: Arc<tempfile::TempDir>,
        db: Option<Arc<TestPgDatabase>>,
    ) -> TestApp {
        Self::start_wrapped(config, data, db, |store| store).await
    }

    /// Like [`TestApp::start`], with the service's store wrapped (to count its queries).
    pub async fn start_wrapped(
        config: Config,
        data: Arc<tempfile::TempDir>,
        db: Option<Arc<TestPgDatabase>>,
        wrap: impl FnOnce(Arc<dyn toolexec_store::Store>) -> Arc<dyn toolexec_store::Store>,
    ) -> TestApp {
        let state = toolexec_server::build_state_with(&config, wrap)
            .await
            .expect("build state");
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind port 0");
        let addr = listener.local_addr().expect("local addr");
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(toolexec_server::serve(state.clone(), listener, async {
            let _ = stopped.await;
        }));
        TestApp {
            base: format!("http://{addr}"),
            http: {
                toolexec_tools::web::install_tls_provider();
                reqwest::Client::new()
            },
            config,
            data,
            db,
            state,
            stop: Some(stop),
            task: Some(task),
        }
    }

    /// Stops the server (graceful shutdown) and starts a new one on the same store and data.
    pub async fn restart(mut self) -> TestApp {
        self.stop().await;
        TestApp::start(self.config.clone(), self.data.clone(), self.db.clone()).await
    }

    pub async fn stop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            task.await.expect("server task").expect("server result");
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    pub async fn get(&self, path: &str) -> reqwest::Response {
        self.http.get(self.url(path)).send().await.expect("GET")
    }

    pub async fn post(&self, path: &str, body: &Value) -> reqwest::Response {
        self.http
            .post(self.url(path))
            .json(body)
            .send()
            .await
            .expect("POST")
    }

    pub async fn delete(&self, path: &str) -> reqwest::Response {
        self.http
            .delete(self.url(path))
            .send()
            .await
            .expect("DELETE")
    }

    /// Creates a session and returns its JSON.
    pub async fn session(&self, body: Value) -> Value {
        let resp = self.post("/v1/sessions", &body).await;
        assert_eq!(
            resp.status(),
            201,
            "create session: {}",
            resp.text().await.unwrap_or_default()
        );
        resp.json().await.expect("session json")
    }

    /// Posts a batch and returns the `results` array (asserting 200).
    pub async fn calls(&self, session_id: &str, calls: Value) -> Vec<Value> {
        let resp = self
            .post(
                &format!("/v1/sessions/{session_id}/calls"),
                &json!({"calls": calls}),
            )
            .await;
        let status = resp.status();
        let body: Value = resp.json().await.expect("calls json");
        assert_eq!(status, 200, "calls: {body}");
        body["results"].as_array().expect("results").clone()
    }

    /// One call; returns its result.
    pub async fn call(&self, session_id: &str, id: &str, name: &str, args: Value) -> Value {
        let mut r = self
            .calls(
                session_id,
                json!([{"id": id, "name": name, "arguments": args}]),
            )
            .await;
        r.remove(0)
    }

    /// `GET /v1/invocations/{id}` for a call result's invocation.
    pub async fn invocation_of(&self, result: &Value) -> Value {
        let id = result["invocation_id"].as_str().expect("invocation_id");
        let resp = self.get(&format!("/v1/invocations/{id}")).await;
        assert_eq!(resp.status(), 200);
        resp.json().await.expect("invocation json")
    }

    /// One sample of the service's Prometheus metrics (0 if absent).
    pub async fn metric(&self, name: &str) -> f64 {
        let text = self.get("/metrics").await.text().await.expect("metrics");
        text.lines()
            .find_map(|l| {
                l.strip_prefix(name)
                    .and_then(|v| v.strip_prefix(' '))
                    .and_then(|v| v.trim().parse().ok())
            })
            .unwrap_or(0.0)
    }

    pub async fn events(&self, session_id: &str) -> Vec<Value> {
        let resp = self
            .get(&format!("/v1/sessions/{session_id}/events?limit=1000"))
            .await;
        assert_eq!(resp.status(), 200);
        let body: Value = resp.json().await.expect("events json");
        body["events"].as_array().expect("events").clone()
    }

    /// Every event of a session, page after page.
    pub async fn events_all(&self, session_id: &str) -> Vec<Value> {
        let mut all = Vec::new();
        let mut after = 0;
        loop {
            let resp = self
                .get(&format!(
                    "/v1/sessions/{session_id}/events?limit=1000&after={after}"
                ))
                .await;
            assert_eq!(resp.status(), 200);
            let body: Value = resp.json().await.expect("events json");
            all.extend(body["events"].as_array().expect("events").iter().cloned());
            match body["next_after"].as_i64() {
                Some(next) => after = next,
                None => return all,
            }
        }
    }
}

impl Drop for TestApp {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

/// Controls over a test database that only tests need: making it unreachable, reading rows.
pub trait DbControl {
    /// Refuses (and cuts) every connection to the database, or allows them again: the store
    /// going down and coming back, for real.
    fn set_reachable(&self, reachable: bool) -> impl std::future::Future<Output = ()>;
    /// The first column of every row of `sql`, as text.
    fn query_strings(&self, sql: &'static str) -> impl std::future::Future<Output = Vec<String>>;
}

fn admin_url() -> String {
    std::env::var("TOOLEXEC_TEST_DATABASE_URL")
        .unwrap_or_else(|_| crate::db::DEFAULT_ADMIN_URL.to_owned())
}

impl DbControl for TestPgDatabase {
    async fn set_reachable(&self, reachable: bool) {
        use sqlx::Connection;
        let mut admin = sqlx::PgConnection::connect(&admin_url())
            .await
            .expect("admin connection");
        let name = self.name();
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "ALTER DATABASE {name} ALLOW_CONNECTIONS {reachable}"
        )))
        .execute(&mut admin)
        .await
        .expect("alter database");
        if !reachable {
            sqlx::query(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1",
            )
            .bind(name)
            .execute(&mut admin)
            .await
            .expect("terminate backends");
        }
    }

    async fn query_strings(&self, sql: &'static str) -> Vec<String> {
        use sqlx::{Connection, Row};
        let mut conn = sqlx::PgConnection::connect(self.url())
            .await
            .expect("connect");
        sqlx::query(sql)
            .fetch_all(&mut conn)
            .await
            .expect("query")
            .iter()
            .map(|r| r.get::<String, _>(0))
            .collect()
    }
}
