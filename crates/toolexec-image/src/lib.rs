//! OCI images for sessions: pulled from a registry, every blob verified against its digest,
//! layers unpacked as hostile input (the `unpack` module) into a content-addressed directory under the
//! data folder, one pull per manifest digest however many ask at once.
//!
//! Layout under the cache's folder (the service's is `<workspace_root>/.images`):
//! - `sha256/<hex>/` — one image, by the digest of its (platform) manifest: `rootfs/` (the
//!   layers applied in order) and `image.json` ([`Image`]). It appears whole (a rename) or not
//!   at all.
//! - `locks/` — one empty file per digest pulled, `flock`ed while a process pulls it, so that
//!   processes sharing the cache download a digest once (the `digest_lock` module).
//! - `tmp/` — downloads and unpackings under way, and images being removed. Each entry is held
//!   by an exclusive `flock` while its pull or removal runs; opening the cache (another process's
//!   `toolexec images list`) removes only the entries no one holds, what a process that died
//!   left. A pull whose caller gives up (its future dropped) removes its own entry.
//!
//! Sessions run in these trees (`toolexec-engine`'s `environments`, the sandbox init binds
//! them), each holding a [`Lease`] on its image: a shared `flock` on the image's directory, seen
//! by every process on the node. An image under a lease is neither removed
//! ([`ImageStore::remove`] answers [`Removal::InUse`]) nor evicted. The cache is bounded
//! (`environments.max_cache_bytes`, [`Limits::max_cache_bytes`]): before a pull and after it
//! lands, the least recently used images no one leases are evicted until the cache fits (the
//! modification time of an image's `image.json` is when a session last took it).
//!
//! Registries are reached through the egress classification (`toolexec-net`): a URL with an
//! IP-literal host is checked here before it is requested, names by the caller's client when
//! it dials (the service's resolves through the same policy, and checks redirect targets).
use std::collections::HashMap;
use std::io::{self, BufReader};
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use rustix::fs::{FlockOperation, Mode, OFlags};
use serde::{Deserialize, Serialize};

mod compression;
mod config;
mod digest_lock;
pub mod reference;
mod registry;
mod unpack;

use compression::{Compression, ZstdFrames, compression};
pub use config::{EnvironmentsConfig, NamedImage, RegistryCredential};
pub use reference::Reference;
use registry::Registry;

/// Why an image could not be had. Each is its own kind, for its own problem code.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ImageError {
    #[error("invalid image reference {0}")]
    InvalidReference(String),
    #[error("registry not allowed: {0}")]
    RegistryNotAllowed(String),
    #[error("image not found: {0}")]
    NotFound(String),
    #[error("unauthorized: {0}")]
    Unauthorized(String),
    #[error("registry unreachable: {0}")]
    Unreachable(String),
    #[error("no image for this platform: {0}")]
    WrongPlatform(String),
    #[error("image too big: {0}")]
    TooBig(String),
    #[error("digest mismatch: {0}")]
    DigestMismatch(String),
    #[error("invalid manifest: {0}")]
    InvalidManifest(String),
    #[error("invalid layer: {0}")]
    InvalidLayer(String),
    #[error("image cache: {0}")]
    Io(String),
}

/// The operator's bounds on one image.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// The most an image may be: its blobs as downloaded, and again its files unpacked
    /// (`limits.max_image_bytes`).
    pub max_image_bytes: u64,
    /// Tar headers across its layers (`limits.max_image_entries`): bounds inodes and time.
    pub max_image_entries: u64,
    /// Longest one pull may take, from its first request to the image in place
    /// (`limits.image_pull_timeout_ms`): a registry that trickles bytes cannot hold it forever.
    pub pull_timeout: std::time::Duration,
    /// The most the cache's images may take unpacked, together
    /// (`environments.max_cache_bytes`): past it, the least recently used images no session
    /// holds are evicted. Images in use are never evicted, so the cache can exceed it while
    /// they are.
    pub max_cache_bytes: u64,
}

