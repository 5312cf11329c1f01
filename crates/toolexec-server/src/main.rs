//! `toolexec`: serve the API, apply migrations, create API keys, print the OpenAPI document.
#![forbid(unsafe_code)]

use std::path::PathBuf;

use anyhow::Context;
use clap::{Parser, Subcommand};
use toolexec_server::{Config, build_state, open_database, open_store, serve};

#[derive(Parser)]
#[command(
    name = "toolexec",
    version,
    about = "Runs tools for remote LLM agent loops, sandboxed and recorded"
)]
struct Cli {
    /// Configuration file (TOML). Default: ./toolexec.toml if present. TOOLEXEC_* variables override it.
    #[arg(long, global = true, env = "TOOLEXEC_CONFIG")]
    config: Option<PathBuf>,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// Run the HTTP service (the default).
    Serve,
    /// Apply database migrations and exit.
    Migrate,
    /// Manage API keys.
    Keys {
        #[command(subcommand)]
        command: KeysCommand,
    },
    /// The tool catalog: what this service offers, as configured (web tools need their
    /// provider), and each tool's manual and schema.
    Tools {
        #[command(subcommand)]
        command: ToolsCommand,
    },
    /// Expire closed sessions: delete those closed before the cutoff with their logs, then the
    /// blobs no other session names (in the database and the object store). A session that
    /// another one was forked or replayed from is kept while that one is (docs/operator.md,
    /// "Retention and backup"). Prints what it deleted as JSON.
    Retention {
        /// Age of the cutoff: sessions closed more than this long ago expire (`30d`, `12h`,
        /// `90m`, `3600s`, `2w`).
        #[arg(long, value_parser = parse_age)]
        closed_before: std::time::Duration,
        /// Say what would be deleted, and delete nothing.
        #[arg(long)]
        dry_run: bool,
    },
    /// Print the tools reference as Markdown (or write it to a file; `docs/tools.md` is the checked-in copy).
    ToolsDoc {
        #[arg(long)]
        write: Option<PathBuf>,
    },
    /// Print the problem codes of the API as Markdown (or write them to a file; `docs/problems.md` is the checked-in copy).
    ProblemsDoc {
        #[arg(long)]
        write: Option<PathBuf>,
    },
    /// Print the effective configuration: every setting, its value and where it came from
    /// (default, file, environment), the database password redacted.
    Config,
    /// OCI images in this node's cache (`<workspace_root>/.images`, docs/environments.md): pull one
    /// ahead of the sessions that will use it, list them, remove one.
    Images {
        #[command(subcommand)]
        command: ImagesCommand,
    },
    /// Print the OpenAPI document (or write it to a file).
    Openapi {
        /// Write to this file instead of stdout (`openapi/openapi.json` is the checked-in copy).
        #[arg(long)]
        write: Option<PathBuf>,
    },
}

#[derive(Subcommand)]
enum ToolsCommand {
    /// One line per tool: name, read-only, capabilities, whether it is available here, summary.
    List,
    /// A tool's manual, limits and argument schema; with --format, its definition as that
    /// provider takes it (openai = Responses API, openai_chat, anthropic, mcp).
    Describe {
        name: String,
        #[arg(long, value_parser = ["openai", "openai_chat", "anthropic", "mcp"])]
        format: Option<String>,
    },
}

#[derive(Subcommand)]
enum ImagesCommand {
    /// Pull an image: a name of `environments.images`, or a reference to a registry of
    /// `environments.allow_registries`. Prints the image as JSON (its digest included).
    Pull { image: String },
    /// The cached images, as JSON.
    List,
    /// Remove a cached image by its digest (`sha256:…`).
    Rm { digest: String },
}

#[derive(Subcommand)]
enum KeysCommand {
    /// Create an API key for a tenant (created if new). The key is printed once; only its hash is stored.
    Create {
        #[arg(long)]
        tenant: String,
    },
}

/// Logs only (no trace export): the one-shot commands.
fn init_logs(format: &str) -> anyhow::Result<toolexec_server::telemetry::Telemetry> {
    toolexec_server::telemetry::init(format, &Default::default(), "")
}

fn main() -> anyhow::Result<()> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?
        .block_on(run())
}

