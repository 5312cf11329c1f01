//! The store suite: the same test bodies against Postgres and SQLite, each test on a fresh
//! database. `store_suite!` turns every listed body into `store::postgres::<name>` and
//! `store::sqlite::<name>`.
use std::collections::{BTreeMap, BTreeSet};

use serde_json::{Value, json};
use sqlx::types::chrono::Utc;
use toolexec_core::{
    CallStatus, Capability, EventKind, InvocationStatus, Policy, Session, SessionStatus, Tenant,
    Truncation, TruncationMode, new_id, sha256_hex,
};
use toolexec_store::pages::{ByteBounds, Listed};
use toolexec_store::{
    Assigned, Blob, NewEvent, NewInvocation, Outcome, StoreError, Write, WriteError,
};
use toolexec_tests::db::{TestPgDatabase, TestStore};
use uuid::Uuid;

macro_rules! store_suite {
    ($($test:ident),* $(,)?) => {
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $test() {
                    let db = toolexec_tests::db::TestStore::postgres().await;
                    super::$test(&db).await;
                }
            )*
        }
        mod sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $test() {
                    let db = toolexec_tests::db::TestStore::sqlite().await;
                    super::$test(&db).await;
                }
            )*
        }
    };
}

store_suite!(
    migrating_again_changes_nothing_and_the_store_answers_pings,
    ensuring_a_tenant_twice_returns_the_same_tenant,
    api_keys_resolve_to_their_tenant_until_revoked,
    a_created_session_is_stored_active_with_its_first_events,
    sessions_are_listed_newest_first_one_page_at_a_time,
    another_tenants_session_is_not_found_anywhere,
    closing_a_session_appends_session_closed_once,
    a_started_then_finished_call_gets_consecutive_seqs_and_records_its_events,
    a_record_writes_start_side_effects_and_finish_in_one_go,
    a_read_with_no_side_effect_is_one_event_and_reads_like_two,
    one_batch_can_start_and_finish_a_call_across_several_sessions,
    a_call_id_recorded_in_an_earlier_batch_is_a_duplicate,
    a_duplicate_call_id_in_one_batch_does_not_abort_the_others,
    a_closed_or_missing_session_refuses_new_calls_but_running_ones_can_finish,
    finishing_an_invocation_that_is_not_running_is_refused,
    concurrent_committers_get_gapless_ordered_seqs,
    a_blob_is_stored_once_and_readable,
    every_shape_of_a_group_commit_writes_what_it_carries,
    an_invocation_lists_its_side_effects_in_log_order,
    the_output_is_the_blob_when_truncated_and_the_content_otherwise,
    interrupting_a_node_finishes_only_its_own_running_calls,
    events_are_paged_by_after_and_limit,
    pages_are_bounded_in_bytes_and_show_a_large_row_by_its_size,
    lookup_calls_returns_the_session_and_the_calls_it_already_has,
    the_call_ids_of_a_session_are_read_page_by_page,
    the_last_process_number_is_the_highest_process_id_started,
    the_event_log_refuses_updates_and_deletes,
    blobs_beyond_the_statement_bound_are_stored_once_in_bounded_statements,
    a_batch_the_database_refuses_writes_nothing_and_says_why_in_plain_words,
    the_open_session_cap_counts_only_active_sessions,
    a_process_start_is_found_by_its_id_in_its_own_session_only,
    events_of_given_kinds_are_read_up_to_a_seq,
    the_todo_events_of_a_session_are_read_without_the_rest_of_its_log,
    events_of_no_invocation_are_appended_under_the_session_lock,
    blobs_are_read_many_at_once_and_missing_ones_left_out,
    a_session_remembers_where_it_came_from,
    a_replay_report_is_saved_replaced_and_read_by_its_tenant_only,
    a_lease_is_held_by_one_node_until_released_or_expired,
    retention_deletes_closed_sessions_only_and_never_an_origin_that_stays,
    blob_rows_of_either_kind_are_deleted_by_hash,
);

// --- helpers ---

const NODE: &str = "node-a";

async fn tenant(db: &TestStore, name: &str) -> Tenant {
    db.store.ensure_tenant(name).await.unwrap()
}

fn new_session(tenant: &Tenant) -> Session {
    Session {
        id: new_id(),
        tenant_id: tenant.id,
        status: SessionStatus::Active,
        tools: None,
        policy: Policy::default(),
        env: BTreeMap::new(),
        metadata: json!({}),
        created_at: Utc::now(),
        closed_at: None,
        last_seq: 0,
        origin: None,
        environment: None,
        truncated: None,
    }
}

/// An active session whose log holds `session.created` at seq 1.
async fn session(db: &TestStore, tenant: &Tenant) -> Session {
    db.store
        .create_session(
            &new_session(tenant),
            vec![NewEvent {
                kind: EventKind::SessionCreated,
                data: json!({"files": 0}),
            }],
            vec![],
            u64::MAX,
        )
        .await
        .unwrap()
}

fn call(session_id: Uuid, call_id: &str) -> NewInvocation {
    call_on(session_id, call_id, NODE)
}

fn call_on(session_id: Uuid, call_id: &str, node: &str) -> NewInvocation {
    let arguments = json!({"file_path": format!("{call_id}.txt")});
    NewInvocation {
        id: new_id(),
        session_id,
        call_id: call_id.to_owned(),
        name: "write_file".to_owned(),
        arguments_sha256: sha256_hex(arguments.to_string().as_bytes()),
        arguments,
        read_only: false,
        capabilities: vec![Capability::FsRead, Capability::FsWrite],
        node: node.to_owned(),
        started_at: Utc::now(),
    }
}

fn ok(content: &str) -> Outcome {
    Outcome {
        status: CallStatus::Ok,
        content: content.to_owned(),
        truncated: None,
        output_chars: content.chars().count() as i64,
        output_sha256: None,
        finished_at: Utc::now(),
        duration_ms: 12.5,
        reads: Vec::new(),
        structured: None,
    }
}

fn file_event(kind: EventKind, path: &str) -> NewEvent {
    NewEvent {
        kind,
        data: json!({"path": path}),
    }
}

fn start(invocation: NewInvocation) -> Write {
    Write::Start { invocation }
}

fn record(invocation: NewInvocation, content: &str) -> Write {
    Write::Record {
        invocation,
        outcome: ok(content),
        side_effects: vec![],
        blobs: vec![],
    }
}

fn finish(invocation: &NewInvocation, outcome: Outcome) -> Write {
    Write::Finish {
        session_id: invocation.session_id,
        invocation_id: invocation.id,
        outcome,
        side_effects: vec![],
        blobs: vec![],
    }
}

fn assigned(started_seq: i64, finished_seq: Option<i64>) -> Result<Assigned, WriteError> {
    Ok(Assigned {
        started_seq,
        finished_seq,
    })
}

async fn seqs(db: &TestStore, session: &Session) -> Vec<i64> {
    db.store
        .events(session.tenant_id, session.id, 0, 10_000)
        .await
        .unwrap()
        .iter()
        .map(|e| e.seq)
        .collect()
}

fn one_to(n: i64) -> Vec<i64> {
    (1..=n).collect()
}

// --- tests ---

async fn migrating_again_changes_nothing_and_the_store_answers_pings(db: &TestStore) {
    db.store.migrate().await.unwrap();
    db.store.ping().await.unwrap();
    assert!(["postgres", "sqlite"].contains(&db.store.backend()));
}

async fn ensuring_a_tenant_twice_returns_the_same_tenant(db: &TestStore) {
    let first = tenant(db, "acme").await;
    let again = tenant(db, "acme").await;
    let other = tenant(db, "globex").await;
    assert_eq!(first, again);
    assert_eq!(first.name, "acme");
    assert_ne!(first.id, other.id);
}

async fn api_keys_resolve_to_their_tenant_until_revoked(db: &TestStore) {
    let acme = tenant(db, "acme").await;
    assert!(!db.store.has_api_keys().await.unwrap());

    let hash = sha256_hex(b"tx_secret_key");
    db.store
        .create_api_key(acme.id, &hash, "tx_secr")
        .await
        .unwrap();
    assert!(db.store.has_api_keys().await.unwrap());
    assert_eq!(db.store.tenant_for_key(&hash).await.unwrap(), Some(acme));
    assert_eq!(
        db.store
            .tenant_for_key(&sha256_hex(b"other"))
            .await
            .unwrap(),
        None
    );

    let revoked = db
        .execute(&format!(
            "UPDATE api_keys SET revoked_at = CURRENT_TIMESTAMP WHERE key_sha256 = '{hash}'"
        ))
        .await
        .unwrap();
    assert_eq!(revoked, 1);
    assert_eq!(db.store.tenant_for_key(&hash).await.unwrap(), None);
    // Revoking every key locks clients out; it does not switch authentication off.
    assert!(db.store.has_api_keys().await.unwrap());

    let missing = db
        .store
        .create_api_key(new_id(), &sha256_hex(b"k2"), "k2")
        .await;
    assert!(matches!(missing, Err(StoreError::NotFound)), "{missing:?}");
}