/// `environments.max_cache_bytes` when the operator sets none: four images at the largest
/// `limits.max_image_bytes` allows by default.
pub const DEFAULT_MAX_CACHE_BYTES: u64 = 32 * 1024 * 1024 * 1024;

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_image_bytes: 8 * 1024 * 1024 * 1024,
            max_image_entries: 1_000_000,
            pull_timeout: std::time::Duration::from_secs(30 * 60),
            max_cache_bytes: DEFAULT_MAX_CACHE_BYTES,
        }
    }
}

/// How registries are reached: which over plain HTTP, which with credentials, and which
/// addresses at all.
#[derive(Debug, Clone, Default)]
pub struct Registries {
    /// Registries (`host[:port]`) reached over plain HTTP.
    pub insecure: Vec<String>,
    pub credentials: Vec<RegistryCredential>,
    /// The public internet plus the operator's allow-list (`environments.allow_cidrs`): a
    /// registry on a private network or loopback must be named there.
    pub policy: toolexec_net::NetPolicy,
}

/// What [`ImageStore::remove`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Removal {
    Removed,
    /// The image is not in the cache.
    NotCached,
    /// A session (of this process or another on the node) runs in it: it was left alone.
    InUse,
}

/// A session's hold on a cached image (a shared `flock` on its directory): while any exists,
/// in any process, the image is neither evicted nor removed. Released when dropped.
#[derive(Debug)]
pub struct Lease {
    _dir: OwnedFd,
    pub digest: String,
}

/// An image in the cache.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Image {
    /// The reference it was pulled as.
    pub reference: String,
    /// The digest of its manifest for this platform: what a session records.
    pub digest: String,
    pub config_digest: String,
    /// The config's `Env` and `WorkingDir`.
    pub env: Vec<String>,
    pub working_dir: String,
    /// Bytes of its files unpacked, and its blobs as downloaded.
    pub unpacked_bytes: u64,
    pub download_bytes: u64,
    /// Device nodes and FIFOs its layers held, not made.
    pub skipped_devices: u64,
    /// Where its tree is (not serialized: it follows from the cache's folder).
    #[serde(skip)]
    pub rootfs: PathBuf,
}

/// A pull under way: its result once there, and its progress for every caller waiting on it.
#[derive(Debug, Default)]
struct Pull {
    result: tokio::sync::OnceCell<Result<Image, ImageError>>,
    progress: std::sync::OnceLock<tokio::sync::watch::Sender<Progress>>,
}

impl Pull {
    fn progress(&self) -> &tokio::sync::watch::Sender<Progress> {
        self.progress
            .get_or_init(|| tokio::sync::watch::Sender::new(Progress::default()))
    }
}

type Inflight = Arc<Pull>;

/// How far a pull is: bytes of its blobs downloaded (and checked) of all it declares.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Progress {
    pub bytes_done: u64,
    pub bytes_total: u64,
}

/// The images of one data folder.
#[derive(Debug, Clone)]
pub struct ImageStore {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    dir: PathBuf,
    limits: Limits,
    client: reqwest::Client,
    insecure: Vec<String>,
    credentials: Vec<RegistryCredential>,
    policy: toolexec_net::NetPolicy,
    inflight: Mutex<HashMap<String, Inflight>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Descriptor {
    media_type: Option<String>,
    digest: String,
    size: u64,
    platform: Option<Platform>,
}

#[derive(Deserialize)]
struct Platform {
    architecture: String,
    os: String,
    variant: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Manifest {
    media_type: Option<String>,
    config: Option<Descriptor>,
    layers: Option<Vec<Descriptor>>,
    manifests: Option<Vec<Descriptor>>,
}

#[derive(Deserialize, Default)]
struct ConfigFile {
    architecture: Option<String>,
    os: Option<String>,
    config: Option<RunConfig>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "PascalCase")]
struct RunConfig {
    env: Option<Vec<String>>,
    working_dir: Option<String>,
}

/// Largest image config.
const MAX_CONFIG_BYTES: u64 = 4 * 1024 * 1024;

/// The host's architecture as OCI names it.
pub fn host_architecture() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "x86" => "386",
        other => other,
    }
}

fn io(what: &Path, e: impl std::fmt::Display) -> ImageError {
    ImageError::Io(format!("{}: {e}", what.display()))
}

