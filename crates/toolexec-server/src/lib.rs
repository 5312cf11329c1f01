//! The toolexec binary's library half: building the store, engine and HTTP app from a
//! [`Config`], and serving on an injected listener with an injected shutdown future (so tests run
//! the real server on port 0).
#![forbid(unsafe_code)]

pub mod config;
pub mod http;
mod span_fields;
pub mod telemetry;
mod toolsdoc;

use std::future::Future;
use std::sync::Arc;

use anyhow::Context;
use tokio::net::TcpListener;
use toolexec_api::limits::{Limiter, RateLimit};
use toolexec_api::{ApiConfig, AppState, Auth, AuthMode};
use toolexec_engine::{Engine, EngineConfig};
use toolexec_store::Store;
use toolexec_store::postgres::PgStore;
use toolexec_store::sqlite::SqliteStore;
use toolexec_tools::Registry;

pub use config::Config;
pub use toolsdoc::{problems_markdown, tool_manual, tools_list, tools_markdown};

/// Opens the store the configuration names (Postgres or the embedded SQLite file), with its
/// large blobs in object storage when `blobs.backend = "s3"`.
pub async fn open_store(config: &Config) -> anyhow::Result<Arc<dyn Store>> {
    let store = open_database(config).await?;
    if !config
        .blobs
        .uses_object_store()
        .map_err(|e| anyhow::anyhow!(e))?
    {
        return Ok(store);
    }
    let s3 = config.blobs.s3().map_err(|e| anyhow::anyhow!(e))?;
    let blobs = toolexec_store::objects::ObjectBlobs::new(
        store,
        s3,
        &config.blobs.s3_prefix,
        config.blobs.inline_max_bytes,
    )
    .map_err(|e| anyhow::anyhow!(e))?;
    blobs
        .check_writable()
        .await
        .map_err(|e| anyhow::anyhow!(e))?;
    tracing::info!(
        bucket = config.blobs.s3_bucket.as_deref().unwrap_or_default(),
        endpoint = config.blobs.s3_endpoint.as_deref().unwrap_or("(AWS)"),
        prefix = %config.blobs.s3_prefix,
        inline_max_bytes = config.blobs.inline_max_bytes,
        "blobs in object storage"
    );
    Ok(Arc::new(blobs))
}

/// The database store alone (Postgres or the embedded SQLite file): what `migrate` and `keys`
/// need, without reaching for the object store (and its credentials).
pub async fn open_database(config: &Config) -> anyhow::Result<Arc<dyn Store>> {
    let store: Arc<dyn Store> = match config.database_url.as_deref() {
        Some(url) if url.starts_with("postgres://") || url.starts_with("postgresql://") => {
            Arc::new(
                PgStore::connect(url, config.max_db_connections)
                    .await
                    .with_context(|| format!("connecting to {}", config::redact_url(url)))?
                    .with_blob_statement_bytes(config.limits.blob_bytes_per_statement),
            )
        }
        Some(url) if url.starts_with("sqlite:") => {
            let path = url
                .trim_start_matches("sqlite://")
                .trim_start_matches("sqlite:");
            Arc::new(
                open_sqlite(std::path::Path::new(path))
                    .await?
                    .with_blob_statement_bytes(config.limits.blob_bytes_per_statement),
            )
        }
        Some(other) => anyhow::bail!(
            "database_url '{}' is neither postgres://… nor sqlite:PATH",
            config::redact_url(other)
        ),
        None => {
            std::fs::create_dir_all(&config.data_dir)
                .with_context(|| format!("creating {}", config.data_dir.display()))?;
            Arc::new(
                open_sqlite(&config.data_dir.join("toolexec.db"))
                    .await?
                    .with_blob_statement_bytes(config.limits.blob_bytes_per_statement),
            )
        }
    };
    Ok(store)
}

async fn open_sqlite(path: &std::path::Path) -> anyhow::Result<SqliteStore> {
    SqliteStore::open(path)
        .await
        .with_context(|| format!("opening SQLite store {}", path.display()))
}

