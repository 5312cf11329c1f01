//! Sessions in OCI images (issue 26, docs/environments.md): the image a new session asks for
//! (or the operator's default) is resolved to a manifest digest and pulled into the node's
//! cache (one pull per digest however many sessions ask at once); the digest is recorded on the
//! session, and every later runtime of it — a restart, a take-over by another replica, a fork,
//! a replay — runs in that digest, pulled again by digest if this node does not have it.
use std::sync::Arc;

use toolexec_core::{EnvironmentRequest, ProblemCode, SessionEnvironment};
pub use toolexec_image::Progress;
use toolexec_image::{EnvironmentsConfig, Image, ImageError, ImageStore};
use toolexec_sandbox::SessionImage;

use crate::runtimes::Runtimes;
use crate::runtimes::invalid;
use crate::{Engine, EngineError, Result};

/// The images sessions may run in and this node's cache of them.
#[derive(Debug)]
pub struct Environments {
    pub store: ImageStore,
    pub config: EnvironmentsConfig,
}

impl Environments {
    pub fn new(store: ImageStore, config: EnvironmentsConfig) -> Self {
        Self { store, config }
    }
}

/// What a pre-pull brought into the cache.
#[derive(Debug, Clone)]
pub struct PulledEnvironment {
    /// What a session asking for the same image now would record.
    pub environment: SessionEnvironment,
    /// Whether it was in the cache already (nothing was downloaded).
    pub cached: bool,
    pub unpacked_bytes: u64,
    pub download_bytes: u64,
}

/// The problem an image error is answered with.
pub(crate) fn problem(e: ImageError) -> EngineError {
    let (code, detail) = match e {
        ImageError::RegistryNotAllowed(d) => (ProblemCode::ImageNotAllowed, d),
        ImageError::NotFound(d) => (ProblemCode::ImageNotFound, d),
        ImageError::Unauthorized(d) => (ProblemCode::RegistryUnauthorized, d),
        ImageError::Unreachable(d) => (ProblemCode::RegistryUnreachable, d),
        ImageError::WrongPlatform(d) => (ProblemCode::ImageWrongPlatform, d),
        ImageError::TooBig(d) => (ProblemCode::ImageTooLarge, d),
        e @ (ImageError::InvalidReference(_)
        | ImageError::DigestMismatch(_)
        | ImageError::InvalidManifest(_)
        | ImageError::InvalidLayer(_)) => (ProblemCode::InvalidImage, e.to_string()),
        // The cache's own disk: the detail has host paths, for the log only.
        ImageError::Io(d) => return EngineError::Internal(format!("image cache: {d}")),
    };
    invalid(code, detail)
}

/// The image for a session's sandboxes, holding a lease on it in the cache (not evicted nor
/// removed while the session's runtime lives). The config's `Env` goes through the rule of a
/// session's `env` (`session_env`): what it refuses there (`LD_*`, `BASH_ENV`, `PYTHONPATH`, …)
/// is dropped here, and logged, so that an image cannot do what a session may not.
fn open(store: &ImageStore, image: &Image) -> Result<Arc<SessionImage>> {
    let lease = store.lease(image).map_err(problem)?;
    let name = |kv: &String| kv.split_once('=').map_or(kv.clone(), |(k, _)| k.to_owned());
    let (env, dropped): (Vec<String>, Vec<String>) = image
        .env
        .iter()
        .cloned()
        .partition(|kv| crate::session_env::refusal(&name(kv)).is_none());
    if !dropped.is_empty() {
        let names: Vec<String> = dropped.iter().map(name).collect();
        tracing::info!(digest = %image.digest, dropped = ?names, "image Env variables a session's env may not hold were dropped");
    }
    SessionImage::open(&image.rootfs, &env, &image.digest)
        .map(|i| Arc::new(i.holding(lease)))
        .map_err(|e| {
            EngineError::Internal(format!(
                "the image {} cannot be opened in the cache: {e}",
                image.digest
            ))
        })
}

impl Runtimes {
    fn count_cache(&self, engine: &Engine, envs: &Environments) {
        if let Ok(images) = envs.store.list() {
            engine
                .metrics
                .image_cache_bytes(images.iter().map(|i| i.unpacked_bytes).sum());
        }
    }

