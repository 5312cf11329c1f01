//! The file tools as a caller uses them: through `Registry::builtin()`, argument validation and
//! `run`, against a real workspace.
#![allow(
    clippy::disallowed_methods,
    reason = "tests build hostile layouts and check results on the host, outside the jail"
)]
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test helpers fail the test loudly"
)]

use std::fs;
use std::path::PathBuf;
use std::sync::Arc;

use serde_json::{Value, json};
use toolexec_core::{
    CallStatus, Capability, FileChangeKind, OutputLimit, TruncationMode, sha256_hex,
};
use toolexec_tools::{Registry, ToolContext, ToolOutput, Workspace};

struct Session {
    _tmp: tempfile::TempDir,
    root: PathBuf,
    registry: Registry,
    ctx: ToolContext,
}

impl Session {
    fn new() -> Self {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("ws");
        let workspace = Arc::new(Workspace::create(&root).unwrap());
        Self {
            _tmp: tmp,
            root,
            registry: Registry::builtin().unwrap(),
            ctx: ToolContext::new(uuid::Uuid::now_v7(), workspace),
        }
    }

    fn file(&self, rel: &str, contents: &str) {
        let path = self.root.join(rel);
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(path, contents).unwrap();
    }

    /// Validates like the engine does, then runs.
    async fn call(&self, name: &str, args: Value) -> ToolOutput {
        if let Err(e) = self.registry.validate(name, &args).expect("known tool") {
            panic!("{}", e.to_model_text(name));
        }
        self.registry.get(name).unwrap().run(&self.ctx, args).await
    }
}

#[test]
fn the_catalog_describes_every_tool_truthfully() {
    let registry = Registry::builtin().unwrap();
    use Capability::{ContentFromSource, FsRead, FsWrite, Network, Process};
    use TruncationMode::{Head, HeadTail, Tail};
    let expected: [(&str, bool, &[Capability], usize, TruncationMode); 26] = [
        ("read_file", true, &[FsRead], 50_000, HeadTail),
        ("read_many_files", true, &[FsRead], 50_000, HeadTail),
        ("write_file", false, &[FsWrite], 1_000, Tail),
        ("edit_file", false, &[FsRead, FsWrite], 10_000, Tail),
        ("apply_patch", false, &[FsRead, FsWrite], 10_000, Tail),
        (
            "str_replace_based_edit_tool",
            false,
            &[FsRead, FsWrite],
            50_000,
            HeadTail,
        ),
        ("grep", true, &[FsRead], 30_000, Tail),
        ("glob", true, &[FsRead], 20_000, Tail),
        ("list_dir", true, &[FsRead], 50_000, HeadTail),
        (
            "file_copy",
            false,
            &[FsRead, FsWrite, ContentFromSource],
            50_000,
            HeadTail,
        ),
        ("file_delete", false, &[FsWrite], 50_000, HeadTail),
        (
            "shell",
            false,
            &[Process, FsRead, FsWrite],
            50_000,
            HeadTail,
        ),
        ("bash", false, &[Process, FsRead, FsWrite], 50_000, HeadTail),
        (
            "exec_command",
            false,
            &[Process, FsRead, FsWrite],
            200_000,
            HeadTail,
        ),
        (
            "write_stdin",
            false,
            &[Process, FsRead, FsWrite],
            200_000,
            HeadTail,
        ),
        ("process_read", true, &[Process], 70_000, Tail),
        ("process_write", false, &[Process], 1_000, Tail),
        ("process_kill", false, &[Process], 1_000, Tail),
        ("update_plan", false, &[], 50_000, HeadTail),
        ("TaskCreate", false, &[], 50_000, HeadTail),
        ("TaskUpdate", false, &[], 50_000, HeadTail),
        ("TaskGet", true, &[], 50_000, HeadTail),
        ("TaskList", true, &[], 50_000, HeadTail),
        ("read_output", true, &[], 50_000, HeadTail),
        ("web_fetch", true, &[Network], 101_000, Head),
        ("web_search", true, &[Network], 30_000, Head),
    ];
    assert_eq!(
        registry.names().count(),
        expected.len(),
        "every tool is described here"
    );
    for (name, read_only, capabilities, chars, mode) in expected {
        let spec = registry.get(name).unwrap().spec();
        assert_eq!(spec.read_only, read_only, "{name}");
        assert_eq!(spec.capabilities, capabilities, "{name}");
        assert_eq!(spec.output_limit, OutputLimit::new(chars, mode), "{name}");
        assert_eq!(
            spec.input_schema["additionalProperties"],
            json!(false),
            "{name}"
        );
        assert!(
            spec.description.contains("Example"),
            "{name}: no worked example"
        );
    }
}

