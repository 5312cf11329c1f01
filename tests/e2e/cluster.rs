//! Three replicas of the compiled binary on one Postgres, behind nginx configured with the
//! example gateway's proxy settings (`deploy/gateway/toolexec-proxy.conf`) and round-robin over
//! the replicas: sessions created and used through the gateway run on the node they live on
//! (the others forward to it); `kill -9` of a node mid-call, then the next calls through the
//! gateway continue its sessions on another node with the workspace as the log last recorded it
//! and the log gapless; a SIGTERM drain hands a node's sessions over with no call lost or run
//! twice.
//!
//! Needs `nginx` on the PATH (Debian: `apt-get install nginx-light`; `.ci/run` installs it).
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use toolexec_tests::binary::{toolexec, toolexec_binary};
use toolexec_tests::db::TestPgDatabase;

/// Lease TTL of the replicas: a dead node's sessions are taken over within about this long.
const TTL_MS: u64 = 2_000;

/// A free port on loopback (bound, then let go: the replica binds it a moment later).
fn free_port() -> u16 {
    free_port_on("127.0.0.1")
}

/// A free port on the loopback address `ip`.
fn free_port_on(ip: &str) -> u16 {
    let l = std::net::TcpListener::bind((ip, 0)).unwrap();
    l.local_addr().unwrap().port()
}

/// One replica: `toolexec serve` with its own data directory (node-local workspaces).
struct Replica {
    name: String,
    /// The loopback address it is bound to.
    ip: String,
    port: u16,
    child: Option<Child>,
    log: PathBuf,
    _data: tempfile::TempDir,
}

impl Replica {
    fn start(name: &str, db: &TestPgDatabase, dir: &Path) -> Self {
        Self::start_with(name, db, dir, &[])
    }

    /// Like [`Replica::start`], with more settings in the environment.
    fn start_with(name: &str, db: &TestPgDatabase, dir: &Path, env: &[(&str, &str)]) -> Self {
        Self::start_on("127.0.0.1", name, db, dir, env)
    }

