//! Making, seeding and closing sessions.
use std::sync::Arc;

use serde_json::json;
use toolexec_core::ProblemCode;
use toolexec_core::{EventKind, NewSession, Policy, Session, SessionStatus, new_id};
use toolexec_store::{Blob, NewEvent};
use uuid::Uuid;

use crate::{Engine, EngineError, Result};

use super::{Runtimes, SessionRuntime, invalid, out_of_descriptors};

/// Most sessions in one page of `list_sessions`.
pub const MAX_PAGE: u32 = 200;

impl Runtimes {
    pub(crate) fn check_new_session(&self, engine: &Engine, new: &NewSession) -> Result<()> {
        let limits = &engine.config.limits;
        if let Some(tools) = &new.tools {
            let unknown: Vec<&str> = tools
                .iter()
                .map(String::as_str)
                .filter(|t| engine.registry.get(t).is_none())
                .collect();
            if !unknown.is_empty() {
                return Err(invalid(
                    ProblemCode::UnknownTool,
                    format!(
                        "tools: unknown tool(s) {}; GET /v1/tools lists the catalog",
                        unknown.join(", ")
                    ),
                ));
            }
        }
        if let Some(policy) = &new.policy {
            check_policy(policy, limits)?;
            let egress = engine
                .config
                .sandbox
                .as_ref()
                .is_some_and(|s| s.config().egress);
            if policy.network == toolexec_core::NetworkPolicy::Allow && !egress {
                return Err(invalid(
                ProblemCode::PolicyAboveCeiling,
                    "policy.network: this service gives commands no network (sandbox.egress is off); create the session with network \"none\"".into(),
                ));
            }
            let gated = policy.approval.iter().flat_map(|a| a.tools.iter());
            if let Some(tool) = gated.into_iter().find(|t| engine.registry.get(t).is_none()) {
                return Err(invalid(
                    ProblemCode::UnknownTool,
                    format!("policy.approval.tools: unknown tool '{tool}'"),
                ));
            }
            for tool in policy.output_limits.keys() {
                if engine.registry.get(tool).is_none() {
                    return Err(invalid(
                        ProblemCode::UnknownTool,
                        format!("policy.output_limits: unknown tool '{tool}'"),
                    ));
                }
            }
        }
        if let Some(env) = &new.env {
            for key in env.keys() {
                let ok = !key.is_empty()
                    && key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
                    && !key.starts_with(|c: char| c.is_ascii_digit());
                if !ok {
                    return Err(invalid(
                        ProblemCode::InvalidEnv,
                        format!(
                            "env: '{key}' is not a valid variable name (letters, digits, '_'; not starting with a digit)"
                        ),
                    ));
                }
                if let Some(why) = crate::session_env::refusal(key) {
                    return Err(invalid(ProblemCode::InvalidEnv, why));
                }
            }
            if env.values().any(|v| v.contains('\0')) {
                return Err(invalid(
                    ProblemCode::InvalidEnv,
                    "env: values must not contain NUL bytes".into(),
                ));
            }
        }
        // Stored as JSON, which no database holds with NUL; and unlike a call's arguments it is
        // returned as is, so it is refused rather than recorded with a replacement.
        if let Some(at) = new
            .metadata
            .as_ref()
            .and_then(|m| crate::canonical::nul_pointer(m, String::new()))
        {
            return Err(invalid(
                ProblemCode::InvalidMetadata,
                format!("metadata{at}: must not contain a NUL character (\\u0000)"),
            ));
        }
        if new
            .files
            .as_ref()
            .is_some_and(|f| f.len() > limits.max_seed_files)
        {
            return Err(invalid(
                ProblemCode::TooManyFiles,
                format!("files: at most {} seed files", limits.max_seed_files),
            ));
        }
        Ok(())
    }