/// Decides how requests are authenticated. Refuses a non-loopback bind with no auth.
pub async fn auth_mode(config: &Config, store: &dyn Store) -> anyhow::Result<AuthMode> {
    if let Some(h) = &config.trusted_identity_header {
        return Ok(AuthMode::TrustedHeader(h.to_ascii_lowercase()));
    }
    if store.has_api_keys().await? {
        return Ok(AuthMode::ApiKeys);
    }
    let addr = config.bind_addr()?;
    if !addr.ip().is_loopback() {
        anyhow::bail!(
            "refusing to listen on {addr} without authentication: create an API key with \
             `toolexec keys create --tenant NAME`, configure trusted_identity_header for a \
             gateway, or bind 127.0.0.1"
        );
    }
    Ok(AuthMode::Local(store.ensure_tenant("local").await?))
}

pub mod descriptors;

/// Builds the application state from a configuration: store (migrated if configured), engine
/// (which interrupts this node's leftovers from a previous run) and auth.
pub async fn build_state(config: &Config) -> anyhow::Result<Arc<AppState>> {
    build_state_with(config, |store| store).await
}

/// Like [`build_state`], with the opened store wrapped before anything uses it (instrumentation,
/// or a test that counts the store's queries).
pub async fn build_state_with(
    config: &Config,
    wrap: impl FnOnce(Arc<dyn Store>) -> Arc<dyn Store>,
) -> anyhow::Result<Arc<AppState>> {
    let store = wrap(open_store(config).await?);
    if config.auto_migrate {
        store.migrate().await.context("applying migrations")?;
    }
    let mode = auth_mode(config, store.as_ref()).await?;
    let web = Arc::new(
        toolexec_tools::web::WebAccess::from_config(
            &config.web,
            &config.sandbox.egress_allow_cidrs,
        )
        .map_err(|e| anyhow::anyhow!("web tools: {e}"))?,
    );
    let net = toolexec_tools::operator::LoadNet {
        egress_allow: config.sandbox.egress_allow_cidrs.clone(),
        resolver: web.resolver.clone(),
    };
    let registry = Arc::new(
        Registry::with_custom(&config.tools, &net)
            .await
            .map_err(|e| anyhow::anyhow!("building the tool registry: {e}"))?,
    );
    let mut engine_config = EngineConfig::new(config.node(), config.workspace_root());
    engine_config.limits = config.limits.clone();
    let fds = descriptors::raise_open_files_limit();
    let cached = descriptors::session_budget(fds.soft, config.max_concurrent_requests);
    if cached < engine_config.limits.max_cached_sessions {
        tracing::warn!(
            open_files = fds.soft,
            configured = engine_config.limits.max_cached_sessions,
            kept = cached,
            "the open-file limit allows fewer cached sessions than limits.max_cached_sessions: \
             idle sessions beyond it drop their workspace handles (raise the hard RLIMIT_NOFILE \
             of the service to keep more)"
        );
        engine_config.limits.max_cached_sessions = cached;
    }
    engine_config.recorder_writers = config.recorder_writers;
    if let Some(url) = &config.cluster.advertise_url {
        url::Url::parse(url)
            .map_err(|e| anyhow::anyhow!("cluster.advertise_url {url:?} is not a URL: {e}"))?;
    }
    if config.cluster.shared_workspaces && config.limits.session_disk_bytes > 0 {
        // Each node would mount a session's image on its own: one ext4 image mounted by two
        // hosts is corrupted.
        anyhow::bail!(
            "limits.session_disk_bytes cannot be used with cluster.shared_workspaces: a session's \
             disk image would be mounted by more than one node; use one or the other"
        );
    }
    engine_config.cluster = config.cluster.clone();
    let door = toolexec_api::door::Door::new(
        &config.allowed_hosts,
        &config.allowed_origins,
        &own_addresses(config)?,
    )
    .map_err(|e| anyhow::anyhow!(e))?;
    let failures = toolexec_api::auth_failures::AuthFailures::new(
        toolexec_api::auth_failures::FailureLimit {
            per_second: config.auth_failure_rate_per_second,
            burst: config.auth_failure_burst,
        },
        &config.trusted_proxies,
    )
    .map_err(|e| anyhow::anyhow!(e))?;
    engine_config.durable_start_for_read_only = config.durable_start_for_read_only;
    let mut sandbox_config = config.sandbox.clone();
    // The operator's tool folder, read-only in every sandbox, at its own path: command tools
    // run the operator's files there.
    if let Some(dir) = &config.tools.dir
        && !config.tools.command.is_empty()
    {
        let dir =
            std::fs::canonicalize(dir).with_context(|| format!("tools.dir {}", dir.display()))?;
        if !sandbox_config.ro_binds.contains(&dir) {
            sandbox_config.ro_binds.push(dir);
        }
    }
    let sandbox = toolexec_sandbox::Sandbox::probe(sandbox_config, &config.workspace_root()).await;
    let status = sandbox.status();
    if status.ready {
        tracing::info!(mode = status.mode, detail = %status.detail, "sandbox");
    } else {
        tracing::error!(detail = %status.detail, "sandbox unavailable: shell calls fail closed and /readyz reports not ready");
    }
    if status.mode == "unsandboxed" {
        tracing::warn!(
            "sandbox.mode = \"unsandboxed\": commands run on the host without isolation"
        );
    }
    engine_config.sandbox = Some(sandbox);
    // Sessions in OCI images, when the operator configured any (docs/environments.md); without
    // `[environments]` every session sees the host's /usr and /etc, as before.
    let envs = &config.environments;
    if !envs.images.is_empty() || !envs.allow_registries.is_empty() {
        let images = image_store(config)?;
        engine_config.environments = Some(Arc::new(
            toolexec_engine::environments::Environments::new(images, envs.clone()),
        ));
    }
    engine_config.web = web;
    let engine = Engine::start(store, registry, engine_config)
        .await
        .map_err(|e| anyhow::anyhow!("starting the engine: {e}"))?;
    Ok(Arc::new(AppState {
        engine,
        auth: Auth::new(mode).limit_failures(failures),
        limiter: Limiter::new(RateLimit {
            requests_per_second: config.rate_limit_per_second,
            burst: config.rate_limit_burst,
        }),
        config: ApiConfig {
            body_limit_bytes: config.body_limit_bytes,
            max_concurrent_requests: config.max_concurrent_requests,
            max_concurrent_requests_per_tenant: config
                .max_concurrent_requests_per_tenant
                .unwrap_or_else(|| {
                    toolexec_api::default_max_concurrent_requests_per_tenant(
                        config.max_concurrent_requests,
                    )
                }),
            body_read_timeout: std::time::Duration::from_millis(config.body_read_timeout_ms),
            header_read_timeout: std::time::Duration::from_millis(config.header_read_timeout_ms),
            max_connections: config.max_connections,
            write_stall_timeout: std::time::Duration::from_millis(config.write_stall_timeout_ms),
            door,
        },
    }))
}

