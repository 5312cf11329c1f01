//! The walk a newcomer does with curl, and the call pipeline's user-visible rules.
use serde_json::{Value, json};
use toolexec_tests::app::{spawn_app, spawn_sqlite_app};

#[tokio::test]
async fn health_and_readiness_report_the_store_in_use() {
    let app = spawn_app().await;
    let r = app.get("/healthz").await;
    assert_eq!(r.status(), 200);
    let r = app.get("/readyz").await;
    assert_eq!(r.status(), 200);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["status"], "ready");
    assert_eq!(body["store"], "postgres");
    assert_eq!(body["sandbox"]["mode"], "enforced", "{body}");
    assert_eq!(body["sandbox"]["ready"], true, "{body}");
}

#[tokio::test]
async fn a_newcomer_can_write_and_read_a_file_and_see_both_invocations_and_the_change_in_the_log() {
    let app = spawn_app().await;
    let s = app
        .session(json!({"metadata": {"purpose": "quickstart"}}))
        .await;
    let sid = s["id"].as_str().unwrap();
    assert_eq!(s["status"], "active");
    assert_eq!(s["metadata"]["purpose"], "quickstart");

    let w = app
        .call(
            sid,
            "call_1",
            "write_file",
            json!({"file_path": "hello.txt", "content": "hi\nthere\n"}),
        )
        .await;
    assert_eq!(w["status"], "ok", "{w}");
    assert_eq!(w["is_error"], false);
    let r = app
        .call(
            sid,
            "call_2",
            "read_file",
            json!({"file_path": "hello.txt"}),
        )
        .await;
    assert_eq!(r["status"], "ok", "{r}");
    assert!(r["content"].as_str().unwrap().contains("     1\thi"), "{r}");
    assert!(
        r["content"].as_str().unwrap().contains("     2\tthere"),
        "{r}"
    );
    assert!(r["seq"].as_i64().unwrap() > w["seq"].as_i64().unwrap());

    let events = app.events(sid).await;
    let kinds: Vec<&str> = events.iter().map(|e| e["kind"].as_str().unwrap()).collect();
    assert_eq!(
        kinds,
        [
            "session.created",
            "invocation.started",
            "file.created",
            "invocation.finished",
            // The read: one event, its finish carrying its start.
            "invocation.finished"
        ]
    );
    let seqs: Vec<i64> = events.iter().map(|e| e["seq"].as_i64().unwrap()).collect();
    assert_eq!(seqs, (1..=5).collect::<Vec<_>>());
    let read = &events[4]["data"];
    assert_eq!(read["call_id"], "call_2");
    assert_eq!(read["arguments"], json!({"file_path": "hello.txt"}));
    assert_eq!(read["read_only"], true);
    assert_eq!(read["status"], "ok");
    assert_eq!(r["seq"], 5);
    let change = &events[2]["data"];
    assert_eq!(change["path"], "hello.txt");
    assert_eq!(change["kind"], "created");
    assert_eq!(change["capability"], "fs.write");
    assert!(change["before_sha256"].is_null());
    assert_eq!(
        change["after_sha256"],
        toolexec_core::sha256_hex(b"hi\nthere\n")
    );

    let inv: Value = app.invocation_of(&w).await;
    assert_eq!(inv["call_id"], "call_1");
    assert_eq!(inv["status"], "ok");
    assert_eq!(inv["capabilities"], json!(["fs.write"]));
    assert_eq!(inv["side_effects"].as_array().unwrap().len(), 1);
    assert_eq!(inv["side_effects"][0]["kind"], "file.created");

    // The file contents are kept as a content-addressed blob.
    let blob = app
        .state
        .engine
        .store()
        .blob(change["after_sha256"].as_str().unwrap())
        .await
        .unwrap();
    assert_eq!(blob.as_deref(), Some(&b"hi\nthere\n"[..]));
}

#[tokio::test]
async fn the_embedded_sqlite_store_serves_the_same_walk_with_no_configuration() {
    let app = spawn_sqlite_app().await;
    let ready: Value = app.get("/readyz").await.json().await.unwrap();
    assert_eq!(ready["store"], "sqlite");
    let s = app.session(json!({"files": {"README.md": "# hi\n"}})).await;
    let sid = s["id"].as_str().unwrap();
    let r = app
        .call(
            sid,
            "c1",
            "read_file",
            json!({"file_path": "/workspace/README.md"}),
        )
        .await;
    assert_eq!(r["status"], "ok", "{r}");
    let events = app.events(sid).await;
    assert_eq!(events[0]["kind"], "session.created");
    assert_eq!(events[1]["kind"], "file.created");
    assert_eq!(events.last().unwrap()["kind"], "invocation.finished");
}

