//! `toolexec-bench images` (issue 26): the first command of a new session in a cached OCI image
//! next to the first command of a new host-view session, measured alternately in the same run
//! through the real service (HTTP, recorded); the pull and unpacking of a Python image next to
//! `skopeo copy` + `umoci unpack` of it; and the disk that 100 sessions on one image take.
//!
//! The image is a busybox-static root pushed to Debian's `docker-registry` on loopback (started
//! here; `apt-get install docker-registry skopeo busybox-static`), laid out as an OCI image
//! with GNU tar and pushed with `skopeo`, then pulled once with `POST /v1/environments`.
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context;
use serde_json::json;

use crate::shell::open_up;
use crate::{Server, Stats, tempdir};

/// The issue's goal: p50 of a cached image's first command within this of the host view's.
const GOAL_P50_WITHIN_MS: f64 = 5.0;

pub async fn run(dur: Duration, sessions_for_disk: usize) -> anyhow::Result<()> {
    let data = tempdir()?;
    let result = measure(&data, dur, sessions_for_disk).await;
    let _ = std::fs::remove_dir_all(&data);
    result
}

fn run_cmd(cmd: &mut Command) -> anyhow::Result<String> {
    let out = cmd.output().with_context(|| format!("{cmd:?}"))?;
    anyhow::ensure!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn sha256(path: &Path) -> anyhow::Result<String> {
    Ok(run_cmd(Command::new("sha256sum").arg(path))?
        .split_whitespace()
        .next()
        .context("sha256sum")?
        .to_owned())
}

fn blob(blobs: &Path, bytes: &[u8]) -> anyhow::Result<(String, usize)> {
    let tmp = blobs.join("incoming");
    std::fs::write(&tmp, bytes)?;
    let hex = sha256(&tmp)?;
    std::fs::rename(&tmp, blobs.join(&hex))?;
    Ok((format!("sha256:{hex}"), bytes.len()))
}

/// A busybox root as an OCI image layout, pushed to `registry` as `name`.
fn push_busybox(work: &Path, registry: &str, name: &str) -> anyhow::Result<()> {
    let root = work.join("root");
    let bin = root.join("bin");
    std::fs::create_dir_all(&bin)?;
    std::fs::create_dir_all(root.join("etc"))?;
    std::fs::copy("/bin/busybox", bin.join("busybox")).context("/bin/busybox (busybox-static)")?;
    for applet in run_cmd(Command::new("/bin/busybox").arg("--list"))?.split_whitespace() {
        if applet != "busybox" {
            std::os::unix::fs::symlink("busybox", bin.join(applet))?;
        }
    }
    push_root(work, &root, registry, name)
}

/// A Python root: the host's `/usr/bin/python3*` and its whole standard library
/// (`/usr/lib/python3.*`): what a pull of a Python image moves and unpacks.
fn push_python(work: &Path, registry: &str, name: &str) -> anyhow::Result<()> {
    let root = work.join("root");
    run_cmd(
        Command::new("sh")
            .arg("-c")
            .arg("mkdir -p \"$1/usr/bin\" \"$1/usr/lib\" && cp -a /usr/bin/python3* \"$1/usr/bin/\" && cp -a /usr/lib/python3.* \"$1/usr/lib/\"")
            .arg("sh")
            .arg(&root),
    )?;
    push_root(work, &root, registry, name)
}

/// `root` as a one-layer OCI image layout (GNU tar, gzip), pushed with skopeo.
fn push_root(work: &Path, root: &Path, registry: &str, name: &str) -> anyhow::Result<()> {
    let layout = work.join("layout");
    let blobs = layout.join("blobs/sha256");
    std::fs::create_dir_all(&blobs)?;
    let tar = work.join("layer.tar");
    run_cmd(
        Command::new("tar")
            .args(["--numeric-owner", "--owner=0", "--group=0", "-cf"])
            .arg(&tar)
            .arg("-C")
            .arg(root)
            .arg("."),
    )?;
    let diff_id = sha256(&tar)?;
    run_cmd(Command::new("gzip").args(["-n", "-1"]).arg(&tar))?;
    let layer = blob(&blobs, &std::fs::read(work.join("layer.tar.gz"))?)?;
    let config = json!({"architecture": "amd64", "os": "linux",
        "config": {"Env": ["PATH=/bin"], "WorkingDir": "/"},
        "rootfs": {"type": "layers", "diff_ids": [format!("sha256:{diff_id}")]}});
    let config = blob(&blobs, config.to_string().as_bytes())?;
    let manifest = json!({"schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": config.0, "size": config.1},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": layer.0, "size": layer.1}]});
    let manifest = blob(&blobs, manifest.to_string().as_bytes())?;
    std::fs::write(
        layout.join("index.json"),
        json!({"schemaVersion": 2, "manifests": [{"mediaType": "application/vnd.oci.image.manifest.v1+json",
            "digest": manifest.0, "size": manifest.1,
            "annotations": {"org.opencontainers.image.ref.name": "img"}}]})
        .to_string(),
    )?;
    std::fs::write(
        layout.join("oci-layout"),
        r#"{"imageLayoutVersion":"1.0.0"}"#,
    )?;
    run_cmd(
        Command::new("skopeo")
            .args(["copy", "--quiet", "--dest-tls-verify=false"])
            .arg(format!("oci:{}:img", layout.display()))
            .arg(format!("docker://{registry}/{name}")),
    )?;
    Ok(())
}

/// `du -sk`, in KiB.
fn du_kib(path: &Path) -> anyhow::Result<u64> {
    run_cmd(Command::new("du").arg("-sk").arg(path))?
        .split_whitespace()
        .next()
        .context("du")?
        .parse()
        .context("du")
}

async fn measure(data: &Path, dur: Duration, sessions_for_disk: usize) -> anyhow::Result<()> {
    // The registry, on a free loopback port.
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let registry = format!("127.0.0.1:{port}");
    let reg_dir = data.join("registry");
    std::fs::create_dir_all(&reg_dir)?;
    let reg_config = reg_dir.join("config.yml");
    std::fs::write(
        &reg_config,
        format!(
            "version: 0.1\nlog:\n  level: error\nstorage:\n  filesystem:\n    rootdirectory: {}\nhttp:\n  addr: {registry}\n",
            reg_dir.join("storage").display()
        ),
    )?;
    let mut reg = tokio::process::Command::new("/usr/bin/docker-registry")
        .arg("serve")
        .arg(&reg_config)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .context("/usr/bin/docker-registry (apt-get install docker-registry)")?;
    let until = Instant::now() + Duration::from_secs(20);
    while std::net::TcpStream::connect(&registry).is_err() {
        anyhow::ensure!(Instant::now() < until, "docker-registry did not listen");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    push_busybox(&data.join("image"), &registry, "bench/busybox:1")?;
    push_python(&data.join("python"), &registry, "bench/python:1")?;

    let workspaces = data.join("workspaces");
    open_up(&workspaces)?;
    let mut config = toolexec_server::Config {
        bind: "127.0.0.1:0".into(),
        data_dir: data.to_owned(),
        workspace_root: Some(workspaces.clone()),
        log_format: "text".into(),
        rate_limit_per_second: 0.0,
        ..Default::default()
    };
    config.environments.allow_registries = vec![registry.clone()];
    config.environments.insecure_registries = vec![registry.clone()];
    // The bench's registry is on loopback: allow-listed for the egress policy.
    config.environments.allow_cidrs = vec!["127.0.0.1".into()];
    config.limits.max_open_sessions_per_tenant = config
        .limits
        .max_open_sessions_per_tenant
        .max(sessions_for_disk as u64 + 10);
    let server = Server::start(config).await?;
    let base = server.base.clone();
    let result = measure_with(&base, &registry, &workspaces, dur, sessions_for_disk).await;
    server.stop().await?;
    let _ = reg.kill().await;
    result
}

async fn measure_with(
    base: &str,
    registry: &str,
    workspaces: &Path,
    dur: Duration,
    sessions_for_disk: usize,
) -> anyhow::Result<()> {
    let http = reqwest::Client::new();
    let image = format!("{registry}/bench/busybox:1");
    let t = Instant::now();
    let pulled: serde_json::Value = http
        .post(format!("{base}/v1/environments"))
        .json(&json!({"image": image}))
        .send()
        .await?
        .error_for_status()?
        .json()
        .await?;
    println!(
        "pulled {} ({} bytes unpacked) in {:.0} ms",
        pulled["environment"]["digest"],
        pulled["unpacked_bytes"],
        t.elapsed().as_secs_f64() * 1000.0
    );

    // Alternating: a host-view session, then one in the cached image, each created, its first
    // command (`true`, which starts the session's sandbox) timed, then closed.
    let first = |body: serde_json::Value| {
        let http = http.clone();
        let base = base.to_owned();
        async move {
            let s: serde_json::Value = http
                .post(format!("{base}/v1/sessions"))
                .json(&body)
                .send()
                .await?
                .error_for_status()?
                .json()
                .await?;
            let sid = s["id"].as_str().context("session id")?.to_owned();
            let t = Instant::now();
            let r: serde_json::Value = http
                .post(format!("{base}/v1/sessions/{sid}/calls"))
                .json(&json!({"calls": [{"id": "first", "name": "shell", "arguments": {"command": "true"}}]}))
                .send()
                .await?
                .error_for_status()?
                .json()
                .await?;
            let us = t.elapsed().as_micros() as u64;
            anyhow::ensure!(r["results"][0]["status"] == "ok", "first command: {r}");
            http.delete(format!("{base}/v1/sessions/{sid}"))
                .send()
                .await?
                .error_for_status()?;
            anyhow::Ok(us)
        }
    };
    let start = Instant::now();
    let (mut host, mut in_image) = (Vec::new(), Vec::new());
    while host.len() < 1000 && (host.len() < 30 || start.elapsed() < dur) {
        host.push(first(json!({})).await?);
        in_image.push(first(json!({"environment": {"image": image}})).await?);
    }
    let elapsed = start.elapsed();
    let (host, in_image) = (
        Stats::from_latencies(host, elapsed),
        Stats::from_latencies(in_image, elapsed),
    );
    println!(
        "first command of a new session, alternating, {} each: host view p50 {:.2} ms p99 {:.2} ms | cached image p50 {:.2} ms p99 {:.2} ms",
        host.calls,
        host.pct(0.5),
        host.pct(0.99),
        in_image.pct(0.5),
        in_image.pct(0.99)
    );
    let diff = in_image.pct(0.5) - host.pct(0.5);
    println!(
        "goal: image p50 within {GOAL_P50_WITHIN_MS} ms of the host view's: {:+.2} ms — {}",
        diff,
        if diff <= GOAL_P50_WITHIN_MS {
            "met"
        } else {
            "NOT met"
        }
    );

    // Pull and unpack of a Python image (the host's python3 and its whole standard library)
    // by the service, next to `skopeo copy` + `umoci unpack` of the same image, alternating;
    // the service's cache entry is removed between its runs.
    let py = format!("{registry}/bench/python:1");
    let scratch = workspaces.join("pull-baseline");
    for round in 1..=3 {
        let t = Instant::now();
        let pulled: serde_json::Value = http
            .post(format!("{base}/v1/environments"))
            .json(&json!({"image": py}))
            .send()
            .await?
            .error_for_status()?
            .json()
            .await?;
        let ours = t.elapsed().as_secs_f64();
        anyhow::ensure!(pulled["cached"] == false, "{pulled}");
        let digest = pulled["environment"]["digest"].as_str().context("digest")?;
        std::fs::remove_dir_all(
            workspaces
                .join(".images/sha256")
                .join(digest.trim_start_matches("sha256:")),
        )?;
        let _ = std::fs::remove_dir_all(&scratch);
        std::fs::create_dir_all(&scratch)?;
        let t = Instant::now();
        run_cmd(
            Command::new("skopeo")
                .args(["copy", "--quiet", "--src-tls-verify=false"])
                .arg(format!("docker://{py}"))
                .arg(format!("oci:{}:py", scratch.join("layout").display())),
        )?;
        run_cmd(
            Command::new("umoci")
                .args(["unpack", "--rootless", "--image"])
                .arg(format!("{}:py", scratch.join("layout").display()))
                .arg(scratch.join("bundle")),
        )?;
        let theirs = t.elapsed().as_secs_f64();
        println!(
            "pull + unpack of the Python image ({} bytes downloaded, {} unpacked), round {round}: toolexec {:.2} s, skopeo copy + umoci unpack {:.2} s ({:.2}x)",
            pulled["download_bytes"],
            pulled["unpacked_bytes"],
            ours,
            theirs,
            theirs / ours
        );
    }
    let _ = std::fs::remove_dir_all(&scratch);

    // Disk: N sessions on the image, each writing a little; the cache holds one copy.
    let images = workspaces.join(".images");
    let cache_before = du_kib(&images)?;
    let mut ids = Vec::new();
    for i in 0..sessions_for_disk {
        let s: serde_json::Value = http
            .post(format!("{base}/v1/sessions"))
            .json(&json!({"environment": {"image": image}}))
            .send()
            .await?
            .error_for_status()?
            .json()
            .await?;
        let sid = s["id"].as_str().context("session id")?.to_owned();
        let r: serde_json::Value = http
            .post(format!("{base}/v1/sessions/{sid}/calls"))
            .json(&json!({"calls": [{"id": "w", "name": "shell",
                "arguments": {"command": format!("echo session {i} > note.txt")}}]}))
            .send()
            .await?
            .error_for_status()?
            .json()
            .await?;
        anyhow::ensure!(r["results"][0]["status"] == "ok", "{r}");
        ids.push(sid);
    }
    let cache_after = du_kib(&images)?;
    let all = du_kib(workspaces)?;
    println!(
        "disk, {sessions_for_disk} sessions on the image (each wrote one file): image cache {cache_before} KiB before, {cache_after} KiB after; workspace root in all (cache included) {all} KiB"
    );
    for sid in ids {
        http.delete(format!("{base}/v1/sessions/{sid}"))
            .send()
            .await?
            .error_for_status()?;
    }
    Ok(())
}
