//! The adversarial suite of the workspace jail (`crates/toolexec-tools/tests/jail.rs`), end to
//! end over HTTP: the hostile layout is built on disk in a session's workspace directory, and
//! the file tools are called on it through `POST /v1/sessions/{id}/calls` as a model would.
//!
//! Beside each workspace (`<data>/workspaces/<sid>`) sits an outside directory
//! `<data>/workspaces/<sid>-outside` (the workspace's name is a string prefix of it: the
//! `starts_with` bug) holding a secret. Every attack must be refused — `denied` or `error`,
//! `is_error`, a message that says why — without the secret in any result, with nothing outside
//! read, created or changed, and with each refusal in the session's log: an
//! `invocation.finished` of the same status and no `file.*` event. Every request has a timeout,
//! so a FIFO that hangs a tool fails the suite instead of hanging it. One server for the suite,
//! one session per case; every failure is reported together. The server must stay healthy.
//!
//! Also here: a short property test over HTTP with the hostile path alphabet of
//! `path_props.rs`, and the NUL-byte case, ignored while a `\u0000` in a call's arguments gets
//! `503` on Postgres instead of a recorded refusal (see its test).
use std::collections::BTreeMap;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use proptest::prelude::*;
use proptest::test_runner::{Config as ProptestConfig, TestRunner};
use serde_json::{Value, json};
use toolexec_tests::app::{TestApp, spawn_app};

/// What the outside file holds; no result may ever show it.
const SECRET: &str = "TOP SECRET: outside the workspace\n";
/// The part of [`SECRET`] looked for in results.
const SECRET_MARK: &str = "TOP SECRET";
/// The name of a file that exists only outside (`outside/sub/deeper`): a listing that shows it
/// went outside. Never part of the arguments of a call checked for it.
const OUTSIDE_ONLY_NAME: &str = "deeper";

/// Longest any one call may take: a FIFO that blocks a tool fails here instead of hanging.
const CALL_TIMEOUT: Duration = Duration::from_secs(15);

/// The reasons a refusal may give (any one of them, case-insensitively).
const OUTSIDE: &[&str] = &["outside the workspace"];
const NOT_REGULAR: &[&str] = &["not a regular file"];
/// Writing or deleting a symlink is refused as a symlink; through one that leads out, as outside.
const SYMLINK_OR_OUTSIDE: &[&str] = &["symbolic link", "outside the workspace"];
/// A loop is "too many levels of symbolic links"; writing or deleting the link itself, "a
/// symbolic link".
const LOOP: &[&str] = &["symbolic link"];
const INVALID: &[&str] = &["invalid path"];
const HARD_LINK: &[&str] = &["hard link"];
const TOO_LARGE: &[&str] = &["limit", "too large"];
const DIRECTORY: &[&str] = &["directory"];

/// Everything under a directory, not following symlinks: path → (kind, contents or link
/// target, inode).
type Snapshot = BTreeMap<PathBuf, (String, Vec<u8>, u64)>;

fn snapshot(root: &Path) -> Snapshot {
    let mut seen = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let meta = fs::symlink_metadata(&path).unwrap();
            let contents = if meta.is_file() {
                fs::read(&path).unwrap()
            } else if meta.file_type().is_symlink() {
                fs::read_link(&path)
                    .unwrap()
                    .as_os_str()
                    .as_bytes()
                    .to_vec()
            } else {
                Vec::new()
            };
            if meta.is_dir() {
                stack.push(path.clone());
            }
            seen.insert(
                path,
                (format!("{:?}", meta.file_type()), contents, meta.ino()),
            );
        }
    }
    seen
}

/// Whether `reported` (a path in a file event) is workspace-relative, normalised, and names
/// what is really there: its parent directory is inside `ws` with no symlink on the way, and it
/// is not a symlink itself.
fn inside(ws: &Path, reported: &str) -> Result<(), String> {
    if reported.starts_with('/') || reported.split('/').any(|c| matches!(c, "" | "." | "..")) {
        return Err(format!(
            "{reported:?} is not a normalised workspace-relative path"
        ));
    }
    let host = ws.join(reported);
    let parent = host
        .parent()
        .unwrap()
        .canonicalize()
        .map_err(|e| e.to_string())?;
    let expected = ws.canonicalize().unwrap().join(reported);
    if Some(parent.as_path()) != expected.parent() {
        return Err(format!(
            "{reported:?} goes through a symlink or leaves the workspace"
        ));
    }
    if fs::symlink_metadata(&host).is_ok_and(|m| m.file_type().is_symlink()) {
        return Err(format!("{reported:?} is a symlink"));
    }
    Ok(())
}

fn symlink(target: impl AsRef<Path>, link: impl AsRef<Path>) {
    std::os::unix::fs::symlink(target, link).unwrap();
}

fn patch_add(path: &str) -> Value {
    json!({"patch": format!("*** Begin Patch\n*** Add File: {path}\n+pwned\n*** End Patch\n")})
}

fn patch_update(path: &str) -> Value {
    json!({"patch": format!(
        "*** Begin Patch\n*** Update File: {path}\n@@\n-{}\n+pwned\n*** End Patch\n",
        SECRET.trim_end()
    )})
}

fn patch_delete(path: &str) -> Value {
    json!({"patch": format!("*** Begin Patch\n*** Delete File: {path}\n*** End Patch\n")})
}

/// One case: a session, its workspace on disk, the outside directory beside it, and what the
/// case saw.
struct Jail<'a> {
    app: &'a TestApp,
    case: &'static str,
    sid: String,
    ws: PathBuf,
    outside: PathBuf,
    before: Snapshot,
    /// Results of the calls that had to be refused.
    refused: Vec<Value>,
    /// Invocations allowed to change files inside the workspace.
    changing: Vec<String>,
    failures: Vec<String>,
    calls: usize,
}

