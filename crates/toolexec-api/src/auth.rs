//! Who is calling: the tenant behind a request, decided once per request by an extractor so that
//! no handler can forget it.
//!
//! Modes: API keys (bearer tokens, stored as SHA-256 hashes), a trusted gateway that asserts the
//! tenant in a header, or — only on a loopback bind with no keys — one local tenant.
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use toolexec_core::ProblemCode;

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use sha2::{Digest, Sha256};
use toolexec_core::Tenant;

use crate::AppState;
use crate::auth_failures::AuthFailures;
use crate::problem::ApiError;

/// How long a verified key is trusted without asking the store again. Bounds the store reads a
/// busy client causes (one per key per TTL) and how long a revoked key keeps working. The entry
/// stays after that (until the cache is full): it marks the key as one this node has verified,
/// which the limit on failed lookups lets through.
const KEY_CACHE_TTL: Duration = Duration::from_secs(30);
/// Most keys cached at once; the cache is cleared when full (cheap, and bounded memory).
const KEY_CACHE_MAX: usize = 10_000;

#[derive(Debug, Clone)]
pub enum AuthMode {
    /// No keys configured and a loopback bind: every request is this tenant.
    Local(Tenant),
    /// Bearer API keys.
    ApiKeys,
    /// A gateway in front authenticates and names the tenant in this header. Use only when the
    /// service is reachable through that gateway alone.
    TrustedHeader(String),
}

#[derive(Debug)]
pub struct Auth {
    pub mode: AuthMode,
    cache: Mutex<HashMap<String, (Tenant, Instant)>>,
    /// Lookups of keys this node has not verified, limited per source.
    failures: AuthFailures,
}

impl Auth {
    /// No limit on failed lookups; see [`Auth::limit_failures`].
    pub fn new(mode: AuthMode) -> Self {
        Self {
            mode,
            cache: Mutex::new(HashMap::new()),
            failures: AuthFailures::default(),
        }
    }

    /// Limits lookups of unknown keys per source (see [`crate::auth_failures`]).
    pub fn limit_failures(mut self, failures: AuthFailures) -> Self {
        self.failures = failures;
        self
    }

    pub fn describe(&self) -> &'static str {
        match self.mode {
            AuthMode::Local(_) => "local (single tenant, loopback only)",
            AuthMode::ApiKeys => "api keys",
            AuthMode::TrustedHeader(_) => "trusted gateway header",
        }
    }
}

/// The SHA-256 a key is stored under.
pub fn key_hash(key: &str) -> String {
    hex::encode(Sha256::digest(key.as_bytes()))
}

/// The tenant of the current request.
#[derive(Debug, Clone)]
pub struct AuthTenant(pub Tenant);

fn unauthorized(detail: &str) -> ApiError {
    ApiError::new(ProblemCode::Unauthorized, detail)
}

impl FromRequestParts<Arc<AppState>> for AuthTenant {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &Arc<AppState>,
    ) -> Result<Self, Self::Rejection> {
        // Authenticated once per request (the forwarding layer may have done it): one rate
        // token, one request slot.
        if let Some(known) = parts.extensions.get::<AuthTenant>() {
            return Ok(known.clone());
        }
        let tenant = authenticate(parts, state).await?;
        crate::observe::record_tenant(tenant.0.id);
        state.limiter.check(tenant.0.id)?;
        crate::limits::take_tenant_slot(parts, tenant.0.id)?;
        parts.extensions.insert(tenant.clone());
        Ok(tenant)
    }
}

async fn authenticate(parts: &Parts, state: &Arc<AppState>) -> Result<AuthTenant, ApiError> {
    let auth = &state.auth;
    match &auth.mode {
        AuthMode::Local(t) => Ok(AuthTenant(t.clone())),
        AuthMode::TrustedHeader(name) => {
            let tenant = parts
                .headers
                .get(name.as_str())
                .and_then(|v| v.to_str().ok())
                .map(str::trim)
                .filter(|v| !v.is_empty() && v.len() <= 200)
                .ok_or_else(|| unauthorized("the gateway did not assert a tenant"))?;
            Ok(AuthTenant(
                state.engine.store().ensure_tenant(tenant).await?,
            ))
        }
        AuthMode::ApiKeys => {
            // The SWE-ReX client sends its key as `X-API-Key`: taken on that API's prefix only.
            let api_key = crate::swerex::is_swerex_path(parts.uri.path())
                .then(|| parts.headers.get("x-api-key"))
                .flatten()
                .and_then(|v| v.to_str().ok());
            let header = match api_key {
                Some(key) if !parts.headers.contains_key(axum::http::header::AUTHORIZATION) => {
                    format!("Bearer {key}")
                }
                _ => parts
                    .headers
                    .get(axum::http::header::AUTHORIZATION)
                    .and_then(|v| v.to_str().ok())
                    .ok_or_else(|| {
                        unauthorized("send an API key as 'Authorization: Bearer <key>' (create one with `toolexec keys create --tenant NAME`)")
                    })?
                    .to_owned(),
            };
            let key = header
                .strip_prefix("Bearer ")
                .or_else(|| header.strip_prefix("bearer "))
                .map(str::trim)
                .filter(|k| !k.is_empty() && k.len() <= 200)
                .ok_or_else(|| unauthorized("the Authorization header must be 'Bearer <key>'"))?;
            let hash = key_hash(key);
            if let Some(t) = auth.cached(&hash) {
                return Ok(AuthTenant(t));
            }
            // A key verified here before (its cache entry grown old) is looked up again freely;
            // one never seen only while its source has failures left to spend.
            let source = auth.failures.source(parts);
            if !auth.known(&hash) {
                auth.failures.check(source)?;
            }
            match state.engine.store().tenant_for_key(&hash).await? {
                Some(t) => {
                    auth.remember(hash, t.clone());
                    Ok(AuthTenant(t))
                }
                None => {
                    auth.forget(&hash);
                    auth.failures.failed(source);
                    Err(unauthorized("unknown or revoked API key"))
                }
            }
        }
    }
}

impl Auth {
    fn cached(&self, hash: &str) -> Option<Tenant> {
        let cache = self.cache.lock().ok()?;
        let (t, at) = cache.get(hash)?;
        (at.elapsed() < KEY_CACHE_TTL).then(|| t.clone())
    }

    /// Whether this node verified the key before (however long ago; until it fails a lookup or
    /// the cache is cleared).
    fn known(&self, hash: &str) -> bool {
        self.cache.lock().is_ok_and(|c| c.contains_key(hash))
    }

    fn forget(&self, hash: &str) {
        if let Ok(mut cache) = self.cache.lock() {
            cache.remove(hash);
        }
    }

    fn remember(&self, hash: String, tenant: Tenant) {
        if let Ok(mut cache) = self.cache.lock() {
            if cache.len() >= KEY_CACHE_MAX {
                cache.clear();
            }
            cache.insert(hash, (tenant, Instant::now()));
        }
    }
}
