use serde_json::json;
use toolexec_core::Policy;

use super::*;

async fn a_session(store: &SqliteStore) -> Session {
    let tenant = store.ensure_tenant("local").await.unwrap();
    let session = Session {
        id: new_id(),
        tenant_id: tenant.id,
        status: SessionStatus::Active,
        tools: None,
        policy: Policy::default(),
        env: Default::default(),
        metadata: json!({}),
        created_at: Utc::now(),
        closed_at: None,
        last_seq: 0,
        origin: None,
        environment: None,
        truncated: None,
    };
    store
        .create_session(&session, vec![], vec![], u64::MAX)
        .await
        .unwrap()
}

#[tokio::test]
async fn an_in_memory_store_keeps_its_data_between_calls() {
    let store = SqliteStore::memory().await.unwrap();
    store.migrate().await.unwrap();
    let session = a_session(&store).await;
    let read = store
        .get_session(session.tenant_id, session.id)
        .await
        .unwrap();
    assert_eq!(read, session);
}

#[tokio::test]
async fn opening_creates_the_file_and_its_folder_in_wal_mode() {
    let dir = std::env::temp_dir().join(format!("toolexec-store-{}", Uuid::new_v4()));
    let path = dir.join("nested/data/toolexec.db");
    let store = SqliteStore::open(&path).await.unwrap();
    store.migrate().await.unwrap();
    assert!(path.is_file());
    let mode: String = sqlx::query_scalar("PRAGMA journal_mode")
        .fetch_one(&store.reader)
        .await
        .unwrap();
    assert_eq!(mode, "wal");
    // Readers cannot write, whatever a bug might try.
    let write = sqlx::query("DELETE FROM tenants")
        .execute(&store.reader)
        .await;
    assert!(write.is_err());
    a_session(&store).await;
    drop(store);
    std::fs::remove_dir_all(&dir).unwrap();
}
