//! Pulls from a real OCI registry served on loopback by the test (the read side of the
//! distribution API: `/v2/`, manifests by tag and digest, blobs), with layers built here,
//! hostile ones included.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::io::Write;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{HeaderMap, Response, StatusCode, Uri};
use sha2::{Digest, Sha256};
use toolexec_image::{ImageError, ImageStore, Limits, RegistryCredential, Removal};

const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
const OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";
const GZIP_LAYER: &str = "application/vnd.oci.image.layer.v1.tar+gzip";

fn digest(bytes: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(bytes)))
}

#[derive(Default)]
struct State {
    /// (repository, tag or digest) -> (media type, bytes).
    manifests: HashMap<(String, String), (String, Vec<u8>)>,
    /// digest -> bytes served (the test may make them differ from the digest).
    blobs: HashMap<String, Vec<u8>>,
    blob_gets: HashMap<String, usize>,
    blob_delay: Duration,
    /// A further delay before serving these blobs (a layer, not the config).
    delays: HashMap<String, Duration>,
    /// When set, every `/v2/` request needs `Authorization: Bearer <it>`, got from `/token`.
    token: Option<String>,
    /// The query strings `/token` was asked with.
    token_queries: Vec<String>,
    /// When set, `/token` answers only this `Authorization` (HTTP basic).
    token_basic: Option<String>,
    /// When set, every `/v2/` request needs this `Authorization` (HTTP basic), else 401 with a
    /// `Basic` challenge.
    basic: Option<String>,
    /// Every `Authorization` header the registry was sent.
    authorizations: Vec<String>,
    host: String,
}

#[derive(Clone)]
struct Registry {
    state: Arc<Mutex<State>>,
    host: String,
    /// What the stores this test opens are configured with.
    credentials: Vec<RegistryCredential>,
}

