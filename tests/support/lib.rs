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