/// The names and addresses this node is reached by, which it always answers for besides the
/// loopback names: the address it is bound to (unless it is the unspecified address, which no
/// client names) and the one the other replicas forward to (`cluster.advertise_url`).
fn own_addresses(config: &Config) -> anyhow::Result<Vec<String>> {
    let mut own = Vec::new();
    let ip = config.bind_addr()?.ip();
    if !ip.is_unspecified() {
        own.push(ip.to_string());
    }
    if let Some(url) = &config.cluster.advertise_url {
        let url = url::Url::parse(url)
            .map_err(|e| anyhow::anyhow!("cluster.advertise_url {url:?} is not a URL: {e}"))?;
        if let Some(host) = url.host_str() {
            own.push(host.to_owned());
        }
    }
    Ok(own)
}

/// Serves the app on `listener` until `shutdown` resolves, then lets in-flight requests and
/// batches finish.
pub async fn serve(
    state: Arc<AppState>,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let limits = http::ConnectionLimits {
        header_read_timeout: state.config.header_read_timeout,
        max_connections: state.config.max_connections,
        write_stall_timeout: state.config.write_stall_timeout,
    };
    let engine = state.engine.clone();
    let draining = engine.clone();
    // Draining first: the other replicas hold requests for this node's sessions instead of
    // forwarding them here while it finishes what it runs.
    let shutdown = async move {
        shutdown.await;
        draining.cluster().drain().await;
    };
    let served = http::serve_app(toolexec_api::app(state), listener, limits, shutdown)
        .await
        .context("serving HTTP");
    // In-flight requests are done; batches whose clients went away may still be finishing
    // their running call (SPEC §7: finish in-flight calls and record the outcome).
    engine.wait_for_batches().await;
    // Then the sessions are handed over: the next call of each, on any node, takes it over.
    engine.cluster().leave().await;
    served
}

