//! A real OCI registry on loopback (Debian's `docker-registry`, the distribution v2 server) and
//! images built here without the internet (GNU tar, an OCI image layout, pushed with `skopeo`). Every tool must be
//! installed (`.ci/run` installs them): a missing one fails the test, it never skips it.
//! Test-only code: panicking on a failed setup is the point.
#![allow(clippy::unwrap_used, clippy::expect_used)]
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A tool the tests need, by its absolute path; a clear failure if it is not installed.
pub fn tool(path: &str) -> PathBuf {
    let p = PathBuf::from(path);
    assert!(
        p.is_file(),
        "{path} is missing: install it with `apt-get install -y docker-registry skopeo umoci \
         busybox-static apache2-utils` (.ci/run does)"
    );
    p
}

fn run(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A `docker-registry serve` on `127.0.0.1:<port>`, storing in a temporary folder; killed on
/// drop.
pub struct Registry {
    child: Child,
    /// `127.0.0.1:PORT`: the registry part of an image reference.
    pub host: String,
    dir: tempfile::TempDir,
    /// `user:password` when the registry wants them (`htpasswd` auth): skopeo pushes with them.
    creds: Option<String>,
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Registry {
    pub fn start() -> Registry {
        Self::start_with(None)
    }

    /// A registry that answers only `user` with `password` (HTTP basic auth against an
    /// `htpasswd` file with a bcrypt line made by apache2-utils' `htpasswd`): anything else
    /// gets 401 with a `Basic` challenge.
    pub fn start_with_auth(user: &str, password: &str) -> Registry {
        Self::start_with(Some((user, password)))
    }

    fn start_with(auth: Option<(&str, &str)>) -> Registry {
        let bin = tool("/usr/bin/docker-registry");
        let dir = tempfile::tempdir().unwrap();
        // A port nobody holds now (the registry binds it a moment later).
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let host = format!("127.0.0.1:{port}");
        let config = dir.path().join("config.yml");
        let mut yaml = format!(
            "version: 0.1\nlog:\n  level: error\nstorage:\n  filesystem:\n    rootdirectory: {}\n  delete:\n    enabled: true\nhttp:\n  addr: {host}\n",
            dir.path().join("storage").display()
        );
        if let Some((user, password)) = auth {
            let line = run(Command::new(tool("/usr/bin/htpasswd")).args(["-nbB", user, password]));
            let file = dir.path().join("htpasswd");
            std::fs::write(&file, line.trim()).unwrap();
            yaml.push_str(&format!(
                "auth:\n  htpasswd:\n    realm: test-registry\n    path: {}\n",
                file.display()
            ));
        }
        std::fs::write(&config, yaml).unwrap();
        let child = Command::new(bin)
            .arg("serve")
            .arg(&config)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("starting docker-registry");
        let creds = auth.map(|(u, p)| format!("{u}:{p}"));
        let mut registry = Registry {
            child,
            host,
            dir,
            creds,
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if std::net::TcpStream::connect(&registry.host).is_ok() {
                break;
            }
            if let Ok(Some(status)) = registry.child.try_wait() {
                panic!("docker-registry exited: {status}");
            }
            assert!(
                Instant::now() < deadline,
                "docker-registry did not listen on {} within 20 s",
                registry.host
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        registry
    }

    /// Builds an image of `root`'s tree (one gzip layer made by GNU tar) with `env` in its
    /// config, lays it out as an OCI image layout, pushes it with `skopeo` as
    /// `<registry>/<name>` (`repo:tag`), and returns its manifest digest.
    ///
    /// Not `umoci insert`: Debian's umoci 0.4.7 writes layers whose tar stream is cut short
    /// (GNU tar reports "Unexpected EOF in archive" on them), so the layout is written here.
    pub fn push(&self, root: &Path, env: &[&str], name: &str) -> String {
        let skopeo = tool("/usr/bin/skopeo");
        let work = tempfile::tempdir_in(self.dir.path()).unwrap();
        let layout = work.path().join("layout");
        let blobs = layout.join("blobs/sha256");
        std::fs::create_dir_all(&blobs).unwrap();
        let tar = work.path().join("layer.tar");
        run(Command::new(tool("/usr/bin/tar"))
            .args(["--numeric-owner", "--owner=0", "--group=0", "-cf"])
            .arg(&tar)
            .arg("-C")
            .arg(root)
            .arg("."));
        let diff_id = sha256_file(&tar);
        run(Command::new(tool("/usr/bin/gzip"))
            .args(["-n", "-1"])
            .arg(&tar));
        let layer = put_blob(
            &blobs,
            &std::fs::read(work.path().join("layer.tar.gz")).unwrap(),
        );
        let config = serde_json::json!({
            "architecture": "amd64", "os": "linux",
            "config": {"Env": env, "WorkingDir": "/"},
            "rootfs": {"type": "layers", "diff_ids": [format!("sha256:{diff_id}")]}
        });
        let config = put_blob(&blobs, config.to_string().as_bytes());
        let manifest = serde_json::json!({
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                       "digest": config.0, "size": config.1},
            "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
                        "digest": layer.0, "size": layer.1}]
        });
        let manifest = put_blob(&blobs, manifest.to_string().as_bytes());
        std::fs::write(
            layout.join("index.json"),
            serde_json::json!({
                "schemaVersion": 2,
                "manifests": [{"mediaType": "application/vnd.oci.image.manifest.v1+json",
                               "digest": manifest.0, "size": manifest.1,
                               "annotations": {"org.opencontainers.image.ref.name": "img"}}]
            })
            .to_string(),
        )
        .unwrap();
        std::fs::write(
            layout.join("oci-layout"),
            r#"{"imageLayoutVersion":"1.0.0"}"#,
        )
        .unwrap();
        let digest_file = work.path().join("digest");
        let mut copy = Command::new(&skopeo);
        copy.args(["copy", "--quiet", "--dest-tls-verify=false"]);
        if let Some(creds) = &self.creds {
            copy.arg("--dest-creds").arg(creds);
        }
        run(copy
            .arg("--digestfile")
            .arg(&digest_file)
            .arg(format!("oci:{}:img", layout.display()))
            .arg(format!("docker://{}/{name}", self.host)));
        std::fs::read_to_string(&digest_file)
            .unwrap()
            .trim()
            .to_owned()
    }
}

fn sha256_file(path: &Path) -> String {
    run(Command::new(tool("/usr/bin/sha256sum")).arg(path))
        .split_whitespace()
        .next()
        .unwrap()
        .to_owned()
}

/// Stores `bytes` as a blob of the layout: `(sha256:…, size)`.
fn put_blob(blobs: &Path, bytes: &[u8]) -> (String, usize) {
    let tmp = blobs.join("incoming");
    std::fs::write(&tmp, bytes).unwrap();
    let hex = sha256_file(&tmp);
    std::fs::rename(&tmp, blobs.join(&hex)).unwrap();
    (format!("sha256:{hex}"), bytes.len())
}

/// A root with busybox (static) as `/bin/busybox` and every applet a link to it: a shell, no
/// python3.
pub fn busybox_root(dir: &Path) {
    let busybox = tool("/bin/busybox");
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    std::fs::copy(&busybox, bin.join("busybox")).unwrap();
    for applet in run(Command::new(&busybox).arg("--list")).split_whitespace() {
        if applet != "busybox" {
            std::os::unix::fs::symlink("busybox", bin.join(applet)).unwrap();
        }
    }
    std::fs::create_dir_all(dir.join("etc")).unwrap();
}

/// Copies the host file `path` into `root` at the same place: its directory's real path (links
/// on the way resolved, `/lib` → `/usr/lib`), its own name (`libz.so.1`, not the file a link of
/// that name leads to), its contents.
fn copy_in(root: &Path, path: &Path) {
    let dir = std::fs::canonicalize(path.parent().unwrap()).unwrap();
    let real = dir.join(path.file_name().unwrap());
    let dest = root.join(real.strip_prefix("/").unwrap());
    if dest.exists() {
        return;
    }
    std::fs::create_dir_all(dest.parent().unwrap()).unwrap();
    std::fs::copy(&real, &dest).unwrap();
}

/// A small root with the host's `python3` (its binary, the libraries `ldd` names and the
/// modules it loads to run `json`) and `bash`, busybox for `sh` and a few tools, and the host's
/// merged-`/usr` links (`/bin` → `usr/bin`, …).
pub fn python_root(dir: &Path) {
    let python = tool("/usr/bin/python3");
    let real = std::fs::canonicalize(&python).unwrap();
    copy_in(dir, &real);
    let bin = dir.join("usr/bin");
    std::os::unix::fs::symlink(real.file_name().unwrap(), bin.join("python3")).unwrap();
    let bash = std::fs::canonicalize(tool("/bin/bash")).unwrap();
    copy_in(dir, &bash);
    for binary in [&real, &bash] {
        copy_libraries(dir, binary);
    }
    let modules = run(Command::new(&python).args([
        "-c",
        "import sys, json\nfor m in list(sys.modules.values()):\n    f = getattr(m, '__file__', None)\n    if f: print(f)",
    ]));
    for m in modules.lines() {
        copy_in(dir, Path::new(m));
    }
    std::fs::copy(tool("/bin/busybox"), bin.join("busybox")).unwrap();
    for applet in ["sh", "ls", "cat", "echo", "test", "sleep", "env"] {
        std::os::unix::fs::symlink("busybox", bin.join(applet)).unwrap();
    }
    for (name, target) in [
        ("bin", "usr/bin"),
        ("lib", "usr/lib"),
        ("lib64", "usr/lib64"),
    ] {
        std::os::unix::fs::symlink(target, dir.join(name)).unwrap();
    }
    std::fs::create_dir_all(dir.join("etc")).unwrap();
}

/// The shared libraries `ldd` names for `binary`, and the loader by the name it asks for.
fn copy_libraries(dir: &Path, binary: &Path) {
    for line in run(Command::new(tool("/usr/bin/ldd")).arg(binary)).lines() {
        // "libz.so.1 => /lib/x86_64-linux-gnu/libz.so.1 (0x…)" or "/lib64/ld-linux….so.2 (0x…)"
        let path = line
            .split("=>")
            .last()
            .and_then(|p| p.split_whitespace().next())
            .filter(|p| p.starts_with('/'));
        if let Some(p) = path {
            copy_in(dir, Path::new(p));
            // The loader by the name the binary asks for (`/lib64/…`), through the links below.
            let name = Path::new(p);
            if name.starts_with("/lib64") {
                let d = dir.join("usr/lib64");
                std::fs::create_dir_all(&d).unwrap();
                let target = std::fs::canonicalize(name).unwrap();
                let link = d.join(name.file_name().unwrap());
                if !link.exists() {
                    std::os::unix::fs::symlink(&target, link).unwrap();
                }
            }
        }
    }
}