    /// The image a new session runs in: the one it asks for, else the operator's default, else
    /// none. Pulled (unless cached) before the session exists, so that a session is never
    /// recorded with an image it cannot have.
    pub(crate) async fn new_environment(
        &self,
        engine: &Engine,
        asked: Option<&EnvironmentRequest>,
    ) -> Result<Option<(SessionEnvironment, Arc<SessionImage>)>> {
        let Some(envs) = &engine.config.environments else {
            return match asked {
                None => Ok(None),
                Some(r) => Err(invalid(
                    ProblemCode::ImageNotAllowed,
                    format!(
                        "environment.image '{}': this service has no environments configured \
                         (environments.images, environments.allow_registries); sessions see \
                         the host's /usr and /etc",
                        r.image
                    ),
                )),
            };
        };
        let asked = match (asked, &envs.config.default) {
            (Some(r), _) => r.image.clone(),
            (None, Some(default)) => default.clone(),
            (None, None) => return Ok(None),
        };
        if engine
            .config
            .sandbox
            .as_ref()
            .is_some_and(|s| s.is_unsandboxed())
        {
            return Err(EngineError::Unavailable(
                "sessions in an image need the sandbox; this service runs commands unsandboxed \
                 (sandbox.mode = \"unsandboxed\")"
                    .into(),
            ));
        }
        let (environment, image, _) = self.pull_asked(engine, envs, &asked, |_| {}).await?;
        Ok(Some((environment, open(&envs.store, &image)?)))
    }

    /// Resolves what a caller asked for (a configured name or an allowed reference) and pulls
    /// it unless cached: the environment to record, the image, whether it was cached.
    async fn pull_asked(
        &self,
        engine: &Engine,
        envs: &Environments,
        asked: &str,
        progress: impl Fn(Progress) + Send + Sync + 'static,
    ) -> Result<(SessionEnvironment, Image, bool)> {
        let reference = envs.config.resolve(asked).map_err(problem)?;
        let started = std::time::Instant::now();
        let (image, cached) = envs
            .store
            .resolve_watching(&reference, progress)
            .await
            .map_err(problem)?;
        engine
            .metrics
            .image_resolved(cached, started.elapsed().as_secs_f64());
        if !cached {
            self.count_cache(engine, envs);
        }
        let name = envs
            .config
            .images
            .iter()
            .any(|i| i.name == asked)
            .then(|| asked.to_owned());
        let environment = SessionEnvironment {
            image: reference,
            digest: image.digest.clone(),
            name,
        };
        Ok((environment, image, cached))
    }

    /// Pulls an image into this node's cache ahead of the sessions that will run in it
    /// (`POST /v1/environments`), reporting the download's progress.
    pub async fn pull_environment(
        &self,
        engine: &Engine,
        asked: &str,
        progress: impl Fn(Progress) + Send + Sync + 'static,
    ) -> Result<PulledEnvironment> {
        let Some(envs) = &engine.config.environments else {
            return Err(invalid(
                ProblemCode::ImageNotAllowed,
                format!(
                    "image '{asked}': this service has no environments configured \
                     (environments.images, environments.allow_registries)"
                ),
            ));
        };
        let (environment, image, cached) = self.pull_asked(engine, envs, asked, progress).await?;
        Ok(PulledEnvironment {
            environment,
            cached,
            unpacked_bytes: image.unpacked_bytes,
            download_bytes: image.download_bytes,
        })
    }

    /// The image of an existing session: from this node's cache, or pulled again by its digest
    /// (never by its tag, which may name another image by now).
    pub(crate) async fn session_image(
        &self,
        engine: &Engine,
        environment: Option<&SessionEnvironment>,
    ) -> Result<Option<Arc<SessionImage>>> {
        let Some(env) = environment else {
            return Ok(None);
        };
        let restore = |why: String| {
            EngineError::Unavailable(format!(
                "the session runs in the image {} ({}), which this node cannot have: {why}. \
                 Restore it in the registry (push that digest to {}) or on this node \
                 (toolexec images pull {}), then retry",
                env.image,
                env.digest,
                env.pinned(),
                env.pinned()
            ))
        };
        let Some(envs) = &engine.config.environments else {
            return Err(restore(
                "this node has no environments configured ([environments])".into(),
            ));
        };
        let image = match envs.store.get(&env.digest).map_err(problem)? {
            Some(image) => {
                engine.metrics.image_resolved(true, 0.0);
                image
            }
            None => {
                let started = std::time::Instant::now();
                let (image, _) = envs
                    .store
                    .resolve(&env.pinned())
                    .await
                    .map_err(|e| match e {
                        ImageError::Io(d) => EngineError::Internal(format!("image cache: {d}")),
                        e => restore(e.to_string()),
                    })?;
                engine
                    .metrics
                    .image_resolved(false, started.elapsed().as_secs_f64());
                self.count_cache(engine, envs);
                image
            }
        };
        if image.digest != env.digest {
            return Err(restore(format!(
                "pulling it by digest gave {} instead",
                image.digest
            )));
        }
        open(&envs.store, &image).map(Some)
    }
}