impl<'a> Jail<'a> {
    /// A fresh session with `inside.txt` in its workspace and, outside, `secret` and
    /// `sub/deeper`. `build` plants the hostile layout before the outside is snapshotted.
    async fn new(app: &'a TestApp, case: &'static str, build: impl FnOnce(&Self)) -> Jail<'a> {
        let session = app.session(json!({"metadata": {"jail": case}})).await;
        let sid = session["id"].as_str().unwrap().to_owned();
        let workspaces = app.data.path().join("workspaces");
        let ws = workspaces.join(&sid);
        let outside = workspaces.join(format!("{sid}-outside"));
        fs::create_dir_all(outside.join("sub")).unwrap();
        fs::write(outside.join("secret"), SECRET).unwrap();
        fs::write(outside.join("sub").join(OUTSIDE_ONLY_NAME), SECRET).unwrap();
        fs::write(ws.join("inside.txt"), "inside\n").unwrap();
        let mut jail = Jail {
            app,
            case,
            sid,
            ws,
            outside,
            before: Snapshot::new(),
            refused: Vec::new(),
            changing: Vec::new(),
            failures: Vec::new(),
            calls: 0,
        };
        build(&jail);
        jail.before = snapshot(&jail.outside);
        jail
    }

    /// A path in the workspace on disk.
    fn at(&self, rel: &str) -> PathBuf {
        self.ws.join(rel)
    }

    /// `../<sid>-outside/<rest>`: the outside directory, relative to the workspace root.
    fn up(&self, rest: &str) -> String {
        let name = self.outside.file_name().unwrap().to_str().unwrap();
        if rest.is_empty() {
            format!("../{name}")
        } else {
            format!("../{name}/{rest}")
        }
    }

    /// The host path of something outside.
    fn host(&self, rest: &str) -> String {
        self.outside.join(rest).to_str().unwrap().to_owned()
    }

    fn fail(&mut self, why: String) {
        self.failures.push(format!("{}: {why}", self.case));
    }

    /// Sends one call with a timeout; the result, or `None` (and a failure) when there was no
    /// proper answer.
    async fn send(&mut self, tool: &str, args: Value) -> Option<Value> {
        self.calls += 1;
        let id = format!("{}-{}", self.case, self.calls);
        let url = self.app.url(&format!("/v1/sessions/{}/calls", self.sid));
        let body = json!({"calls": [{"id": id, "name": tool, "arguments": args}]});
        let started = Instant::now();
        let response = self
            .app
            .http
            .post(url)
            .json(&body)
            .timeout(CALL_TIMEOUT)
            .send()
            .await;
        let response = match response {
            Ok(response) => response,
            Err(e) => {
                self.fail(format!(
                    "{tool} {args}: no answer after {:?}: {e}",
                    started.elapsed()
                ));
                return None;
            }
        };
        let status = response.status();
        let text = response.text().await.unwrap_or_default();
        let parsed: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
        if status != 200 {
            self.fail(format!("{tool} {args}: HTTP {status}: {text}"));
            return None;
        }
        let result = parsed["results"][0].clone();
        if result["call_id"] != id.as_str() {
            self.fail(format!("{tool} {args}: not this call's result: {text}"));
            return None;
        }
        let content = result["content"].as_str().unwrap_or_default();
        if content.contains(SECRET_MARK) {
            self.fail(format!("{tool} {args}: the secret leaked: {content}"));
        }
        Some(result)
    }

    /// The call must be refused, saying one of `reasons`.
    async fn refused(&mut self, tool: &str, args: Value, reasons: &[&str]) {
        let Some(result) = self.send(tool, args.clone()).await else {
            return;
        };
        let content = result["content"].as_str().unwrap_or_default();
        let lower = content.to_lowercase();
        if !matches!(
            result["status"].as_str(),
            Some("denied" | "error" | "invalid_arguments")
        ) || result["is_error"] != true
        {
            self.fail(format!(
                "{tool} {args}: not refused: {} {content}",
                result["status"]
            ));
        } else if !reasons.iter().any(|r| lower.contains(&r.to_lowercase())) {
            self.fail(format!(
                "{tool} {args}: refused ({}) without saying {reasons:?}: {content}",
                result["status"]
            ));
        }
        self.refused.push(result);
    }

    /// A read-only call that may succeed or fail, but must answer and show nothing from outside.
    async fn no_leak(&mut self, tool: &str, args: Value) -> Option<Value> {
        let result = self.send(tool, args.clone()).await?;
        let content = result["content"].as_str().unwrap_or_default();
        if content.contains(OUTSIDE_ONLY_NAME) {
            self.fail(format!(
                "{tool} {args}: shows a file from outside: {content}"
            ));
        }
        Some(result)
    }

    /// The same hostile path through every tool that takes one, each refused with `reasons`.
    async fn every_tool(&mut self, path: &str, reasons: &[&str]) {
        self.refused("read_file", json!({"file_path": path}), reasons)
            .await;
        self.refused("read_many_files", json!({"paths": [path]}), reasons)
            .await;
        self.refused(
            "write_file",
            json!({"file_path": path, "content": "pwned\n"}),
            reasons,
        )
        .await;
        self.refused(
            "edit_file",
            json!({"file_path": path, "old_string": SECRET_MARK, "new_string": "pwned"}),
            reasons,
        )
        .await;
        self.refused("file_delete", json!({"path": path}), reasons)
            .await;
        self.refused(
            "file_copy",
            json!({"source": path, "dest": "copied.txt"}),
            reasons,
        )
        .await;
        self.refused(
            "file_copy",
            json!({"source": "inside.txt", "dest": path, "overwrite": true}),
            reasons,
        )
        .await;
        self.refused("apply_patch", patch_update(path), reasons)
            .await;
        self.refused(
            "grep",
            json!({"pattern": SECRET_MARK, "path": path}),
            reasons,
        )
        .await;
    }

    /// The same hostile directory through every tool that takes one.
    async fn every_dir_tool(&mut self, dir: &str, reasons: &[&str]) {
        self.refused("list_dir", json!({"path": dir, "depth": 3}), reasons)
            .await;
        self.refused("glob", json!({"pattern": "**/*", "path": dir}), reasons)
            .await;
        self.refused("grep", json!({"pattern": "SECRET", "path": dir}), reasons)
            .await;
        for name in ["new.txt", "sub/new.txt", "fresh/dirs/new.txt"] {
            let path = format!("{dir}/{name}");
            self.refused(
                "write_file",
                json!({"file_path": path, "content": "pwned\n"}),
                reasons,
            )
            .await;
            self.refused(
                "file_copy",
                json!({"source": "inside.txt", "dest": path}),
                reasons,
            )
            .await;
            self.refused("apply_patch", patch_add(&path), reasons).await;
        }
    }

    /// Whole-workspace searches and listings: they answer, and show nothing from outside.
    async fn walks_stay_inside(&mut self) {
        self.no_leak("grep", json!({"pattern": "SECRET|pwned"}))
            .await;
        self.no_leak("glob", json!({"pattern": "**/*"})).await;
        self.no_leak("list_dir", json!({"path": ".", "depth": 10}))
            .await;
    }

    /// The workspace root holds exactly these names (nothing was created).
    fn workspace_holds(&mut self, names: &[&[u8]]) {
        let mut entries: Vec<Vec<u8>> = fs::read_dir(&self.ws)
            .unwrap()
            .map(|e| e.unwrap().file_name().as_bytes().to_vec())
            .collect();
        entries.sort();
        if entries != names {
            self.fail(format!(
                "the workspace holds {:?}",
                entries
                    .iter()
                    .map(|e| String::from_utf8_lossy(e).into_owned())
                    .collect::<Vec<_>>()
            ));
        }
    }

    /// Checks what the case left: nothing outside changed, and the log has every refusal with
    /// its status and no side effect but the allowed ones. Returns the failures.
    async fn finish(mut self) -> Vec<String> {
        let after = snapshot(&self.outside);
        if after != self.before {
            self.fail(format!(
                "the outside changed:\nbefore: {:?}\nafter:  {:?}",
                self.before, after
            ));
        }
        let events = self.app.events(&self.sid).await;
        if events.len() >= 1000 {
            self.fail(format!("{} events: more than one page", events.len()));
        }
        let kind = |e: &Value| e["kind"].as_str().unwrap_or_default().to_owned();
        let mut finished: BTreeMap<String, Value> = BTreeMap::new();
        let mut file_events = Vec::new();
        for event in &events {
            let invocation = event["invocation_id"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            if kind(event) == "invocation.finished" {
                finished.insert(invocation, event["data"].clone());
            } else if kind(event).starts_with("file.") {
                file_events.push((invocation, event.clone()));
            }
        }
        let mut problems = Vec::new();
        for result in &self.refused {
            let invocation = result["invocation_id"].as_str().unwrap_or_default();
            match finished.get(invocation) {
                None => problems.push(format!("no invocation.finished for {result}")),
                Some(data) => {
                    if data["status"] != result["status"]
                        || data["is_error"] != true
                        || data["call_id"] != result["call_id"]
                    {
                        problems.push(format!(
                            "invocation.finished {data} does not match the refusal {result}"
                        ));
                    }
                }
            }
        }
        for (invocation, event) in &file_events {
            if !self.changing.contains(invocation) {
                problems.push(format!("a file event of no allowed change: {event}"));
            }
            let path = event["data"]["path"].as_str().unwrap_or_default();
            if let Err(why) = inside(&self.ws, path) {
                problems.push(format!("file event {event}: {why}"));
            }
        }
        for problem in problems {
            self.fail(problem);
        }
        self.failures
    }
}