async fn serve(state: Arc<Mutex<State>>, uri: Uri, headers: HeaderMap) -> Response<Body> {
    let path = uri.path().to_string();
    {
        let mut s = state.lock().unwrap();
        if let Some(a) = headers.get("authorization").and_then(|v| v.to_str().ok()) {
            s.authorizations.push(a.to_owned());
        }
        if let Some(basic) = s.basic.clone() {
            let sent = headers.get("authorization").and_then(|v| v.to_str().ok());
            if sent != Some(basic.as_str()) {
                return Response::builder()
                    .status(StatusCode::UNAUTHORIZED)
                    .header("www-authenticate", r#"Basic realm="test-registry""#)
                    .body(Body::empty())
                    .unwrap();
            }
        }
        if let Some(token) = s.token.clone() {
            if path == "/token" {
                let sent = headers.get("authorization").and_then(|v| v.to_str().ok());
                if let Some(want) = &s.token_basic
                    && sent != Some(want.as_str())
                {
                    return Response::builder()
                        .status(StatusCode::UNAUTHORIZED)
                        .body(Body::empty())
                        .unwrap();
                }
                s.token_queries.push(uri.query().unwrap_or("").to_string());
                return Response::new(Body::from(format!(r#"{{"token":"{token}"}}"#)));
            }
            let sent = headers.get("authorization").and_then(|v| v.to_str().ok());
            if sent != Some(format!("Bearer {token}").as_str()) {
                let realm = format!("http://{}/token", s.host);
                return Response::builder()
                    .status(StatusCode::UNAUTHORIZED)
                    .header(
                        "www-authenticate",
                        format!(
                            r#"Bearer realm="{realm}",service="test-registry",scope="repository:tok/x:pull""#
                        ),
                    )
                    .body(Body::empty())
                    .unwrap();
            }
        }
    }
    let not_found = || {
        Response::builder()
            .status(StatusCode::NOT_FOUND)
            .body(Body::from(r#"{"errors":[{"code":"NOT_FOUND"}]}"#))
            .unwrap()
    };
    if path == "/v2/" {
        return Response::new(Body::from("{}"));
    }
    let Some(rest) = path.strip_prefix("/v2/") else {
        return not_found();
    };
    if let Some((repo, reference)) = rest.rsplit_once("/manifests/") {
        let found = state
            .lock()
            .unwrap()
            .manifests
            .get(&(repo.to_string(), reference.to_string()))
            .cloned();
        return match found {
            Some((media_type, bytes)) => Response::builder()
                .header("content-type", media_type)
                .header("docker-content-digest", digest(&bytes))
                .body(Body::from(bytes))
                .unwrap(),
            None => not_found(),
        };
    }
    if let Some((_repo, d)) = rest.rsplit_once("/blobs/") {
        let (bytes, delay) = {
            let mut s = state.lock().unwrap();
            *s.blob_gets.entry(d.to_string()).or_default() += 1;
            let extra = s.delays.get(d).copied().unwrap_or_default();
            (s.blobs.get(d).cloned(), s.blob_delay + extra)
        };
        tokio::time::sleep(delay).await;
        return match bytes {
            Some(b) => Response::builder()
                .header("content-type", "application/octet-stream")
                .body(Body::from(b))
                .unwrap(),
            None => not_found(),
        };
    }
    not_found()
}

impl Registry {
    async fn start() -> Self {
        let state = Arc::new(Mutex::new(State::default()));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let host = listener.local_addr().unwrap().to_string();
        state.lock().unwrap().host = host.clone();
        let s = state.clone();
        let app = axum::Router::new()
            .fallback(move |uri: Uri, headers: HeaderMap| serve(s.clone(), uri, headers));
        tokio::spawn(async move { axum::serve(listener, app).await });
        Self {
            state,
            host,
            credentials: Vec::new(),
        }
    }

    fn blob(&self, bytes: Vec<u8>) -> String {
        let d = digest(&bytes);
        self.state.lock().unwrap().blobs.insert(d.clone(), bytes);
        d
    }

    fn manifest(&self, repo: &str, tag: &str, media_type: &str, bytes: Vec<u8>) -> String {
        let d = digest(&bytes);
        let mut s = self.state.lock().unwrap();
        for r in [tag.to_string(), d.clone()] {
            s.manifests.insert(
                (repo.to_string(), r),
                (media_type.to_string(), bytes.clone()),
            );
        }
        d
    }

    /// Pushes an image of `layers` (tar streams, gzipped here) as `repo:tag`; its manifest
    /// digest.
    fn push(&self, repo: &str, tag: &str, layers: &[Vec<u8>]) -> String {
        self.push_for(repo, tag, layers, "amd64")
    }

    fn push_for(&self, repo: &str, tag: &str, layers: &[Vec<u8>], arch: &str) -> String {
        let layers: Vec<(String, Vec<u8>)> = layers
            .iter()
            .map(|tar| (GZIP_LAYER.to_string(), gzip(tar)))
            .collect();
        self.push_blobs(repo, tag, &layers, arch)
    }

    /// Pushes an image of layers given as (media type, blob).
    fn push_blobs(
        &self,
        repo: &str,
        tag: &str,
        layers: &[(String, Vec<u8>)],
        arch: &str,
    ) -> String {
        let config = serde_json::to_vec(&serde_json::json!({
            "architecture": arch, "os": "linux",
            "config": {"Env": ["PATH=/usr/local/bin:/usr/bin:/bin"], "WorkingDir": "/srv"},
            "rootfs": {"type": "layers", "diff_ids": []}
        }))
        .unwrap();
        let config_size = config.len();
        let config_digest = self.blob(config);
        let layers: Vec<serde_json::Value> = layers
            .iter()
            .map(|(media_type, blob)| {
                let size = blob.len();
                let d = self.blob(blob.clone());
                serde_json::json!({"mediaType": media_type, "digest": d, "size": size})
            })
            .collect();
        let manifest = serde_json::to_vec(&serde_json::json!({
            "schemaVersion": 2, "mediaType": OCI_MANIFEST,
            "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                       "digest": config_digest, "size": config_size},
            "layers": layers
        }))
        .unwrap();
        self.manifest(repo, tag, OCI_MANIFEST, manifest)
    }

    fn gets(&self, d: &str) -> usize {
        self.state
            .lock()
            .unwrap()
            .blob_gets
            .get(d)
            .copied()
            .unwrap_or(0)
    }

    fn reference(&self, repo: &str, tag: &str) -> String {
        format!("{}/{repo}:{tag}", self.host)
    }

    fn store(&self, data: &Path, limits: Limits) -> ImageStore {
        toolexec_tools::web::install_tls_provider();
        ImageStore::open(
            data,
            limits,
            reqwest::Client::new(),
            toolexec_image::Registries {
                insecure: vec![self.host.clone()],
                credentials: self.credentials.clone(),
                // The test's registry is on loopback: allow-listed, as an operator would.
                policy: toolexec_net::NetPolicy::new(&["127.0.0.0/8"]).unwrap(),
            },
        )
        .unwrap()
    }
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    enc.write_all(bytes).unwrap();
    enc.finish().unwrap()
}

/// A tar stream written header by header, names and link targets as given (`..`, absolute),
/// which `tar::Builder`'s own path setters would refuse.
struct Tar(tar::Builder<Vec<u8>>);

impl Tar {
    fn new() -> Self {
        Self(tar::Builder::new(Vec::new()))
    }

    fn raw(
        &mut self,
        kind: tar::EntryType,
        name: &str,
        link: &str,
        mode: u32,
        data: &[u8],
        size: u64,
    ) {
        let mut h = tar::Header::new_gnu();
        let old = h.as_old_mut();
        old.name[..name.len()].copy_from_slice(name.as_bytes());
        old.linkname[..link.len()].copy_from_slice(link.as_bytes());
        h.set_entry_type(kind);
        h.set_mode(mode);
        h.set_size(size);
        h.set_mtime(0);
        h.set_cksum();
        self.0.append(&h, data).unwrap();
    }

    fn file(mut self, name: &str, data: &str) -> Self {
        self.raw(
            tar::EntryType::Regular,
            name,
            "",
            0o644,
            data.as_bytes(),
            data.len() as u64,
        );
        self
    }

    fn file_mode(mut self, name: &str, data: &str, mode: u32) -> Self {
        self.raw(
            tar::EntryType::Regular,
            name,
            "",
            mode,
            data.as_bytes(),
            data.len() as u64,
        );
        self
    }

    fn dir(mut self, name: &str) -> Self {
        self.raw(tar::EntryType::Directory, name, "", 0o755, b"", 0);
        self
    }

    fn symlink(mut self, name: &str, target: &str) -> Self {
        self.raw(tar::EntryType::Symlink, name, target, 0o777, b"", 0);
        self
    }

    fn hardlink(mut self, name: &str, target: &str) -> Self {
        self.raw(tar::EntryType::Link, name, target, 0o644, b"", 0);
        self
    }

    fn special(mut self, kind: tar::EntryType, name: &str) -> Self {
        self.raw(kind, name, "", 0o666, b"", 0);
        self
    }

    fn done(self) -> Vec<u8> {
        self.0.into_inner().unwrap()
    }
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap()
}

/// Every path under `dir`, not following links.
fn walk(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let e = e.unwrap();
            let p = e.path();
            out.push(p.strip_prefix(dir).unwrap().display().to_string());
            if e.file_type().unwrap().is_dir() {
                todo.push(p);
            }
        }
    }
    out.sort();
    out
}

#[tokio::test]
async fn an_image_is_pulled_by_tag_and_digest_with_its_layers_applied_in_order() {
    let reg = Registry::start().await;
    let l1 = Tar::new()
        .dir("etc/")
        .file("etc/a", "a")
        .file("etc/b", "b")
        .dir("usr/bin/")
        .file_mode("usr/bin/tool", "#!/bin/sh\n", 0o4755)
        .symlink("bin", "usr/bin")
        .file("data/old1", "1")
        .file("data/sub/old2", "2")
        .done();
    let l2 = Tar::new()
        .file("etc/.wh.a", "")
        .file("data/new", "n")
        .file("data/.wh..wh..opq", "")
        .hardlink("usr/bin/tool2", "usr/bin/tool")
        .file("bin/via-link", "v")
        .done();
    let digest = reg.push("tools/base", "1", &[l1, l2]);
    let tmp = tempfile::tempdir().unwrap();
    let store = reg.store(tmp.path(), Limits::default());

    let image = store.pull(&reg.reference("tools/base", "1")).await.unwrap();
    assert_eq!(image.digest, digest);
    assert_eq!(image.env, ["PATH=/usr/local/bin:/usr/bin:/bin"]);
    assert_eq!(image.working_dir, "/srv");
    let root = &image.rootfs;
    assert!(root.starts_with(tmp.path().join("images/sha256")));
    assert!(!root.join("etc/a").exists(), "whiteout applied");
    assert_eq!(read(&root.join("etc/b")), "b");
    assert_eq!(
        walk(&root.join("data")),
        ["new"],
        "opaque directory applied"
    );
    let tool = std::fs::metadata(root.join("usr/bin/tool")).unwrap();
    assert_eq!(tool.permissions().mode() & 0o7777, 0o755, "set-uid cleared");
    let tool2 = std::fs::metadata(root.join("usr/bin/tool2")).unwrap();
    assert_eq!(tool.ino(), tool2.ino(), "hard link made");
    assert_eq!(
        std::fs::read_link(root.join("bin")).unwrap(),
        Path::new("usr/bin")
    );
    assert_eq!(
        read(&root.join("usr/bin/via-link")),
        "v",
        "resolved through the image's link"
    );

    // By digest: the cache answers, no blob is fetched again.
    let before: usize = reg.state.lock().unwrap().blob_gets.values().sum();
    let again = store
        .pull(&format!("{}/tools/base@{digest}", reg.host))
        .await
        .unwrap();
    assert_eq!(again.digest, digest);
    let after: usize = reg.state.lock().unwrap().blob_gets.values().sum();
    assert_eq!(before, after);
    assert_eq!(store.list().unwrap().len(), 1);
    assert_eq!(store.remove(&digest).unwrap(), Removal::Removed);
    assert_eq!(store.remove(&digest).unwrap(), Removal::NotCached);
    assert!(store.list().unwrap().is_empty());
    assert!(!root.exists());
    assert!(walk(&tmp.path().join("images/tmp")).is_empty());
}

#[tokio::test]
async fn an_index_resolves_to_the_hosts_platform_and_an_index_without_it_is_refused() {
    let reg = Registry::start().await;
    let arm = reg.push_for(
        "multi/x",
        "arm-only",
        &[Tar::new().file("which", "arm").done()],
        "arm64",
    );
    let amd = reg.push(
        "multi/x",
        "amd-only",
        &[Tar::new().file("which", "amd").done()],
    );
    let entry = |d: &str, arch: &str| {
        serde_json::json!({"mediaType": OCI_MANIFEST, "digest": d, "size": 1,
                           "platform": {"os": "linux", "architecture": arch}})
    };
    let index = |entries: Vec<serde_json::Value>| {
        serde_json::to_vec(&serde_json::json!({
            "schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": entries}))
        .unwrap()
    };
    reg.manifest(
        "multi/x",
        "both",
        OCI_INDEX,
        index(vec![entry(&arm, "arm64"), entry(&amd, "amd64")]),
    );
    reg.manifest(
        "multi/x",
        "arm",
        OCI_INDEX,
        index(vec![entry(&arm, "arm64")]),
    );
    let tmp = tempfile::tempdir().unwrap();
    let store = reg.store(tmp.path(), Limits::default());
    assert_eq!(
        toolexec_image::host_architecture(),
        "amd64",
        "these tests assume amd64"
    );
    let image = store.pull(&reg.reference("multi/x", "both")).await.unwrap();
    assert_eq!(image.digest, amd);
    assert_eq!(read(&image.rootfs.join("which")), "amd");
    let err = store
        .pull(&reg.reference("multi/x", "arm"))
        .await
        .unwrap_err();
    assert!(matches!(err, ImageError::WrongPlatform(_)), "{err}");
    let err = store
        .pull(&reg.reference("multi/x", "nope"))
        .await
        .unwrap_err();
    assert!(matches!(err, ImageError::NotFound(_)), "{err}");
}

/// The image's root, and a canary file beside the data folder that no layer may change.
struct Hostile {
    reg: Registry,
    tmp: tempfile::TempDir,
    canary: std::path::PathBuf,
}

impl Hostile {
    async fn new() -> Self {
        let reg = Registry::start().await;
        let tmp = tempfile::tempdir().unwrap();
        std::fs::create_dir(tmp.path().join("data")).unwrap();
        let canary = tmp.path().join("canary");
        std::fs::write(&canary, "untouched").unwrap();
        Self { reg, tmp, canary }
    }

    fn store(&self, limits: Limits) -> ImageStore {
        self.reg.store(&self.tmp.path().join("data"), limits)
    }

    async fn pull(
        &self,
        layers: &[Vec<u8>],
        limits: Limits,
    ) -> Result<toolexec_image::Image, ImageError> {
        self.reg.push("hostile/x", "t", layers);
        self.store(limits)
            .pull(&self.reg.reference("hostile/x", "t"))
            .await
    }

    /// Nothing outside the data folder changed, and nothing is left half-made in it.
    fn check_outside(&self) {
        assert_eq!(read(&self.canary), "untouched");
        assert_eq!(std::fs::metadata(&self.canary).unwrap().nlink(), 1);
        assert_eq!(
            walk(self.tmp.path())
                .iter()
                .filter(|p| !p.starts_with("data"))
                .count(),
            1
        );
        assert!(walk(&self.tmp.path().join("data/images/tmp")).is_empty());
    }
}

#[tokio::test]
async fn names_with_dotdot_or_absolute_land_inside_the_image() {
    let h = Hostile::new().await;
    let l = Tar::new()
        .file("../../../../../../../../canary", "dotdot")
        .file(&h.canary.display().to_string(), "absolute")
        .done();
    let image = h.pull(&[l], Limits::default()).await.unwrap();
    assert_eq!(read(&image.rootfs.join("canary")), "dotdot");
    let inside = image.rootfs.join(h.canary.strip_prefix("/").unwrap());
    assert_eq!(read(&inside), "absolute");
    h.check_outside();
}

#[tokio::test]
async fn entries_written_through_links_aimed_outside_stay_inside() {
    let h = Hostile::new().await;
    let outside_dir = h.tmp.path().display().to_string();
    // Same layer: a link to the host's folder (absolute and by climbing), then entries
    // beneath it.
    let l1 = Tar::new()
        .symlink("abs", &outside_dir)
        .file("abs/canary", "through abs")
        .symlink("up", "../../../../../../../../..")
        .file(&format!("up{outside_dir}/canary2"), "through up")
        .symlink("c", &h.canary.display().to_string())
        .done();
    // Next layer: a file where the link to the canary is, and an entry beneath a link of the
    // layer below.
    let l2 = Tar::new()
        .file("c", "replaces the link")
        .file("abs/later", "later")
        .done();
    let image = h.pull(&[l1, l2], Limits::default()).await.unwrap();
    let root = &image.rootfs;
    let inner = root.join(h.tmp.path().strip_prefix("/").unwrap());
    assert_eq!(read(&inner.join("canary")), "through abs");
    assert_eq!(read(&inner.join("canary2")), "through up");
    assert_eq!(read(&inner.join("later")), "later");
    assert!(std::fs::symlink_metadata(root.join("c")).unwrap().is_file());
    assert_eq!(read(&root.join("c")), "replaces the link");
    h.check_outside();
}

#[tokio::test]
async fn hard_links_aimed_outside_are_refused_and_devices_skipped() {
    let h = Hostile::new().await;
    let l = Tar::new()
        .hardlink("hl", &h.canary.display().to_string())
        .done();
    let err = h.pull(&[l], Limits::default()).await.unwrap_err();
    assert!(matches!(err, ImageError::InvalidLayer(_)), "{err}");
    assert!(err.to_string().contains("not in the image"), "{err}");
    let l = Tar::new().hardlink("hl", "../../../../../../canary").done();
    let err = h.pull(&[l], Limits::default()).await.unwrap_err();
    assert!(matches!(err, ImageError::InvalidLayer(_)), "{err}");
    h.check_outside();

    let h = Hostile::new().await;
    let l = Tar::new()
        .special(tar::EntryType::Char, "dev/mem")
        .special(tar::EntryType::Block, "dev/sda")
        .special(tar::EntryType::Fifo, "fifo")
        .file_mode("sgid", "x", 0o2775)
        .dir("sticky")
        .done();
    let image = h.pull(&[l], Limits::default()).await.unwrap();
    assert_eq!(image.skipped_devices, 3);
    assert!(!image.rootfs.join("dev/mem").exists());
    assert!(!image.rootfs.join("fifo").exists());
    let mode = std::fs::metadata(image.rootfs.join("sgid"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o7777, 0o775);
    h.check_outside();
}

#[tokio::test]
async fn a_declared_10_gb_entry_is_refused_at_its_header() {
    let h = Hostile::new().await;
    let mut t = Tar::new();
    t.raw(
        tar::EntryType::Regular,
        "huge",
        "",
        0o644,
        b"only a little",
        10 << 30,
    );
    let limits = Limits {
        max_image_bytes: 1 << 30,
        ..Limits::default()
    };
    let err = h.pull(&[t.done()], limits).await.unwrap_err();
    assert!(matches!(err, ImageError::TooBig(_)), "{err}");
    assert!(err.to_string().contains("limits.max_image_bytes"), "{err}");
    assert!(h.store(limits).list().unwrap().is_empty());
    h.check_outside();
}

#[tokio::test]
async fn a_gzip_bomb_stops_at_the_header_in_bounded_time() {
    let h = Hostile::new().await;
    // 256 MiB of zeros is about 0.25 MiB gzipped.
    let zeros = vec![0u8; 256 << 20];
    let mut t = Tar::new();
    t.raw(
        tar::EntryType::Regular,
        "zeros",
        "",
        0o644,
        &zeros,
        zeros.len() as u64,
    );
    let tar = t.done();
    drop(zeros);
    let limits = Limits {
        max_image_bytes: 32 << 20,
        ..Limits::default()
    };
    let started = Instant::now();
    let err = h.pull(&[tar], limits).await.unwrap_err();
    assert!(matches!(err, ImageError::TooBig(_)), "{err}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    h.check_outside();
}

#[tokio::test]
async fn many_tiny_entries_stop_at_the_entry_limit() {
    let h = Hostile::new().await;
    let mut t = Tar::new();
    for i in 0..5_000 {
        t.raw(tar::EntryType::Regular, &format!("f{i}"), "", 0o644, b"", 0);
    }
    let limits = Limits {
        max_image_entries: 1_000,
        ..Limits::default()
    };
    let err = h.pull(&[t.done()], limits).await.unwrap_err();
    assert!(matches!(err, ImageError::TooBig(_)), "{err}");
    assert!(
        err.to_string().contains("limits.max_image_entries"),
        "{err}"
    );
    h.check_outside();
}

#[tokio::test]
async fn a_blob_that_does_not_match_its_digest_is_refused() {
    let h = Hostile::new().await;
    let layer = Tar::new().file("a", "genuine").done();
    h.reg.push("hostile/x", "t", std::slice::from_ref(&layer));
    let d = digest(&gzip(&layer));
    let mut tampered = gzip(&Tar::new().file("a", "tampered").done());
    tampered.truncate(gzip(&layer).len());
    h.reg
        .state
        .lock()
        .unwrap()
        .blobs
        .insert(d.clone(), tampered);
    let store = h.store(Limits::default());
    let err = store
        .pull(&h.reg.reference("hostile/x", "t"))
        .await
        .unwrap_err();
    assert!(matches!(err, ImageError::DigestMismatch(_)), "{err}");
    assert!(err.to_string().contains(&d), "{err}");
    // Longer than declared: refused as it streams.
    let mut longer = gzip(&layer);
    longer.extend_from_slice(&[0; 4096]);
    h.reg.state.lock().unwrap().blobs.insert(d.clone(), longer);
    let err = store
        .pull(&h.reg.reference("hostile/x", "t"))
        .await
        .unwrap_err();
    assert!(matches!(err, ImageError::DigestMismatch(_)), "{err}");
    assert!(store.list().unwrap().is_empty());
    h.check_outside();
}

#[tokio::test]
async fn an_image_over_the_size_cap_is_refused_before_any_layer_is_fetched() {
    let h = Hostile::new().await;
    let big: String = (0..200_000).map(|i| format!("{i:x}")).collect();
    let layer = Tar::new().file("big", &big).done();
    let d = digest(&gzip(&layer));
    let limits = Limits {
        max_image_bytes: 64 * 1024,
        ..Limits::default()
    };
    let err = h.pull(&[layer], limits).await.unwrap_err();
    assert!(matches!(err, ImageError::TooBig(_)), "{err}");
    assert!(err.to_string().contains("limits.max_image_bytes"), "{err}");
    assert_eq!(h.reg.gets(&d), 0);
    h.check_outside();
}

#[tokio::test]
async fn concurrent_pulls_of_one_digest_download_it_once() {
    let reg = Registry::start().await;
    let layers = [
        Tar::new().file("one", "1").done(),
        Tar::new().file("two", "2").done(),
    ];
    let digests: Vec<String> = layers.iter().map(|l| digest(&gzip(l))).collect();
    let manifest = reg.push("shared/x", "t", &layers);
    reg.state.lock().unwrap().blob_delay = Duration::from_millis(200);
    let tmp = tempfile::tempdir().unwrap();
    let store = reg.store(tmp.path(), Limits::default());
    let pulls: Vec<_> = (0..8)
        .map(|_| {
            let store = store.clone();
            let r = reg.reference("shared/x", "t");
            tokio::spawn(async move { store.pull(&r).await })
        })
        .collect();
    for p in pulls {
        assert_eq!(p.await.unwrap().unwrap().digest, manifest);
    }
    for d in &digests {
        assert_eq!(reg.gets(d), 1, "{d}");
    }
    assert_eq!(store.list().unwrap().len(), 1);
}

#[tokio::test]
async fn a_registry_that_asks_for_an_anonymous_bearer_token_gets_one() {
    let reg = Registry::start().await;
    let digest = reg.push("tok/x", "t", &[Tar::new().file("a", "a").done()]);
    reg.state.lock().unwrap().token = Some("t0k3n".into());
    let tmp = tempfile::tempdir().unwrap();
    let store = reg.store(tmp.path(), Limits::default());
    let image = store.pull(&reg.reference("tok/x", "t")).await.unwrap();
    assert_eq!(image.digest, digest);
    let queries = reg.state.lock().unwrap().token_queries.clone();
    // One token for the whole pull (manifest, config, layer).
    assert_eq!(
        queries,
        ["service=test-registry&scope=repository%3Atok%2Fx%3Apull"]
    );
}

const ZSTD_LAYER: &str = "application/vnd.oci.image.layer.v1.tar+zstd";

fn zstd(bytes: &[u8]) -> Vec<u8> {
    ruzstd::encoding::compress_to_vec(bytes, ruzstd::encoding::CompressionLevel::Fastest)
}

#[tokio::test]
async fn zstd_layers_of_several_frames_and_skippable_frames_are_applied() {
    let reg = Registry::start().await;
    // One tar stream split across two frames, with a skippable frame between them (as
    // zstd:chunked layers are made), then a plain one-frame zstd layer over it.
    let tar = Tar::new().file("a", "from zstd").file("b", "second").done();
    let (head, tail) = tar.split_at(1024);
    let mut multi = zstd(head);
    multi.extend_from_slice(&0x184D_2A50u32.to_le_bytes());
    multi.extend_from_slice(&5u32.to_le_bytes());
    multi.extend_from_slice(b"skip!");
    multi.extend_from_slice(&zstd(tail));
    let over = zstd(&Tar::new().file("b", "replaced").file(".wh.a", "").done());
    let layers = [
        (ZSTD_LAYER.to_string(), multi),
        (ZSTD_LAYER.to_string(), over),
    ];
    let digest = reg.push_blobs("z/x", "t", &layers, "amd64");
    let tmp = tempfile::tempdir().unwrap();
    let store = reg.store(tmp.path(), Limits::default());
    let image = store.pull(&reg.reference("z/x", "t")).await.unwrap();
    assert_eq!(image.digest, digest);
    assert_eq!(walk(&image.rootfs), ["b"]);
    assert_eq!(read(&image.rootfs.join("b")), "replaced");
}

#[tokio::test]
async fn a_gzip_layer_of_several_members_is_applied_whole() {
    // As umoci (pgzip) and pigz write them: one tar stream cut into gzip members, one after
    // another. A decoder that stops after the first member would keep "a" and lose "b".
    let reg = Registry::start().await;
    let tar = Tar::new()
        .file("a", "first member")
        .file("b", "second member")
        .done();
    let (head, tail) = tar.split_at(1024);
    let mut blob = gzip(head);
    blob.extend_from_slice(&gzip(tail));
    let layers = [(GZIP_LAYER.to_string(), blob)];
    let digest = reg.push_blobs("g/multi", "t", &layers, "amd64");
    let tmp = tempfile::tempdir().unwrap();
    let image = reg
        .store(tmp.path(), Limits::default())
        .pull(&reg.reference("g/multi", "t"))
        .await
        .unwrap();
    assert_eq!(image.digest, digest);
    assert_eq!(walk(&image.rootfs), ["a", "b"]);
    assert_eq!(read(&image.rootfs.join("b")), "second member");
}

#[tokio::test]
async fn a_zstd_frame_asking_for_a_huge_window_is_refused() {
    let h = Hostile::new().await;
    // Frame magic, no flags, a window of 2^30 bytes, one empty last raw block.
    let mut frame = 0xFD2F_B528u32.to_le_bytes().to_vec();
    frame.extend_from_slice(&[0x00, 20 << 3, 0x01, 0x00, 0x00]);
    let layers = [(ZSTD_LAYER.to_string(), frame)];
    h.reg.push_blobs("hostile/x", "t", &layers, "amd64");
    let err = h
        .store(Limits::default())
        .pull(&h.reg.reference("hostile/x", "t"))
        .await
        .unwrap_err();
    assert!(matches!(err, ImageError::InvalidLayer(_)), "{err}");
    assert!(err.to_string().to_lowercase().contains("window"), "{err}");
    h.check_outside();
}

#[tokio::test]
async fn whiteouts_and_opaque_markers_beneath_links_aimed_outside_stay_inside() {
    let h = Hostile::new().await;
    let outside = h.tmp.path().display().to_string();
    let l1 = Tar::new()
        .symlink("abs", &outside)
        .symlink("up", "../../../../../../../../..")
        .done();
    let l2 = Tar::new()
        .file("abs/.wh.canary", "")
        .file(&format!("up{outside}/.wh.canary"), "")
        .file("abs/.wh..wh..opq", "")
        .file(&format!("up{outside}/.wh..wh..opq"), "")
        .file("up/.wh..wh..opq", "")
        .file("kept", "k")
        .done();
    let image = h.pull(&[l1, l2], Limits::default()).await.unwrap();
    // `up/` is the image's root: opaque there, what the layer below left goes, `kept` stays.
    assert_eq!(walk(&image.rootfs), ["kept"]);
    h.check_outside();
}

#[tokio::test]
async fn a_file_over_a_hard_link_does_not_write_into_the_linked_file() {
    let h = Hostile::new().await;
    let l1 = Tar::new()
        .file("etc/shadow", "original")
        .hardlink("h", "etc/shadow")
        .done();
    let l2 = Tar::new().file("h", "rewritten").done();
    let image = h.pull(&[l1, l2], Limits::default()).await.unwrap();
    assert_eq!(read(&image.rootfs.join("etc/shadow")), "original");
    assert_eq!(read(&image.rootfs.join("h")), "rewritten");
    h.check_outside();
}

#[tokio::test]
async fn extension_headers_are_bounded_and_their_names_resolved_inside() {
    let h = Hostile::new().await;
    // A GNU long name declaring 10 MiB: refused at its header.
    let mut t = Tar::new();
    t.raw(
        tar::EntryType::GNULongName,
        "././@LongLink",
        "",
        0o644,
        b"x",
        10 << 20,
    );
    let err = h.pull(&[t.done()], Limits::default()).await.unwrap_err();
    assert!(matches!(err, ImageError::InvalidLayer(_)), "{err}");
    assert!(err.to_string().contains("extension header"), "{err}");
    // A pax path climbing out: cleaned inside the root.
    let record = b"path=../../../../../../pax-escape\n";
    let pax = format!("{} {}", record.len() + 3, String::from_utf8_lossy(record));
    assert_eq!(pax.len(), record.len() + 3);
    let mut t = Tar::new();
    t.raw(
        tar::EntryType::XHeader,
        "pax",
        "",
        0o644,
        pax.as_bytes(),
        pax.len() as u64,
    );
    t.raw(tar::EntryType::Regular, "short", "", 0o644, b"p", 1);
    let image = h.pull(&[t.done()], Limits::default()).await.unwrap();
    assert_eq!(read(&image.rootfs.join("pax-escape")), "p");
    assert!(!h.tmp.path().join("pax-escape").exists());
    h.check_outside();
}

#[tokio::test]
async fn an_opaque_directory_keeps_what_its_layer_wrote_through_a_link() {
    let reg = Registry::start().await;
    let l1 = Tar::new()
        .file("usr/bin/old", "o")
        .symlink("bin", "usr/bin")
        .done();
    let l2 = Tar::new()
        .file("bin/new", "n")
        .file("usr/bin/.wh..wh..opq", "")
        .done();
    reg.push("o/x", "t", &[l1, l2]);
    let tmp = tempfile::tempdir().unwrap();
    let image = reg
        .store(tmp.path(), Limits::default())
        .pull(&reg.reference("o/x", "t"))
        .await
        .unwrap();
    assert_eq!(walk(&image.rootfs.join("usr/bin")), ["new"]);
}

#[tokio::test]
async fn a_registry_that_is_too_slow_fails_the_pull_at_its_deadline() {
    let h = Hostile::new().await;
    h.reg
        .push("hostile/x", "t", &[Tar::new().file("a", "a").done()]);
    h.reg.state.lock().unwrap().blob_delay = Duration::from_secs(30);
    let limits = Limits {
        pull_timeout: Duration::from_millis(500),
        ..Limits::default()
    };
    let started = Instant::now();
    let err = h
        .store(limits)
        .pull(&h.reg.reference("hostile/x", "t"))
        .await
        .unwrap_err();
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    assert!(
        err.to_string().contains("limits.image_pull_timeout_ms"),
        "{err}"
    );
    h.check_outside();
}

#[tokio::test]
async fn a_tree_made_deep_through_links_is_removed_without_exhausting_the_stack() {
    // Each chain is 1,900 directories (a path within PATH_MAX); a link to the bottom of the last
    // one starts the next, so the real tree is 15,200 levels deep, far deeper than a path can
    // name. A whiteout of its top removes it all, as does removing the image.
    let h = Hostile::new().await;
    let chain = vec!["d"; 1900].join("/");
    let mut b = tar::Builder::new(Vec::new());
    let file = |b: &mut tar::Builder<Vec<u8>>, path: &str| {
        let mut hd = tar::Header::new_gnu();
        hd.set_entry_type(tar::EntryType::Regular);
        hd.set_mode(0o644);
        hd.set_size(1);
        b.append_data(&mut hd, path, &b"x"[..]).unwrap();
    };
    file(&mut b, &format!("{chain}/f"));
    let mut prev = String::new();
    for i in 1..8 {
        let link = format!("l{i}");
        let target = if prev.is_empty() {
            chain.clone()
        } else {
            format!("{prev}/{chain}")
        };
        let mut hd = tar::Header::new_gnu();
        hd.set_entry_type(tar::EntryType::Symlink);
        hd.set_mode(0o777);
        hd.set_size(0);
        b.append_link(&mut hd, &link, &target).unwrap();
        file(&mut b, &format!("{link}/{chain}/f"));
        prev = link;
    }
    let l1 = b.into_inner().unwrap();
    let l2 = Tar::new().file(".wh.d", "").file("kept", "k").done();
    let image = h
        .pull(std::slice::from_ref(&l1), Limits::default())
        .await
        .unwrap();
    let store = h.store(Limits::default());
    assert_eq!(store.remove(&image.digest).unwrap(), Removal::Removed);
    let image = h.pull(&[l1, l2], Limits::default()).await.unwrap();
    let mut left = walk(&image.rootfs);
    left.retain(|p| !p.starts_with('l'));
    assert_eq!(left, ["kept"]);
    h.check_outside();
}

/// The digest of a tar layer as pushed (gzipped).
fn layer_digest(tar: &[u8]) -> String {
    digest(&gzip(tar))
}

/// Waits until `dir` has an entry (a pull's folder in `tmp/`), at most 10 s.
async fn until_not_empty(dir: &Path) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while walk(dir).is_empty() {
        assert!(
            Instant::now() < deadline,
            "nothing appeared in {}",
            dir.display()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn opening_the_cache_again_leaves_a_pull_under_way_alone() {
    let reg = Registry::start().await;
    let layer = Tar::new().file("a", "a").done();
    let digest = reg.push("slow/x", "t", std::slice::from_ref(&layer));
    reg.state
        .lock()
        .unwrap()
        .delays
        .insert(layer_digest(&layer), Duration::from_millis(800));
    let tmp = tempfile::tempdir().unwrap();
    let store = reg.store(tmp.path(), Limits::default());
    let r = reg.reference("slow/x", "t");
    let pull = tokio::spawn(async move { store.pull(&r).await });
    until_not_empty(&tmp.path().join("images/tmp")).await;
    // What `toolexec images list` does in another process while the service pulls.
    let other = reg.store(tmp.path(), Limits::default());
    assert!(other.list().unwrap().is_empty());
    let image = pull.await.unwrap().unwrap();
    assert_eq!(image.digest, digest);
    assert_eq!(read(&image.rootfs.join("a")), "a");
    assert!(walk(&tmp.path().join("images/tmp")).is_empty());
}

#[tokio::test]
async fn opening_the_cache_removes_what_a_dead_pull_left() {
    let tmp = tempfile::tempdir().unwrap();
    let left = tmp.path().join("images/tmp/1234-0-0");
    std::fs::create_dir_all(left.join("rootfs/usr")).unwrap();
    std::fs::write(left.join("rootfs/usr/f"), "x").unwrap();
    let reg = Registry::start().await;
    let _store = reg.store(tmp.path(), Limits::default());
    assert!(walk(&tmp.path().join("images/tmp")).is_empty());
}

#[tokio::test]
async fn a_pull_given_up_by_its_caller_leaves_nothing_in_tmp() {
    let reg = Registry::start().await;
    let layer = Tar::new().file("a", "a").done();
    reg.push("slow/x", "t", std::slice::from_ref(&layer));
    reg.state
        .lock()
        .unwrap()
        .delays
        .insert(layer_digest(&layer), Duration::from_secs(30));
    let tmp = tempfile::tempdir().unwrap();
    let store = reg.store(tmp.path(), Limits::default());
    let r = reg.reference("slow/x", "t");
    let s = store.clone();
    let pull = tokio::spawn(async move { s.pull(&r).await });
    let work = tmp.path().join("images/tmp");
    until_not_empty(&work).await;
    pull.abort();
    assert!(pull.await.unwrap_err().is_cancelled());
    assert!(walk(&work).is_empty(), "{:?}", walk(&work));
    assert!(store.list().unwrap().is_empty());
}

/// An image of one file of `bytes` bytes (its name `repo`'s, so that each is an image of its
/// own).
fn sized(reg: &Registry, repo: &str, bytes: usize) -> String {
    let name = repo.replace('/', "-");
    reg.push(
        repo,
        "t",
        &[Tar::new().file(&name, &"x".repeat(bytes)).done()],
    )
}

#[tokio::test]
async fn the_cache_evicts_the_least_recently_used_image_no_session_holds() {
    let reg = Registry::start().await;
    let a = sized(&reg, "a/x", 4000);
    let b = sized(&reg, "b/x", 4000);
    let c = sized(&reg, "c/x", 4000);
    let d = sized(&reg, "d/x", 4000);
    let tmp = tempfile::tempdir().unwrap();
    // Room for two images of 4000 bytes, not three.
    let limits = Limits {
        max_cache_bytes: 10_000,
        ..Limits::default()
    };
    let store = reg.store(tmp.path(), limits);
    let cached = |store: &ImageStore| {
        let mut d: Vec<String> = store
            .list()
            .unwrap()
            .into_iter()
            .map(|i| i.digest)
            .collect();
        d.sort();
        d
    };
    let sorted = |mut v: Vec<String>| {
        v.sort();
        v
    };
    let image_a = store.pull(&reg.reference("a/x", "t")).await.unwrap();
    let lease = store.lease(&image_a).unwrap();
    tokio::time::sleep(Duration::from_millis(20)).await;
    store.pull(&reg.reference("b/x", "t")).await.unwrap();
    tokio::time::sleep(Duration::from_millis(20)).await;
    // a is the least recently used, but a session holds it: b goes.
    store.pull(&reg.reference("c/x", "t")).await.unwrap();
    assert_eq!(cached(&store), sorted(vec![a.clone(), c.clone()]));
    // Another process on the node cannot remove it either.
    let other = reg.store(tmp.path(), limits);
    assert_eq!(other.remove(&a).unwrap(), Removal::InUse);
    assert!(image_a.rootfs.join("a-x").is_file());
    drop(lease);
    tokio::time::sleep(Duration::from_millis(20)).await;
    // Released, a is the least recently used: it goes for d.
    store.pull(&reg.reference("d/x", "t")).await.unwrap();
    assert_eq!(cached(&store), sorted(vec![c.clone(), d.clone()]));
    assert!(!image_a.rootfs.exists());
    // Taking c again makes d the one to go next.
    let image_c = store.get(&c).unwrap().unwrap();
    drop(store.lease(&image_c).unwrap());
    tokio::time::sleep(Duration::from_millis(20)).await;
    store.pull(&reg.reference("b/x", "t")).await.unwrap();
    assert_eq!(cached(&store), sorted(vec![b, c]));
    assert!(walk(&tmp.path().join("images/tmp")).is_empty());
}

#[tokio::test]
async fn a_lease_on_a_removed_image_fails() {
    let reg = Registry::start().await;
    sized(&reg, "a/x", 10);
    let tmp = tempfile::tempdir().unwrap();
    let store = reg.store(tmp.path(), Limits::default());
    let image = store.pull(&reg.reference("a/x", "t")).await.unwrap();
    assert_eq!(store.remove(&image.digest).unwrap(), Removal::Removed);
    let err = store.lease(&image).unwrap_err();
    assert!(err.to_string().contains("pull it again"), "{err}");
}

fn basic(user: &str, password: &str) -> String {
    use base64::Engine;
    format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"))
    )
}

fn credential(reg: &Registry, password: Option<&str>, file: Option<&Path>) -> RegistryCredential {
    RegistryCredential {
        registry: reg.host.clone(),
        username: "alice".into(),
        password: password.map(str::to_owned),
        password_file: file.map(Path::to_path_buf),
    }
}

#[tokio::test]
async fn a_registry_with_basic_auth_is_pulled_from_with_the_operators_credentials_only() {
    let mut reg = Registry::start().await;
    let digest = reg.push("priv/x", "t", &[Tar::new().file("a", "a").done()]);
    reg.state.lock().unwrap().basic = Some(basic("alice", "s3cr3t-pw"));
    let r = reg.reference("priv/x", "t");

    let tmp = tempfile::tempdir().unwrap();
    let err = reg
        .store(tmp.path(), Limits::default())
        .pull(&r)
        .await
        .unwrap_err();
    assert!(matches!(err, ImageError::Unauthorized(_)), "{err}");
    assert!(
        err.to_string().contains("environments.credentials"),
        "{err}"
    );

    reg.credentials = vec![credential(&reg, Some("wrong-pw"), None)];
    let err = reg
        .store(tmp.path(), Limits::default())
        .pull(&r)
        .await
        .unwrap_err();
    assert!(matches!(err, ImageError::Unauthorized(_)), "{err}");
    assert!(err.to_string().contains("check them"), "{err}");
    assert!(!err.to_string().contains("wrong-pw"), "{err}");
    assert!(!format!("{:?}", reg.credentials).contains("wrong-pw"));

    // From a file (a mounted secret), its trailing newline not part of it.
    let secret = tmp.path().join("secret");
    std::fs::write(&secret, "s3cr3t-pw\n").unwrap();
    reg.credentials = vec![credential(&reg, None, Some(&secret))];
    let image = reg
        .store(tmp.path(), Limits::default())
        .pull(&r)
        .await
        .unwrap();
    assert_eq!(image.digest, digest);
    assert_eq!(read(&image.rootfs.join("a")), "a");
    let json = std::fs::read_to_string(image.rootfs.parent().unwrap().join("image.json")).unwrap();
    assert!(!json.contains("s3cr3t"), "{json}");
}

#[tokio::test]
async fn a_registry_whose_token_service_wants_credentials_gets_them_for_the_token_only() {
    let mut reg = Registry::start().await;
    let digest = reg.push("tok/x", "t", &[Tar::new().file("a", "a").done()]);
    {
        let mut s = reg.state.lock().unwrap();
        s.token = Some("t0k3n".into());
        s.token_basic = Some(basic("alice", "s3cr3t-pw"));
    }
    let r = reg.reference("tok/x", "t");
    let tmp = tempfile::tempdir().unwrap();
    let err = reg
        .store(tmp.path(), Limits::default())
        .pull(&r)
        .await
        .unwrap_err();
    assert!(matches!(err, ImageError::Unauthorized(_)), "{err}");
    assert!(
        err.to_string().contains("environments.credentials"),
        "{err}"
    );

    reg.credentials = vec![credential(&reg, Some("s3cr3t-pw"), None)];
    let image = reg
        .store(tmp.path(), Limits::default())
        .pull(&r)
        .await
        .unwrap();
    assert_eq!(image.digest, digest);
    // The credentials went to the token service; the registry itself saw the token.
    let sent = reg.state.lock().unwrap().authorizations.clone();
    assert!(sent.contains(&basic("alice", "s3cr3t-pw")), "{sent:?}");
    assert!(sent.contains(&"Bearer t0k3n".to_owned()), "{sent:?}");
    assert_eq!(
        sent.iter().filter(|a| a.starts_with("Basic")).count(),
        1,
        "{sent:?}"
    );
}

#[tokio::test]
async fn a_registry_at_an_address_the_egress_policy_refuses_is_not_reached() {
    let reg = Registry::start().await;
    reg.push("a/x", "t", &[Tar::new().file("a", "a").done()]);
    let tmp = tempfile::tempdir().unwrap();
    toolexec_tools::web::install_tls_provider();
    let store = ImageStore::open(
        tmp.path(),
        Limits::default(),
        reqwest::Client::new(),
        toolexec_image::Registries {
            insecure: vec![reg.host.clone()],
            credentials: Vec::new(),
            policy: toolexec_net::NetPolicy::public_only(),
        },
    )
    .unwrap();
    let err = store.pull(&reg.reference("a/x", "t")).await.unwrap_err();
    assert!(matches!(err, ImageError::RegistryNotAllowed(_)), "{err}");
    assert!(
        err.to_string().contains("environments.allow_cidrs"),
        "{err}"
    );
    assert!(err.to_string().contains("loopback"), "{err}");
    // Nothing was asked of it.
    assert!(reg.state.lock().unwrap().blob_gets.is_empty());
}

/// Entries beneath `tmp`'s pulls' `rootfs` folders, counted while they change (a folder that
/// goes meanwhile counts as empty).
fn unpacked_so_far(tmp: &Path) -> usize {
    let mut n = 0;
    let Ok(pulls) = std::fs::read_dir(tmp) else {
        return 0;
    };
    for pull in pulls.flatten() {
        let mut todo = vec![pull.path().join("rootfs")];
        while let Some(d) = todo.pop() {
            let Ok(entries) = std::fs::read_dir(&d) else {
                continue;
            };
            for e in entries.flatten() {
                n += 1;
                if e.file_type().is_ok_and(|t| t.is_dir()) {
                    todo.push(e.path());
                }
            }
        }
    }
    n
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pull_given_up_while_unpacking_stops_and_leaves_no_folder_and_no_hold() {
    const FILES: usize = 20_000;
    let reg = Registry::start().await;
    let mut tar = Tar::new();
    for i in 0..FILES {
        tar = tar.file(&format!("d{}/f{i}", i % 100), "x");
    }
    let digest = reg.push("many/x", "t", &[tar.done()]);
    let tmp = tempfile::tempdir().unwrap();
    let store = reg.store(tmp.path(), Limits::default());
    let r = reg.reference("many/x", "t");
    let work = tmp.path().join("images/tmp");
    let s = store.clone();
    let r2 = r.clone();
    let pull = tokio::spawn(async move { s.pull(&r2).await });
    // Until its unpacking has begun (the layer is downloaded whole first).
    let deadline = Instant::now() + Duration::from_secs(60);
    while unpacked_so_far(&work) == 0 {
        assert!(Instant::now() < deadline, "the unpacking never began");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    pull.abort();
    let given_up = Instant::now();
    assert!(pull.await.unwrap_err().is_cancelled());
    // The unpacking stops at its next entry and its folder goes with it.
    let left = |work: &Path| std::fs::read_dir(work).unwrap().count();
    while left(&work) > 0 {
        assert!(
            given_up.elapsed() < Duration::from_secs(60),
            "the pull's folder is still there"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let cleaned = given_up.elapsed();
    assert!(store.list().unwrap().is_empty());
    assert!(walk(&tmp.path().join("images/sha256")).is_empty());

    // Nothing holds the image's digest: it is pulled again whole, and removed (no lock was
    // left on it, nor on a folder of its).
    let started = Instant::now();
    let image = store.pull(&r).await.unwrap();
    let whole = started.elapsed();
    assert_eq!(image.digest, digest);
    assert_eq!(walk(&image.rootfs).len(), FILES + 100);
    assert_eq!(store.remove(&digest).unwrap(), Removal::Removed);
    assert!(walk(&work).is_empty());
    // It stopped rather than unpacking on to the end of its blob's buffer (thousands of
    // entries of this layer) before its folder was removed.
    assert!(
        cleaned * 4 < whole,
        "given up and removed in {cleaned:?}; a whole pull takes {whole:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_caches_on_one_folder_download_a_digest_once() {
    // Two stores opened on one folder share nothing in memory, as two processes (the service
    // and `toolexec images pull`, or two services on one data folder) do; a flock is per open
    // file, so they contend for it as two processes would.
    let reg = Registry::start().await;
    let layer = Tar::new().file("a", "a").done();
    let manifest = reg.push("twice/x", "t", std::slice::from_ref(&layer));
    reg.state
        .lock()
        .unwrap()
        .delays
        .insert(layer_digest(&layer), Duration::from_millis(500));
    let tmp = tempfile::tempdir().unwrap();
    let pulls: Vec<_> = (0..2)
        .map(|_| {
            let store = reg.store(tmp.path(), Limits::default());
            let r = reg.reference("twice/x", "t");
            tokio::spawn(async move { store.pull(&r).await })
        })
        .collect();
    for p in pulls {
        let image = p.await.unwrap().unwrap();
        assert_eq!(image.digest, manifest);
        assert_eq!(read(&image.rootfs.join("a")), "a");
    }
    assert_eq!(reg.gets(&layer_digest(&layer)), 1);
    assert!(walk(&tmp.path().join("images/tmp")).is_empty());
}