async fn run() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let loaded =
        Config::load_with_sources(cli.config.as_deref()).context("loading configuration")?;
    let config = loaded.config.clone();
    match cli.command.unwrap_or(Command::Serve) {
        Command::Serve => {
            let telemetry = toolexec_server::telemetry::init(
                &config.log_format,
                &config.telemetry,
                &config.node(),
            )?;
            tracing::info!(config = ?config, traces = telemetry.exporting(), "starting");
            let state = build_state(&config).await?;
            let addr = config.bind_addr()?;
            let listener = tokio::net::TcpListener::bind(addr)
                .await
                .with_context(|| format!("binding {addr}"))?;
            tracing::info!(
                address = %listener.local_addr()?,
                store = state.engine.store().backend(),
                auth = state.auth.describe(),
                "listening"
            );
            let served = serve(state, listener, shutdown_signal()).await;
            // The spans of the last requests are queued still: export them before leaving.
            let _ = tokio::task::spawn_blocking(move || telemetry.shutdown()).await;
            served?;
            tracing::info!("stopped");
        }
        Command::Migrate => {
            init_logs(&config.log_format)?;
            let store = open_database(&config).await?;
            store.migrate().await.context("applying migrations")?;
            eprintln!("migrations applied ({})", store.backend());
        }
        Command::Keys {
            command: KeysCommand::Create { tenant },
        } => {
            let tenant = tenant.trim();
            anyhow::ensure!(
                !tenant.is_empty() && tenant.len() <= 200,
                "--tenant must be 1 to 200 characters"
            );
            let store = open_database(&config).await?;
            store.migrate().await.context("applying migrations")?;
            let t = store.ensure_tenant(tenant).await?;
            let mut secret = [0u8; 32];
            getrandom::fill(&mut secret).map_err(|e| anyhow::anyhow!("no randomness: {e}"))?;
            let key = format!("tx_{}", hex::encode(secret));
            store
                .create_api_key(t.id, &toolexec_api::key_hash(&key), &key[..11])
                .await?;
            eprintln!(
                "API key for tenant '{}' (shown once; store it now). Restart the service if it was running without keys.",
                t.name
            );
            println!("{key}");
        }
        Command::Tools { command } => {
            let web = toolexec_tools::web::WebAccess::from_config(
                &config.web,
                &config.sandbox.egress_allow_cidrs,
            )
            .map_err(|e| anyhow::anyhow!("web: {e}"))?;
            // The operator's tools too, loaded and checked as `serve` does.
            let net = toolexec_tools::operator::LoadNet {
                egress_allow: config.sandbox.egress_allow_cidrs.clone(),
                resolver: web.resolver.clone(),
            };
            let registry = toolexec_tools::Registry::with_custom(&config.tools, &net)
                .await
                .map_err(|e| anyhow::anyhow!("building the tool registry: {e}"))?;
            match command {
                ToolsCommand::List => stdout(&toolexec_server::tools_list(&registry, &web))?,
                ToolsCommand::Describe { name, format } => {
                    let Some(spec) = registry.get(&name).map(|t| t.spec().clone()) else {
                        anyhow::bail!(
                            "no tool {name:?}; `toolexec tools list` shows the {} tools",
                            registry.specs().count()
                        );
                    };
                    match format.as_deref() {
                        None => stdout(&toolexec_server::tool_manual(
                            &spec,
                            registry.get(&name).and_then(|t| t.unavailable(&web)),
                        ))?,
                        Some(f) => {
                            use toolexec_api::dialects as d;
                            let def = match f {
                                "openai" => serde_json::to_value(d::openai(&spec)),
                                "openai_chat" => serde_json::to_value(d::openai_chat(&spec)),
                                "anthropic" => serde_json::to_value(d::anthropic(&spec)),
                                _ => serde_json::to_value(d::mcp(&spec)),
                            }?;
                            stdout(&format!("{}\n", serde_json::to_string_pretty(&def)?))?;
                        }
                    }
                }
            }
        }
        Command::Retention {
            closed_before,
            dry_run,
        } => {
            let _telemetry = init_logs(&config.log_format)?;
            let store = open_store(&config).await?;
            store.migrate().await.context("applying migrations")?;
            let cutoff = chrono::Utc::now()
                - chrono::Duration::from_std(closed_before).context("--closed-before")?;
            let report = toolexec_store::retention::run(store.as_ref(), cutoff, dry_run)
                .await
                .context("retention")?;
            println!("{}", serde_json::to_string_pretty(&report)?);
        }
        Command::ToolsDoc { write } => {
            let registry = toolexec_tools::Registry::builtin()?;
            emit(toolexec_server::tools_markdown(&registry), write)?;
        }
        Command::ProblemsDoc { write } => {
            emit(toolexec_server::problems_markdown(), write)?;
        }
        Command::Images { command } => {
            let _logs = init_logs(&config.log_format)?;
            let store = toolexec_server::image_store(&config)?;
            let show = |image: &toolexec_image::Image| {
                serde_json::json!({
                    "reference": image.reference,
                    "digest": image.digest,
                    "unpacked_bytes": image.unpacked_bytes,
                    "download_bytes": image.download_bytes,
                    "env": image.env,
                    "working_dir": image.working_dir,
                    "skipped_devices": image.skipped_devices,
                    "rootfs": image.rootfs,
                })
            };
            match command {
                ImagesCommand::Pull { image } => {
                    let reference = config
                        .environments
                        .resolve(&image)
                        .map_err(|e| anyhow::anyhow!("{e}"))?;
                    let pulled = store
                        .pull(&reference)
                        .await
                        .map_err(|e| anyhow::anyhow!("{e}"))?;
                    stdout(&format!("{:#}\n", show(&pulled)))?;
                }
                ImagesCommand::List => {
                    let images = store.list().map_err(|e| anyhow::anyhow!("{e}"))?;
                    let shown: Vec<_> = images.iter().map(show).collect();
                    stdout(&format!("{:#}\n", serde_json::Value::from(shown)))?;
                }
                ImagesCommand::Rm { digest } => {
                    match store.remove(&digest).map_err(|e| anyhow::anyhow!("{e}"))? {
                        toolexec_image::Removal::Removed => {}
                        toolexec_image::Removal::NotCached => {
                            anyhow::bail!("no image {digest} in {}", config.data_dir.display())
                        }
                        toolexec_image::Removal::InUse => anyhow::bail!(
                            "the image {digest} is in use: a session on this node runs in it, \
                             and it stays while one does. Close those sessions (or let them go \
                             idle) and try again"
                        ),
                    }
                }
            }
        }
        Command::Config => {
            print!("{}", Config::describe(&loaded));
        }
        Command::Openapi { write } => {
            let registry = toolexec_tools::Registry::builtin()?;
            emit(toolexec_api::openapi_json(&registry), write)?;
        }
    }
    Ok(())
}