async fn a_created_session_is_stored_active_with_its_first_events(db: &TestStore) {
    let acme = tenant(db, "acme").await;
    let seed = Blob::new(b"fn main() {}\n".to_vec());
    let mut new = new_session(&acme);
    new.tools = Some(vec!["read_file".into(), "write_file".into()]);
    new.env = BTreeMap::from([("LANG".to_owned(), "C.UTF-8".to_owned())]);
    new.metadata = json!({"agent": "test", "n": 5});
    new.policy.default_timeout_ms = Some(30_000);
    new.last_seq = 99; // ignored

    let stored = db
        .store
        .create_session(
            &new,
            vec![
                NewEvent {
                    kind: EventKind::SessionCreated,
                    data: json!({"tools": ["read_file", "write_file"]}),
                },
                NewEvent {
                    kind: EventKind::FileCreated,
                    data: json!({"path": "src/main.rs", "after_sha256": seed.sha256}),
                },
            ],
            vec![seed.clone()],
            u64::MAX,
        )
        .await
        .unwrap();

    assert_eq!(stored.id, new.id);
    assert_eq!(stored.tenant_id, acme.id);
    assert_eq!(stored.status, SessionStatus::Active);
    assert_eq!(stored.last_seq, 2);
    assert_eq!(stored.tools, new.tools);
    assert_eq!(stored.env, new.env);
    assert_eq!(stored.metadata, new.metadata);
    assert_eq!(stored.policy, new.policy);
    assert_eq!(stored.closed_at, None);
    assert_eq!(db.store.get_session(acme.id, new.id).await.unwrap(), stored);

    let events = db.store.events(acme.id, new.id, 0, 100).await.unwrap();
    let kinds: Vec<_> = events
        .iter()
        .map(|e| (e.seq, e.kind, e.invocation_id))
        .collect();
    assert_eq!(
        kinds,
        vec![
            (1, EventKind::SessionCreated, None),
            (2, EventKind::FileCreated, None)
        ]
    );
    assert_eq!(events[1].data["path"], "src/main.rs");
    assert!(events.iter().all(|e| e.session_id == new.id));
    assert_eq!(
        db.store.blob(&seed.sha256).await.unwrap(),
        Some(seed.bytes.to_vec())
    );
}

async fn sessions_are_listed_newest_first_one_page_at_a_time(db: &TestStore) {
    let acme = tenant(db, "acme").await;
    let globex = tenant(db, "globex").await;
    let mut ids = Vec::new();
    for _ in 0..5 {
        ids.push(session(db, &acme).await.id);
    }
    let theirs = session(db, &globex).await;
    ids.reverse(); // newest first

    let mut pages = Vec::new();
    let mut before = None;
    loop {
        let page = db
            .store
            .list_sessions(acme.id, before, 2, ByteBounds::UNBOUNDED)
            .await
            .unwrap();
        pages.push(page.sessions.iter().map(Listed::id).collect::<Vec<_>>());
        match page.next_before {
            Some(next) => {
                assert_eq!(Some(next), page.sessions.last().map(Listed::id));
                before = Some(next);
            }
            None => break,
        }
    }
    assert_eq!(
        pages,
        vec![ids[0..2].to_vec(), ids[2..4].to_vec(), ids[4..5].to_vec()]
    );

    let exact = db
        .store
        .list_sessions(acme.id, None, 5, ByteBounds::UNBOUNDED)
        .await
        .unwrap();
    assert_eq!(exact.sessions.len(), 5);
    assert_eq!(exact.next_before, None, "a full last page has no next page");

    let other = db
        .store
        .list_sessions(globex.id, None, 10, ByteBounds::UNBOUNDED)
        .await
        .unwrap();
    assert_eq!(
        other.sessions.iter().map(Listed::id).collect::<Vec<_>>(),
        vec![theirs.id]
    );
}

async fn another_tenants_session_is_not_found_anywhere(db: &TestStore) {
    let acme = tenant(db, "acme").await;
    let intruder = tenant(db, "intruder").await;
    let s = session(db, &acme).await;
    let c = call(s.id, "c1");
    db.store.commit(&[record(c.clone(), "done")]).await.unwrap();

    let not_found = |r: Result<(), StoreError>, what: &str| {
        assert!(matches!(r, Err(StoreError::NotFound)), "{what}: {r:?}");
    };
    let st = &db.store;
    not_found(
        st.get_session(intruder.id, s.id).await.map(drop),
        "get_session",
    );
    not_found(
        st.close_session(intruder.id, s.id, json!({}))
            .await
            .map(drop),
        "close_session",
    );
    not_found(
        st.events(intruder.id, s.id, 0, 10).await.map(drop),
        "events",
    );
    not_found(
        st.lookup_calls(intruder.id, s.id, &["c1".into()])
            .await
            .map(drop),
        "lookup_calls",
    );
    not_found(
        st.invocation(intruder.id, c.id).await.map(drop),
        "invocation",
    );
    not_found(
        st.invocation_output(intruder.id, c.id).await.map(drop),
        "invocation_output",
    );
    not_found(
        st.event_texts(intruder.id, s.id, 0, 10, ByteBounds::UNBOUNDED)
            .await
            .map(drop),
        "event_texts",
    );
    not_found(
        st.event_text(intruder.id, s.id, 1, None).await.map(drop),
        "event_text",
    );
    not_found(
        st.session_excerpt(intruder.id, s.id, 100).await.map(drop),
        "session_excerpt",
    );
    assert!(
        st.list_sessions(intruder.id, None, 10, ByteBounds::UNBOUNDED)
            .await
            .unwrap()
            .sessions
            .is_empty()
    );

    // A session that does not exist at all looks the same.
    not_found(
        st.get_session(acme.id, new_id()).await.map(drop),
        "missing get_session",
    );
    not_found(
        st.events(acme.id, new_id(), 0, 10).await.map(drop),
        "missing events",
    );
    not_found(
        st.invocation(acme.id, new_id()).await.map(drop),
        "missing invocation",
    );

    // The intruder's close changed nothing.
    let after = st.get_session(acme.id, s.id).await.unwrap();
    assert_eq!(after.status, SessionStatus::Active);
    assert_eq!(after.last_seq, 3);
}

async fn closing_a_session_appends_session_closed_once(db: &TestStore) {
    let acme = tenant(db, "acme").await;
    let s = session(db, &acme).await;

    let closed = db
        .store
        .close_session(acme.id, s.id, json!({"reason": "done"}))
        .await
        .unwrap();
    assert_eq!(closed.status, SessionStatus::Closed);
    assert!(closed.closed_at.is_some());
    assert_eq!(closed.last_seq, 2);
    assert_eq!(db.store.get_session(acme.id, s.id).await.unwrap(), closed);

    let events = db.store.events(acme.id, s.id, 0, 10).await.unwrap();
    assert_eq!(events.len(), 2);
    assert_eq!(events[1].kind, EventKind::SessionClosed);
    assert_eq!(events[1].seq, 2);
    assert_eq!(events[1].data, json!({"reason": "done"}));

    let again = db
        .store
        .close_session(acme.id, s.id, json!({"reason": "again"}))
        .await
        .unwrap();
    assert_eq!(again, closed, "closing a closed session changes nothing");
    assert_eq!(seqs(db, &s).await, vec![1, 2]);
}

async fn a_started_then_finished_call_gets_consecutive_seqs_and_records_its_events(db: &TestStore) {
    let acme = tenant(db, "acme").await;
    let s = session(db, &acme).await;
    let c = call(s.id, "toolu_01");

    let started = db.store.commit(&[start(c.clone())]).await.unwrap();
    assert_eq!(started, vec![assigned(2, None)]);

    let running = db.store.invocation(acme.id, c.id).await.unwrap();
    assert_eq!(running.status, InvocationStatus::Running);
    assert_eq!(running.started_seq, 2);
    assert_eq!(running.finished_seq, None);
    assert_eq!(running.content, None);
    assert_eq!(running.capabilities, c.capabilities);
    assert_eq!(running.arguments, c.arguments);
    assert!(!running.read_only);

    let blob = Blob::new(b"hello\n".to_vec());
    let outcome = ok("Wrote 6 bytes to toolu_01.txt");
    let finished = db
        .store
        .commit(&[Write::Finish {
            session_id: s.id,
            invocation_id: c.id,
            outcome: outcome.clone(),
            side_effects: vec![NewEvent {
                kind: EventKind::FileCreated,
                data: json!({"path": "toolu_01.txt", "after_sha256": blob.sha256}),
            }],
            blobs: vec![blob.clone()],
        }])
        .await
        .unwrap();
    assert_eq!(finished, vec![assigned(2, Some(4))]);

    let events = db.store.events(acme.id, s.id, 1, 100).await.unwrap();
    let shape: Vec<_> = events
        .iter()
        .map(|e| (e.seq, e.kind, e.invocation_id))
        .collect();
    assert_eq!(
        shape,
        vec![
            (2, EventKind::InvocationStarted, Some(c.id)),
            (3, EventKind::FileCreated, Some(c.id)),
            (4, EventKind::InvocationFinished, Some(c.id)),
        ]
    );
    assert_eq!(
        events[0].data,
        json!({
            "call_id": "toolu_01",
            "name": "write_file",
            "arguments": c.arguments,
            "read_only": false,
            "capabilities": ["fs.read", "fs.write"],
        })
    );
    assert_eq!(
        events[2].data,
        json!({
            "call_id": "toolu_01",
            "name": "write_file",
            "status": "ok",
            "is_error": false,
            "duration_ms": 12.5,
            "truncated": null,
            "output_chars": outcome.output_chars,
            "output_sha256": null,
        })
    );

    let done = db.store.invocation(acme.id, c.id).await.unwrap();
    assert_eq!(done.status, InvocationStatus::Ok);
    assert!(!done.is_error);
    assert_eq!(done.content.as_deref(), Some(outcome.content.as_str()));
    assert_eq!(done.output_chars, Some(outcome.output_chars));
    assert_eq!(done.duration_ms, Some(12.5));
    assert!(done.finished_at.is_some());
    assert_eq!((done.started_seq, done.finished_seq), (2, Some(4)));
    assert_eq!(done.side_effects.len(), 1);
    assert_eq!(
        db.store.get_session(acme.id, s.id).await.unwrap().last_seq,
        4
    );
    assert_eq!(
        db.store.blob(&blob.sha256).await.unwrap(),
        Some(blob.bytes.to_vec())
    );
}