/// Whether `digest` is a sha256 digest, and its hex.
fn digest_hex(digest: &str) -> Result<&str, ImageError> {
    if reference::is_sha256_digest(digest) {
        Ok(&digest[7..])
    } else {
        Err(ImageError::InvalidManifest(format!(
            "'{digest}' is not a sha256 digest"
        )))
    }
}

impl ImageStore {
    /// The image cache under `data_dir/images`, with `client` for registries (the registries
    /// in `insecure` are reached over plain HTTP, those in `credentials` with them). Every URL
    /// requested (a registry's, a token realm's) is checked against `policy` first: an
    /// IP-literal host must be public or allow-listed. Names are the client's to check when
    /// they are dialled (the service's client resolves through the same policy), as are
    /// redirects. Removes what an earlier run left unfinished.
    pub fn open(
        data_dir: &Path,
        limits: Limits,
        client: reqwest::Client,
        registries: Registries,
    ) -> Result<Self, ImageError> {
        Self::open_at(&data_dir.join("images"), limits, client, registries)
    }

    /// [`ImageStore::open`] with the cache in `dir` itself.
    pub fn open_at(
        dir: &Path,
        limits: Limits,
        client: reqwest::Client,
        registries: Registries,
    ) -> Result<Self, ImageError> {
        let Registries {
            insecure,
            credentials,
            policy,
        } = registries;
        let dir = dir.to_path_buf();
        let tmp = dir.join("tmp");
        for d in [&dir.join("sha256"), &tmp, &dir.join("locks")] {
            std::fs::create_dir_all(d).map_err(|e| io(d, e))?;
        }
        sweep(&tmp)?;
        Ok(Self {
            inner: Arc::new(Inner {
                dir,
                limits,
                client,
                insecure,
                credentials,
                policy,
                inflight: Mutex::new(HashMap::new()),
            }),
        })
    }

    fn image_dir(&self, digest: &str) -> Result<PathBuf, ImageError> {
        Ok(self.inner.dir.join("sha256").join(digest_hex(digest)?))
    }

    /// The cached image of `digest`, if it is there.
    pub fn get(&self, digest: &str) -> Result<Option<Image>, ImageError> {
        let dir = self.image_dir(digest)?;
        let meta = dir.join("image.json");
        let bytes = match std::fs::read(&meta) {
            Ok(b) => b,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(io(&meta, e)),
        };
        let mut image: Image = serde_json::from_slice(&bytes).map_err(|e| io(&meta, e))?;
        image.rootfs = dir.join("rootfs");
        Ok(Some(image))
    }

    /// Every cached image.
    pub fn list(&self) -> Result<Vec<Image>, ImageError> {
        let mut out: Vec<Image> = self.scan()?.into_iter().map(|(i, _)| i).collect();
        out.sort_by(|a, b| a.reference.cmp(&b.reference));
        Ok(out)
    }

    /// Every cached image with when a session last took it.
    fn scan(&self) -> Result<Vec<(Image, std::time::SystemTime)>, ImageError> {
        let sha = self.inner.dir.join("sha256");
        let mut out = Vec::new();
        for entry in std::fs::read_dir(&sha).map_err(|e| io(&sha, e))? {
            let entry = entry.map_err(|e| io(&sha, e))?;
            let digest = format!("sha256:{}", entry.file_name().to_string_lossy());
            if let Ok(Some(image)) = self.get(&digest) {
                let used = std::fs::metadata(entry.path().join("image.json"))
                    .and_then(|m| m.modified())
                    .unwrap_or(std::time::UNIX_EPOCH);
                out.push((image, used));
            }
        }
        Ok(out)
    }

    /// Marks `digest` as used now (the order eviction goes by).
    fn touch(&self, digest: &str) {
        if let Ok(dir) = self.image_dir(digest) {
            let now = std::time::SystemTime::now();
            let _ = std::fs::File::options()
                .write(true)
                .open(dir.join("image.json"))
                .and_then(|f| f.set_times(std::fs::FileTimes::new().set_modified(now)));
        }
    }