#[test]
fn arguments_that_break_the_schema_are_reported_with_their_pointer_and_rule() {
    let registry = Registry::builtin().unwrap();
    let cases = [
        (
            "read_file",
            json!({"file_path": "a", "offset": 0}),
            "/offset",
            "minimum",
        ),
        (
            "read_file",
            json!({"file_path": "a", "limit": 0}),
            "/limit",
            "minimum",
        ),
        ("read_file", json!({}), "", "required"),
        (
            "read_file",
            json!({"file_path": "a", "lines": 3}),
            "",
            "additionalProperties",
        ),
        ("write_file", json!({"file_path": "a"}), "", "required"),
        (
            "write_file",
            json!({"file_path": "a", "content": 3}),
            "/content",
            "type",
        ),
        ("list_dir", json!({"depth": 11}), "/depth", "maximum"),
        ("list_dir", json!({"depth": 0}), "/depth", "minimum"),
    ];
    for (name, args, pointer, rule) in cases {
        let error = registry.validate(name, &args).unwrap().unwrap_err();
        assert_eq!(
            (error.pointer.as_str(), error.rule.as_str()),
            (pointer, rule),
            "{name} {args}"
        );
    }
}

#[tokio::test]
async fn read_file_numbers_lines_like_cat_n() {
    let s = Session::new();
    s.file("src/main.rs", "fn main() {\n    println!(\"hi\");\n}\n");
    let out = s
        .call("read_file", json!({"file_path": "src/main.rs"}))
        .await;
    assert_eq!(out.status, CallStatus::Ok);
    assert_eq!(
        out.content,
        "     1\tfn main() {\n     2\t    println!(\"hi\");\n     3\t}\n"
    );
    assert!(out.changes.is_empty());
}

#[tokio::test]
async fn read_file_pages_with_offset_and_limit_and_says_where_to_continue() {
    let s = Session::new();
    let text: String = (1..=50).map(|n| format!("line {n}\n")).collect();
    s.file("log.txt", &text);
    let out = s
        .call(
            "read_file",
            json!({"file_path": "/workspace/log.txt", "offset": 11, "limit": 5}),
        )
        .await;
    assert_eq!(out.status, CallStatus::Ok);
    let numbered: Vec<&str> = out.content.lines().take(5).collect();
    assert_eq!(numbered[0], "    11\tline 11");
    assert_eq!(numbered[4], "    15\tline 15");
    assert!(
        out.content
            .ends_with("… 35 more lines; call read_file with offset=16 to continue.\n"),
        "{}",
        out.content
    );
}