async fn a_record_writes_start_side_effects_and_finish_in_one_go(db: &TestStore) {
    let acme = tenant(db, "acme").await;
    let s = session(db, &acme).await;
    let c = call(s.id, "c1");
    let mut outcome = ok("no such file");
    outcome.status = CallStatus::Error;

    let result = db
        .store
        .commit(&[Write::Record {
            invocation: c.clone(),
            outcome,
            side_effects: vec![
                file_event(EventKind::FileCreated, "a"),
                file_event(EventKind::FileDeleted, "b"),
            ],
            blobs: vec![],
        }])
        .await
        .unwrap();
    assert_eq!(result, vec![assigned(2, Some(5))]);

    let kinds: Vec<_> = db
        .store
        .events(acme.id, s.id, 1, 100)
        .await
        .unwrap()
        .iter()
        .map(|e| e.kind)
        .collect();
    assert_eq!(
        kinds,
        vec![
            EventKind::InvocationStarted,
            EventKind::FileCreated,
            EventKind::FileDeleted,
            EventKind::InvocationFinished
        ]
    );
    let inv = db.store.invocation(acme.id, c.id).await.unwrap();
    assert_eq!(inv.status, InvocationStatus::Error);
    assert!(inv.is_error);
    assert_eq!((inv.started_seq, inv.finished_seq), (2, Some(5)));
}

async fn a_read_with_no_side_effect_is_one_event_and_reads_like_two(db: &TestStore) {
    let acme = tenant(db, "acme").await;
    let s = session(db, &acme).await;
    let read_only = |call_id: &str| NewInvocation {
        name: "read_file".to_owned(),
        read_only: true,
        capabilities: vec![Capability::FsRead],
        ..call(s.id, call_id)
    };
    // One read as it is recorded now (one write, one event), one as records made before were
    // (a durable start, then its finish: two events), then a repeat of the first.
    let (now, before) = (read_only("now"), read_only("before"));
    let results = db
        .store
        .commit(&[
            record(now.clone(), "one line"),
            start(before.clone()),
            finish(&before, ok("one line")),
            record(read_only("now"), "again"),
        ])
        .await
        .unwrap();
    assert_eq!(
        results[..3],
        [
            assigned(2, Some(2)),
            assigned(3, None),
            assigned(3, Some(4))
        ]
    );
    assert_eq!(results[3], Err(WriteError::DuplicateCall(now.id)));

    let events = db.store.events(acme.id, s.id, 1, 100).await.unwrap();
    let shape: Vec<_> = events
        .iter()
        .map(|e| (e.seq, e.kind, e.invocation_id))
        .collect();
    assert_eq!(
        shape,
        vec![
            (2, EventKind::InvocationFinished, Some(now.id)),
            (3, EventKind::InvocationStarted, Some(before.id)),
            (4, EventKind::InvocationFinished, Some(before.id)),
        ]
    );
    // The one event is the start and the end: what `invocation.started` and
    // `invocation.finished` would have said, together.
    assert_eq!(
        events[0].data,
        json!({
            "call_id": "now",
            "name": "read_file",
            "arguments": now.arguments,
            "read_only": true,
            "capabilities": ["fs.read"],
            "status": "ok",
            "is_error": false,
            "duration_ms": 12.5,
            "truncated": null,
            "output_chars": 8,
            "output_sha256": null,
        })
    );
    let starts: Vec<i64> = events
        .iter()
        .filter(|e| e.kind.starts_call(&e.data))
        .map(|e| e.seq)
        .collect();
    assert_eq!(starts, [2, 3]);
    // Both invocations read alike: finished, their output, no side effects.
    for (c, seqs) in [(&now, (2, Some(2))), (&before, (3, Some(4)))] {
        let inv = db.store.invocation(acme.id, c.id).await.unwrap();
        assert_eq!(inv.status, InvocationStatus::Ok);
        assert_eq!(inv.content.as_deref(), Some("one line"));
        assert_eq!(inv.arguments, c.arguments);
        assert!(inv.read_only);
        assert_eq!((inv.started_seq, inv.finished_seq), seqs);
        assert!(inv.side_effects.is_empty());
    }
    assert_eq!(
        db.store.get_session(acme.id, s.id).await.unwrap().last_seq,
        4
    );
    // A finish of the one-event read is refused: it is not running.
    assert_eq!(
        db.store.commit(&[finish(&now, ok("late"))]).await.unwrap(),
        vec![Err(WriteError::NotRunning)]
    );
}

async fn one_batch_can_start_and_finish_a_call_across_several_sessions(db: &TestStore) {
    let acme = tenant(db, "acme").await;
    let one = session(db, &acme).await;
    let two = session(db, &acme).await;
    let a = call(one.id, "c1");
    let b = call(two.id, "c1");

    let results = db
        .store
        .commit(&[
            start(a.clone()),
            start(b.clone()),
            finish(&a, ok("a")),
            record(call(two.id, "c2"), "c2"),
        ])
        .await
        .unwrap();
    assert_eq!(
        results,
        vec![
            assigned(2, None),
            assigned(2, None),
            assigned(2, Some(3)),
            assigned(3, Some(4)),
        ]
    );
    assert_eq!(seqs(db, &one).await, one_to(3));
    assert_eq!(seqs(db, &two).await, one_to(4));
    assert_eq!(
        db.store
            .get_session(acme.id, one.id)
            .await
            .unwrap()
            .last_seq,
        3
    );
    assert_eq!(
        db.store
            .get_session(acme.id, two.id)
            .await
            .unwrap()
            .last_seq,
        4
    );
    let a_done = db.store.invocation(acme.id, a.id).await.unwrap();
    assert_eq!(a_done.status, InvocationStatus::Ok);
    assert_eq!(a_done.finished_seq, Some(3));
    let b_running = db.store.invocation(acme.id, b.id).await.unwrap();
    assert_eq!(b_running.status, InvocationStatus::Running);
}

async fn a_call_id_recorded_in_an_earlier_batch_is_a_duplicate(db: &TestStore) {
    let acme = tenant(db, "acme").await;
    let s = session(db, &acme).await;
    let first = call(s.id, "c1");
    db.store
        .commit(&[record(first.clone(), "done")])
        .await
        .unwrap();

    let again = db
        .store
        .commit(&[start(call(s.id, "c1")), record(call(s.id, "c1"), "x")])
        .await
        .unwrap();
    assert_eq!(
        again,
        vec![
            Err(WriteError::DuplicateCall(first.id)),
            Err(WriteError::DuplicateCall(first.id))
        ]
    );
    // The same call id in another session is another call.
    let other = session(db, &acme).await;
    let fine = db
        .store
        .commit(&[record(call(other.id, "c1"), "x")])
        .await
        .unwrap();
    assert_eq!(fine, vec![assigned(2, Some(3))]);

    assert_eq!(seqs(db, &s).await, one_to(3));
    assert_eq!(
        db.store.get_session(acme.id, s.id).await.unwrap().last_seq,
        3
    );
}

async fn a_duplicate_call_id_in_one_batch_does_not_abort_the_others(db: &TestStore) {
    let acme = tenant(db, "acme").await;
    let s = session(db, &acme).await;
    let old = call(s.id, "old");
    db.store
        .commit(&[record(old.clone(), "old")])
        .await
        .unwrap();

    let first = call(s.id, "c1");
    let second = call(s.id, "c1");
    let reused_id = NewInvocation {
        call_id: "c3".into(),
        ..first.clone()
    };
    let results = db
        .store
        .commit(&[
            start(first.clone()),
            start(second),
            record(call(s.id, "old"), "again"),
            record(call(s.id, "c2"), "two"),
            start(reused_id),
        ])
        .await
        .unwrap();
    assert_eq!(
        results,
        vec![
            assigned(4, None),
            Err(WriteError::DuplicateCall(first.id)),
            Err(WriteError::DuplicateCall(old.id)),
            assigned(5, Some(6)),
            Err(WriteError::DuplicateCall(first.id)),
        ]
    );
    assert_eq!(seqs(db, &s).await, one_to(6));

    let (_, found) = db
        .store
        .lookup_calls(acme.id, s.id, &["c1".into(), "c2".into(), "c3".into()])
        .await
        .unwrap();
    let found: Vec<_> = found
        .iter()
        .map(|i| (i.call_id.as_str(), i.id, i.status))
        .collect();
    assert_eq!(found.len(), 2);
    assert_eq!(found[0], ("c1", first.id, InvocationStatus::Running));
    assert_eq!(found[1].0, "c2");
}

async fn a_closed_or_missing_session_refuses_new_calls_but_running_ones_can_finish(db: &TestStore) {
    let acme = tenant(db, "acme").await;
    let s = session(db, &acme).await;
    let running = call(s.id, "c0");
    db.store.commit(&[start(running.clone())]).await.unwrap();
    db.store
        .close_session(acme.id, s.id, json!({}))
        .await
        .unwrap(); // seq 3

    let results = db
        .store
        .commit(&[
            start(call(s.id, "c1")),
            record(call(s.id, "c2"), "x"),
            start(call(new_id(), "c3")),
            finish(&running, ok("finished after close")),
        ])
        .await
        .unwrap();
    assert_eq!(
        results,
        vec![
            Err(WriteError::SessionNotActive),
            Err(WriteError::SessionNotActive),
            Err(WriteError::SessionNotActive),
            assigned(2, Some(4)),
        ]
    );
    assert_eq!(seqs(db, &s).await, one_to(4));
    let (_, found) = db
        .store
        .lookup_calls(acme.id, s.id, &["c1".into(), "c2".into()])
        .await
        .unwrap();
    assert!(found.is_empty());
}