/// `..` in every position, from the root and from a subdirectory, and the same through
/// `/workspace`.
async fn dot_dot_escapes(app: &TestApp) -> Vec<String> {
    let mut j = Jail::new(app, "dot-dot", |j| fs::create_dir(j.at("a")).unwrap()).await;
    let name = j.outside.file_name().unwrap().to_str().unwrap().to_owned();
    for path in [
        j.up("secret"),
        format!("./{}", j.up("secret")),
        format!("a/../{}", j.up("secret")),
        format!("a/../../{name}/sub/deeper"),
        format!("/workspace/../{name}/secret"),
        format!("/workspace/a/../../{name}/secret"),
    ] {
        j.every_tool(&path, OUTSIDE).await;
    }
    for dir in [
        "..".to_owned(),
        "a/../..".to_owned(),
        j.up(""),
        j.up("sub"),
        "/workspace/..".to_owned(),
    ] {
        j.every_dir_tool(&dir, OUTSIDE).await;
    }
    j.refused("apply_patch", patch_delete(&j.up("secret")), OUTSIDE)
        .await;
    j.refused(
        "file_copy",
        json!({"source": "inside.txt", "dest": j.up("secret"), "overwrite": true}),
        OUTSIDE,
    )
    .await;
    // A glob pattern that climbs is not a way out either.
    j.no_leak("glob", json!({"pattern": format!("../{name}/**/*")}))
        .await;
    j.no_leak("glob", json!({"pattern": "../*"})).await;
    j.walks_stay_inside().await;
    j.finish().await
}

