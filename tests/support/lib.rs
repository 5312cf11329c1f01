//! test support

pub mod app;
pub mod binary;
pub mod counting;
pub mod db;
pub mod fixtures;
pub mod moto;
pub mod procs;
pub mod registry;

/// `on_both_stores!(a, b)` turns each listed `async fn a(backend: Backend)` of the module into
/// the tests `postgres::a` and `sqlite::a` (Postgres first), so every case runs on both stores.
#[macro_export]
macro_rules! on_both_stores {
    ($($test:ident),* $(,)?) => {
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $test() {
                    super::$test($crate::app::Backend::Postgres).await;
                }
            )*
        }
        mod sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $test() {
                    super::$test($crate::app::Backend::Sqlite).await;
                }
            )*
        }
    };
}

/// Whether a log event (as the API shows it) starts a call: its `invocation.started`, or the
/// `invocation.finished` of a read recorded in one event, which carries the start's
/// `arguments` (`EventKind::starts_call`).
pub fn starts_call(event: &serde_json::Value) -> bool {
    event["kind"] == "invocation.started"
        || (event["kind"] == "invocation.finished" && event["data"].get("arguments").is_some())
}