async fn finishing_an_invocation_that_is_not_running_is_refused(db: &TestStore) {
    let acme = tenant(db, "acme").await;
    let s = session(db, &acme).await;
    let other = session(db, &acme).await;
    let done = call(s.id, "done");
    let running = call(s.id, "running");
    db.store
        .commit(&[record(done.clone(), "x"), start(running.clone())])
        .await
        .unwrap(); // seqs 2..=4

    let wrong_session = Write::Finish {
        session_id: other.id,
        invocation_id: running.id,
        outcome: ok("x"),
        side_effects: vec![],
        blobs: vec![],
    };
    let unknown = Write::Finish {
        session_id: s.id,
        invocation_id: new_id(),
        outcome: ok("x"),
        side_effects: vec![],
        blobs: vec![],
    };
    let results = db
        .store
        .commit(&[
            finish(&done, ok("again")),
            unknown,
            wrong_session,
            finish(&running, ok("first")),
            finish(&running, ok("second")),
        ])
        .await
        .unwrap();
    assert_eq!(
        results,
        vec![
            Err(WriteError::NotRunning),
            Err(WriteError::NotRunning),
            Err(WriteError::NotRunning),
            assigned(4, Some(5)),
            Err(WriteError::NotRunning),
        ]
    );
    let inv = db.store.invocation(acme.id, running.id).await.unwrap();
    assert_eq!(inv.content.as_deref(), Some("first"));
    assert_eq!(seqs(db, &s).await, one_to(5));
    assert_eq!(seqs(db, &other).await, vec![1]);
}

async fn concurrent_committers_get_gapless_ordered_seqs(db: &TestStore) {
    const TASKS: usize = 20;
    const ROUNDS: usize = 5;
    let acme = tenant(db, "acme").await;
    let a = session(db, &acme).await;
    let b = session(db, &acme).await;

    let mut tasks = tokio::task::JoinSet::new();
    for task in 0..TASKS {
        let store = db.store.clone();
        // Half the tasks name the sessions in the other order: the store must lock them in one
        // order regardless, or two batches would deadlock.
        let order = if task % 2 == 0 {
            [a.id, b.id]
        } else {
            [b.id, a.id]
        };
        tasks.spawn(async move {
            let mut mine = Vec::new();
            for round in 0..ROUNDS {
                let batch: Vec<Write> = order
                    .iter()
                    .map(|&sid| record(call(sid, &format!("t{task}-r{round}")), "ok"))
                    .collect();
                let results = store.commit(&batch).await.unwrap();
                for (sid, result) in order.iter().zip(results) {
                    mine.push((*sid, result.unwrap()));
                }
            }
            mine
        });
    }
    let mut assigned_seqs: BTreeMap<Uuid, Vec<i64>> = BTreeMap::new();
    while let Some(done) = tasks.join_next().await {
        let mine = done.unwrap();
        for sid in [a.id, b.id] {
            let ordered: Vec<i64> = mine
                .iter()
                .filter(|(s, _)| *s == sid)
                .map(|(_, x)| x.started_seq)
                .collect();
            assert!(
                ordered.windows(2).all(|w| w[0] < w[1]),
                "one task's commits got seqs out of order: {ordered:?}"
            );
        }
        for (sid, x) in mine {
            assert_eq!(x.finished_seq, Some(x.started_seq + 1));
            let seqs = assigned_seqs.entry(sid).or_default();
            seqs.extend([x.started_seq, x.started_seq + 1]);
        }
    }

    let expected = 1 + (TASKS * ROUNDS * 2) as i64;
    for s in [&a, &b] {
        assert_eq!(seqs(db, s).await, one_to(expected));
        let given: BTreeSet<i64> = assigned_seqs[&s.id].iter().copied().collect();
        assert_eq!(given, (2..=expected).collect::<BTreeSet<_>>());
        let stored = db.store.get_session(acme.id, s.id).await.unwrap();
        assert_eq!(stored.last_seq, expected);
    }
}

async fn a_blob_is_stored_once_and_readable(db: &TestStore) {
    let acme = tenant(db, "acme").await;
    let s = session(db, &acme).await;
    let blob = Blob::new(b"the same bytes".to_vec());
    let with_blob = |call_id: &str, blobs: Vec<Blob>| Write::Record {
        invocation: call(s.id, call_id),
        outcome: ok("x"),
        side_effects: vec![],
        blobs,
    };
    db.store
        .commit(&[
            with_blob("c1", vec![blob.clone(), blob.clone()]),
            with_blob("c2", vec![blob.clone()]),
        ])
        .await
        .unwrap();
    db.store
        .commit(&[with_blob("c3", vec![blob.clone()])])
        .await
        .unwrap();

    assert_eq!(
        db.store.blob(&blob.sha256).await.unwrap(),
        Some(blob.bytes.to_vec())
    );
    let rows = db
        .scalar(&format!(
            "SELECT COUNT(*) FROM blobs WHERE sha256 = '{}'",
            blob.sha256
        ))
        .await
        .unwrap();
    assert_eq!(rows, 1);
    assert_eq!(
        db.store.blob(&sha256_hex(b"never stored")).await.unwrap(),
        None
    );

    // Blobs of a write that is refused are not stored.
    let orphan = Blob::new(b"orphan".to_vec());
    let refused = db
        .store
        .commit(&[with_blob("c1", vec![orphan.clone()])])
        .await
        .unwrap();
    assert!(matches!(refused[0], Err(WriteError::DuplicateCall(_))));
    assert_eq!(db.store.blob(&orphan.sha256).await.unwrap(), None);
}

/// Postgres writes a batch from cached state with a statement made for what the batch holds
/// (new invocations, finishes of earlier ones, blobs); every combination the service makes is
/// written whole, in one gapless log.
async fn every_shape_of_a_group_commit_writes_what_it_carries(db: &TestStore) {
    let acme = tenant(db, "acme").await;
    let s = session(db, &acme).await;
    let running: Vec<NewInvocation> = (0..4).map(|i| call(s.id, &format!("r{i}"))).collect();
    let blob = |text: &str| Blob::new(text.as_bytes().to_vec());
    let finish_with = |inv: &NewInvocation, blobs: Vec<Blob>| Write::Finish {
        session_id: s.id,
        invocation_id: inv.id,
        outcome: ok("done"),
        side_effects: vec![],
        blobs,
    };
    let record_with = |call_id: &str, blobs: Vec<Blob>| Write::Record {
        invocation: call(s.id, call_id),
        outcome: ok("done"),
        side_effects: vec![],
        blobs,
    };
    let started_later = call(s.id, "n1");
    let batches: Vec<(&str, Vec<Write>)> = vec![
        (
            "new invocations",
            running.iter().cloned().map(start).collect(),
        ),
        (
            "new invocations and blobs",
            vec![record_with("b1", vec![blob("one")])],
        ),
        ("finishes", vec![finish_with(&running[0], vec![])]),
        (
            "finishes and blobs",
            vec![finish_with(&running[1], vec![blob("two")])],
        ),
        (
            "new invocations and finishes",
            vec![
                start(started_later.clone()),
                finish_with(&running[2], vec![]),
            ],
        ),
        (
            "everything",
            vec![
                record_with("b2", vec![blob("three")]),
                finish_with(&running[3], vec![blob("four")]),
            ],
        ),
    ];
    for (shape, batch) in batches {
        let locked_before = db.locked_commits();
        let results = db.store.commit(&batch).await.unwrap();
        assert_eq!(results.len(), batch.len(), "{shape}");
        assert!(results.iter().all(Result::is_ok), "{shape}: {results:?}");
        // Written by its own statement, not by the locked path after a refused check.
        assert_eq!(
            db.locked_commits(),
            locked_before,
            "{shape} took the locked path"
        );
    }
    for inv in &running {
        let stored = db.store.invocation(acme.id, inv.id).await.unwrap();
        assert_eq!(stored.status, InvocationStatus::Ok, "{}", inv.call_id);
    }
    let n1 = db
        .store
        .invocation(acme.id, started_later.id)
        .await
        .unwrap();
    assert_eq!(n1.status, InvocationStatus::Running);
    for text in ["one", "two", "three", "four"] {
        let b = blob(text);
        assert_eq!(
            db.store.blob(&b.sha256).await.unwrap(),
            Some(b.bytes.to_vec())
        );
    }
    let last = db.store.get_session(acme.id, s.id).await.unwrap().last_seq;
    assert_eq!(seqs(db, &s).await, one_to(last));
}

async fn an_invocation_lists_its_side_effects_in_log_order(db: &TestStore) {
    let acme = tenant(db, "acme").await;
    let s = session(db, &acme).await;
    let c = call(s.id, "c1");
    db.store
        .commit(&[
            record(call(s.id, "before"), "x"),
            Write::Record {
                invocation: c.clone(),
                outcome: ok("x"),
                side_effects: vec![
                    file_event(EventKind::FileCreated, "a"),
                    file_event(EventKind::FileModified, "b"),
                    file_event(EventKind::FileDeleted, "c"),
                ],
                blobs: vec![],
            },
        ])
        .await
        .unwrap();

    let inv = db.store.invocation(acme.id, c.id).await.unwrap();
    let effects: Vec<_> = inv
        .side_effects
        .iter()
        .map(|e| (e.seq, e.kind, e.invocation_id, e.data["path"].clone()))
        .collect();
    assert_eq!(
        effects,
        vec![
            (5, EventKind::FileCreated, Some(c.id), json!("a")),
            (6, EventKind::FileModified, Some(c.id), json!("b")),
            (7, EventKind::FileDeleted, Some(c.id), json!("c")),
        ]
    );
    assert_eq!((inv.started_seq, inv.finished_seq), (4, Some(8)));
}