/// Absolute paths: elsewhere on the host, the outside directory, the workspace's own host path
/// (the model only ever sees /workspace), look-alikes of /workspace, `/workspace/../etc/passwd`.
async fn absolute_paths(app: &TestApp) -> Vec<String> {
    let mut j = Jail::new(app, "absolute", |_| {}).await;
    let own = j.at("inside.txt").to_str().unwrap().to_owned();
    for path in [
        "/etc/passwd".to_owned(),
        j.host("secret"),
        own,
        "/workspacefoo/inside.txt".to_owned(),
        "/workspaces/inside.txt".to_owned(),
        "/workspace/../etc/passwd".to_owned(),
        "/workspace/../../etc/passwd".to_owned(),
        "/workspace/./../etc/hostname".to_owned(),
    ] {
        j.every_tool(&path, OUTSIDE).await;
    }
    for dir in [
        "/".to_owned(),
        "/etc".to_owned(),
        j.host(""),
        j.ws.to_str().unwrap().to_owned(),
        "/workspacefoo".to_owned(),
    ] {
        j.every_dir_tool(&dir, OUTSIDE).await;
    }
    j.refused("apply_patch", patch_add("/etc/toolexec-jail-test"), OUTSIDE)
        .await;
    j.refused(
        "write_file",
        json!({"file_path": "/workspace/../etc/toolexec-jail-test", "content": "pwned\n"}),
        OUTSIDE,
    )
    .await;
    let planted = Path::new("/etc/toolexec-jail-test");
    if planted.exists() {
        let _ = fs::remove_file(planted);
        j.fail("/etc/toolexec-jail-test was created".into());
    }
    if fs::read(j.at("inside.txt")).unwrap() != b"inside\n" {
        j.fail("inside.txt changed".into());
    }
    j.finish().await
}

/// Symlinks to a file outside, absolute and relative, at the root and deep down.
async fn symlinks_to_outside_files(app: &TestApp) -> Vec<String> {
    let mut j = Jail::new(app, "symlinked-files", |j| {
        fs::create_dir_all(j.at("a/b/c")).unwrap();
        symlink(j.outside.join("secret"), j.at("abs-link"));
        symlink(j.up("secret"), j.at("rel-link"));
        symlink(
            format!("../../../{}", j.up("secret")),
            j.at("a/b/c/deep-link"),
        );
    })
    .await;
    for link in ["abs-link", "rel-link", "a/b/c/deep-link"] {
        j.every_tool(link, SYMLINK_OR_OUTSIDE).await;
        j.refused("read_file", json!({"file_path": link}), OUTSIDE)
            .await;
        j.refused("grep", json!({"pattern": "SECRET", "path": link}), OUTSIDE)
            .await;
        j.refused("apply_patch", patch_delete(link), SYMLINK_OR_OUTSIDE)
            .await;
        if !fs::symlink_metadata(j.at(link)).is_ok_and(|m| m.file_type().is_symlink()) {
            j.fail(format!("{link} is no longer the symlink"));
        }
    }
    j.walks_stay_inside().await;
    j.finish().await
}

/// Symlinks to the outside directory, at any depth, absolute and relative, and through a chain
/// of links.
async fn symlinks_to_outside_dirs(app: &TestApp) -> Vec<String> {
    let mut j = Jail::new(app, "symlinked-dirs", |j| {
        fs::create_dir_all(j.at("a/b/c")).unwrap();
        fs::create_dir(j.at("inner")).unwrap();
        symlink(&j.outside, j.at("a/b/c/escape"));
        symlink(format!("../../../{}", j.up("")), j.at("a/b/c/rel-escape"));
        symlink(j.up(""), j.at("out"));
        symlink("../out", j.at("inner/via"));
    })
    .await;
    for dir in ["a/b/c/escape", "a/b/c/rel-escape", "out", "inner/via"] {
        j.every_tool(&format!("{dir}/secret"), OUTSIDE).await;
        j.every_tool(&format!("{dir}/sub/deeper"), OUTSIDE).await;
        j.every_dir_tool(dir, OUTSIDE).await;
        j.every_dir_tool(&format!("{dir}/sub"), OUTSIDE).await;
    }
    j.every_tool("/workspace/out/secret", OUTSIDE).await;
    j.walks_stay_inside().await;
    j.finish().await
}

/// Symlink loops: two links pointing at each other, and a link to itself.
async fn symlink_loops(app: &TestApp) -> Vec<String> {
    let mut j = Jail::new(app, "symlink-loop", |j| {
        symlink("loop-b", j.at("loop-a"));
        symlink("loop-a", j.at("loop-b"));
        symlink("self", j.at("self"));
    })
    .await;
    for path in ["loop-a", "self"] {
        j.every_tool(path, LOOP).await;
        j.every_tool(&format!("{path}/x.txt"), LOOP).await;
        j.every_dir_tool(path, LOOP).await;
    }
    j.walks_stay_inside().await;
    j.finish().await
}

/// `/proc/self/root` and `/proc/self/cwd`, given as paths and planted as symlinks.
async fn proc_self(app: &TestApp) -> Vec<String> {
    let mut j = Jail::new(app, "proc-self", |j| {
        symlink("/proc/self/root/etc/passwd", j.at("root-link"));
        symlink("/proc/self/cwd", j.at("cwd-link"));
        symlink(
            "../../../../../../../../../../proc/self/root/etc",
            j.at("rel-proc"),
        );
        symlink(
            format!("/proc/self/root{}", j.outside.display()),
            j.at("proc-out"),
        );
    })
    .await;
    let via_proc = format!("/proc/self/root{}", j.outside.display());
    for path in [
        "/proc/self/root/etc/passwd".to_owned(),
        "/proc/self/cwd/Cargo.toml".to_owned(),
        format!("{via_proc}/secret"),
        "root-link".to_owned(),
        "cwd-link/Cargo.toml".to_owned(),
        "rel-proc/passwd".to_owned(),
        "proc-out/secret".to_owned(),
    ] {
        j.every_tool(&path, SYMLINK_OR_OUTSIDE).await;
        j.refused("read_file", json!({"file_path": path}), OUTSIDE)
            .await;
    }
    for dir in [
        "/proc/self/root".to_owned(),
        "/proc/self/cwd".to_owned(),
        via_proc,
        "cwd-link".to_owned(),
        "rel-proc".to_owned(),
        "proc-out".to_owned(),
    ] {
        j.every_dir_tool(&dir, OUTSIDE).await;
    }
    let cwd = std::env::current_dir().unwrap();
    for name in ["new.txt", "sub/new.txt", "fresh/dirs/new.txt"] {
        if cwd.join(name).exists() {
            j.fail(format!(
                "{name} was created in the server's working directory"
            ));
        }
    }
    j.walks_stay_inside().await;
    j.finish().await
}