    /// A hold on `image` for a session that runs in it: while the [`Lease`] lives, the image
    /// is neither evicted nor removed (by this process or another). Fails when the image is no
    /// longer in the cache (it was removed meanwhile: pull it again).
    pub fn lease(&self, image: &Image) -> Result<Lease, ImageError> {
        let dir = self.image_dir(&image.digest)?;
        let gone = || {
            ImageError::Io(format!(
                "{}: the image was removed from the cache as a session took it; pull it again",
                image.digest
            ))
        };
        let fd = match open_root(&dir) {
            Ok(fd) => fd,
            Err(_) if !dir.exists() => return Err(gone()),
            Err(e) => return Err(e),
        };
        match rustix::fs::flock(&fd, FlockOperation::NonBlockingLockShared) {
            Ok(()) => {}
            // Held exclusively: being removed.
            Err(rustix::io::Errno::WOULDBLOCK) => return Err(gone()),
            Err(e) => return Err(io(&dir, e)),
        }
        // Still the image's directory (not renamed away for removal before the lock was had).
        let held = rustix::fs::fstat(&fd).map_err(|e| io(&dir, e))?;
        if rustix::fs::stat(dir.join("image.json")).is_err() {
            return Err(gone());
        }
        let now = rustix::fs::stat(&dir).map_err(|_| gone())?;
        if (now.st_dev, now.st_ino) != (held.st_dev, held.st_ino) {
            return Err(gone());
        }
        self.touch(&image.digest);
        Ok(Lease {
            _dir: fd,
            digest: image.digest.clone(),
        })
    }