    /// Like [`Replica::start_with`], bound to (and advertising) the loopback address `ip`.
    fn start_on(
        ip: &str,
        name: &str,
        db: &TestPgDatabase,
        dir: &Path,
        env: &[(&str, &str)],
    ) -> Self {
        let data = tempfile::tempdir().unwrap();
        let port = free_port_on(ip);
        let log = dir.join(format!("{name}.log"));
        let mut cmd = toolexec(data.path());
        cmd.arg("serve")
            .env("TOOLEXEC_BIND", format!("{ip}:{port}"))
            .env("TOOLEXEC_DATABASE_URL", db.url())
            .env("TOOLEXEC_DATA_DIR", data.path())
            .env("TOOLEXEC_NODE", name)
            .env(
                "TOOLEXEC_CLUSTER__ADVERTISE_URL",
                format!("http://{ip}:{port}"),
            )
            .env("TOOLEXEC_LIMITS__LEASE_TTL_MS", TTL_MS.to_string())
            .env("TOOLEXEC_LOG_FORMAT", "json")
            .env("RUST_LOG", "info")
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap());
        let child = cmd.spawn().expect("spawning toolexec");
        let r = Self {
            name: name.to_owned(),
            ip: ip.to_owned(),
            port,
            child: Some(child),
            log,
            _data: data,
        };
        r.wait_listening();
        r
    }

    fn wait_listening(&self) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline {
            let text = std::fs::read_to_string(&self.log).unwrap_or_default();
            if text.contains("\"listening\"") {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!(
            "{} did not start:\n{}",
            self.name,
            std::fs::read_to_string(&self.log).unwrap_or_default()
        );
    }

    fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            c.kill().unwrap();
            c.wait().unwrap();
        }
    }

    fn signal(&self, signal: rustix::process::Signal) {
        let child = self.child.as_ref().expect("running");
        let pid = rustix::process::Pid::from_raw(child.id() as i32).unwrap();
        rustix::process::kill_process(pid, signal).unwrap();
    }

    /// SIGTERM; the replica drains and exits by itself.
    fn terminate(&mut self) -> Child {
        let child = self.child.take().expect("running");
        let pid = rustix::process::Pid::from_raw(child.id() as i32).unwrap();
        rustix::process::kill_process(pid, rustix::process::Signal::TERM).unwrap();
        child
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// nginx in front of the replicas: the example gateway's proxy settings, round robin.
struct Gateway {
    child: Child,
    port: u16,
}

impl Gateway {
    fn start(dir: &Path, replicas: &[&Replica]) -> Self {
        let nginx = which("nginx").expect(
            "nginx is needed for the cluster test (Debian: apt-get install nginx-light; .ci/run installs it)",
        );
        let port = free_port();
        let proxy = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../deploy/gateway/toolexec-proxy.conf")
            .canonicalize()
            .unwrap();
        let servers: String = replicas
            .iter()
            .map(|r| {
                format!(
                    "        server 127.0.0.1:{} max_fails=1 fail_timeout=5s;\n",
                    r.port
                )
            })
            .collect();
        let d = dir.display();
        let conf = format!(
            "daemon off;\nworker_processes 1;\npid {d}/nginx.pid;\nerror_log {d}/nginx-error.log warn;\n\
             events {{ worker_connections 512; }}\n\
             http {{\n    access_log off;\n\
                 client_body_temp_path {d}/body; proxy_temp_path {d}/proxy;\n\
                 fastcgi_temp_path {d}/fastcgi; uwsgi_temp_path {d}/uwsgi; scgi_temp_path {d}/scgi;\n\
                 map $http_x_request_id $toolexec_request_id {{\n        \"~^[A-Za-z0-9._:-]{{1,128}}$\" $http_x_request_id;\n        default $request_id;\n    }}\n\
                 upstream toolexec {{\n{servers}        keepalive 16;\n    }}\n\
                 server {{\n        listen 127.0.0.1:{port};\n        client_max_body_size 16m;\n\
                 location / {{\n            include {};\n        }}\n    }}\n}}\n",
            proxy.display()
        );
        let path = dir.join("nginx.conf");
        std::fs::write(&path, conf).unwrap();
        let child = Command::new(nginx)
            .arg("-c")
            .arg(&path)
            .arg("-p")
            .arg(dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "nginx did not start");
            std::thread::sleep(Duration::from_millis(50));
        }
        Self { child, port }
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn which(name: &str) -> Option<PathBuf> {
    [
        "/usr/sbin",
        "/usr/bin",
        "/usr/local/sbin",
        "/usr/local/bin",
        "/sbin",
        "/bin",
    ]
    .iter()
    .map(|d| Path::new(d).join(name))
    .find(|p| p.is_file())
}

struct Client {
    http: reqwest::Client,
    base: String,
}

impl Client {
    async fn post(&self, path: &str, body: &Value) -> (u16, Value) {
        let resp = self
            .http
            .post(format!("{}{path}", self.base))
            .json(body)
            .send()
            .await
            .unwrap();
        let status = resp.status().as_u16();
        (status, resp.json().await.unwrap_or(Value::Null))
    }

    async fn get(&self, path: &str) -> Value {
        self.http
            .get(format!("{}{path}", self.base))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap()
    }

    /// One call through the gateway, retried (same id) while the answer is a 503: what a
    /// client does when a node goes away.
    async fn call(&self, sid: &str, id: &str, name: &str, args: Value) -> Value {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let (status, body) = self
                .post(
                    &format!("/v1/sessions/{sid}/calls"),
                    &json!({"calls": [{"id": id, "name": name, "arguments": args}]}),
                )
                .await;
            if status == 200 {
                return body["results"][0].clone();
            }
            assert!(
                (status == 503 || status == 502) && Instant::now() < deadline,
                "{id}: HTTP {status}: {body}"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

/// Which node each session lives on, and which node ran each of its calls, from the database.
async fn placement(db: &TestPgDatabase) -> (HashMap<String, String>, Vec<(String, String)>) {
    let pool = sqlx::PgPool::connect(db.url()).await.unwrap();
    let owners: Vec<(uuid::Uuid, String)> =
        sqlx::query_as("SELECT session_id, node FROM session_leases")
            .fetch_all(&pool)
            .await
            .unwrap();
    let ran: Vec<(uuid::Uuid, String)> = sqlx::query_as("SELECT session_id, node FROM invocations")
        .fetch_all(&pool)
        .await
        .unwrap();
    pool.close().await;
    (
        owners
            .into_iter()
            .map(|(s, n)| (s.to_string(), n))
            .collect(),
        ran.into_iter().map(|(s, n)| (s.to_string(), n)).collect(),
    )
}

/// The node that ran one call.
async fn ran_on(db: &TestPgDatabase, sid: &str, call_id: &str) -> String {
    let pool = sqlx::PgPool::connect(db.url()).await.unwrap();
    let node: String =
        sqlx::query_scalar("SELECT node FROM invocations WHERE session_id = $1 AND call_id = $2")
            .bind(uuid::Uuid::parse_str(sid).unwrap())
            .bind(call_id)
            .fetch_one(&pool)
            .await
            .unwrap();
    pool.close().await;
    node
}

/// The workspace as the log's latest state has it (path → sha256), from `GET …/tree`.
async fn tree_of_log(c: &Client, sid: &str) -> BTreeMap<String, String> {
    let tree = c.get(&format!("/v1/sessions/{sid}/tree?limit=1000")).await;
    tree["entries"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["kind"] == "file")
        .map(|e| {
            (
                e["path"].as_str().unwrap().to_owned(),
                e["sha256"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

/// The workspace as it is on the node serving the session, hashed by a command.
async fn tree_on_disk(c: &Client, sid: &str, id: &str) -> BTreeMap<String, String> {
    let r = c
        .call(
            sid,
            id,
            "shell",
            json!({"command": "find . -type f -printf '%P\\n' | sort | while read f; do printf '%s %s\\n' \"$(sha256sum \"$f\" | cut -d' ' -f1)\" \"$f\"; done"}),
        )
        .await;
    assert_eq!(r["status"], "ok", "{r}");
    let out = r["content"].as_str().unwrap();
    let listing = out
        .split("--- stdout ---\n")
        .nth(1)
        .unwrap_or("")
        .split("--- stderr ---")
        .next()
        .unwrap_or("");
    listing
        .lines()
        .filter_map(|l| l.split_once(' '))
        .map(|(h, p)| (p.to_owned(), h.to_owned()))
        .collect()
}

/// Every seq from 1 to the last, once.
async fn assert_gapless(c: &Client, sid: &str) -> Vec<Value> {
    let page = c
        .get(&format!("/v1/sessions/{sid}/events?after=0&limit=1000"))
        .await;
    let events = page["events"].as_array().unwrap().clone();
    let seqs: Vec<i64> = events.iter().map(|e| e["seq"].as_i64().unwrap()).collect();
    assert_eq!(
        seqs,
        (1..=seqs.len() as i64).collect::<Vec<_>>(),
        "the log of {sid} has a gap"
    );
    events
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn replicas_behind_the_gateway_forward_take_over_and_drain() {
    toolexec_tools::web::install_tls_provider();
    assert!(toolexec_binary().is_file());
    let db = TestPgDatabase::create().await;
    let dir = tempfile::tempdir().unwrap();
    let mut nodes: Vec<Replica> = ["n0", "n1", "n2"]
        .iter()
        .map(|n| Replica::start(n, &db, dir.path()))
        .collect();
    let gateway = Gateway::start(dir.path(), &nodes.iter().collect::<Vec<_>>());
    let c = Client {
        http: reqwest::Client::new(),
        base: format!("http://127.0.0.1:{}", gateway.port),
    };

    // Sessions made through the gateway land on every node (round robin).
    let mut sessions = Vec::new();
    for i in 0..6 {
        let (status, s) = c.post("/v1/sessions", &json!({"metadata": {"i": i}})).await;
        assert_eq!(status, 201, "{s}");
        sessions.push(s["id"].as_str().unwrap().to_owned());
    }
    // Used through the gateway: every request of a session reaches some node, and runs on
    // the one it lives on.
    for (i, sid) in sessions.iter().enumerate() {
        for (k, (name, args)) in [
            (
                "write_file",
                json!({"file_path": "a.txt", "content": format!("session {i}\n")}),
            ),
            (
                "shell",
                json!({"command": format!("echo {i} > b.txt; mkdir -p d; echo deep > d/c.txt")}),
            ),
            ("read_file", json!({"file_path": "b.txt"})),
        ]
        .into_iter()
        .enumerate()
        {
            let r = c.call(sid, &format!("c{k}"), name, args).await;
            assert_eq!(r["status"], "ok", "{r}");
        }
    }
    let (owners, ran) = placement(&db).await;
    let homes: std::collections::HashSet<&String> = sessions.iter().map(|s| &owners[s]).collect();
    assert_eq!(homes.len(), 3, "sessions on every node: {owners:?}");
    for (session, node) in &ran {
        assert_eq!(
            &owners[session], node,
            "a call of {session} ran off its node"
        );
    }

    // kill -9 of a node while a call of one of its sessions runs.
    let victim_sid = sessions[0].clone();
    let victim = owners[&victim_sid].clone();
    // A persistent shell with state on the node when it dies: the next bash call says it
    // was lost with the node.
    let sh = c
        .call(
            &victim_sid,
            "sh-before",
            "bash",
            json!({"command": "mkdir -p d && cd d && export ON_VICTIM=1"}),
        )
        .await;
    assert_eq!(sh["status"], "ok", "{sh}");
    // A terminal alive on the node when it dies: recorded as ended by the take-over.
    let term = c
        .call(
            &victim_sid,
            "term",
            "exec_command",
            json!({"cmd": "cat", "tty": true, "yield_time_ms": 250}),
        )
        .await;
    assert!(
        term["content"]
            .as_str()
            .unwrap()
            .contains("Process running with session ID"),
        "{term}"
    );
    let running = {
        let (http, base, sid) = (c.http.clone(), c.base.clone(), victim_sid.clone());
        tokio::spawn(async move {
            http.post(format!("{base}/v1/sessions/{sid}/calls"))
                .json(&json!({"calls": [{"id": "long", "name": "shell", "arguments": {"command": "echo started > started.txt; sleep 30", "timeout_ms": 60000}}]}))
                .send()
                .await
                .map(|r| r.status().as_u16())
        })
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let events = c
            .get(&format!(
                "/v1/sessions/{victim_sid}/events?after=0&limit=1000"
            ))
            .await;
        if events["events"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["kind"] == "invocation.started" && e["data"]["call_id"] == "long")
        {
            break;
        }
        assert!(Instant::now() < deadline, "the long call never started");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let killed = Instant::now();
    nodes.iter_mut().find(|n| n.name == victim).unwrap().kill9();
    let _ = running.await;
    // The next call through the gateway continues the session on another node.
    let r = c
        .call(
            &victim_sid,
            "after-kill",
            "shell",
            json!({"command": "cat a.txt b.txt d/c.txt"}),
        )
        .await;
    let took = killed.elapsed();
    assert_eq!(r["status"], "ok", "{r}");
    let content = r["content"].as_str().unwrap();
    assert!(
        content.contains("session 0") && content.contains("deep"),
        "{content}"
    );
    // The call that was running is recorded interrupted; a retry of it runs nothing.
    let again = c
        .call(
            &victim_sid,
            "long",
            "shell",
            json!({"command": "echo started > started.txt; sleep 30", "timeout_ms": 60000}),
        )
        .await;
    assert_eq!(again["status"], "interrupted", "{again}");
    let sh = c
        .call(
            &victim_sid,
            "sh-after",
            "bash",
            json!({"command": "pwd; echo \"[$ON_VICTIM]\""}),
        )
        .await;
    let text = sh["content"].as_str().unwrap();
    assert!(
        text.starts_with(
            "[the shell was restarted, state was lost: this node took the session over"
        ) && text.ends_with("/workspace\n[]\n"),
        "{sh}"
    );
    let events = assert_gapless(&c, &victim_sid).await;
    let taken = events
        .iter()
        .find(|e| e["kind"] == "session.taken_over")
        .expect("a session.taken_over event");
    assert_eq!(taken["data"]["from_node"], victim.as_str(), "{taken}");
    assert!(
        events.iter().any(|e| e["kind"] == "terminal.exited"
            && e["data"]["killed_by"] == "the session moved to another node"),
        "no terminal.exited for the terminal of the node that died"
    );
    assert_ne!(taken["data"]["node"], victim.as_str());
    let (owners_now, _) = placement(&db).await;
    assert_ne!(owners_now[&victim_sid], victim);
    // The workspace is byte for byte the log's latest state (started.txt, written by the
    // interrupted command before the kill, was never recorded and is not there).
    let log_tree = tree_of_log(&c, &victim_sid).await;
    let disk = tree_on_disk(&c, &victim_sid, "hash-after-kill").await;
    assert_eq!(disk, log_tree, "workspace vs log after the takeover");
    eprintln!("takeover after kill -9: next call answered {took:?} after the kill");

    // The other sessions of the dead node continue too.
    for sid in sessions
        .iter()
        .filter(|s| owners[*s] == victim && **s != victim_sid)
    {
        let r = c
            .call(
                sid,
                "after-kill",
                "read_file",
                json!({"file_path": "a.txt"}),
            )
            .await;
        assert_eq!(r["status"], "ok", "{r}");
    }

    // A node that freezes (SIGSTOP) keeps its connections open and answers nothing: a request
    // forwarded to it is given up once its heartbeat is old, and its session is taken over.
    // Back (SIGCONT), it forwards the session's calls to where it now lives instead of taking
    // it back.
    let (owners, _) = placement(&db).await;
    let frozen_sid = sessions
        .iter()
        .find(|s| owners[*s] != victim)
        .unwrap()
        .clone();
    let frozen = owners[&frozen_sid].clone();
    let heir = nodes
        .iter()
        .find(|n| n.name != victim && n.name != frozen)
        .unwrap();
    let (heir_name, heir_port) = (heir.name.clone(), heir.port);
    let frozen_port = nodes.iter().find(|n| n.name == frozen).unwrap().port;
    let takeovers = |events: &[Value]| {
        events
            .iter()
            .filter(|e| e["kind"] == "session.taken_over")
            .count()
    };
    let before = takeovers(&assert_gapless(&c, &frozen_sid).await);
    let direct = |port: u16| Client {
        http: c.http.clone(),
        base: format!("http://127.0.0.1:{port}"),
    };
    nodes
        .iter()
        .find(|n| n.name == frozen)
        .unwrap()
        .signal(rustix::process::Signal::STOP);
    let r = direct(heir_port)
        .call(
            &frozen_sid,
            "while-frozen",
            "read_file",
            json!({"file_path": "a.txt"}),
        )
        .await;
    assert_eq!(r["status"], "ok", "{r}");
    assert_eq!(ran_on(&db, &frozen_sid, "while-frozen").await, heir_name);
    nodes
        .iter()
        .find(|n| n.name == frozen)
        .unwrap()
        .signal(rustix::process::Signal::CONT);
    let r = direct(frozen_port)
        .call(
            &frozen_sid,
            "after-thaw",
            "read_file",
            json!({"file_path": "a.txt"}),
        )
        .await;
    assert_eq!(r["status"], "ok", "{r}");
    assert_eq!(ran_on(&db, &frozen_sid, "after-thaw").await, heir_name);
    let events = assert_gapless(&c, &frozen_sid).await;
    assert_eq!(
        takeovers(&events),
        before + 1,
        "taken over once, not taken back"
    );

    // A SIGTERM drain: a node with sessions stops while one of its calls runs; the call ends
    // and is recorded, and calls sent meanwhile run once, on the node that takes over.
    let (owners, _) = placement(&db).await;
    let drained_sid = sessions
        .iter()
        .find(|s| owners[*s] != victim)
        .unwrap()
        .clone();
    let drained = owners[&drained_sid].clone();
    let in_flight = {
        let (http, base, sid) = (c.http.clone(), c.base.clone(), drained_sid.clone());
        tokio::spawn(async move {
            http.post(format!("{base}/v1/sessions/{sid}/calls"))
                .json(&json!({"calls": [{"id": "during-drain", "name": "shell", "arguments": {"command": "sleep 1; echo line-0 >> lines.txt"}}]}))
                .send()
                .await
                .unwrap()
                .json::<Value>()
                .await
                .unwrap()
        })
    };
    tokio::time::sleep(Duration::from_millis(400)).await;
    let stopping = nodes
        .iter_mut()
        .find(|n| n.name == drained)
        .unwrap()
        .terminate();
    for i in 1..=5 {
        let r = c
            .call(
                &drained_sid,
                &format!("drain-{i}"),
                "shell",
                json!({"command": format!("echo line-{i} >> lines.txt")}),
            )
            .await;
        assert_eq!(r["status"], "ok", "{r}");
    }
    let first = in_flight.await.unwrap();
    assert_eq!(first["results"][0]["status"], "ok", "{first}");
    let status = tokio::task::spawn_blocking(move || {
        let mut child = stopping;
        child.wait().unwrap()
    })
    .await
    .unwrap();
    assert!(status.success(), "the drained node exited {status:?}");
    let r = c
        .call(
            &drained_sid,
            "lines",
            "read_file",
            json!({"file_path": "lines.txt"}),
        )
        .await;
    let text = r["content"].as_str().unwrap();
    for i in 0..=5 {
        assert_eq!(
            text.matches(&format!("line-{i}\n")).count(),
            1,
            "line {i} once: {text}"
        );
    }
    let events = assert_gapless(&c, &drained_sid).await;
    let started: Vec<&str> = events
        .iter()
        .filter(|e| e["kind"] == "invocation.started")
        .filter_map(|e| e["data"]["call_id"].as_str())
        .collect();
    for id in ["during-drain", "drain-1", "drain-5"] {
        assert_eq!(
            started.iter().filter(|s| **s == id).count(),
            1,
            "{id} ran once"
        );
    }
    let log_tree = tree_of_log(&c, &drained_sid).await;
    let disk = tree_on_disk(&c, &drained_sid, "hash-after-drain").await;
    assert_eq!(disk, log_tree, "workspace vs log after the drain");
    drop(gateway);
}

/// A session's MCP requests that reach another replica run where the session lives (forwarded
/// like its calls), and each replica checks their Host: the one they reached against the name
/// clients use, the one they are forwarded to against its own address (the replicas are bound
/// to 127.0.0.2 and 127.0.0.3, which no loopback name covers). A client-sent forwarding header
/// switches no check off.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_mcp_call_sent_to_another_replica_runs_on_the_sessions_node() {
    toolexec_tools::web::install_tls_provider();
    let db = TestPgDatabase::create().await;
    let dir = tempfile::tempdir().unwrap();
    // Clients know the service by a public name only.
    let env = [("TOOLEXEC_ALLOWED_HOSTS", "tools.example.com")];
    let n0 = Replica::start_on("127.0.0.2", "n0", &db, dir.path(), &env);
    let n1 = Replica::start_on("127.0.0.3", "n1", &db, dir.path(), &env);
    let on = |r: &Replica| Client {
        http: reqwest::Client::new(),
        base: format!("http://{}:{}", r.ip, r.port),
    };
    let (c0, c1) = (on(&n0), on(&n1));
    let (status, s) = c0.post("/v1/sessions", &json!({})).await;
    assert_eq!(status, 201, "{s}");
    let sid = s["id"].as_str().unwrap().to_owned();
    let r = c0
        .call(
            &sid,
            "c0",
            "write_file",
            json!({"file_path": "a.txt", "content": "x\n"}),
        )
        .await;
    assert_eq!(r["status"], "ok", "{r}");
    let mcp = |c: &Client, host: Option<&str>, forged: bool| {
        let mut req = c
            .http
            .post(format!("{}/v1/sessions/{sid}/mcp", c.base))
            .header("accept", "application/json, text/event-stream")
            .header("mcp-protocol-version", "2025-11-25")
            .timeout(Duration::from_secs(60))
            .json(&json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                          "params": {"name": "read_file", "arguments": {"file_path": "a.txt"},
                                     "_meta": {"dev.toolexec/call_id": "m1"}}}));
        if let Some(host) = host {
            req = req.header("host", host);
        }
        if forged {
            req = req.header("x-toolexec-forwarded-by", "n1");
        }
        req.send()
    };
    let resp = mcp(&c1, Some("rebind.example"), false).await.unwrap();
    assert_eq!(resp.status(), 403, "checked on the replica it reached");
    let resp = mcp(&c0, Some("rebind.example"), true).await.unwrap();
    assert_eq!(
        resp.status(),
        403,
        "a forged forward is checked like any request"
    );
    let resp = mcp(&c1, Some("tools.example.com"), false).await.unwrap();
    assert_eq!(resp.status(), 200);
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["result"]["isError"], false, "{body}");
    assert!(
        body["result"]["content"][0]["text"]
            .as_str()
            .unwrap()
            .contains('x')
    );
    assert_eq!(ran_on(&db, &sid, "m1").await, "n0");
    assert_eq!(ran_on(&db, &sid, "c0").await, "n0");
}