/// Over-long names and paths, and a file whose name is not UTF-8.
async fn over_long_and_non_utf8_names(app: &TestApp) -> Vec<String> {
    let mut j = Jail::new(app, "long-names", |j| {
        let name = std::ffi::OsStr::from_bytes(b"caf\xe9.txt");
        fs::write(j.ws.join(name), "latin-1 name\n").unwrap();
    })
    .await;
    let long_name = "n".repeat(256);
    let long_path = format!("{}x", "d/".repeat(2048));
    let long_escape = format!("{}{}", "../".repeat(1400), j.up("secret"));
    for path in [long_name, long_path, long_escape] {
        j.every_tool(&path, INVALID).await;
        j.every_dir_tool(&path, INVALID).await;
    }
    j.walks_stay_inside().await;
    j.workspace_holds(&[b"caf\xe9.txt", b"inside.txt"]);
    j.finish().await
}

/// NUL bytes in a path (JSON `\u0000`): invalid, refused, recorded, nothing created.
async fn nul_bytes(app: &TestApp) -> Vec<String> {
    let mut j = Jail::new(app, "nul-bytes", |_| {}).await;
    for path in [
        "a\0b".to_owned(),
        "\0".to_owned(),
        format!("inside.txt\0{}", j.up("secret")),
        format!("{}\0", j.up("secret")),
    ] {
        j.every_tool(&path, INVALID).await;
        j.every_dir_tool(&path, INVALID).await;
    }
    j.workspace_holds(&[b"inside.txt"]);
    j.finish().await
}

/// A FIFO (and a symlink to it) and a unix socket: refused, and nothing hangs.
async fn fifos_and_sockets(app: &TestApp) -> Vec<String> {
    let mut listener = None;
    let mut j = Jail::new(app, "fifo-socket", |j| {
        let made = std::process::Command::new("mkfifo")
            .arg(j.at("pipe"))
            .status()
            .unwrap();
        assert!(made.success(), "mkfifo");
        symlink("pipe", j.at("pipe-link"));
        listener = Some(std::os::unix::net::UnixListener::bind(j.at("sock")).unwrap());
    })
    .await;
    for path in ["pipe", "pipe-link", "sock"] {
        j.every_tool(path, &["not a regular file", "symbolic link"])
            .await;
        j.refused("read_file", json!({"file_path": path}), NOT_REGULAR)
            .await;
        j.refused("list_dir", json!({"path": path}), &["not a directory"])
            .await;
    }
    j.walks_stay_inside().await;
    // Unblock anything that did open the FIFO, so a failure here cannot hang the suite.
    let _ = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(j.at("pipe"));
    let pipe = fs::symlink_metadata(j.at("pipe")).unwrap().file_type();
    let sock = fs::symlink_metadata(j.at("sock")).unwrap().file_type();
    if !pipe.is_fifo() || !sock.is_socket() {
        j.fail(format!(
            "the FIFO or the socket was replaced: {pipe:?} {sock:?}"
        ));
    }
    drop(listener);
    j.finish().await
}

/// A hard link to the outside secret: never read, never written through. Replacing the link
/// itself by a copy is allowed, and leaves the outside file as it was.
async fn hard_links(app: &TestApp) -> Vec<String> {
    let mut j = Jail::new(app, "hard-link", |j| {
        fs::hard_link(j.outside.join("secret"), j.at("planted")).unwrap();
    })
    .await;
    j.refused("read_file", json!({"file_path": "planted"}), HARD_LINK)
        .await;
    j.refused("read_many_files", json!({"paths": ["planted"]}), HARD_LINK)
        .await;
    j.refused(
        "write_file",
        json!({"file_path": "planted", "content": "pwned\n"}),
        HARD_LINK,
    )
    .await;
    j.refused(
        "edit_file",
        json!({"file_path": "planted", "old_string": SECRET_MARK, "new_string": "pwned"}),
        HARD_LINK,
    )
    .await;
    j.refused("file_delete", json!({"path": "planted"}), HARD_LINK)
        .await;
    j.refused(
        "file_copy",
        json!({"source": "planted", "dest": "copied.txt"}),
        HARD_LINK,
    )
    .await;
    j.refused("apply_patch", patch_update("planted"), HARD_LINK)
        .await;
    j.refused("apply_patch", patch_delete("planted"), HARD_LINK)
        .await;
    j.no_leak("grep", json!({"pattern": SECRET_MARK, "path": "planted"}))
        .await;
    j.walks_stay_inside().await;
    if fs::metadata(j.outside.join("secret")).unwrap().nlink() != 2 {
        j.fail("the hard link is gone".into());
    }
    // Overwriting the name by a copy replaces the link, not the outside file.
    if let Some(copied) = j
        .send(
            "file_copy",
            json!({"source": "inside.txt", "dest": "planted", "overwrite": true}),
        )
        .await
    {
        if copied["status"] == "ok" {
            j.changing
                .push(copied["invocation_id"].as_str().unwrap().to_owned());
            if fs::read(j.at("planted")).unwrap() != b"inside\n"
                || fs::metadata(j.outside.join("secret")).unwrap().nlink() != 1
            {
                j.fail("the copy did not replace the link".into());
            }
            // Recorded as a change of `planted` whose old contents were never read.
            let events = app.events(&j.sid).await;
            let change: Vec<&Value> = events
                .iter()
                .filter(|e| e["invocation_id"] == copied["invocation_id"])
                .filter(|e| e["kind"].as_str().unwrap_or_default().starts_with("file."))
                .collect();
            let as_expected = change.len() == 1
                && change[0]["kind"] == "file.modified"
                && change[0]["data"]["path"] == "planted"
                && change[0]["data"]["before_sha256"].is_null()
                && change[0]["data"]["capability"] == "content_from_source";
            if !as_expected {
                j.fail(format!(
                    "the copy onto the hard link was recorded as {change:?}"
                ));
            }
        } else if copied["is_error"] != true {
            j.fail(format!("file_copy onto the hard link: {copied}"));
        }
    }
    j.finish().await
}