    /// Removes the cached image of `digest`, unless a session holds it.
    pub fn remove(&self, digest: &str) -> Result<Removal, ImageError> {
        let dir = self.image_dir(digest)?;
        let fd = match open_root(&dir) {
            Ok(fd) => fd,
            Err(_) if !dir.exists() => return Ok(Removal::NotCached),
            Err(e) => return Err(e),
        };
        match rustix::fs::flock(&fd, FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => {}
            Err(rustix::io::Errno::WOULDBLOCK) => return Ok(Removal::InUse),
            Err(e) => return Err(io(&dir, e)),
        }
        // Renamed away first, so that it is gone at once and whole; the lock (on the directory
        // itself) goes with it, so that no sweep of `tmp/` takes it meanwhile.
        let doomed = self.inner.dir.join("tmp").join(format!("rm-{}", unique()));
        match std::fs::rename(&dir, &doomed) {
            Ok(()) => {}
            // Removed by another meanwhile.
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Removal::NotCached),
            Err(e) => return Err(io(&dir, e)),
        }
        remove_tree(&doomed)?;
        drop(fd);
        Ok(Removal::Removed)
    }

    /// Evicts the least recently used images no session holds until the cache, with
    /// `incoming` bytes more, fits `max_cache_bytes` (`keep` is never evicted: the image just
    /// pulled). What cannot be evicted (in use) stays, and the cache is over its bound until it
    /// is released.
    fn make_room(&self, incoming: u64, keep: Option<&str>) {
        let max = self.inner.limits.max_cache_bytes;
        let Ok(mut images) = self.scan() else {
            return;
        };
        let mut total: u64 = images.iter().map(|(i, _)| i.unpacked_bytes).sum();
        if total.saturating_add(incoming) <= max {
            return;
        }
        images.sort_by_key(|(_, used)| *used);
        for (image, _) in images {
            if total.saturating_add(incoming) <= max {
                break;
            }
            if keep == Some(image.digest.as_str()) {
                continue;
            }
            match self.remove(&image.digest) {
                Ok(Removal::Removed) => {
                    total = total.saturating_sub(image.unpacked_bytes);
                    tracing::info!(
                        digest = %image.digest,
                        reference = %image.reference,
                        bytes = image.unpacked_bytes,
                        max_cache_bytes = max,
                        "image evicted from the cache (least recently used)"
                    );
                }
                Ok(Removal::NotCached | Removal::InUse) => {}
                Err(e) => tracing::warn!(digest = %image.digest, "evicting: {e}"),
            }
        }
        if total.saturating_add(incoming) > max {
            tracing::warn!(
                cache_bytes = total,
                incoming,
                max_cache_bytes = max,
                "the image cache is over environments.max_cache_bytes: the images left are in \
                 use by sessions"
            );
        }
    }

    /// Pulls `reference` (unless its manifest's digest is cached) and returns the image.
    /// Concurrent pulls that resolve to one digest share one download and unpacking.
    pub async fn pull(&self, reference: &str) -> Result<Image, ImageError> {
        self.resolve(reference).await.map(|(image, _)| image)
    }

    /// [`ImageStore::pull`], and whether the image was in the cache already (`false`: this
    /// call pulled it, or waited for the pull of another).
    pub async fn resolve(&self, reference: &str) -> Result<(Image, bool), ImageError> {
        self.resolve_watching(reference, |_| {}).await
    }

    /// [`ImageStore::resolve`], calling `progress` as the download goes on (whoever started
    /// the pull of that digest: every caller waiting on one pull sees its progress).
    pub async fn resolve_watching(
        &self,
        reference: &str,
        progress: impl Fn(Progress) + Send + Sync + 'static,
    ) -> Result<(Image, bool), ImageError> {
        let timeout = self.inner.limits.pull_timeout;
        let deadline = tokio::time::Instant::now() + timeout;
        let pulled = self.pull_by(reference, deadline, Arc::new(progress));
        match tokio::time::timeout_at(deadline, pulled).await {
            Ok(result) => result,
            Err(_) => Err(too_slow(reference, timeout)),
        }
    }

    async fn pull_by(
        &self,
        reference: &str,
        deadline: tokio::time::Instant,
        progress: Arc<dyn Fn(Progress) + Send + Sync>,
    ) -> Result<(Image, bool), ImageError> {
        let r = reference::parse(reference)?;
        if r.is_digest()
            && let Some(image) = self.get(&r.reference)?
        {
            self.touch(&image.digest);
            return Ok((image, true));
        }
        let insecure = self.inner.insecure.contains(&r.registry);
        let credential = self
            .inner
            .credentials
            .iter()
            .find(|c| c.registry == r.registry)
            .cloned();
        let registry = Registry::new(
            self.inner.client.clone(),
            &r,
            insecure,
            credential,
            self.inner.policy.clone(),
        );
        let (manifest, digest) = resolve_platform(&registry, &r).await?;
        if let Some(image) = self.get(&digest)? {
            self.touch(&image.digest);
            return Ok((image, true));
        }
        let cell = {
            let mut map = self
                .inner
                .inflight
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            map.entry(digest.clone()).or_default().clone()
        };
        // This caller's view of the pull's progress, whoever runs it.
        let mut watching = cell.progress().subscribe();
        let forward = tokio::spawn(async move {
            while watching.changed().await.is_ok() {
                let now = *watching.borrow_and_update();
                progress(now);
            }
        });
        let result = cell
            .result
            .get_or_init(|| self.fetch(&registry, &r, manifest, &digest, deadline, cell.progress()))
            .await
            .clone();
        forward.abort();
        {
            let mut map = self
                .inner
                .inflight
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            if map.get(&digest).is_some_and(|c| Arc::ptr_eq(c, &cell)) {
                map.remove(&digest);
            }
        }
        result.map(|image| (image, false))
    }

    /// Downloads and unpacks the image of `manifest` (whose digest is `digest`).
    async fn fetch(
        &self,
        registry: &Registry,
        r: &Reference,
        manifest: Manifest,
        digest: &str,
        deadline: tokio::time::Instant,
        progress: &tokio::sync::watch::Sender<Progress>,
    ) -> Result<Image, ImageError> {
        if let Some(image) = self.get(digest)? {
            return Ok(image);
        }
        // Another process pulling this digest into this cache: wait for it, and take its image.
        let _digest_lock =
            digest_lock::exclusive(&self.inner.dir.join("locks"), digest_hex(digest)?).await?;
        if let Some(image) = self.get(digest)? {
            return Ok(image);
        }
        let limits = self.inner.limits;
        let config = manifest.config.ok_or_else(|| {
            ImageError::InvalidManifest(format!("{r}: the manifest has no config"))
        })?;
        let layers = manifest.layers.unwrap_or_default();
        let mut total = config.size;
        for l in &layers {
            digest_hex(&l.digest)?;
            total = total.saturating_add(l.size);
        }
        if total > limits.max_image_bytes {
            return Err(ImageError::TooBig(format!(
                "{r} is {total} bytes to download; the most one image may be is {} bytes \
                 (limits.max_image_bytes)",
                limits.max_image_bytes
            )));
        }
        if config.size > MAX_CONFIG_BYTES {
            return Err(ImageError::TooBig(format!(
                "{r}: its config is {} bytes, over {MAX_CONFIG_BYTES}",
                config.size
            )));
        }
        digest_hex(&config.digest)?;
        let config_bytes = registry
            .small_blob(&r.repository, &config.digest, config.size)
            .await?;
        let parsed: ConfigFile = serde_json::from_slice(&config_bytes).map_err(|e| {
            ImageError::InvalidManifest(format!("{r}: its config is not readable: {e}"))
        })?;
        if let (Some(os), Some(arch)) = (&parsed.os, &parsed.architecture)
            && (os != "linux" || arch != host_architecture())
        {
            return Err(ImageError::WrongPlatform(format!(
                "{r} is for {os}/{arch}; this host runs linux/{}",
                host_architecture()
            )));
        }
        // Room for it first (its download is the least it will take), then the work folder:
        // held while the pull runs, removed when it ends or its caller gives up.
        self.make_room(total, None);
        let work = WorkDir::create(&self.inner.dir.join("tmp"))?;
        let cancel = CancelOnDrop(work.cancelled.clone());
        // Within the deadline, or cut there (the unpacking checks it too, so that nothing goes
        // on writing once the pull has given up); either way `work` is removed below.
        let fetched = tokio::time::timeout_at(
            deadline,
            self.fetch_into(
                registry,
                r,
                &layers,
                &work,
                deadline.into_std(),
                (progress, total),
            ),
        )
        .await
        .unwrap_or_else(|_| Err(too_slow(&r.to_string(), limits.pull_timeout)));
        let (unpacked, skipped) = fetched?;
        let run = parsed.config.unwrap_or_default();
        let image = Image {
            reference: r.to_string(),
            digest: digest.to_string(),
            config_digest: config.digest.clone(),
            env: run.env.unwrap_or_default(),
            working_dir: run.working_dir.unwrap_or_default(),
            unpacked_bytes: unpacked,
            download_bytes: total,
            skipped_devices: skipped,
            rootfs: PathBuf::new(),
        };
        let meta = work.path.join("image.json");
        let json = serde_json::to_vec_pretty(&image).map_err(|e| io(&meta, e))?;
        std::fs::write(&meta, json).map_err(|e| io(&meta, e))?;
        let dest = self.image_dir(digest)?;
        match std::fs::rename(&work.path, &dest) {
            Ok(()) => {}
            // Another process finished it meanwhile (`work` is removed as it is dropped).
            Err(_) if dest.join("image.json").exists() => {}
            Err(e) => return Err(io(&dest, e)),
        }
        // Its lock released now: it is the image's directory, which sessions lease.
        drop(cancel);
        drop(work);
        self.make_room(0, Some(digest));
        self.get(digest)?
            .ok_or_else(|| ImageError::Io(format!("{digest} vanished as it was stored")))
    }

    /// Downloads each layer to `work`, verifies it, and applies it to `work/rootfs`.
    async fn fetch_into(
        &self,
        registry: &Registry,
        r: &Reference,
        layers: &[Descriptor],
        work: &Arc<WorkDir>,
        deadline: std::time::Instant,
        (progress, total): (&tokio::sync::watch::Sender<Progress>, u64),
    ) -> Result<(u64, u64), ImageError> {
        let cancelled = work.cancelled.clone();
        let work_dir = work;
        let work = work_dir.path.as_path();
        let limits = self.inner.limits;
        let mut done_before = total - layers.iter().map(|l| l.size).sum::<u64>();
        progress.send_replace(Progress {
            bytes_done: done_before,
            bytes_total: total,
        });
        let rootfs = work.join("rootfs");
        std::fs::create_dir(&rootfs).map_err(|e| io(&rootfs, e))?;
        let mut budget = unpack::Budget {
            bytes_left: limits.max_image_bytes,
            entries_left: limits.max_image_entries,
            max_bytes: limits.max_image_bytes,
            max_entries: limits.max_image_entries,
            deadline,
            timeout: limits.pull_timeout,
            cancelled: cancelled.clone(),
        };
        let mut skipped = 0;
        for layer in layers {
            let compression =
                compression(layer.media_type.as_deref().unwrap_or("")).map_err(|why| {
                    ImageError::InvalidLayer(format!("{r}: layer {}: {why}", layer.digest))
                })?;
            let blob = work.join(format!("{}.blob", digest_hex(&layer.digest)?));
            registry
                .blob_to_file(&r.repository, &layer.digest, layer.size, &blob, |n| {
                    progress.send_replace(Progress {
                        bytes_done: done_before + n,
                        bytes_total: total,
                    });
                })
                .await?;
            done_before += layer.size;
            let rootfs = rootfs.clone();
            let blob2 = blob.clone();
            let mut b = budget.clone();
            // The work folder stays until this ends, even when the pull is given up meanwhile
            // (then the unpacking stops at its next entry, or the reader below at its next
            // read, and the folder goes with the last hold on it).
            let hold = work_dir.clone();
            let cancelled = cancelled.clone();
            let (stats, b) = tokio::task::spawn_blocking(move || {
                let _hold = hold;
                let root = open_root(&rootfs)?;
                let file = std::fs::File::open(&blob2).map_err(|e| io(&blob2, e))?;
                let reader = BufReader::with_capacity(
                    256 * 1024,
                    Cancellable {
                        inner: file,
                        cancelled,
                    },
                );
                let stats = match compression {
                    // Every member of the stream: parallel compressors (umoci's pgzip, pigz)
                    // write a layer as several gzip members one after another, and a decoder
                    // that stops after the first drops the rest of the layer without a word.
                    Compression::Gzip => unpack::apply_layer(
                        &root,
                        flate2::read::MultiGzDecoder::new(reader),
                        &mut b,
                    ),
                    Compression::Zstd => {
                        unpack::apply_layer(&root, ZstdFrames::new(reader), &mut b)
                    }
                    Compression::None => unpack::apply_layer(&root, reader, &mut b),
                }?;
                Ok::<_, ImageError>((stats, b))
            })
            .await
            .map_err(|e| ImageError::Io(format!("unpacking: {e}")))??;
            budget = b;
            skipped += stats.skipped_devices;
            let _ = std::fs::remove_file(&blob);
        }
        Ok((limits.max_image_bytes - budget.bytes_left, skipped))
    }
}