async fn the_output_is_the_blob_when_truncated_and_the_content_otherwise(db: &TestStore) {
    let acme = tenant(db, "acme").await;
    let s = session(db, &acme).await;
    let plain = call(s.id, "plain");
    let cut = call(s.id, "cut");
    let binary = call(s.id, "binary");
    let running = call(s.id, "running");

    let full = "line\n".repeat(1000);
    let full_blob = Blob::new(full.clone().into_bytes());
    let mut truncated = ok("line\n[… 4990 characters more after this point …]");
    truncated.truncated = Some(Truncation {
        total_chars: 5000,
        omitted_chars: 4990,
        mode: TruncationMode::Head,
    });
    truncated.output_chars = 5000;
    truncated.output_sha256 = Some(full_blob.sha256.clone());
    let bytes_blob = Blob::new(vec![b'o', b'k', 0xff]);
    let mut lossy = ok("ok?");
    lossy.output_sha256 = Some(bytes_blob.sha256.clone());

    db.store
        .commit(&[
            record(plain.clone(), "short output"),
            Write::Record {
                invocation: cut.clone(),
                outcome: truncated.clone(),
                side_effects: vec![],
                blobs: vec![full_blob],
            },
            Write::Record {
                invocation: binary.clone(),
                outcome: lossy,
                side_effects: vec![],
                blobs: vec![bytes_blob],
            },
            start(running.clone()),
        ])
        .await
        .unwrap();

    let st = &db.store;
    assert_eq!(
        st.invocation_output(acme.id, plain.id).await.unwrap(),
        "short output"
    );
    assert_eq!(st.invocation_output(acme.id, cut.id).await.unwrap(), full);
    assert_eq!(
        st.invocation_output(acme.id, binary.id).await.unwrap(),
        "ok\u{fffd}"
    );
    assert_eq!(st.invocation_output(acme.id, running.id).await.unwrap(), "");

    let inv = st.invocation(acme.id, cut.id).await.unwrap();
    assert_eq!(inv.truncated, truncated.truncated);
    assert_eq!(inv.output_chars, Some(5000));
    assert_eq!(inv.content.as_deref(), Some(truncated.content.as_str()));
}

async fn interrupting_a_node_finishes_only_its_own_running_calls(db: &TestStore) {
    let acme = tenant(db, "acme").await;
    let one = session(db, &acme).await;
    let two = session(db, &acme).await;
    let mine = call_on(one.id, "mine", NODE);
    let theirs = call_on(one.id, "theirs", "node-b");
    let finished = call_on(one.id, "finished", NODE);
    let elsewhere = call_on(two.id, "mine-too", NODE);
    db.store
        .commit(&[
            start(mine.clone()),
            start(theirs.clone()),
            record(finished.clone(), "done"),
            start(elsewhere.clone()),
        ])
        .await
        .unwrap(); // one: 2 mine, 3 theirs, 4-5 finished; two: 2 elsewhere

    let message = "The service restarted while this call ran.";
    assert_eq!(db.store.interrupt_running(NODE, message).await.unwrap(), 2);

    let inv = db.store.invocation(acme.id, mine.id).await.unwrap();
    assert_eq!(inv.status, InvocationStatus::Interrupted);
    assert!(inv.is_error);
    assert_eq!(inv.content.as_deref(), Some(message));
    assert!(inv.finished_at.is_some());
    assert_eq!(inv.finished_seq, Some(6));
    let last = db.store.events(acme.id, one.id, 5, 10).await.unwrap();
    assert_eq!(last.len(), 1);
    assert_eq!(last[0].kind, EventKind::InvocationFinished);
    assert_eq!(last[0].invocation_id, Some(mine.id));
    assert_eq!(last[0].data["status"], "interrupted");
    assert_eq!(last[0].data["is_error"], true);
    assert_eq!(last[0].data["call_id"], "mine");

    let other = db.store.invocation(acme.id, elsewhere.id).await.unwrap();
    assert_eq!(other.status, InvocationStatus::Interrupted);
    assert_eq!(other.finished_seq, Some(3));
    assert_eq!(seqs(db, &two).await, one_to(3));

    let untouched = db.store.invocation(acme.id, theirs.id).await.unwrap();
    assert_eq!(untouched.status, InvocationStatus::Running);
    let kept = db.store.invocation(acme.id, finished.id).await.unwrap();
    assert_eq!(kept.status, InvocationStatus::Ok);
    assert_eq!(kept.content.as_deref(), Some("done"));

    assert_eq!(db.store.interrupt_running(NODE, message).await.unwrap(), 0);
    assert_eq!(seqs(db, &one).await, one_to(6));
}

async fn events_are_paged_by_after_and_limit(db: &TestStore) {
    let acme = tenant(db, "acme").await;
    let s = session(db, &acme).await;
    db.store
        .commit(&[
            record(call(s.id, "c1"), "1"),
            record(call(s.id, "c2"), "2"),
            record(call(s.id, "c3"), "3"),
        ])
        .await
        .unwrap(); // seqs 1..=7

    let page = |after: i64, limit: u32| async move {
        db.store
            .events(acme.id, s.id, after, limit)
            .await
            .unwrap()
            .iter()
            .map(|e| e.seq)
            .collect::<Vec<_>>()
    };
    assert_eq!(page(0, 3).await, vec![1, 2, 3]);
    assert_eq!(page(3, 3).await, vec![4, 5, 6]);
    assert_eq!(page(6, 3).await, vec![7]);
    assert_eq!(page(7, 3).await, Vec::<i64>::new());
    assert_eq!(page(2, 0).await, Vec::<i64>::new());
    assert_eq!(page(0, 100).await, one_to(7));
}

/// Pages by bytes (issue 23, §4): the walk stops before the event that would take the page
/// over its bound (the first one always comes), an event over the inline bound comes by its
/// size only, and its beginning or its whole text is read alone. Sessions the same.
async fn pages_are_bounded_in_bytes_and_show_a_large_row_by_its_size(db: &TestStore) {
    let acme = tenant(db, "acme").await;
    let s = session(db, &acme).await; // seq 1: session.created
    let sizes = [1000, 1000, 5000, 1000, 1000]; // seqs 2..=6
    db.store
        .append_events(
            acme.id,
            s.id,
            sizes
                .iter()
                .map(|n| NewEvent {
                    kind: EventKind::PlanUpdated,
                    data: json!({"x": "a".repeat(*n)}),
                })
                .collect(),
            vec![],
        )
        .await
        .unwrap();
    let bounds = ByteBounds {
        max_bytes: 3000,
        inline_bytes: 2500,
        excerpt_bytes: 100,
        overhead_bytes: 10,
    };
    let page = |after: i64, limit: u32, bounds: ByteBounds| async move {
        db.store
            .event_texts(acme.id, s.id, after, limit, bounds)
            .await
            .unwrap()
    };
    let seqs = |p: &toolexec_store::pages::EventTexts| {
        p.events
            .iter()
            .map(|e| (e.seq, e.data.is_some()))
            .collect::<Vec<_>>()
    };
    // 1, 2 and 3 whole (~2 KB); 4 by its size (an excerpt's 100); 5 would go over.
    let first = page(0, 100, bounds).await;
    assert_eq!(seqs(&first), [(1, true), (2, true), (3, true), (4, false)]);
    assert!(first.more);
    let big = &first.events[3];
    assert!(big.data_bytes > 5000 && big.data_bytes < 5100, "{big:?}");
    assert_eq!(big.kind, EventKind::PlanUpdated);
    let whole = &first.events[1];
    assert!(whole.is_whole());
    assert_eq!(
        serde_json::from_str::<Value>(whole.data.as_deref().unwrap()).unwrap(),
        json!({"x": "a".repeat(1000)})
    );
    let rest = page(4, 100, bounds).await;
    assert_eq!(seqs(&rest), [(5, true), (6, true)]);
    assert!(!rest.more);
    assert_eq!(page(6, 100, bounds).await.events, vec![]);
    // The count bound: no more known beyond it.
    let two = page(0, 2, bounds).await;
    assert_eq!(seqs(&two), [(1, true), (2, true)]);
    assert!(!two.more);
    // A bound smaller than any event: one event a page, whole if it may be.
    let tiny = ByteBounds {
        max_bytes: 1,
        ..bounds
    };
    assert_eq!(seqs(&page(1, 100, tiny).await), [(2, true)]);
    assert_eq!(seqs(&page(3, 100, tiny).await), [(4, false)]);
    assert_eq!(page(0, 100, ByteBounds::UNBOUNDED).await.events.len(), 6);
    // The large one alone: its beginning, or whole.
    let cut = db
        .store
        .event_text(acme.id, s.id, 4, Some(50))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(cut.data.as_ref().unwrap().chars().count(), 50);
    assert!(!cut.is_whole());
    assert_eq!(cut.data_bytes, big.data_bytes);
    let full = db
        .store
        .event_text(acme.id, s.id, 4, None)
        .await
        .unwrap()
        .unwrap();
    assert!(full.is_whole());
    assert_eq!(
        serde_json::from_str::<Value>(full.data.as_deref().unwrap()).unwrap(),
        json!({"x": "a".repeat(5000)})
    );
    assert_eq!(
        db.store.event_text(acme.id, s.id, 99, None).await.unwrap(),
        None
    );

    // Sessions: one with large metadata comes by its id and size, and its excerpt is valid.
    let mut large = new_session(&acme);
    large.metadata = json!({"notes": "n".repeat(5000), "owner": "eve"});
    db.store
        .create_session(&large, vec![], vec![], u64::MAX)
        .await
        .unwrap();
    let newer = session(db, &acme).await;
    let listed = db
        .store
        .list_sessions(acme.id, None, 10, bounds)
        .await
        .unwrap();
    assert_eq!(listed.sessions.len(), 3, "{listed:?}");
    assert!(matches!(&listed.sessions[0], Listed::Whole(w) if w.id == newer.id));
    match &listed.sessions[1] {
        Listed::Over { id, bytes } => {
            assert_eq!(*id, large.id);
            assert!(*bytes > 5000, "{bytes}");
        }
        other => panic!("{other:?}"),
    }
    assert!(matches!(&listed.sessions[2], Listed::Whole(w) if w.id == s.id));
    assert_eq!(listed.next_before, None);
    let excerpt = db
        .store
        .session_excerpt(acme.id, large.id, 40)
        .await
        .unwrap();
    let notes = excerpt.metadata["notes"].as_str().unwrap();
    assert!(notes.starts_with("nnn") && notes.ends_with('…'), "{notes}");
    assert!(notes.len() < 50, "{notes}");
    assert_eq!(excerpt.policy, large.policy);
}