/// A 100 GiB sparse file: refused quickly by everything that would read it whole.
async fn huge_sparse_file(app: &TestApp) -> Vec<String> {
    const SIZE: u64 = 100 << 30;
    let mut j = Jail::new(app, "huge-file", |j| {
        fs::File::create(j.at("huge.bin"))
            .unwrap()
            .set_len(SIZE)
            .unwrap();
    })
    .await;
    let started = Instant::now();
    for (tool, args) in [
        ("read_file", json!({"file_path": "huge.bin"})),
        ("read_many_files", json!({"paths": ["huge.bin"]})),
        (
            "write_file",
            json!({"file_path": "huge.bin", "content": "small now\n"}),
        ),
        (
            "edit_file",
            json!({"file_path": "huge.bin", "old_string": "x", "new_string": "y"}),
        ),
        ("file_delete", json!({"path": "huge.bin"})),
        ("apply_patch", patch_delete("huge.bin")),
    ] {
        j.refused(tool, args, TOO_LARGE).await;
    }
    j.no_leak("grep", json!({"pattern": "x", "path": "huge.bin"}))
        .await;
    j.walks_stay_inside().await;
    let elapsed = started.elapsed();
    if elapsed > Duration::from_secs(20) {
        j.fail(format!("the refusals took {elapsed:?}"));
    }
    if fs::metadata(j.at("huge.bin")).unwrap().len() != SIZE {
        j.fail("huge.bin changed".into());
    }
    j.finish().await
}

/// Symlinks that stay inside are never written through, and an absolute one is never followed.
async fn symlinks_inside(app: &TestApp) -> Vec<String> {
    let mut j = Jail::new(app, "symlinks-inside", |j| {
        fs::write(j.at("real.txt"), "original\n").unwrap();
        symlink("real.txt", j.at("link.txt"));
        symlink("missing.txt", j.at("dangling.txt"));
        symlink(j.at("real.txt"), j.at("abs-inside"));
    })
    .await;
    for path in ["link.txt", "dangling.txt"] {
        j.refused(
            "write_file",
            json!({"file_path": path, "content": "pwned\n"}),
            &["symbolic link"],
        )
        .await;
        j.refused("file_delete", json!({"path": path}), &["symbolic link"])
            .await;
    }
    j.every_tool("abs-inside", SYMLINK_OR_OUTSIDE).await;
    j.refused("read_file", json!({"file_path": "abs-inside"}), OUTSIDE)
        .await;
    if fs::read(j.at("real.txt")).unwrap() != b"original\n" || j.at("missing.txt").exists() {
        j.fail("written through a symlink".into());
    }
    j.finish().await
}

/// `file_delete` deletes one regular file: not a directory, not the root.
async fn deleting_directories(app: &TestApp) -> Vec<String> {
    let mut j = Jail::new(app, "delete-dirs", |j| {
        fs::create_dir_all(j.at("dir/inner")).unwrap();
        fs::write(j.at("dir/inner/f"), "x").unwrap();
    })
    .await;
    for path in [
        "dir",
        "dir/inner",
        ".",
        "/workspace",
        "/workspace/",
        "dir/..",
    ] {
        j.refused("file_delete", json!({"path": path}), DIRECTORY)
            .await;
        j.refused("apply_patch", patch_delete(path), DIRECTORY)
            .await;
    }
    if !j.at("dir/inner/f").exists() {
        j.fail("dir/inner/f was deleted".into());
    }
    j.finish().await
}