/// A pull's folder under `tmp/`, held by an exclusive `flock` (so that another process opening
/// the cache leaves it alone) and removed with the last hold on it: when the pull ends, or when
/// its caller gives up and the unpacking under way has stopped.
#[derive(Debug)]
struct WorkDir {
    path: PathBuf,
    _lock: OwnedFd,
    /// Set when the pull is given up: the unpacking stops at its next read.
    cancelled: Arc<AtomicBool>,
}

impl WorkDir {
    fn create(tmp: &Path) -> Result<Arc<Self>, ImageError> {
        loop {
            let path = tmp.join(unique());
            std::fs::create_dir(&path).map_err(|e| io(&path, e))?;
            let fd = open_root(&path)?;
            rustix::fs::flock(&fd, FlockOperation::NonBlockingLockExclusive)
                .map_err(|e| io(&path, e))?;
            // A sweep by another process may have taken it between the two: then anew.
            let held = rustix::fs::fstat(&fd).map_err(|e| io(&path, e))?;
            match rustix::fs::stat(&path) {
                Ok(st) if (st.st_dev, st.st_ino) == (held.st_dev, held.st_ino) => {
                    return Ok(Arc::new(Self {
                        path,
                        _lock: fd,
                        cancelled: Arc::new(AtomicBool::new(false)),
                    }));
                }
                _ => continue,
            }
        }
    }
}

