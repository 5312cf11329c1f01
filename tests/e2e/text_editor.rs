//! Anthropic's text editor (`str_replace_based_edit_tool`) over HTTP: its four commands with the
//! reference implementation's messages, on the file tools' jail and read-before-write rules,
//! its changes recorded like theirs.
use serde_json::{Value, json};
use toolexec_tests::app::spawn_app;

const TOOL: &str = "str_replace_based_edit_tool";

fn text(r: &Value) -> &str {
    r["content"].as_str().unwrap()
}

#[tokio::test]
async fn the_text_editor_views_creates_replaces_and_inserts_like_anthropics() {
    let app = spawn_app().await;
    let s = app
        .session(json!({"files": {
            "app.py": "def greet():\n    print('helo')\n\nprint('helo')\n",
            "pkg/mod.py": "x = 1\n",
        }}))
        .await;
    let sid = s["id"].as_str().unwrap();
    let call = |id: &'static str, args: Value| {
        let app = &app;
        async move { app.call(sid, id, TOOL, args).await }
    };

    // An existing file the session has not seen is not edited.
    let unread = call(
        "e1",
        json!({"command": "str_replace", "path": "/workspace/app.py", "old_str": "def greet", "new_str": "def hello"}),
    )
    .await;
    assert_eq!(unread["status"], "denied", "{unread}");
    assert!(text(&unread).contains("has not been read"), "{unread}");
    assert!(text(&unread).contains("`view` command"), "{unread}");

    // view: cat -n, whole or a range; it counts as a read.
    let v = call(
        "v1",
        json!({"command": "view", "path": "/workspace/app.py"}),
    )
    .await;
    assert_eq!(v["status"], "ok", "{v}");
    assert_eq!(
        text(&v),
        "Here's the result of running `cat -n` on /workspace/app.py:\n     1\tdef greet():\n     2\t    print('helo')\n     3\t\n     4\tprint('helo')\n"
    );
    let part = call(
        "v2",
        json!({"command": "view", "path": "app.py", "view_range": [2, -1]}),
    )
    .await;
    assert!(
        text(&part).ends_with("     2\t    print('helo')\n     3\t\n     4\tprint('helo')\n"),
        "{part}"
    );
    assert!(!text(&part).contains("def greet"), "{part}");
    let bad_range = call(
        "v3",
        json!({"command": "view", "path": "app.py", "view_range": [3, 9]}),
    )
    .await;
    assert_eq!(bad_range["status"], "error");
    assert!(
        text(&bad_range).starts_with("Invalid `view_range`: [3, 9]. Its second element `9`"),
        "{bad_range}"
    );
    let cut = call(
        "v4",
        json!({"command": "view", "path": "app.py", "max_characters": 30}),
    )
    .await;
    assert!(text(&cut).contains("     1\tdef greet():\n"), "{cut}");
    assert!(!text(&cut).contains("print"), "{cut}");
    assert!(text(&cut).contains("view_range [2, -1]"), "{cut}");

    // str_replace: zero and several matches change nothing and say so.
    let none = call(
        "r1",
        json!({"command": "str_replace", "path": "/workspace/app.py", "old_str": "print('bye')", "new_str": "x"}),
    )
    .await;
    assert_eq!(none["status"], "error");
    assert!(
        text(&none).starts_with("No replacement was performed, old_str `print('bye')` did not appear verbatim in /workspace/app.py."),
        "{none}"
    );
    let several = call(
        "r2",
        json!({"command": "str_replace", "path": "/workspace/app.py", "old_str": "print('helo')", "new_str": "print('hello')"}),
    )
    .await;
    assert_eq!(several["status"], "error");
    assert!(
        text(&several).starts_with(
            "No replacement was performed. Multiple occurrences of old_str `print('helo')` in lines [2, 4]"
        ),
        "{several}"
    );
    let one = call(
        "r3",
        json!({"command": "str_replace", "path": "/workspace/app.py", "old_str": "    print('helo')", "new_str": "    print('hello')"}),
    )
    .await;
    assert_eq!(one["status"], "ok", "{one}");
    assert!(
        text(&one).starts_with(
            "The file /workspace/app.py has been edited. Here's the result of running `cat -n` on a snippet of app.py:\n     1\tdef greet():\n     2\t    print('hello')\n"
        ),
        "{one}"
    );

    // insert: after a line, 0 is the top; out of range is refused.
    let top = call(
        "i1",
        json!({"command": "insert", "path": "/workspace/app.py", "insert_line": 0, "new_str": "import sys"}),
    )
    .await;
    assert_eq!(top["status"], "ok", "{top}");
    assert!(
        text(&top).contains("     1\timport sys\n     2\tdef greet():\n"),
        "{top}"
    );
    let end = call(
        "i2",
        json!({"command": "insert", "path": "app.py", "insert_line": 5, "new_str": "greet()\n"}),
    )
    .await;
    assert_eq!(end["status"], "ok", "{end}");
    let far = call(
        "i3",
        json!({"command": "insert", "path": "app.py", "insert_line": 99, "new_str": "x"}),
    )
    .await;
    assert_eq!(far["status"], "error");
    assert_eq!(
        text(&far),
        "Invalid `insert_line` parameter: 99. It should be within the range of lines of the file: [0, 6]"
    );
    let missing = call(
        "i4",
        json!({"command": "insert", "path": "app.py", "new_str": "x"}),
    )
    .await;
    assert_eq!(missing["status"], "invalid_arguments");
    assert_eq!(
        text(&missing),
        "Parameter `insert_line` is required for command: insert"
    );
    let read = app
        .call(sid, "rf", "read_file", json!({"file_path": "app.py"}))
        .await;
    assert!(
        text(&read).starts_with("     1\timport sys\n     2\tdef greet():\n     3\t    print('hello')\n     4\t\n     5\tprint('helo')\n     6\tgreet()\n"),
        "{read}"
    );

    // create: new files only.
    let created = call(
        "c1",
        json!({"command": "create", "path": "/workspace/new/notes.md", "file_text": "# Notes\n"}),
    )
    .await;
    assert_eq!(created["status"], "ok", "{created}");
    assert_eq!(
        text(&created),
        "File created successfully at: /workspace/new/notes.md"
    );
    let again = call(
        "c2",
        json!({"command": "create", "path": "/workspace/new/notes.md", "file_text": "other\n"}),
    )
    .await;
    assert_eq!(again["status"], "error");
    assert_eq!(
        text(&again),
        "File already exists at: /workspace/new/notes.md. Cannot overwrite files using command `create`."
    );

    // A directory lists its entries; nothing outside the workspace is reached.
    let dir = call("d1", json!({"command": "view", "path": "/workspace"})).await;
    assert_eq!(dir["status"], "ok", "{dir}");
    assert!(
        text(&dir)
            .starts_with("Here's the files and directories up to 2 levels deep in /workspace:\n"),
        "{dir}"
    );
    assert!(text(&dir).contains("mod.py"), "{dir}");
    assert!(text(&dir).contains("notes.md"), "{dir}");
    let outside = call("o1", json!({"command": "view", "path": "/etc/passwd"})).await;
    assert_eq!(outside["status"], "denied", "{outside}");
    let undo = call("u1", json!({"command": "undo_edit", "path": "app.py"})).await;
    assert_eq!(undo["status"], "invalid_arguments", "{undo}");

    // Recorded like the file tools' changes: after the session's own files, the edit, the
    // insertions and the creation.
    let events = app.events(sid).await;
    let changes: Vec<(&str, &str)> = events
        .iter()
        .filter(|e| {
            e["kind"]
                .as_str()
                .is_some_and(|k| k.starts_with("file.") && e["data"]["capability"] == "fs.write")
        })
        .map(|e| {
            (
                e["kind"].as_str().unwrap(),
                e["data"]["path"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        changes,
        [
            ("file.created", "app.py"),
            ("file.created", "pkg/mod.py"),
            ("file.modified", "app.py"),
            ("file.modified", "app.py"),
            ("file.modified", "app.py"),
            ("file.created", "new/notes.md"),
        ],
        "{events:#?}"
    );
    let catalog: Value = app.get("/v1/tools").await.json().await.unwrap();
    assert!(
        catalog["tools"]
            .as_array()
            .unwrap()
            .iter()
            .any(|t| t["name"] == TOOL)
    );
}

#[tokio::test]
async fn the_text_editor_refuses_stale_files_keeps_crlf_and_replays_without_divergence() {
    let app = spawn_app().await;
    let s = app
        .session(json!({"files": {"win.txt": "one\r\ntwo\r\n", "app.py": "x = 1\n"}}))
        .await;
    let sid = s["id"].as_str().unwrap().to_owned();
    let steps = [
        ("s0", TOOL, json!({"command": "view", "path": "app.py"})),
        // A command changes the file after the view: the view no longer counts.
        ("s1", "shell", json!({"command": "echo 'y = 2' >> app.py"})),
        (
            "s2",
            TOOL,
            json!({"command": "str_replace", "path": "app.py", "old_str": "x = 1", "new_str": "x = 3"}),
        ),
        ("s3", TOOL, json!({"command": "view", "path": "app.py"})),
        (
            "s4",
            TOOL,
            json!({"command": "str_replace", "path": "app.py", "old_str": "x = 1", "new_str": "x = 3"}),
        ),
        ("s5", TOOL, json!({"command": "view", "path": "win.txt"})),
        (
            "s6",
            TOOL,
            json!({"command": "insert", "path": "win.txt", "insert_line": 1, "new_str": "one and a half\nnearly two"}),
        ),
        (
            "s7",
            TOOL,
            json!({"command": "str_replace", "path": "win.txt", "old_str": "nearly two\ntwo", "new_str": "2"}),
        ),
    ];
    let mut results = Vec::new();
    for (id, name, args) in steps {
        results.push(app.call(&sid, id, name, args).await);
    }
    assert_eq!(results[2]["status"], "denied", "{}", results[2]);
    assert!(
        text(&results[2]).contains("changed since you read it"),
        "{}",
        results[2]
    );
    assert_eq!(results[4]["status"], "ok", "{}", results[4]);
    assert_eq!(results[6]["status"], "ok", "{}", results[6]);
    assert_eq!(results[7]["status"], "ok", "{}", results[7]);
    // Line endings kept: the inserted lines and the replacement are written with \r\n.
    let events = app.events(&sid).await;
    let last = events
        .iter()
        .rev()
        .find(|e| e["kind"] == "file.modified" && e["data"]["path"] == "win.txt")
        .unwrap();
    assert_eq!(
        last["data"]["after_sha256"],
        toolexec_core::sha256_hex(b"one\r\none and a half\r\n2\r\n"),
        "{last}"
    );

    // Re-run in a fresh workspace, the calls give what they gave.
    let resp = app
        .post(
            &format!("/v1/sessions/{sid}/replay"),
            &json!({"mode": "verify"}),
        )
        .await;
    assert_eq!(resp.status(), 200);
    let replay: Value = resp.json().await.unwrap();
    assert_eq!(replay["status"], "finished", "{replay}");
    assert_eq!(replay["calls_replayed"], 8, "{replay:#}");
    assert_eq!(replay["calls_diverged"], 0, "{replay:#}");
}

#[tokio::test]
async fn a_view_stops_at_the_read_budget_with_the_line_to_go_on_from() {
    let app =
        toolexec_tests::app::spawn_app_with(|c| c.limits.max_read_bytes_per_call = 1000).await;
    let lines: String = (1..=500).map(|n| format!("line {n:03}\n")).collect();
    let s = app.session(json!({"files": {"long.txt": lines}})).await;
    let sid = s["id"].as_str().unwrap();
    let v = app
        .call(
            sid,
            "v",
            TOOL,
            json!({"command": "view", "path": "long.txt"}),
        )
        .await;
    assert_eq!(v["status"], "ok", "{v}");
    // Each numbered line is 6 + 1 + 8 + 1 = 16 bytes: 62 fit in 1000.
    assert!(text(&v).contains("    62\tline 062\n"), "{v}");
    assert!(!text(&v).contains("line 063"), "{v}");
    assert!(
        text(&v).ends_with(
            "… stopped before line 63: this call's read budget (1000 bytes) reached. View from there with view_range [63, -1].\n"
        ),
        "{v}"
    );
    let next = app
        .call(
            sid,
            "v2",
            TOOL,
            json!({"command": "view", "path": "long.txt", "view_range": [63, 64]}),
        )
        .await;
    assert!(
        text(&next).ends_with("    63\tline 063\n    64\tline 064\n"),
        "{next}"
    );
}