/// Another session's workspace is outside too, by `..`, by host path and through a symlink; the
/// other session's files and log are untouched.
async fn another_sessions_workspace(app: &TestApp) -> Vec<String> {
    let other = app
        .session(json!({"files": {"theirs.txt": "another session's file\n"}}))
        .await;
    let other_sid = other["id"].as_str().unwrap().to_owned();
    let other_ws = app.data.path().join("workspaces").join(&other_sid);
    let other_before = snapshot(&other_ws);
    let mut j = Jail::new(app, "other-session", |j| {
        symlink(format!("../{other_sid}"), j.at("peer"));
    })
    .await;
    for path in [
        format!("../{other_sid}/theirs.txt"),
        format!("/workspace/../{other_sid}/theirs.txt"),
        other_ws.join("theirs.txt").to_str().unwrap().to_owned(),
        "peer/theirs.txt".to_owned(),
    ] {
        j.every_tool(&path, OUTSIDE).await;
    }
    for dir in [format!("../{other_sid}"), "peer".to_owned()] {
        j.every_dir_tool(&dir, OUTSIDE).await;
    }
    if snapshot(&other_ws) != other_before {
        j.fail("the other session's workspace changed".into());
    }
    let theirs: Vec<String> = app
        .events(&other_sid)
        .await
        .iter()
        .map(|e| e["kind"].as_str().unwrap_or_default().to_owned())
        .collect();
    if theirs != ["session.created", "file.created"] {
        j.fail(format!("the other session's log is {theirs:?}"));
    }
    j.finish().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_attack_on_the_jail_over_http_is_refused_recorded_and_changes_nothing_outside() {
    let app = spawn_app().await;
    let mut failures = Vec::new();
    failures.extend(dot_dot_escapes(&app).await);
    failures.extend(absolute_paths(&app).await);
    failures.extend(symlinks_to_outside_files(&app).await);
    failures.extend(symlinks_to_outside_dirs(&app).await);
    failures.extend(symlink_loops(&app).await);
    failures.extend(proc_self(&app).await);
    failures.extend(over_long_and_non_utf8_names(&app).await);
    failures.extend(fifos_and_sockets(&app).await);
    failures.extend(hard_links(&app).await);
    failures.extend(huge_sparse_file(&app).await);
    failures.extend(symlinks_inside(&app).await);
    failures.extend(deleting_directories(&app).await);
    failures.extend(another_sessions_workspace(&app).await);

    // Still healthy, and still serving.
    let health = app.get("/healthz").await;
    assert_eq!(health.status(), 200, "healthz after the attacks");
    let ready = app.get("/readyz").await;
    assert_eq!(ready.status(), 200, "readyz after the attacks");
    let sid = app.session(json!({"files": {"a.txt": "a\n"}})).await["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let r = app
        .call(&sid, "after", "read_file", json!({"file_path": "a.txt"}))
        .await;
    assert_eq!(r["status"], "ok", "{r}");

    assert!(
        failures.is_empty(),
        "{} jail failures over HTTP:\n\n{}",
        failures.len(),
        failures.join("\n\n")
    );
}

/// A `\u0000` anywhere in a call's arguments is refused as `invalid_arguments` by the engine
/// (no database text type holds it) and recorded without it — not a `503` from Postgres.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_nul_byte_in_a_path_is_refused_as_invalid_and_recorded_over_http() {
    let app = spawn_app().await;
    let failures = nul_bytes(&app).await;
    assert_eq!(app.get("/healthz").await.status(), 200);
    assert!(
        failures.is_empty(),
        "{} failures over HTTP:\n\n{}",
        failures.len(),
        failures.join("\n\n")
    );
}

/// What the outside file hard-linked into the property's workspace (as `hard`) holds.
const LINKED: &str = "LINKED: outside the workspace, hard-linked in\n";

/// Path components of the property, repeated by weight: real names, `.`/`..`/empty, the
/// symlinks and the hard link of its layout, and `OUT`/`WS` (the outside directory's and the
/// workspace's own names, filled in per session).
const COMPONENTS: [&str; 24] = [
    "a", "a", "a", "b", "b", "f", "f", "..", "..", "..", ".", "", "new", "secret", "in_dir",
    "in_file", "out_dir", "out_abs", "out_file", "up", "loop", "hard", "OUT", "WS",
];

/// Paths worth starting from: into the workspace through symlinks or not, and out of it.
const KNOWN: [&str; 22] = [
    "f",
    "a/f",
    "a/b/f",
    "a",
    "a/b",
    "new/x",
    "in_file",
    "in_dir/f",
    "in_dir/../f",
    "in_dir/../../f",
    "a/up/f",
    "a/b/../f",
    "hard",
    "loop",
    "out_file",
    "out_dir/secret",
    "out_dir/new",
    "out_abs/secret",
    "up/OUT/secret",
    "up/WS/f",
    "a/b/esc/OUT/secret",
    "../OUT/secret",
];

/// Where a generated path starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Prefix {
    Relative,
    Dot,
    Workspace,
    /// `/workspace` glued to the first component: `/workspacea` is not under it.
    WorkspaceGlued,
    Workspaces,
    DoubleSlash,
    /// The workspace's own host path: the model only ever sees `/workspace`.
    HostRoot,
    HostOutside,
    /// `/proc/self/root` + the host path outside.
    ProcRoot,
    /// `/etc/`: only for calls that cannot change anything.
    Etc,
}

/// Prefixes a changing call may get (all but [`Prefix::Etc`]), repeated by weight.
const WRITABLE_PREFIXES: [Prefix; 20] = [
    Prefix::Relative,
    Prefix::Relative,
    Prefix::Relative,
    Prefix::Relative,
    Prefix::Relative,
    Prefix::Relative,
    Prefix::Relative,
    Prefix::Relative,
    Prefix::Dot,
    Prefix::Workspace,
    Prefix::Workspace,
    Prefix::Workspace,
    Prefix::Workspace,
    Prefix::WorkspaceGlued,
    Prefix::Workspaces,
    Prefix::DoubleSlash,
    Prefix::HostRoot,
    Prefix::HostOutside,
    Prefix::ProcRoot,
    Prefix::ProcRoot,
];

#[derive(Debug, Clone)]
struct GenPath {
    prefix: Prefix,
    components: Vec<&'static str>,
}

impl GenPath {
    fn render(&self, j: &Jail) -> String {
        let outside = j.outside.to_str().unwrap();
        let prefix = match self.prefix {
            Prefix::Relative => String::new(),
            Prefix::Dot => "./".into(),
            Prefix::Workspace => "/workspace/".into(),
            Prefix::WorkspaceGlued => "/workspace".into(),
            Prefix::Workspaces => "/workspaces/".into(),
            Prefix::DoubleSlash => "//workspace/".into(),
            Prefix::HostRoot => format!("{}/", j.ws.display()),
            Prefix::HostOutside => format!("{outside}/"),
            Prefix::ProcRoot => format!("/proc/self/root{outside}/"),
            Prefix::Etc => "/etc/".into(),
        };
        let out_name = j.outside.file_name().unwrap().to_str().unwrap();
        let components: Vec<&str> = self
            .components
            .iter()
            .map(|c| match *c {
                "OUT" => out_name,
                "WS" => j.sid.as_str(),
                c => c,
            })
            .collect();
        format!("{prefix}{}", components.join("/"))
    }
}

#[derive(Debug, Clone)]
enum Op {
    Read(GenPath),
    List(GenPath),
    Grep(GenPath),
    Write(GenPath),
    Delete(GenPath),
    Copy(GenPath, GenPath),
}

fn gen_path(prefixes: Vec<Prefix>) -> impl Strategy<Value = GenPath> {
    let component = prop::sample::select(COMPONENTS.to_vec());
    let random = prop::collection::vec(component.clone(), 0..5);
    let mutated = (
        prop::sample::select(KNOWN.to_vec()),
        prop::collection::vec((any::<prop::sample::Index>(), component), 0..2),
    )
        .prop_map(|(known, inserts)| {
            let mut components: Vec<&'static str> = known.split('/').collect();
            for (at, component) in inserts {
                components.insert(at.index(components.len() + 1), component);
            }
            components
        });
    (
        prop::sample::select(prefixes),
        prop_oneof![1 => random, 4 => mutated],
    )
        .prop_map(|(prefix, components)| GenPath { prefix, components })
}

fn any_path() -> impl Strategy<Value = GenPath> {
    let mut prefixes = WRITABLE_PREFIXES.to_vec();
    prefixes.push(Prefix::Etc);
    gen_path(prefixes)
}