#[tokio::test]
async fn read_file_refuses_a_binary_file() {
    let s = Session::new();
    fs::write(s.root.join("logo.png"), b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR").unwrap();
    let out = s.call("read_file", json!({"file_path": "logo.png"})).await;
    assert_eq!(out.status, CallStatus::Error);
    assert!(out.content.contains("binary"), "{}", out.content);
}

#[tokio::test]
async fn read_file_outside_the_workspace_is_denied_with_a_way_forward() {
    let s = Session::new();
    let out = s
        .call("read_file", json!({"file_path": "/etc/passwd"}))
        .await;
    assert_eq!(out.status, CallStatus::Denied);
    assert!(
        out.content
            .starts_with("Path '/etc/passwd' is outside the workspace"),
        "{}",
        out.content
    );
    assert!(
        out.content.contains("Use a path under /workspace"),
        "{}",
        out.content
    );
    assert!(!out.content.contains("root:"));
}

#[tokio::test]
async fn read_file_of_a_missing_file_says_how_to_find_it() {
    let s = Session::new();
    let out = s.call("read_file", json!({"file_path": "nope.rs"})).await;
    assert_eq!(out.status, CallStatus::Error);
    assert!(
        out.content.contains("'nope.rs' does not exist"),
        "{}",
        out.content
    );
    assert!(out.content.contains("list_dir"), "{}", out.content);
}

#[tokio::test]
async fn writing_a_new_file_creates_its_parents_and_is_recorded_as_created() {
    let s = Session::new();
    let content = "pub fn a() {}\npub fn b() {}\n";
    let out = s
        .call(
            "write_file",
            json!({"file_path": "src/util/mod.rs", "content": content}),
        )
        .await;
    assert_eq!(out.status, CallStatus::Ok, "{}", out.content);
    assert_eq!(
        out.content,
        "Wrote 2 lines (28 bytes) to src/util/mod.rs (created)."
    );
    assert_eq!(
        fs::read_to_string(s.root.join("src/util/mod.rs")).unwrap(),
        content
    );
    let [change] = out.changes.as_slice() else {
        panic!("one change expected: {:?}", out.changes)
    };
    assert_eq!(change.change.kind, FileChangeKind::Created);
    assert_eq!(change.change.path, "src/util/mod.rs");
    assert_eq!(change.change.before_sha256, None);
    assert_eq!(
        change.change.after_sha256.as_deref(),
        Some(sha256_hex(content.as_bytes()).as_str())
    );
    assert_eq!(change.change.after_size, Some(28));
    assert!(change.change.after_stored);
    assert_eq!(change.change.capability, Capability::FsWrite);
    assert_eq!(change.after.as_deref(), Some(content.as_bytes()));
}

#[tokio::test]
async fn writing_an_unread_existing_file_is_refused() {
    let s = Session::new();
    s.file("src/main.rs", "fn main() {}\n");
    let out = s
        .call(
            "write_file",
            json!({"file_path": "src/main.rs", "content": "oops"}),
        )
        .await;
    assert_eq!(out.status, CallStatus::Denied);
    assert!(
        out.content.starts_with(
            "Cannot write to 'src/main.rs': file exists but has not been read. Use read_file"
        ),
        "{}",
        out.content
    );
    assert!(out.changes.is_empty());
    assert_eq!(
        fs::read_to_string(s.root.join("src/main.rs")).unwrap(),
        "fn main() {}\n"
    );
}

#[tokio::test]
async fn writing_after_a_read_is_allowed_and_recorded_as_modified() {
    let s = Session::new();
    s.file("a.txt", "old\n");
    // Read by its /workspace path, write by its relative path: the same file.
    let read = s
        .call("read_file", json!({"file_path": "/workspace/./a.txt"}))
        .await;
    assert_eq!(read.status, CallStatus::Ok);
    let out = s
        .call(
            "write_file",
            json!({"file_path": "a.txt", "content": "new contents\n"}),
        )
        .await;
    assert_eq!(out.status, CallStatus::Ok, "{}", out.content);
    assert!(
        out.content.contains("(replaced the previous 4 bytes)"),
        "{}",
        out.content
    );
    let change = &out.changes[0].change;
    assert_eq!(change.kind, FileChangeKind::Modified);
    assert_eq!(
        change.before_sha256.as_deref(),
        Some(sha256_hex(b"old\n").as_str())
    );
    assert_eq!(change.before_size, Some(4));
    assert_eq!(change.after_size, Some(13));
    assert_eq!(
        fs::read_to_string(s.root.join("a.txt")).unwrap(),
        "new contents\n"
    );
}

#[tokio::test]
async fn a_write_after_an_out_of_band_change_is_refused_as_stale() {
    let s = Session::new();
    s.file("config.toml", "a = 1\n");
    s.call("read_file", json!({"file_path": "config.toml"}))
        .await;
    // A shell command changes the file behind the session's back.
    s.file("config.toml", "a = 2\n");
    let out = s
        .call(
            "write_file",
            json!({"file_path": "config.toml", "content": "a = 3\n"}),
        )
        .await;
    assert_eq!(out.status, CallStatus::Denied);
    assert!(
        out.content.contains("changed since you read it"),
        "{}",
        out.content
    );
    assert_eq!(
        fs::read_to_string(s.root.join("config.toml")).unwrap(),
        "a = 2\n"
    );
    // Reading again clears the way.
    s.call("read_file", json!({"file_path": "config.toml"}))
        .await;
    let out = s
        .call(
            "write_file",
            json!({"file_path": "config.toml", "content": "a = 3\n"}),
        )
        .await;
    assert_eq!(out.status, CallStatus::Ok, "{}", out.content);
}

#[tokio::test]
async fn a_file_the_session_wrote_can_be_written_again_without_reading_it() {
    let s = Session::new();
    let first = s
        .call("write_file", json!({"file_path": "n.txt", "content": "1"}))
        .await;
    assert_eq!(first.status, CallStatus::Ok);
    let second = s
        .call("write_file", json!({"file_path": "n.txt", "content": "2"}))
        .await;
    assert_eq!(second.status, CallStatus::Ok, "{}", second.content);
    assert_eq!(second.changes[0].change.kind, FileChangeKind::Modified);
}

#[tokio::test]
async fn writing_the_same_contents_again_records_no_change() {
    let s = Session::new();
    s.call(
        "write_file",
        json!({"file_path": "n.txt", "content": "same"}),
    )
    .await;
    let again = s
        .call(
            "write_file",
            json!({"file_path": "n.txt", "content": "same"}),
        )
        .await;
    assert_eq!(again.status, CallStatus::Ok);
    assert!(
        again.content.contains("nothing was written"),
        "{}",
        again.content
    );
    assert!(again.changes.is_empty());
}

#[tokio::test]
async fn writing_outside_the_workspace_is_denied() {
    let s = Session::new();
    let outside = s.root.parent().unwrap().join("escaped.txt");
    for path in [
        "../escaped.txt",
        "/workspace/../escaped.txt",
        outside.to_str().unwrap(),
    ] {
        let out = s
            .call("write_file", json!({"file_path": path, "content": "x"}))
            .await;
        assert_eq!(out.status, CallStatus::Denied, "{path}: {}", out.content);
        assert!(
            out.content.contains("outside the workspace"),
            "{}",
            out.content
        );
    }
    assert!(!outside.exists());
}

#[tokio::test]
async fn writing_over_a_hard_link_to_an_outside_file_is_denied_and_leaves_it_alone() {
    let s = Session::new();
    let outside = s.root.parent().unwrap().join("secret");
    fs::write(&outside, "secret").unwrap();
    fs::hard_link(&outside, s.root.join("planted")).unwrap();
    let read = s.call("read_file", json!({"file_path": "planted"})).await;
    assert_eq!(read.status, CallStatus::Denied);
    assert!(!read.content.contains("secret\n"));
    let out = s
        .call(
            "write_file",
            json!({"file_path": "planted", "content": "x"}),
        )
        .await;
    assert_eq!(out.status, CallStatus::Denied);
    assert!(out.content.contains("hard link"), "{}", out.content);
    assert_eq!(fs::read_to_string(&outside).unwrap(), "secret");
}

#[tokio::test]
async fn list_dir_collapses_single_child_chains_and_marks_directories() {
    let s = Session::new();
    s.file("src/main/java/com/example/App.java", "");
    s.file("src/main/java/com/example/Util.java", "");
    s.file("README.md", "");
    s.file("target/debug/app", "");
    let out = s
        .call("list_dir", json!({"path": "/workspace", "depth": 3}))
        .await;
    assert_eq!(out.status, CallStatus::Ok);
    assert!(
        out.content.starts_with(
            "./\n  README.md\n  src/main/java/com/example/\n    App.java\n    Util.java\n  target/  [not expanded]\n"
        ),
        "{}",
        out.content
    );
    assert!(
        out.content.contains("chain of directories"),
        "{}",
        out.content
    );
}

#[tokio::test]
async fn list_dir_defaults_to_the_workspace_root_one_level_deep() {
    let s = Session::new();
    s.file("a/b.txt", "");
    s.file("a/c.txt", "");
    s.file("z.txt", "");
    let out = s.call("list_dir", json!({})).await;
    assert_eq!(out.status, CallStatus::Ok);
    assert!(
        out.content.starts_with("./\n  a/\n  z.txt\n"),
        "{}",
        out.content
    );
    assert!(!out.content.contains("b.txt"));
}