async fn lookup_calls_returns_the_session_and_the_calls_it_already_has(db: &TestStore) {
    let acme = tenant(db, "acme").await;
    let s = session(db, &acme).await;
    let done = call(s.id, "done");
    let running = call(s.id, "running");
    db.store
        .commit(&[
            record(done.clone(), "x"),
            start(running.clone()),
            record(call(s.id, "unasked"), "y"),
        ])
        .await
        .unwrap();

    let ids: Vec<String> = ["running", "done", "new"].map(String::from).to_vec();
    let (session, found) = db.store.lookup_calls(acme.id, s.id, &ids).await.unwrap();
    assert_eq!(session.id, s.id);
    assert_eq!(session.last_seq, 6);
    let found: Vec<_> = found
        .iter()
        .map(|i| (i.id, i.call_id.as_str(), i.status))
        .collect();
    assert_eq!(
        found,
        vec![
            (done.id, "done", InvocationStatus::Ok),
            (running.id, "running", InvocationStatus::Running),
        ]
    );

    let (session, none) = db.store.lookup_calls(acme.id, s.id, &[]).await.unwrap();
    assert_eq!(session.id, s.id);
    assert!(none.is_empty());
}

async fn the_call_ids_of_a_session_are_read_page_by_page(db: &TestStore) {
    let acme = tenant(db, "acme").await;
    let s = session(db, &acme).await;
    let other = session(db, &acme).await;
    let empty = session(db, &acme).await;
    let mut ids: Vec<String> = (0..25).map(|i| format!("toolu_{i:03}")).collect();
    ids.extend(["A", "b", "call 1", "é"].map(String::from));
    let writes: Vec<Write> = ids.iter().map(|id| record(call(s.id, id), "x")).collect();
    db.store.commit(&writes).await.unwrap();
    db.store
        .commit(&[record(call(other.id, "elsewhere"), "y")])
        .await
        .unwrap();

    let mut read = Vec::new();
    let mut after = String::new();
    let mut pages = 0;
    loop {
        let page = db.store.call_ids(s.id, &after, 10).await.unwrap();
        pages += 1;
        assert!(page.len() <= 10, "{page:?}");
        read.extend(page.iter().cloned());
        match page.last() {
            Some(last) if page.len() == 10 => after = last.clone(),
            _ => break,
        }
    }
    assert_eq!(pages, 3);
    assert_eq!(read.len(), ids.len(), "each id once: {read:?}");
    assert_eq!(
        read.into_iter().collect::<BTreeSet<_>>(),
        ids.into_iter().collect::<BTreeSet<_>>()
    );
    assert!(
        db.store
            .call_ids(empty.id, "", 10)
            .await
            .unwrap()
            .is_empty()
    );
}

async fn the_last_process_number_is_the_highest_process_id_started(db: &TestStore) {
    let acme = tenant(db, "acme").await;
    let s = session(db, &acme).await;
    let t = session(db, &acme).await;
    assert_eq!(db.store.last_process_number(s.id).await.unwrap(), 0);
    let event = |kind, id: &str| NewEvent {
        kind,
        data: json!({"process_id": id}),
    };
    db.store
        .commit(&[Write::Record {
            invocation: call(s.id, "c1"),
            outcome: ok("started"),
            side_effects: vec![
                event(EventKind::ProcessStarted, "p2"),
                // Compared as numbers: "p10" sorts before "p2" as text.
                event(EventKind::ProcessStarted, "p10"),
                // Not starts, or not ids this service gives: not counted.
                event(EventKind::ProcessExited, "p99"),
                event(EventKind::ProcessStarted, "q500"),
                event(EventKind::ProcessStarted, "p7x"),
                event(EventKind::ProcessStarted, "p123456789012345678901"),
            ],
            blobs: vec![],
        }])
        .await
        .unwrap();
    assert_eq!(db.store.last_process_number(s.id).await.unwrap(), 10);
    assert_eq!(db.store.last_process_number(t.id).await.unwrap(), 0);
}

async fn the_event_log_refuses_updates_and_deletes(db: &TestStore) {
    let acme = tenant(db, "acme").await;
    let s = session(db, &acme).await;
    db.store
        .commit(&[record(call(s.id, "c1"), "x")])
        .await
        .unwrap();
    let before: Vec<Value> = db
        .store
        .events(acme.id, s.id, 0, 10)
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.data)
        .collect();

    let update = db.execute("UPDATE events SET kind = 'file.deleted'").await;
    assert!(
        update.is_err(),
        "an UPDATE of the log went through: {update:?}"
    );
    let delete = db.execute("DELETE FROM events").await;
    assert!(
        delete.is_err(),
        "a DELETE from the log went through: {delete:?}"
    );

    let after: Vec<Value> = db
        .store
        .events(acme.id, s.id, 0, 10)
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.data)
        .collect();
    assert_eq!(before, after);
    assert_eq!(after.len(), 3);
}

/// Two Postgres stores on one database: replicas whose cached session state goes stale because
/// the other wrote. Whatever a cache assumed, the database's answer must win.
mod replicas {
    use std::sync::Arc;

    use toolexec_store::Store;

    use super::*;

    /// Two stores on one new database, and the first one's own handle (for its counters).
    async fn two_replicas() -> (
        TestPgDatabase,
        Arc<dyn Store>,
        Arc<dyn Store>,
        Arc<toolexec_store::postgres::PgStore>,
    ) {
        let db = TestPgDatabase::create().await;
        let pg = Arc::new(db.store().await);
        let a: Arc<dyn Store> = pg.clone();
        let b: Arc<dyn Store> = Arc::new(db.store().await);
        (db, a, b, pg)
    }

    async fn session_on(store: &Arc<dyn Store>) -> Session {
        let t = store.ensure_tenant("t").await.unwrap();
        store
            .create_session(
                &new_session(&t),
                vec![NewEvent {
                    kind: EventKind::SessionCreated,
                    data: json!({}),
                }],
                vec![],
                u64::MAX,
            )
            .await
            .unwrap()
    }