fn writable_path() -> impl Strategy<Value = GenPath> {
    gen_path(WRITABLE_PREFIXES.to_vec())
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        any_path().prop_map(Op::Read),
        any_path().prop_map(Op::List),
        any_path().prop_map(Op::Grep),
        writable_path().prop_map(Op::Write),
        writable_path().prop_map(Op::Delete),
        (writable_path(), writable_path()).prop_map(|(s, d)| Op::Copy(s, d)),
    ]
}

/// Whether the jail must refuse `path` as outside: absolute and not `/workspace` or under it.
fn absolute_elsewhere(path: &str) -> bool {
    match path.strip_prefix('/') {
        None => false,
        Some(rest) => match rest.strip_prefix("workspace") {
            Some(under) => !(under.is_empty() || under.starts_with('/')),
            None => true,
        },
    }
}

/// One property case: a session over the layout of `path_props.rs`, its files read first, then
/// `ops` over HTTP. Returns the failures.
///
/// ```text
/// f  a/f  a/b/f                    regular files
/// in_dir -> a/b   in_file -> a/f   a/up -> ..        symlinks that stay inside
/// out_dir -> ../OUT   out_abs -> <host OUT>   out_file -> ../OUT/secret
/// up -> ..   a/b/esc -> ../../..   loop -> loop      symlinks that lead out, a loop
/// hard                             hard link to OUT/linked
/// ```
async fn run_ops(app: &TestApp, ops: &[Op]) -> Vec<String> {
    let mut j = Jail::new(app, "property", |j| {
        fs::write(j.outside.join("linked"), LINKED).unwrap();
        fs::create_dir_all(j.at("a/b")).unwrap();
        fs::write(j.at("f"), "root f\n").unwrap();
        fs::write(j.at("a/f"), "a/f\n").unwrap();
        fs::write(j.at("a/b/f"), "a/b/f\n").unwrap();
        symlink("a/b", j.at("in_dir"));
        symlink("a/f", j.at("in_file"));
        symlink("..", j.at("a/up"));
        symlink(j.up(""), j.at("out_dir"));
        symlink(&j.outside, j.at("out_abs"));
        symlink(j.up("secret"), j.at("out_file"));
        symlink("..", j.at("up"));
        symlink("../../..", j.at("a/b/esc"));
        symlink("loop", j.at("loop"));
        fs::hard_link(j.outside.join("linked"), j.at("hard")).unwrap();
    })
    .await;
    // Read-before-write is part of the setup: writes to the files can then succeed.
    j.send("read_many_files", json!({"paths": ["f", "a/f", "a/b/f"]}))
        .await;
    for op in ops {
        let (tool, args, refused_as_outside) = match op {
            Op::Read(p) => {
                let p = p.render(&j);
                ("read_file", json!({"file_path": p}), absolute_elsewhere(&p))
            }
            Op::List(p) => {
                let p = p.render(&j);
                (
                    "list_dir",
                    json!({"path": p, "depth": 3}),
                    absolute_elsewhere(&p),
                )
            }
            Op::Grep(p) => {
                let p = p.render(&j);
                let args = json!({"pattern": "SECRET|LINKED", "path": p});
                ("grep", args, absolute_elsewhere(&p))
            }
            Op::Write(p) => {
                let p = p.render(&j);
                let args = json!({"file_path": p, "content": "written by the property\n"});
                ("write_file", args, absolute_elsewhere(&p))
            }
            Op::Delete(p) => {
                let p = p.render(&j);
                ("file_delete", json!({"path": p}), absolute_elsewhere(&p))
            }
            Op::Copy(s, d) => {
                let (s, d) = (s.render(&j), d.render(&j));
                let args = json!({"source": s, "dest": d, "overwrite": true});
                // The source is resolved first: a bad dest is only reached past a good source.
                // (An empty path fails the schema before either is resolved.)
                ("file_copy", args, absolute_elsewhere(&s))
            }
        };
        let Some(result) = j.send(tool, args.clone()).await else {
            continue;
        };
        let content = result["content"].as_str().unwrap_or_default();
        if content.contains(LINKED.trim_end()) || content.contains(OUTSIDE_ONLY_NAME) {
            j.fail(format!(
                "{tool} {args}: shows something from outside: {content}"
            ));
        }
        if result["status"] == "ok" {
            if refused_as_outside {
                j.fail(format!("{tool} {args}: not refused: {content}"));
            }
            if matches!(tool, "write_file" | "file_delete" | "file_copy") {
                j.changing
                    .push(result["invocation_id"].as_str().unwrap().to_owned());
            }
        } else if refused_as_outside
            && result["status"] != "invalid_arguments"
            && !content.contains("outside the workspace")
        {
            j.fail(format!("{tool} {args}: not refused as outside: {content}"));
        } else if result["is_error"] == true {
            j.refused.push(result);
        }
        let now = snapshot(&j.outside);
        if now != j.before {
            j.fail(format!("after {tool} {args}, the outside changed"));
            break;
        }
    }
    j.finish().await
}

/// Random paths from a hostile alphabet through the file tools over HTTP, one session each on
/// one server: each call stays inside or is refused (as outside, when it is absolute
/// elsewhere), nothing outside changes, every change recorded names a real file inside, and
/// every refusal is recorded.
#[test]
fn random_hostile_paths_over_http_stay_inside_or_are_refused() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .unwrap();
    let app = runtime.block_on(spawn_app());
    let mut runner = TestRunner::new(ProptestConfig {
        cases: 64,
        failure_persistence: None,
        ..ProptestConfig::default()
    });
    let outcome = runner.run(&prop::collection::vec(op(), 1..5), |ops| {
        let failures = runtime.block_on(run_ops(&app, &ops));
        prop_assert!(failures.is_empty(), "{}", failures.join("\n"));
        Ok(())
    });
    if let Err(e) = outcome {
        panic!("{e}");
    }
    drop(app);
}
