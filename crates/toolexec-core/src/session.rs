//! Tenants own sessions; a session is a workspace, a policy and a tool set.
use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use uuid::Uuid;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Tenant {
    pub id: Uuid,
    pub name: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum SessionStatus {
    Active,
    Closed,
}

impl SessionStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            SessionStatus::Active => "active",
            SessionStatus::Closed => "closed",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "active" => Some(SessionStatus::Active),
            "closed" => Some(SessionStatus::Closed),
            _ => None,
        }
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum NetworkPolicy {
    #[default]
    None,
    Allow,
}

/// What a session may do. The operator's configuration sets ceilings; a session can only
/// tighten them (values above a ceiling are refused when the session is created).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Policy {
    /// Network for tools that use it (`none` unless granted).
    #[serde(default)]
    pub network: NetworkPolicy,
    /// Default timeout of a call, in milliseconds (tools that run processes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_timeout_ms: Option<u64>,
    /// Per-tool output limit overrides, in characters: `{"read_file": 20000}`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub output_limits: BTreeMap<String, usize>,
    /// Calls that wait for a person's decision before they run (see [`ApprovalPolicy`]).
    /// Absent: no call waits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approval: Option<ApprovalPolicy>,
}

/// Which calls of a session need a person's approval before they run: a call of a tool named in
/// `tools`, or of a tool that declares one of `capabilities`. Such a call is answered at once
/// with `status: "pending_approval"` and its invocation id; `POST /v1/invocations/{id}/approve`
/// runs it, `…/deny` records it `denied` without running it, and one nobody decides within
/// `timeout_ms` is recorded `denied` too.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ApprovalPolicy {
    /// Tools whose every call waits for approval: `["shell", "write_file"]`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tools: Vec<String>,
    /// Capabilities whose tools' calls wait for approval: `process` (runs commands), `network`
    /// (reaches the outside world), `fs.write` (changes the workspace), `fs.read`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub capabilities: Vec<crate::tool::Capability>,
    /// How long a call waits for a decision before it is recorded `denied` (milliseconds);
    /// default 15 minutes (or the operator's `limits.max_approval_wait_ms` if lower), at most
    /// that ceiling.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
}

/// Default of [`ApprovalPolicy::timeout_ms`]: long enough for a person to read a command, short
/// enough that a forgotten call does not hold its place all day.
pub const DEFAULT_APPROVAL_TIMEOUT_MS: u64 = 15 * 60 * 1000;

impl ApprovalPolicy {
    /// Why a call of `tool` (declaring `capabilities`) needs approval: each rule it meets, as
    /// `tool:NAME` or `capability:NAME`; empty if it may run at once.
    pub fn reasons(&self, tool: &str, capabilities: &[crate::tool::Capability]) -> Vec<String> {
        let mut why: Vec<String> = Vec::new();
        if self.tools.iter().any(|t| t == tool) {
            why.push(format!("tool:{tool}"));
        }
        for c in &self.capabilities {
            if capabilities.contains(c) {
                why.push(format!("capability:{}", c.as_str()));
            }
        }
        why
    }

    /// The wait for a decision, milliseconds.
    pub fn timeout_ms(&self) -> u64 {
        self.timeout_ms.unwrap_or(DEFAULT_APPROVAL_TIMEOUT_MS)
    }

    /// Whether `self` gates at least every call `other` gates (a fork may only tighten).
    pub fn covers(&self, other: &ApprovalPolicy) -> bool {
        other.tools.iter().all(|t| self.tools.contains(t))
            && other
                .capabilities
                .iter()
                .all(|c| self.capabilities.contains(c))
    }
}

/// The body of `POST /v1/sessions`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NewSession {
    /// Allow-list of tool names; all tools when absent.
    #[serde(default)]
    pub tools: Option<Vec<String>>,
    #[serde(default)]
    pub policy: Option<Policy>,
    /// Environment variables for processes the session runs.
    #[serde(default)]
    pub env: Option<BTreeMap<String, String>>,
    /// Free-form client data, stored and returned as is.
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub metadata: Option<serde_json::Value>,
    /// Files to seed the workspace with: workspace-relative path → UTF-8 contents.
    #[serde(default)]
    pub files: Option<BTreeMap<String, String>>,
    /// The OCI image the session's commands run in (docs/environments.md): a name the operator
    /// configured, or a reference to a registry it allows. Absent: the operator's default
    /// image if one is set, else the host's `/usr` and `/etc`.
    #[serde(default)]
    pub environment: Option<EnvironmentRequest>,
}