/// Writes `text` to stdout; a reader that stops early (`| head`) ends the output, not in a panic.
fn stdout(text: &str) -> anyhow::Result<()> {
    use std::io::Write;
    match std::io::stdout().lock().write_all(text.as_bytes()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(e.into()),
        _ => Ok(()),
    }
}

/// `30d`, `12h`, `90m`, `3600s`, `2w` (a whole number and one unit).
fn parse_age(text: &str) -> Result<std::time::Duration, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .ok_or_else(|| format!("{text:?}: give a unit (s, m, h, d or w), e.g. 30d"))?;
    let (n, unit) = text.split_at(split);
    let n: u64 = n
        .parse()
        .map_err(|_| format!("{text:?}: expected a whole number and a unit, e.g. 30d"))?;
    let seconds = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3_600,
        "d" => 86_400,
        "w" => 7 * 86_400,
        other => {
            return Err(format!(
                "{text:?}: unknown unit {other:?} (s, m, h, d or w)"
            ));
        }
    };
    Ok(std::time::Duration::from_secs(n.saturating_mul(seconds)))
}

/// Prints `doc`, or writes it to `path`.
fn emit(doc: String, path: Option<PathBuf>) -> anyhow::Result<()> {
    match path {
        Some(path) => {
            std::fs::write(&path, doc).with_context(|| format!("writing {}", path.display()))?;
            eprintln!("wrote {}", path.display());
        }
        None => stdout(&doc)?,
    }
    Ok(())
}

/// Resolves on SIGINT or SIGTERM: stop accepting, let in-flight calls finish and be recorded.
async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        () = ctrl_c => {},
        () = term => {},
    }
    tracing::info!("shutdown requested; finishing in-flight requests");
}