    /// Creates a session: its workspace with the seed files, then the session row and its first
    /// events (`session.created`, one `file.created` per seed file) in one transaction.
    pub async fn create_session(
        &self,
        engine: &Engine,
        tenant_id: Uuid,
        new: NewSession,
    ) -> Result<Session> {
        self.check_new_session(engine, &new)?;
        // The image first: pulled (or found in the cache) before anything of the session exists.
        let (environment, image) = match self
            .new_environment(engine, new.environment.as_ref())
            .await?
        {
            Some((e, i)) => (Some(e), Some(i)),
            None => (None, None),
        };
        let id = new_id();
        let now = chrono::Utc::now();
        let session = Session {
            id,
            tenant_id,
            status: SessionStatus::Active,
            tools: new.tools,
            policy: new.policy.unwrap_or_default(),
            env: new.env.unwrap_or_default(),
            metadata: new.metadata.unwrap_or_else(|| json!({})),
            created_at: now,
            closed_at: None,
            last_seq: 0,
            origin: None,
            environment,
            truncated: None,
        };
        let name = id.to_string();
        // Off the async threads: with a disk quota this makes and mounts a filesystem (~50 ms).
        let made = {
            let workspaces = engine.workspaces.clone();
            let name = name.clone();
            tokio::task::spawn_blocking(move || workspaces.create(&name))
                .await
                .map_err(|e| EngineError::Internal(format!("cannot create workspace: {e}")))?
        };
        let workspace = made.map_err(|e| {
            out_of_descriptors(&e)
                .unwrap_or_else(|| EngineError::Internal(format!("cannot create workspace: {e}")))
        })?;
        let rt = Arc::new(self.fresh_runtime(engine, session.clone(), workspace, image));

        let mut events = vec![self.session_created(engine, &session, None)];
        let mut blobs = Vec::new();
        let seeded = self
            .seed_files(engine, &session, &rt, new.files.unwrap_or_default())
            .await;
        let changes = match seeded {
            Ok(c) => c,
            Err(e) => {
                engine.workspaces.remove(&name);
                return Err(e);
            }
        };
        for change in changes {
            let (event, blob) = self.change_event(engine, change);
            events.push(event);
            blobs.extend(blob);
        }
        let (cap, disk_binds) = self.open_session_cap(engine);
        match engine
            .store
            .create_session(&session, events, blobs, cap)
            .await
        {
            Ok(stored) => {
                engine.metrics.session_created();
                self.keep_runtime(engine, rt);
                engine.cluster.settle(stored.id).await;
                Ok(stored)
            }
            Err(e) => {
                engine.workspaces.remove(&name);
                Err(self.refused_create(engine, e, disk_binds))
            }
        }
    }

    /// How many open sessions a tenant may hold: `limits.max_open_sessions_per_tenant`, or
    /// fewer when each reserves its disk quota out of `limits.tenant_disk_bytes` (then `true`).
    pub(crate) fn open_session_cap(&self, engine: &Engine) -> (u64, bool) {
        let limits = &engine.config.limits;
        let cap = limits.max_open_sessions_per_tenant;
        match engine.workspaces.disk_quota() {
            Some(each) if limits.tenant_disk_bytes > 0 => {
                let by_disk = limits.tenant_disk_bytes / each;
                if by_disk < cap {
                    (by_disk, true)
                } else {
                    (cap, false)
                }
            }
            _ => (cap, false),
        }
    }

    /// The error of a refused session create, naming the disk limit when that is what binds.
    pub(crate) fn refused_create(
        &self,
        engine: &Engine,
        e: toolexec_store::StoreError,
        disk_binds: bool,
    ) -> EngineError {
        match e {
            toolexec_store::StoreError::TooManyOpenSessions(max) if disk_binds => {
                EngineError::Conflict {
                    code: toolexec_core::ProblemCode::TooManyOpenSessions,
                    detail: format!(
                        "this tenant's {max} open sessions hold its whole workspace disk quota \
                         (limits.tenant_disk_bytes = {} bytes, {} bytes reserved by each session, \
                         limits.session_disk_bytes); close sessions it no longer needs (DELETE \
                         /v1/sessions/{{id}}) and create this one again",
                        engine.config.limits.tenant_disk_bytes,
                        engine.workspaces.disk_quota().unwrap_or(0)
                    ),
                }
            }
            e => e.into(),
        }
    }

    /// The `session.created` event of a session (with where it came from, and how many files
    /// it started with, for a fork or a replay).
    pub(crate) fn session_created(
        &self,
        engine: &Engine,
        session: &Session,
        from: Option<usize>,
    ) -> NewEvent {
        let mut data = json!({
            "tools": session.tools,
            "policy": session.policy,
            "env_keys": session.env.keys().collect::<Vec<_>>(),
            "metadata": session.metadata,
            "node": engine.config.node,
        });
        if let (Some(environment), serde_json::Value::Object(map)) =
            (&session.environment, &mut data)
        {
            map.insert("environment".into(), json!(environment));
        }
        if let (Some(origin), Some(files), serde_json::Value::Object(map)) =
            (session.origin, from, &mut data)
        {
            map.insert("origin".into(), json!(origin));
            map.insert("files".into(), json!(files));
        }
        NewEvent {
            kind: EventKind::SessionCreated,
            data,
        }
    }

    async fn seed_files(
        &self,
        engine: &Engine,
        session: &Session,
        rt: &SessionRuntime,
        files: std::collections::BTreeMap<String, String>,
    ) -> Result<Vec<toolexec_tools::RecordedChange>> {
        if files.is_empty() {
            return Ok(Vec::new());
        }
        // Seeding goes through write_file itself, so seed paths obey exactly the jail rules the
        // model's writes do.
        let writer = engine
            .registry
            .get("write_file")
            .ok_or_else(|| EngineError::Internal("write_file tool missing".into()))?
            .clone();
        let ctx = self.tool_context(engine, session, rt);
        let mut changes = Vec::new();
        for (path, content) in files {
            let out = writer
                .run(&ctx, json!({"file_path": path, "content": content}))
                .await;
            if out.status.is_error() {
                return Err(invalid(
                    ProblemCode::InvalidSeedFile,
                    format!("files['{path}']: {}", out.content),
                ));
            }
            changes.extend(out.changes);
        }
        // The model has not read the seed files: read-before-write still applies to them.
        for c in &changes {
            rt.reads.forget(&c.change.path);
        }
        Ok(changes)
    }