/// `environment` of `POST /v1/sessions`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct EnvironmentRequest {
    /// A name of `environments.images` (`"py312"`), or `host/repo:tag`, `host/repo@sha256:…`
    /// of a registry in `environments.allow_registries`.
    pub image: String,
}

/// The image a session runs in, as it was resolved when the session was created: forks,
/// rewinds and replays run in `digest`, whatever `image`'s tag names today.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct SessionEnvironment {
    /// The reference it was pulled as (a configured name resolved to its reference).
    pub image: String,
    /// The manifest digest for this host's platform (`sha256:…`).
    pub digest: String,
    /// The configured name it was asked for by, if it was.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub name: Option<String>,
}

impl SessionEnvironment {
    /// `repository@digest`: where the exact image is pulled from again.
    pub fn pinned(&self) -> String {
        let repo = match self.image.split_once('@') {
            Some((repo, _)) => repo,
            None => {
                // A tag follows the last ':' after the last '/' (a port is before it).
                let slash = self.image.rfind('/').map_or(0, |i| i + 1);
                match self.image[slash..].rfind(':') {
                    Some(i) => &self.image[..slash + i],
                    None => &self.image,
                }
            }
        };
        format!("{repo}@{}", self.digest)
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Session {
    pub id: Uuid,
    #[serde(skip)]
    pub tenant_id: Uuid,
    pub status: SessionStatus,
    /// Allow-list of tool names; `null` means every tool in the catalog.
    pub tools: Option<Vec<String>>,
    pub policy: Policy,
    pub env: BTreeMap<String, String>,
    #[schema(value_type = Object)]
    pub metadata: serde_json::Value,
    pub created_at: DateTime<Utc>,
    pub closed_at: Option<DateTime<Utc>>,
    /// The `seq` of the newest event in the session's log.
    pub last_seq: i64,
    /// Where the workspace started, for a fork or a replay: another session as it was right
    /// after one of its events. `null` for a session that started empty (or with seed files).
    pub origin: Option<Origin>,
    /// The OCI image its commands run in; absent when they see the host's `/usr` and `/etc`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub environment: Option<SessionEnvironment>,
    /// In a page of `GET /v1/sessions`, present when the session was larger than the page's
    /// bound: its `tools`, `env` and `metadata` show the beginnings of their values only, and
    /// `full` (`GET /v1/sessions/{id}`) serves it whole.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub truncated: Option<crate::excerpt::Truncated>,
}

/// How a session came from another one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum OriginKind {
    /// `POST /v1/sessions/{id}/fork`.
    Fork,
    /// `POST /v1/sessions/{id}/replay`: it re-ran the source's calls.
    Replay,
}

impl OriginKind {
    pub fn as_str(self) -> &'static str {
        match self {
            OriginKind::Fork => "fork",
            OriginKind::Replay => "replay",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "fork" => Some(OriginKind::Fork),
            "replay" => Some(OriginKind::Replay),
            _ => None,
        }
    }
}

/// The session (of the same tenant) and the event after which a fork's or a replay's workspace
/// started as that session's was.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Origin {
    pub kind: OriginKind,
    pub session_id: Uuid,
    pub seq: i64,
}

impl Session {
    pub fn allows_tool(&self, name: &str) -> bool {
        self.tools
            .as_ref()
            .is_none_or(|list| list.iter().any(|t| t == name))
    }
}

#[cfg(test)]
mod environment_tests {
    use super::SessionEnvironment;

    #[test]
    fn a_pinned_reference_names_the_repository_and_the_digest() {
        let d = "sha256:0123";
        for (image, pinned) in [
            ("127.0.0.1:5000/bb:latest", "127.0.0.1:5000/bb@sha256:0123"),
            ("127.0.0.1:5000/bb", "127.0.0.1:5000/bb@sha256:0123"),
            ("ghcr.io/o/r@sha256:ffff", "ghcr.io/o/r@sha256:0123"),
            ("reg:5000/a/b:1.2", "reg:5000/a/b@sha256:0123"),
        ] {
            let e = SessionEnvironment {
                image: image.into(),
                digest: d.into(),
                name: None,
            };
            assert_eq!(e.pinned(), pinned, "{image}");
        }
    }
}