impl Drop for WorkDir {
    fn drop(&mut self) {
        // Gone already when the pull renamed it into place.
        if std::fs::symlink_metadata(&self.path).is_ok()
            && let Err(e) = remove_tree(&self.path)
        {
            tracing::warn!("removing an unfinished pull: {e}");
        }
    }
}

/// Marks a pull given up when the future that runs it is dropped before it ends.
struct CancelOnDrop(Arc<AtomicBool>);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// A layer's blob, read until its pull is given up.
struct Cancellable<R> {
    inner: R,
    cancelled: Arc<AtomicBool>,
}

impl<R: io::Read> io::Read for Cancellable<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.cancelled.load(Ordering::Relaxed) {
            return Err(io::Error::other("the pull was given up"));
        }
        self.inner.read(buf)
    }
}

/// Removes what no process holds in the cache's `tmp/`: the pulls and removals of a process
/// that died. Those under way (their folder `flock`ed) are left alone.
fn sweep(tmp: &Path) -> Result<(), ImageError> {
    for entry in std::fs::read_dir(tmp).map_err(|e| io(tmp, e))? {
        let entry = entry.map_err(|e| io(tmp, e))?;
        let path = entry.path();
        let Ok(fd) = rustix::fs::open(
            &path,
            OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        ) else {
            // Not openable (a link): nothing can hold it.
            let _ = std::fs::remove_file(&path);
            continue;
        };
        match rustix::fs::flock(&fd, FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => remove_tree(&path)?,
            Err(rustix::io::Errno::WOULDBLOCK) => {}
            Err(e) => return Err(io(&path, e)),
        }
    }
    Ok(())
}