    /// A file change as a log event, with its contents as a blob unless over the size limit.
    pub(crate) fn change_event(
        &self,
        engine: &Engine,
        change: toolexec_tools::RecordedChange,
    ) -> (NewEvent, Option<Blob>) {
        let mut fc = change.change;
        // The bytes move into the blob: contents are never copied on their way to the store.
        let blob = match change.after {
            Some(bytes) if bytes.len() <= engine.config.limits.max_blob_bytes => {
                Some(Blob::new(bytes))
            }
            after => {
                if after.is_some() {
                    fc.after_unstored = Some(toolexec_core::UnstoredReason::TooLarge);
                }
                fc.after_stored = false;
                None
            }
        };
        (
            NewEvent {
                kind: fc.kind.event_kind(),
                data: serde_json::to_value(&fc).unwrap_or_default(),
            },
            blob,
        )
    }

    pub async fn get_session(&self, engine: &Engine, tenant_id: Uuid, id: Uuid) -> Result<Session> {
        Ok(engine.store.get_session(tenant_id, id).await?)
    }

    /// The session as this node runs it: from its runtime when this node has one (the one
    /// cache of a session's state: status, policy, tools, env, environment), else from the
    /// store. Its `last_seq` is the one it had when the runtime was made: for a request that
    /// runs calls and needs the rest (MCP's and SWE-ReX's requests), not for showing it.
    pub async fn session_in_use(
        &self,
        engine: &Engine,
        tenant_id: Uuid,
        id: Uuid,
    ) -> Result<Session> {
        match self.cached_runtime(tenant_id, id)? {
            Some(rt) => Ok(rt.session.clone()),
            None => self.get_session(engine, tenant_id, id).await,
        }
    }

    /// Closes a session: stops its background processes, records `session.closed` (with how
    /// each process ended), then removes its workspace. The log stays.
    pub async fn close_session(
        &self,
        engine: &Engine,
        tenant_id: Uuid,
        id: Uuid,
    ) -> Result<Session> {
        // Running calls are stopped (a command's process tree killed) and queued ones never
        // start, all recorded `cancelled`, before the session closes (SPEC §2).
        engine
            .calls
            .cancel_session_calls(engine, tenant_id, id)
            .await?;
        // Calls waiting for approval can no longer run: recorded denied, and why.
        engine
            .approvals
            .deny_waiting_of_session(engine, tenant_id, id, "the session was closed")
            .await;
        let mut processes = Vec::new();
        let mut terminals = Vec::new();
        if let Some(rt) = self.cached_runtime(tenant_id, id)?
            && let Some(table) = &rt.processes
        {
            // Terminals first, so that how each ended is in `session.closed`.
            terminals = table
                .end_terminals("the session was closed")
                .await
                .into_iter()
                .map(|(t, e)| json!({"terminal_id": t.id, "command": t.command, "tty": t.tty, "exit_code": e.exit_code, "killed_by": e.killed_by}))
                .collect();
            table.shutdown().await;
            processes = table
                .take_exits()
                .into_iter()
                .map(|p| json!({"process_id": p.id, "command": p.command, "state": p.state, "output_bytes": p.output_bytes}))
                .collect();
        }
        let session = engine
            .store
            .close_session(
                tenant_id,
                id,
                json!({"node": engine.config.node, "processes": processes, "terminals": terminals}),
            )
            .await?;
        engine.streams.notify(id);
        engine.cluster.release(id).await;
        let rt = self.cached.lock().ok().and_then(|mut m| m.remove(&id));
        // Wait for running calls of the session to finish before the workspace goes away.
        if let Some(rt) = rt {
            let _guard = rt.schedule.write().await;
        }
        engine.workspaces.remove(&id.to_string());
        Ok(session)
    }
}

fn check_policy(policy: &Policy, limits: &crate::Limits) -> Result<()> {
    if let Some(t) = policy.default_timeout_ms
        && (t == 0 || t > limits.max_timeout_ms)
    {
        return Err(invalid(
            ProblemCode::PolicyAboveCeiling,
            format!(
                "policy.default_timeout_ms: must be between 1 and the operator's ceiling of {} ms",
                limits.max_timeout_ms
            ),
        ));
    }
    if let Some(t) = policy.approval.as_ref().and_then(|a| a.timeout_ms)
        && (t == 0 || t > limits.max_approval_wait_ms)
    {
        return Err(invalid(
            ProblemCode::PolicyAboveCeiling,
            format!(
                "policy.approval.timeout_ms: must be between 1 and the operator's ceiling of {} ms (limits.max_approval_wait_ms)",
                limits.max_approval_wait_ms
            ),
        ));
    }
    for (tool, chars) in &policy.output_limits {
        if *chars == 0 || *chars > limits.max_output_chars {
            return Err(invalid(
                ProblemCode::PolicyAboveCeiling,
                format!(
                    "policy.output_limits.{tool}: must be between 1 and the operator's ceiling of {} characters",
                    limits.max_output_chars
                ),
            ));
        }
    }
    Ok(())
}