    async fn log_seqs(store: &Arc<dyn Store>, s: &Session) -> Vec<i64> {
        store
            .events(s.tenant_id, s.id, 0, 10_000)
            .await
            .unwrap()
            .iter()
            .map(|e| e.seq)
            .collect()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn replicas_writing_one_session_keep_its_seqs_gapless_and_see_each_others_calls() {
        let (_db, a, b, a_pg) = two_replicas().await;
        let s = session_on(&a).await;
        let r = a.commit(&[record(call(s.id, "c1"), "x")]).await.unwrap();
        assert_eq!(r, vec![assigned(2, Some(3))]);
        assert_eq!(a_pg.locked_commits(), 0, "A's own cache was right");
        let r = b.commit(&[record(call(s.id, "c2"), "x")]).await.unwrap();
        assert_eq!(r, vec![assigned(4, Some(5))]);
        // A's cache still says last_seq 3: its one-statement write must notice and step aside.
        let r = a.commit(&[record(call(s.id, "c3"), "x")]).await.unwrap();
        assert_eq!(r, vec![assigned(6, Some(7))]);
        assert_eq!(
            a_pg.locked_commits(),
            1,
            "the stale write took the locked path"
        );
        // B never saw c1 being recorded, but the database did.
        let r = b.commit(&[record(call(s.id, "c1"), "x")]).await.unwrap();
        assert!(matches!(r[0], Err(WriteError::DuplicateCall(_))), "{r:?}");

        let mut tasks = Vec::new();
        for i in 0..24 {
            let store = if i % 2 == 0 { a.clone() } else { b.clone() };
            let sid = s.id;
            tasks.push(tokio::spawn(async move {
                store
                    .commit(&[record(call(sid, &format!("p{i}")), "x")])
                    .await
                    .unwrap()
            }));
        }
        for t in tasks {
            assert!(t.await.unwrap()[0].is_ok());
        }
        assert_eq!(log_seqs(&a, &s).await, one_to(7 + 48));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn a_replicas_stale_cache_cannot_finish_a_call_twice_or_write_to_a_closed_session() {
        let (_db, a, b, _) = two_replicas().await;
        let s = session_on(&a).await;
        let inv = call(s.id, "c1");
        a.commit(&[start(inv.clone())]).await.unwrap();
        // B finishes it (locked path: B has never seen the session)…
        let r = b.commit(&[finish(&inv, ok("b"))]).await.unwrap();
        assert!(r[0].is_ok(), "{r:?}");
        // …so A, which still believes it running, is refused.
        let r = a.commit(&[finish(&inv, ok("a"))]).await.unwrap();
        assert_eq!(r, vec![Err(WriteError::NotRunning)]);
        let shown = a.invocation(s.tenant_id, inv.id).await.unwrap();
        assert_eq!(shown.content.as_deref(), Some("b"));

        b.close_session(s.tenant_id, s.id, json!({})).await.unwrap();
        let r = a.commit(&[record(call(s.id, "c2"), "x")]).await.unwrap();
        assert_eq!(r, vec![Err(WriteError::SessionNotActive)]);
        let seqs = log_seqs(&a, &s).await;
        assert_eq!(seqs, one_to(seqs.len() as i64));
    }
}

/// 24 MiB of blobs against the default 16 MiB bound: in statements of at most the bound (two
/// 6 MiB blobs each), each blob once, from `put_blobs` and from a commit that carries them.
async fn blobs_beyond_the_statement_bound_are_stored_once_in_bounded_statements(db: &TestStore) {
    const MIB: usize = 1024 * 1024;
    let bound = db.store.blob_statement_bytes();
    assert_eq!(bound, 16 * MIB);
    let blobs: Vec<Blob> = (0..4u8).map(|i| Blob::new(vec![i; 6 * MIB])).collect();
    let sizes = db.store.put_blobs(blobs.clone()).await.unwrap();
    assert_eq!(sizes, vec![12 * MIB, 12 * MIB]);
    for b in &blobs {
        assert_eq!(
            db.store.blob(&b.sha256).await.unwrap(),
            Some(b.bytes.to_vec())
        );
    }
    // Postgres asks which are stored and sends none of them again; SQLite's insert is local
    // (no bytes travel) and skips them on conflict.
    let again = db.store.put_blobs(blobs.clone()).await.unwrap();
    if db.store.backend() == "postgres" {
        assert_eq!(again, Vec::<usize>::new());
    }
    assert_eq!(db.scalar("SELECT COUNT(*) FROM blobs").await.unwrap(), 4);

    // A commit whose blobs exceed the bound: the blobs go first, the rows in one statement.
    let acme = tenant(db, "acme").await;
    let s = session(db, &acme).await;
    let more: Vec<Blob> = (10..13u8).map(|i| Blob::new(vec![i; 7 * MIB])).collect();
    let r = db
        .store
        .commit(&[Write::Record {
            invocation: call(s.id, "c1"),
            outcome: ok("x"),
            side_effects: vec![],
            blobs: vec![
                more[0].clone(),
                more[1].clone(),
                more[2].clone(),
                blobs[0].clone(),
            ],
        }])
        .await
        .unwrap();
    assert_eq!(r, vec![assigned(2, Some(3))]);
    for b in more.iter().chain(&blobs) {
        assert_eq!(
            db.store.blob(&b.sha256).await.unwrap(),
            Some(b.bytes.to_vec())
        );
    }
    assert_eq!(db.scalar("SELECT COUNT(*) FROM blobs").await.unwrap(), 7);
}

/// A rule of the database the store cannot know (installed behind its back) refuses one write
/// of a batch: the whole batch writes nothing, the error is `Refused` (not `Unavailable`, which
/// would be retried forever) with a reason in plain words, and the other write alone succeeds.
async fn a_batch_the_database_refuses_writes_nothing_and_says_why_in_plain_words(db: &TestStore) {
    let acme = tenant(db, "acme").await;
    let s = session(db, &acme).await;
    let rule = if db.store.backend() == "postgres" {
        "ALTER TABLE events ADD CONSTRAINT test_refuse CHECK (data->>'path' IS DISTINCT FROM 'forbidden') NOT VALID"
    } else {
        "CREATE TRIGGER test_refuse BEFORE INSERT ON events \
         WHEN json_extract(NEW.data, '$.path') = 'forbidden' \
         BEGIN SELECT RAISE(ABORT, 'test rule'); END"
    };
    db.execute(rule).await.unwrap();
    let fine = record(call(s.id, "fine"), "ok");
    let c = call(s.id, "bad");
    let bad = Write::Record {
        invocation: c,
        outcome: ok("x"),
        side_effects: vec![file_event(EventKind::FileCreated, "forbidden")],
        blobs: vec![],
    };
    assert_eq!(bad.unstorable(), None, "only the database knows this rule");
    match db.store.commit(&[fine.clone(), bad]).await {
        Err(StoreError::Refused { reason, cause }) => {
            assert_eq!(reason, "it breaks a rule of the database's schema");
            assert!(!cause.is_empty());
        }
        other => panic!("expected Refused, got {other:?}"),
    }
    assert_eq!(
        seqs(db, &s).await,
        one_to(1),
        "nothing of the batch written"
    );
    assert_eq!(
        db.store.commit(&[fine]).await.unwrap(),
        vec![assigned(2, Some(3))]
    );
}

async fn the_open_session_cap_counts_only_active_sessions(db: &TestStore) {
    let acme = tenant(db, "acme").await;
    let other = tenant(db, "other").await;
    let first = db
        .store
        .create_session(&new_session(&acme), vec![], vec![], 2)
        .await
        .unwrap();
    db.store
        .create_session(&new_session(&acme), vec![], vec![], 2)
        .await
        .unwrap();
    let third = new_session(&acme);
    assert!(matches!(
        db.store.create_session(&third, vec![], vec![], 2).await,
        Err(StoreError::TooManyOpenSessions(2))
    ));
    assert!(matches!(
        db.store.get_session(acme.id, third.id).await,
        Err(StoreError::NotFound)
    ));
    // Another tenant has a cap of its own.
    db.store
        .create_session(&new_session(&other), vec![], vec![], 2)
        .await
        .unwrap();
    // A closed session no longer counts.
    db.store
        .close_session(acme.id, first.id, json!({}))
        .await
        .unwrap();
    db.store
        .create_session(&third, vec![], vec![], 2)
        .await
        .unwrap();
}

async fn a_process_start_is_found_by_its_id_in_its_own_session_only(db: &TestStore) {
    let acme = tenant(db, "acme").await;
    let other = tenant(db, "other").await;
    let s = session(db, &acme).await;
    let t = session(db, &acme).await;
    let started = |id: &str| NewEvent {
        kind: EventKind::ProcessStarted,
        data: json!({"process_id": id, "command": format!("sleep {id}")}),
    };
    db.store
        .commit(&[Write::Record {
            invocation: call(s.id, "c1"),
            outcome: ok("started"),
            side_effects: vec![
                started("p1"),
                // Not a start: the same id in another kind of event is not found.
                NewEvent {
                    kind: EventKind::ProcessExited,
                    data: json!({"process_id": "p2"}),
                },
            ],
            blobs: vec![],
        }])
        .await
        .unwrap();
    let found = db.store.process_started(acme.id, s.id, "p1").await.unwrap();
    assert_eq!(found.unwrap()["command"], "sleep p1");
    assert_eq!(
        db.store.process_started(acme.id, s.id, "p2").await.unwrap(),
        None
    );
    assert_eq!(
        db.store.process_started(acme.id, t.id, "p1").await.unwrap(),
        None
    );
    assert_eq!(
        db.store
            .process_started(other.id, s.id, "p1")
            .await
            .unwrap(),
        None,
        "another tenant's session"
    );
}

// --- time travel ---

async fn events_of_given_kinds_are_read_up_to_a_seq(db: &TestStore) {
    let t = tenant(db, "acme").await;
    let s = session(db, &t).await;
    let (first, last) = db
        .store
        .append_events(
            t.id,
            s.id,
            (0..6)
                .map(|i| NewEvent {
                    kind: if i % 2 == 0 {
                        EventKind::FileCreated
                    } else {
                        EventKind::PlanUpdated
                    },
                    data: json!({"i": i}),
                })
                .collect(),
            vec![],
        )
        .await
        .unwrap();
    assert_eq!((first, last), (2, 7));
    let files = db
        .store
        .events_of_kinds(
            t.id,
            s.id,
            &[EventKind::FileCreated, EventKind::SessionCreated],
            0,
            6,
            100,
        )
        .await
        .unwrap();
    let seqs: Vec<i64> = files.iter().map(|e| e.seq).collect();
    assert_eq!(seqs, [1, 2, 4, 6]);
    let page = db
        .store
        .events_of_kinds(t.id, s.id, &[EventKind::FileCreated], 2, 7, 1)
        .await
        .unwrap();
    assert_eq!(page.iter().map(|e| e.seq).collect::<Vec<_>>(), [4]);
    let other = tenant(db, "other").await;
    assert!(matches!(
        db.store
            .events_of_kinds(other.id, s.id, &[EventKind::FileCreated], 0, 7, 10)
            .await,
        Err(StoreError::NotFound)
    ));
}

async fn the_todo_events_of_a_session_are_read_without_the_rest_of_its_log(db: &TestStore) {
    let t = tenant(db, "acme").await;
    let s = session(db, &t).await;
    let kinds = [
        EventKind::FileCreated,
        EventKind::TodoCreated,
        EventKind::PlanUpdated,
        EventKind::TodoUpdated,
        EventKind::TodoDeleted,
        EventKind::FileCreated,
    ];
    let (first, _) = db
        .store
        .append_events(
            t.id,
            s.id,
            kinds
                .iter()
                .map(|k| NewEvent {
                    kind: *k,
                    data: json!({}),
                })
                .collect(),
            vec![],
        )
        .await
        .unwrap();
    let todos = db.store.todo_events(t.id, s.id, 0, 100).await.unwrap();
    let seqs: Vec<i64> = todos.iter().map(|e| e.seq).collect();
    assert_eq!(seqs, [first + 1, first + 3, first + 4]);
    assert_eq!(
        todos.iter().map(|e| e.kind).collect::<Vec<_>>(),
        [
            EventKind::TodoCreated,
            EventKind::TodoUpdated,
            EventKind::TodoDeleted
        ]
    );
    let page = db
        .store
        .todo_events(t.id, s.id, first + 1, 1)
        .await
        .unwrap();
    assert_eq!(page.iter().map(|e| e.seq).collect::<Vec<_>>(), [first + 3]);
    let empty = session(db, &t).await;
    assert!(
        db.store
            .todo_events(t.id, empty.id, 0, 10)
            .await
            .unwrap()
            .is_empty()
    );
    let other = tenant(db, "other").await;
    assert!(matches!(
        db.store.todo_events(other.id, s.id, 0, 10).await,
        Err(StoreError::NotFound)
    ));
}

async fn events_of_no_invocation_are_appended_under_the_session_lock(db: &TestStore) {
    let t = tenant(db, "acme").await;
    let s = session(db, &t).await;
    // Appends racing calls of the same session: one gapless log.
    let mut tasks = Vec::new();
    for i in 0..8 {
        let store = db.store.clone();
        let (tid, sid) = (t.id, s.id);
        tasks.push(tokio::spawn(async move {
            if i % 2 == 0 {
                store
                    .append_events(
                        tid,
                        sid,
                        vec![
                            NewEvent {
                                kind: EventKind::WorkspaceRewound,
                                data: json!({"to_seq": 1})
                            };
                            3
                        ],
                        vec![Blob::new(format!("blob {i}").into_bytes())],
                    )
                    .await
                    .map(|_| ())
            } else {
                store
                    .commit(&[Write::Record {
                        invocation: call(sid, &format!("c{i}")),
                        outcome: ok("done"),
                        side_effects: vec![],
                        blobs: vec![],
                    }])
                    .await
                    .map(|_| ())
            }
        }));
    }
    for task in tasks {
        task.await.unwrap().unwrap();
    }
    let all = seqs(db, &s).await;
    assert_eq!(all, (1..=all.len() as i64).collect::<Vec<_>>());
    assert_eq!(all.len(), 1 + 4 * 3 + 4 * 2);
    let stored = db.store.get_session(t.id, s.id).await.unwrap();
    assert_eq!(stored.last_seq, all.len() as i64);
    assert_eq!(
        db.store
            .blob(&sha256_hex(b"blob 0"))
            .await
            .unwrap()
            .as_deref(),
        Some(&b"blob 0"[..])
    );
    // Closed: refused, nothing written.
    db.store.close_session(t.id, s.id, json!({})).await.unwrap();
    assert!(matches!(
        db.store
            .append_events(
                t.id,
                s.id,
                vec![NewEvent {
                    kind: EventKind::WorkspaceRewound,
                    data: json!({})
                }],
                vec![]
            )
            .await,
        Err(StoreError::Refused { .. })
    ));
    let other = tenant(db, "other").await;
    assert!(matches!(
        db.store.append_events(other.id, s.id, vec![], vec![]).await,
        Err(StoreError::NotFound)
    ));
}

async fn blobs_are_read_many_at_once_and_missing_ones_left_out(db: &TestStore) {
    let blobs: Vec<Blob> = (0..5)
        .map(|i| Blob::new(vec![i as u8; 100 * i + 1]))
        .collect();
    db.store.put_blobs(blobs.clone()).await.unwrap();
    let mut wanted: Vec<String> = blobs.iter().map(|b| b.sha256.clone()).collect();
    wanted.push(sha256_hex(b"never stored"));
    let mut got = db.store.blobs(&wanted).await.unwrap();
    got.sort_by(|a, b| a.sha256.cmp(&b.sha256));
    let mut want = blobs.clone();
    want.sort_by(|a, b| a.sha256.cmp(&b.sha256));
    assert_eq!(got, want);
    assert!(db.store.blobs(&[]).await.unwrap().is_empty());
}

async fn a_session_remembers_where_it_came_from(db: &TestStore) {
    let t = tenant(db, "acme").await;
    let source = session(db, &t).await;
    let mut fork = new_session(&t);
    fork.origin = Some(toolexec_core::Origin {
        kind: toolexec_core::OriginKind::Fork,
        session_id: source.id,
        seq: 1,
    });
    let stored = db
        .store
        .create_session(
            &fork,
            vec![NewEvent {
                kind: EventKind::SessionCreated,
                data: json!({}),
            }],
            vec![],
            u64::MAX,
        )
        .await
        .unwrap();
    assert_eq!(stored.origin, fork.origin);
    assert_eq!(
        db.store.get_session(t.id, fork.id).await.unwrap().origin,
        fork.origin
    );
    assert_eq!(
        db.store.get_session(t.id, source.id).await.unwrap().origin,
        None
    );
}

async fn retention_deletes_closed_sessions_only_and_never_an_origin_that_stays(db: &TestStore) {
    let t = tenant(db, "acme").await;
    let origin = session(db, &t).await;
    db.store
        .commit(&[record(call(origin.id, "c1"), "x")])
        .await
        .unwrap();
    let mut fork = new_session(&t);
    fork.origin = Some(toolexec_core::Origin {
        kind: toolexec_core::OriginKind::Fork,
        session_id: origin.id,
        seq: 1,
    });
    let created = vec![NewEvent {
        kind: EventKind::SessionCreated,
        data: json!({}),
    }];
    db.store
        .create_session(&fork, created, vec![], u64::MAX)
        .await
        .unwrap();
    let active = session(db, &t).await;
    db.store
        .close_session(t.id, origin.id, json!({}))
        .await
        .unwrap();

    // The origin of a session that stays: refused, nothing deleted.
    let refused = db.store.delete_sessions(&[origin.id]).await;
    assert!(
        matches!(refused, Err(StoreError::Refused { .. })),
        "{refused:?}"
    );
    assert_eq!(
        db.store.events(t.id, origin.id, 0, 10).await.unwrap().len(),
        4
    );
    // An active session is not deleted.
    let none = db.store.delete_sessions(&[active.id]).await.unwrap();
    assert_eq!(none.sessions, 0);
    assert!(db.store.get_session(t.id, active.id).await.is_ok());
    // Once the fork is closed too, the chain goes together, with every row of it.
    db.store
        .close_session(t.id, fork.id, json!({}))
        .await
        .unwrap();
    let gone = db
        .store
        .delete_sessions(&[origin.id, fork.id])
        .await
        .unwrap();
    assert_eq!(gone.sessions, 2);
    assert_eq!(gone.invocations, 1);
    assert_eq!(gone.events, 4 + 2);
    for id in [origin.id, fork.id] {
        assert!(matches!(
            db.store.get_session(t.id, id).await,
            Err(StoreError::NotFound)
        ));
    }
    // And the log stays append-only for everyone else.
    let delete = db.execute("DELETE FROM events").await;
    assert!(delete.is_err(), "{delete:?}");
    assert_eq!(
        db.scalar("SELECT count(*) FROM sessions_expiring")
            .await
            .unwrap(),
        0
    );
}

async fn blob_rows_of_either_kind_are_deleted_by_hash(db: &TestStore) {
    let inline = Blob::new(b"inline bytes".to_vec());
    let kept = Blob::new(b"kept bytes".to_vec());
    db.store
        .put_blobs(vec![inline.clone(), kept.clone()])
        .await
        .unwrap();
    let object = sha256_hex(b"an object's bytes");
    db.store
        .put_blob_objects(&[(object.clone(), 17)])
        .await
        .unwrap();
    assert_eq!(
        db.store
            .blob_objects(&[object.clone(), kept.sha256.clone()])
            .await
            .unwrap(),
        vec![object.clone()]
    );
    let n = db
        .store
        .delete_blobs(&[inline.sha256.clone(), object.clone(), sha256_hex(b"never")])
        .await
        .unwrap();
    assert_eq!(n, 2);
    assert_eq!(db.store.blob(&inline.sha256).await.unwrap(), None);
    assert!(db.store.blob_objects(&[object]).await.unwrap().is_empty());
    assert_eq!(
        db.store.blob(&kept.sha256).await.unwrap(),
        Some(kept.bytes.to_vec())
    );
}

async fn a_replay_report_is_saved_replaced_and_read_by_its_tenant_only(db: &TestStore) {
    let t = tenant(db, "acme").await;
    let source = session(db, &t).await;
    let target = session(db, &t).await;
    let mut replay = toolexec_core::Replay {
        id: new_id(),
        mode: toolexec_core::ReplayMode::Verify,
        status: toolexec_core::ReplayStatus::Running,
        source_session_id: source.id,
        session_id: target.id,
        calls_total: 2,
        calls_replayed: 0,
        calls_diverged: 0,
        calls: vec![],
        error: None,
        created_at: Utc::now(),
        finished_at: None,
    };
    db.store.save_replay(t.id, &replay).await.unwrap();
    assert_eq!(
        db.store.replay(t.id, replay.id).await.unwrap().status,
        toolexec_core::ReplayStatus::Running
    );
    replay.status = toolexec_core::ReplayStatus::Finished;
    replay.calls_replayed = 2;
    replay.finished_at = Some(Utc::now());
    db.store.save_replay(t.id, &replay).await.unwrap();
    let got = db.store.replay(t.id, replay.id).await.unwrap();
    assert_eq!(got.status, toolexec_core::ReplayStatus::Finished);
    assert_eq!(got.calls_replayed, 2);
    let other = tenant(db, "other").await;
    assert!(matches!(
        db.store.replay(other.id, replay.id).await,
        Err(StoreError::NotFound)
    ));
}

async fn a_lease_is_held_by_one_node_until_released_or_expired(db: &TestStore) {
    use std::time::Duration;
    use toolexec_store::Lease;
    let held = |previous: Option<&str>| Lease::Held {
        previous: previous.map(str::to_owned),
    };
    let busy = |holder: &str| Lease::Busy {
        holder: holder.to_owned(),
    };
    let t = tenant(db, "acme").await;
    let s = session(db, &t).await;
    let long = Duration::from_secs(60);
    assert_eq!(
        db.store.acquire_lease(s.id, "a", long).await.unwrap(),
        held(None)
    );
    // Held: another node is told who holds it; the holder takes it again (and renews it).
    assert_eq!(
        db.store.acquire_lease(s.id, "b", long).await.unwrap(),
        busy("a")
    );
    assert_eq!(
        db.store.acquire_lease(s.id, "a", long).await.unwrap(),
        held(None)
    );
    assert_eq!(db.store.renew_leases("a", long).await.unwrap(), vec![s.id]);
    // Released: free for the other, which learns who held it last.
    db.store.release_leases("a", &[s.id]).await.unwrap();
    assert_eq!(
        db.store.renew_leases("a", long).await.unwrap(),
        Vec::<Uuid>::new(),
        "a released lease is not renewed"
    );
    assert_eq!(
        db.store.acquire_lease(s.id, "b", long).await.unwrap(),
        held(Some("a"))
    );
    // Expired: taken over.
    db.store.release_leases("b", &[s.id]).await.unwrap();
    assert_eq!(
        db.store
            .acquire_lease(s.id, "b", Duration::from_millis(50))
            .await
            .unwrap(),
        held(None)
    );
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        db.store.acquire_lease(s.id, "a", long).await.unwrap(),
        held(Some("b"))
    );
    // Releasing another node's lease does nothing.
    db.store.release_leases("b", &[s.id]).await.unwrap();
    assert_eq!(
        db.store.acquire_lease(s.id, "b", long).await.unwrap(),
        busy("a")
    );
    // A lease of a session that does not exist is refused.
    assert!(db.store.acquire_lease(new_id(), "a", long).await.is_err());
}