fn too_slow(reference: &str, timeout: std::time::Duration) -> ImageError {
    ImageError::Unreachable(format!(
        "pulling {reference} took longer than {} ms (limits.image_pull_timeout_ms); nothing was \
         kept",
        timeout.as_millis()
    ))
}

/// The manifest for this host's platform of what `r` names, and its digest.
async fn resolve_platform(
    registry: &Registry,
    r: &Reference,
) -> Result<(Manifest, String), ImageError> {
    let (bytes, media_type, digest) = registry.manifest(&r.repository, &r.reference).await?;
    let parse = |bytes: &[u8]| {
        serde_json::from_slice::<Manifest>(bytes).map_err(|e| {
            ImageError::InvalidManifest(format!("{r}: the manifest is not readable: {e}"))
        })
    };
    let manifest = parse(&bytes)?;
    let kind = manifest.media_type.clone().unwrap_or(media_type);
    let is_index = kind == registry::OCI_INDEX
        || kind == registry::DOCKER_LIST
        || (manifest.manifests.is_some() && manifest.config.is_none());
    if !is_index {
        return Ok((manifest, digest));
    }
    let arch = host_architecture();
    let entries = manifest.manifests.unwrap_or_default();
    let chosen = entries.iter().find(|d| {
        d.platform.as_ref().is_some_and(|p| {
            p.os == "linux"
                && p.architecture == arch
                && (arch != "arm64" || p.variant.as_deref().is_none_or(|v| v == "v8"))
        })
    });
    let Some(chosen) = chosen else {
        let have: Vec<String> = entries
            .iter()
            .filter_map(|d| d.platform.as_ref())
            .map(|p| format!("{}/{}", p.os, p.architecture))
            .collect();
        return Err(ImageError::WrongPlatform(format!(
            "{r} has no image for linux/{arch} (it has: {})",
            have.join(", ")
        )));
    };
    digest_hex(&chosen.digest)?;
    let (bytes, _, digest) = registry.manifest(&r.repository, &chosen.digest).await?;
    let manifest = parse(&bytes)?;
    if manifest.config.is_none() {
        return Err(ImageError::InvalidManifest(format!(
            "{r}: the index names {}, which is not an image manifest",
            chosen.digest
        )));
    }
    Ok((manifest, digest))
}

fn open_root(path: &Path) -> Result<OwnedFd, ImageError> {
    rustix::fs::open(
        path,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| io(path, e))
}

/// Removes a directory of the cache and everything in it, following no link.
fn remove_tree(path: &Path) -> Result<(), ImageError> {
    let parent = path.parent().unwrap_or(Path::new("/"));
    let name = path.file_name().unwrap_or_default();
    let dir = open_root(parent)?;
    unpack::remove_all(&dir, std::os::unix::ffi::OsStrExt::as_bytes(name)).map_err(|e| io(path, e))
}

/// A name no other pull of this process or another uses.
fn unique() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    format!(
        "{}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos())
    )
}
