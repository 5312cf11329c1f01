//! The task tools and update_plan over HTTP, on both stores: tasks created, updated, listed and
//! deleted; plan steps reconciled by their text; every change a `todo.*` event; the session's
//! list from the log (`GET …/todos`), also after a restart and in a replay.
use serde_json::{Value, json};
use toolexec_tests::app::Backend;

toolexec_tests::on_both_stores!(tasks_and_the_plan_are_todos_in_the_log);

async fn todos(app: &toolexec_tests::app::TestApp, sid: &str) -> Vec<Value> {
    let body: Value = app
        .get(&format!("/v1/sessions/{sid}/todos"))
        .await
        .json()
        .await
        .unwrap();
    body["todos"].as_array().unwrap().clone()
}

async fn tasks_and_the_plan_are_todos_in_the_log(backend: Backend) {
    let app = backend.spawn().await;
    let sid = app.session(json!({})).await["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let r = app
        .call(&sid, "c1", "TaskCreate", json!({"subject": "Fix the parser", "description": "tests pass", "activeForm": "Fixing the parser"}))
        .await;
    assert_eq!(r["status"], "ok", "{r}");
    assert!(
        r["content"].as_str().unwrap().contains("Task t1 created"),
        "{r}"
    );
    let r = app
        .call(&sid, "c2", "TaskCreate", json!({"subject": "Write docs", "description": "README section", "activeForm": null, "metadata": [{"key": "area", "value": "docs"}]}))
        .await;
    assert_eq!(r["status"], "ok", "{r}");
    let r = app
        .call(
            &sid,
            "u1",
            "TaskUpdate",
            json!({"taskId": "t1", "status": "in_progress"}),
        )
        .await;
    assert!(
        r["content"]
            .as_str()
            .unwrap()
            .contains("t1 [in_progress] Fix the parser"),
        "{r}"
    );
    let r = app
        .call(&sid, "g1", "TaskGet", json!({"taskId": "t2"}))
        .await;
    let text = r["content"].as_str().unwrap();
    assert!(
        text.contains("Description: README section") && text.contains("area: docs"),
        "{text}"
    );
    let r = app
        .call(&sid, "x", "TaskUpdate", json!({"taskId": "t9"}))
        .await;
    assert_eq!(r["status"], "error");
    assert!(r["content"].as_str().unwrap().contains("TaskList"), "{r}");
    let r = app
        .call(
            &sid,
            "p1",
            "update_plan",
            json!({"plan": [
                {"step": "read the code", "status": "completed"},
                {"step": "change it", "status": "in_progress"}
            ]}),
        )
        .await;
    assert_eq!(r["status"], "ok", "{r}");
    let r = app
        .call(
            &sid,
            "p2",
            "update_plan",
            json!({"plan": [
                {"step": "read the code", "status": "completed"},
                {"step": "change it", "status": "completed"},
                {"step": "test it", "status": "in_progress"}
            ]}),
        )
        .await;
    assert_eq!(r["status"], "ok", "{r}");
    let r = app
        .call(
            &sid,
            "d1",
            "TaskUpdate",
            json!({"taskId": "t2", "status": "deleted"}),
        )
        .await;
    assert_eq!(r["status"], "ok", "{r}");
    let list = app.call(&sid, "l1", "TaskList", json!({})).await;
    let text = list["content"].as_str().unwrap().to_owned();
    assert!(text.contains("t1 [in_progress] Fix the parser"), "{text}");
    assert!(!text.contains("Write docs"), "{text}");
    assert!(text.contains("[completed] change it (plan step)"), "{text}");

    // Every change is a todo event.
    let events = app.events(&sid).await;
    let kinds: Vec<&str> = events
        .iter()
        .filter_map(|e| e["kind"].as_str())
        .filter(|k| k.starts_with("todo."))
        .collect();
    assert_eq!(
        kinds,
        [
            "todo.created",
            "todo.created",
            "todo.updated", // tasks t1, t2; t1 in progress
            "todo.created",
            "todo.created", // plan: two steps
            "todo.updated",
            "todo.created", // plan: one done, one new
            "todo.deleted"  // t2
        ]
    );
    let now = todos(&app, &sid).await;
    let subjects: Vec<&str> = now.iter().map(|t| t["subject"].as_str().unwrap()).collect();
    assert_eq!(
        subjects,
        ["read the code", "change it", "test it", "Fix the parser"]
    );

    // After a restart the list is rebuilt from the log: the tools see it.
    let app = app.restart().await;
    let again = app.call(&sid, "l2", "TaskList", json!({})).await;
    assert_eq!(again["content"], text);
    let r = app
        .call(
            &sid,
            "c3",
            "TaskCreate",
            json!({"subject": "Release", "description": ""}),
        )
        .await;
    assert!(
        r["content"].as_str().unwrap().contains("Task t6 created"),
        "ids are never reused: {r}"
    );

    // A replay rebuilds the same list.
    let resp = app
        .post(
            &format!("/v1/sessions/{sid}/replay"),
            &json!({"mode": "verify"}),
        )
        .await;
    let replay: Value = resp.json().await.unwrap();
    assert_eq!(replay["status"], "finished", "{replay:#}");
    assert_eq!(replay["calls_diverged"], 0, "{replay:#}");
    let rsid = replay["session_id"].as_str().unwrap();
    let strip = |v: Vec<Value>| {
        v.into_iter()
            .map(|mut t| {
                t.as_object_mut().unwrap().remove("id");
                t
            })
            .collect::<Vec<_>>()
    };
    assert_eq!(
        strip(todos(&app, rsid).await),
        strip(todos(&app, &sid).await)
    );
}