/// The image cache of this node (`<workspace_root>/.images`), reaching registries with
/// rustls and the Mozilla roots (plain HTTP for `environments.insecure_registries`), no proxy
/// from the environment, a connect timeout of 30 s and a read timeout of 60 s, under the egress
/// classification: the public internet plus `environments.allow_cidrs` (every name resolved
/// through it, every IP-literal URL and each of at most 5 redirects — registries send blobs
/// from a CDN — checked against it).
pub fn image_store(config: &Config) -> anyhow::Result<toolexec_image::ImageStore> {
    image_store_resolving(config, std::sync::Arc::new(toolexec_net::SystemResolver))
}

/// [`image_store`] with host names resolved by `resolver` (a test's `StaticResolver`, to have a
/// name answer with an address of its choosing), every answer still checked by the egress
/// classification; everything else as the service builds it.
pub fn image_store_resolving(
    config: &Config,
    resolver: std::sync::Arc<dyn toolexec_net::Resolver>,
) -> anyhow::Result<toolexec_image::ImageStore> {
    let envs = &config.environments;
    envs.validate().map_err(|e| anyhow::anyhow!("{e}"))?;
    let policy = envs.policy().map_err(|e| anyhow::anyhow!("{e}"))?;
    let tls = toolexec_tools::web::tls_config().map_err(|e| anyhow::anyhow!("TLS: {e}"))?;
    let redirects = policy.clone();
    let client = reqwest::Client::builder()
        .no_proxy()
        .redirect(reqwest::redirect::Policy::custom(move |attempt| {
            if attempt.previous().len() >= 5 {
                return attempt.error("more than 5 redirects");
            }
            match redirects.check_parsed_url(attempt.url().clone()) {
                Ok(_) => attempt.follow(),
                Err(refusal) => attempt.error(refusal),
            }
        }))
        .dns_resolver(toolexec_tools::web::CheckedResolve::new(
            policy.clone(),
            resolver,
        ))
        .connect_timeout(std::time::Duration::from_secs(30))
        .read_timeout(std::time::Duration::from_secs(60))
        .tls_backend_preconfigured(tls)
        .user_agent(concat!("toolexec/", env!("CARGO_PKG_VERSION"), " (images)"))
        .build()?;
    let limits = toolexec_image::Limits {
        max_image_bytes: config.limits.max_image_bytes,
        max_image_entries: config.limits.max_image_entries,
        pull_timeout: std::time::Duration::from_millis(config.limits.image_pull_timeout_ms),
        max_cache_bytes: envs.max_cache_bytes,
    };
    // Beneath the workspace root, beside `.egress` and `.uploads`: the sandbox's init reaches an
    // image's tree the way it reaches a workspace, by a path beneath the one directory it may
    // search (a data directory made by `mktemp -d` is 0700).
    toolexec_image::ImageStore::open_at(
        &config.workspace_root().join(".images"),
        limits,
        client,
        toolexec_image::Registries {
            insecure: envs.insecure_registries.clone(),
            credentials: envs.credentials.clone(),
            policy,
        },
    )
    .map_err(|e| anyhow::anyhow!("{e}"))
}