#[tokio::test]
async fn invalid_arguments_name_the_json_pointer_and_the_schema_rule() {
    let app = spawn_app().await;
    let sid = app.session(json!({})).await["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let r = app
        .call(
            &sid,
            "c1",
            "read_file",
            json!({"file_path": "a", "limit": 0}),
        )
        .await;
    assert_eq!(r["status"], "invalid_arguments");
    assert_eq!(r["is_error"], true);
    let text = r["content"].as_str().unwrap();
    assert!(text.contains("arguments/limit"), "{text}");
    assert!(text.contains("minimum"), "{text}");

    let r = app.call(&sid, "c2", "read_file", json!({})).await;
    assert_eq!(r["status"], "invalid_arguments");
    assert!(r["content"].as_str().unwrap().contains("required"), "{r}");

    // Recorded like any call.
    let inv: Value = app.invocation_of(&r).await;
    assert_eq!(inv["status"], "invalid_arguments");
}

#[tokio::test]
async fn an_unknown_tool_is_a_result_for_the_model_not_an_http_error() {
    let app = spawn_app().await;
    let sid = app.session(json!({})).await["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let r = app.call(&sid, "c1", "rm_rf", json!({})).await;
    assert_eq!(r["status"], "unknown_tool");
    assert!(
        r["content"].as_str().unwrap().contains("read_file"),
        "lists the tools: {r}"
    );
}

#[tokio::test]
async fn a_tool_outside_the_sessions_allow_list_is_denied() {
    let app = spawn_app().await;
    let sid = app.session(json!({"tools": ["read_file"]})).await["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let r = app
        .call(
            &sid,
            "c1",
            "write_file",
            json!({"file_path": "a", "content": "x"}),
        )
        .await;
    assert_eq!(r["status"], "denied");
    assert!(
        !app.data
            .path()
            .join("workspaces")
            .join(&sid)
            .join("a")
            .exists()
    );
}

#[tokio::test]
async fn batch_results_come_back_in_request_order_and_a_mutation_sees_what_came_before() {
    let app = spawn_app().await;
    let sid = app.session(json!({})).await["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let results = app
        .calls(
            &sid,
            json!([
                {"id": "w1", "name": "write_file", "arguments": {"file_path": "a.txt", "content": "one\n"}},
                {"id": "r1", "name": "read_file", "arguments": {"file_path": "a.txt"}},
                {"id": "l1", "name": "list_dir", "arguments": {"path": "."}},
                {"id": "w2", "name": "write_file", "arguments": {"file_path": "a.txt", "content": "two\n"}},
                {"id": "r2", "name": "read_file", "arguments": {"file_path": "a.txt"}}
            ]),
        )
        .await;
    let ids: Vec<&str> = results
        .iter()
        .map(|r| r["call_id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["w1", "r1", "l1", "w2", "r2"]);
    assert!(results.iter().all(|r| r["status"] == "ok"), "{results:?}");
    assert!(results[1]["content"].as_str().unwrap().contains("one"));
    assert!(results[4]["content"].as_str().unwrap().contains("two"));
    // The second write needed the read before it: it ran after r1 finished.
    assert!(results[3]["seq"].as_i64() > results[1]["seq"].as_i64());
}

#[tokio::test]
async fn seq_stays_gapless_and_ordered_under_concurrent_batches() {
    let app = spawn_app().await;
    let sid = app.session(json!({"files": {"a.txt": "x\n"}})).await["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let mut tasks = Vec::new();
    for b in 0..16 {
        let http = app.http.clone();
        let url = app.url(&format!("/v1/sessions/{sid}/calls"));
        tasks.push(tokio::spawn(async move {
            let calls: Vec<Value> = (0..4)
                .map(|i| json!({"id": format!("b{b}c{i}"), "name": "read_file", "arguments": {"file_path": "a.txt"}}))
                .collect();
            let r = http.post(url).json(&json!({"calls": calls})).send().await.unwrap();
            assert_eq!(r.status(), 200);
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let events = app.events(&sid).await;
    let seqs: Vec<i64> = events.iter().map(|e| e["seq"].as_i64().unwrap()).collect();
    // session.created + file.created + 64 reads, one event each
    assert_eq!(seqs, (1..=(2 + 64)).collect::<Vec<_>>());
    let s: Value = app
        .get(&format!("/v1/sessions/{sid}"))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(s["last_seq"], 66);
}

/// A session whose read_file output limit is 500 characters, and a read of a 300-line file in
/// it: the session id and the (truncated) result.
async fn truncated_read(app: &toolexec_tests::app::TestApp) -> (String, Value) {
    let body: String = (1..=300).map(|i| format!("line number {i}\n")).collect();
    let sid = app
        .session(
            json!({"files": {"big.txt": body}, "policy": {"output_limits": {"read_file": 500}}}),
        )
        .await["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let r = app
        .call(&sid, "c1", "read_file", json!({"file_path": "big.txt"}))
        .await;
    (sid, r)
}

#[tokio::test]
async fn an_over_long_output_is_truncated_for_the_model_and_kept_in_full() {
    let app = spawn_app().await;
    let (_, r) = truncated_read(&app).await;
    assert_eq!(r["status"], "ok");
    let shown = r["content"].as_str().unwrap();
    assert!(shown.contains("read_output"), "{shown}");
    assert!(shown.contains("line number 1\n"));
    assert!(shown.contains("line number 300"));
    assert!(!shown.contains("line number 150\n"));
    let t = &r["truncated"];
    assert_eq!(t["mode"], "head_tail");
    let total = t["total_chars"].as_u64().unwrap();
    assert!(total > 500);

    let out: Value = app
        .get(&format!(
            "/v1/invocations/{}/output",
            r["invocation_id"].as_str().unwrap()
        ))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(out["total_chars"].as_u64().unwrap(), total);
    assert!(
        out["content"]
            .as_str()
            .unwrap()
            .contains("   150\tline number 150")
    );
    assert!(out["next_offset"].is_null());

    let page: Value = app
        .get(&format!(
            "/v1/invocations/{}/output?offset=10&limit=20",
            r["invocation_id"].as_str().unwrap()
        ))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(page["content"].as_str().unwrap().chars().count(), 20);
    assert_eq!(page["next_offset"], 30);
}

#[tokio::test]
async fn sessions_are_listed_newest_first_with_a_cursor_and_closing_keeps_the_log() {
    let app = spawn_app().await;
    let mut ids = Vec::new();
    for _ in 0..5 {
        ids.push(
            app.session(json!({})).await["id"]
                .as_str()
                .unwrap()
                .to_owned(),
        );
    }
    let page1: Value = app.get("/v1/sessions?limit=2").await.json().await.unwrap();
    let got: Vec<&str> = page1["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["id"].as_str().unwrap())
        .collect();
    assert_eq!(got, [ids[4].as_str(), ids[3].as_str()]);
    let cursor = page1["next_cursor"].as_str().unwrap();
    let page2: Value = app
        .get(&format!("/v1/sessions?limit=2&cursor={cursor}"))
        .await
        .json()
        .await
        .unwrap();
    let got: Vec<&str> = page2["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["id"].as_str().unwrap())
        .collect();
    assert_eq!(got, [ids[2].as_str(), ids[1].as_str()]);

    let sid = &ids[0];
    app.call(
        sid,
        "c1",
        "write_file",
        json!({"file_path": "f", "content": "x"}),
    )
    .await;
    let ws = app.data.path().join("workspaces").join(sid);
    assert!(ws.join("f").exists());
    let closed = app.delete(&format!("/v1/sessions/{sid}")).await;
    assert_eq!(closed.status(), 200);
    let closed: Value = closed.json().await.unwrap();
    assert_eq!(closed["status"], "closed");
    assert!(!ws.exists(), "the workspace is removed");
    // Closing twice is fine; the log stays.
    assert_eq!(
        app.delete(&format!("/v1/sessions/{sid}")).await.status(),
        200
    );
    let events = app.events(sid).await;
    assert_eq!(events.last().unwrap()["kind"], "session.closed");
    // New calls are refused; nothing runs.
    let r = app
        .post(
            &format!("/v1/sessions/{sid}/calls"),
            &json!({"calls": [{"id": "c2", "name": "read_file", "arguments": {"file_path": "f"}}]}),
        )
        .await;
    assert_eq!(r.status(), 409);
    let p: Value = r.json().await.unwrap();
    assert_eq!(p["code"], "session_closed");
    // A retry of an already recorded call still returns its result.
    let again = app
        .call(
            sid,
            "c1",
            "write_file",
            json!({"file_path": "f", "content": "x"}),
        )
        .await;
    assert_eq!(again["status"], "ok");
}

#[tokio::test]
async fn the_catalog_speaks_openai_anthropic_and_mcp() {
    let app = spawn_app().await;
    let own: Value = app.get("/v1/tools").await.json().await.unwrap();
    let names: Vec<&str> = own["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    for t in ["read_file", "write_file", "list_dir"] {
        assert!(names.contains(&t), "{names:?}");
    }
    let rf = own["tools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "read_file")
        .unwrap();
    assert_eq!(rf["read_only"], true);
    assert_eq!(rf["capabilities"], json!(["fs.read"]));
    assert_eq!(rf["input_schema"]["type"], "object");

    let oa: Value = app
        .get("/v1/tools?format=openai")
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(oa["tools"][0]["type"], "function");
    assert!(oa["tools"][0]["parameters"].is_object());
    let chat: Value = app
        .get("/v1/tools?format=openai_chat")
        .await
        .json()
        .await
        .unwrap();
    assert!(chat["tools"][0]["function"]["parameters"].is_object());
    let an: Value = app
        .get("/v1/tools?format=anthropic")
        .await
        .json()
        .await
        .unwrap();
    assert!(an["tools"][0]["input_schema"].is_object());
    let mcp: Value = app.get("/v1/tools?format=mcp").await.json().await.unwrap();
    assert!(mcp["tools"][0]["inputSchema"].is_object());
    assert!(mcp["tools"][0]["annotations"]["readOnlyHint"].is_boolean());

    let one = app.get("/v1/tools/write_file").await;
    assert_eq!(one.status(), 200);
    let missing = app.get("/v1/tools/nope").await;
    assert_eq!(missing.status(), 404);
    assert_eq!(
        missing.headers()["content-type"],
        "application/problem+json"
    );
    let bad = app.get("/v1/tools?format=yaml").await;
    assert_eq!(bad.status(), 400);
}

/// The names of the tools a catalog lists, in any format.
async fn catalog_names(app: &toolexec_tests::app::TestApp, format: &str) -> Vec<String> {
    let body: Value = app
        .get(&format!("/v1/tools?format={format}"))
        .await
        .json()
        .await
        .unwrap();
    body["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            t["name"]
                .as_str()
                .or(t["function"]["name"].as_str())
                .unwrap()
                .to_owned()
        })
        .collect()
}

#[tokio::test]
async fn web_search_is_listed_as_unavailable_until_a_provider_is_configured() {
    let app = spawn_app().await;
    let own: Value = app.get("/v1/tools").await.json().await.unwrap();
    let search = own["tools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "web_search")
        .unwrap();
    assert_eq!(search["available"], false, "{search}");
    assert!(
        search["unavailable_reason"]
            .as_str()
            .unwrap()
            .contains("web.search_provider"),
        "{search}"
    );
    let fetch = own["tools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "web_fetch")
        .unwrap();
    assert_eq!(fetch["available"], true);
    assert!(fetch.get("unavailable_reason").is_none(), "{fetch}");
    // Which sessions may use the web tools here: by default, those granted network access.
    assert_eq!(fetch["requires_session_network"], true, "{fetch}");
    let read = own["tools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "read_file")
        .unwrap();
    assert!(read.get("requires_session_network").is_none(), "{read}");
    // A model is handed only tools it can call.
    for format in ["openai", "anthropic", "mcp"] {
        let names = catalog_names(&app, format).await;
        assert!(
            !names.contains(&"web_search".to_owned()),
            "{format}: {names:?}"
        );
        assert!(
            names.contains(&"web_fetch".to_owned()),
            "{format}: {names:?}"
        );
    }
    let one: Value = app.get("/v1/tools/web_search").await.json().await.unwrap();
    assert_eq!(one["available"], false);

    let app = toolexec_tests::app::spawn_app_with(|c| {
        c.web.search_provider = Some("searxng".to_owned());
        c.web.search_url = Some("http://127.0.0.1:9/".to_owned());
        c.web.public_when_network_none = true;
    })
    .await;
    let one: Value = app.get("/v1/tools/web_search").await.json().await.unwrap();
    assert_eq!(one["available"], true, "{one}");
    assert_eq!(one["requires_session_network"], false, "{one}");
    for format in ["openai", "anthropic", "mcp"] {
        let names = catalog_names(&app, format).await;
        assert!(
            names.contains(&"web_search".to_owned()),
            "{format}: {names:?}"
        );
    }
}

#[tokio::test]
async fn the_docs_page_and_the_openapi_document_are_served() {
    let app = spawn_app().await;
    let doc: Value = app.get("/openapi.json").await.json().await.unwrap();
    assert_eq!(doc["openapi"], "3.1.0");
    assert!(doc["paths"]["/v1/sessions/{id}/calls"]["post"].is_object());
    assert!(doc["components"]["schemas"]["tool.read_file.arguments"].is_object());
    let docs = app.get("/docs/").await;
    assert_eq!(docs.status(), 200);
    assert!(docs.text().await.unwrap().contains("swagger"));
}

#[tokio::test]
async fn update_plan_records_the_plan_in_the_log() {
    let app = spawn_app().await;
    let sid = app.session(json!({})).await["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let r = app
        .call(
            &sid,
            "p1",
            "update_plan",
            json!({"plan": [{"step": "read", "status": "completed"}, {"step": "edit", "status": "in_progress"}], "explanation": "started"}),
        )
        .await;
    assert_eq!(r["status"], "ok", "{r}");
    let events = app.events(&sid).await;
    let plan = events
        .iter()
        .find(|e| e["kind"] == "plan.updated")
        .expect("plan event");
    assert_eq!(plan["data"]["plan"][1]["step"], "edit");
    assert_eq!(plan["invocation_id"], r["invocation_id"]);
    let inv: Value = app.invocation_of(&r).await;
    let kinds: Vec<&str> = inv["side_effects"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e["kind"].as_str())
        .collect();
    // A todo per step, then the plan as a whole.
    assert_eq!(kinds, ["todo.created", "todo.created", "plan.updated"]);
}

#[tokio::test]
async fn read_output_pages_through_a_truncated_result_of_the_same_session_only() {
    let app = spawn_app().await;
    let (sid, r) = truncated_read(&app).await;
    let inv = r["invocation_id"].as_str().unwrap();
    assert!(!r["content"].as_str().unwrap().contains("line number 150\n"));
    let page = app
        .call(
            &sid,
            "c2",
            "read_output",
            json!({"invocation_id": inv, "offset": 0, "limit": 45000}),
        )
        .await;
    assert_eq!(page["status"], "ok", "{page}");
    assert!(
        page["content"]
            .as_str()
            .unwrap()
            .contains("   150\tline number 150")
    );

    let other = app.session(json!({})).await["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let denied = app
        .call(&other, "c1", "read_output", json!({"invocation_id": inv}))
        .await;
    assert!(denied["is_error"].as_bool().unwrap());
    assert!(
        denied["content"]
            .as_str()
            .unwrap()
            .contains("No invocation"),
        "{denied}"
    );
}

#[tokio::test]
async fn a_nul_character_is_refused_as_invalid_arguments_and_recorded_not_a_503() {
    let app = spawn_app().await;
    let sid = app.session(json!({})).await["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let args = json!({"file_path": "a.txt", "content": "a\u{0}b"});
    let r = app.call(&sid, "w1", "write_file", args.clone()).await;
    assert_eq!(r["status"], "invalid_arguments", "{r}");
    assert!(
        r["content"].as_str().unwrap().contains("arguments/content"),
        "{r}"
    );
    assert!(
        !app.data
            .path()
            .join("workspaces")
            .join(&sid)
            .join("a.txt")
            .exists()
    );
    // Recorded (without the NUL), and a retry is still recognised as the same call.
    let again = app.call(&sid, "w1", "write_file", args).await;
    assert_eq!(again, r);
    let inv: Value = app.invocation_of(&r).await;
    assert_eq!(inv["arguments"]["content"], "a\u{FFFD}b");
}

#[tokio::test]
async fn output_with_a_nul_character_is_recorded_and_shown_with_a_replacement_character() {
    let app = spawn_app().await;
    let sid = app.session(json!({})).await["id"]
        .as_str()
        .unwrap()
        .to_owned();
    // Past the first 8 KiB, where the binary check looks, a NUL slips into text output.
    let mut bytes = "x".repeat(9000).into_bytes();
    bytes.extend_from_slice(b"\nbefore\0after\n");
    std::fs::write(
        app.data
            .path()
            .join("workspaces")
            .join(&sid)
            .join("late.txt"),
        bytes,
    )
    .unwrap();
    let r = app
        .call(&sid, "r1", "read_file", json!({"file_path": "late.txt"}))
        .await;
    assert!(r["status"] == "ok" || r["status"] == "error", "{r}");
    if r["status"] == "ok" {
        assert!(
            r["content"]
                .as_str()
                .unwrap()
                .contains("before\u{FFFD}after")
        );
    }
}
