//! The read side of the OCI distribution API: `GET /v2/<repo>/manifests/<ref>` and
//! `GET /v2/<repo>/blobs/<digest>`, over the reqwest client the caller gives (its TLS, its
//! resolver and egress rules).
//!
//! Why not `oci-client`: it is the well-kept crate (ORAS), on the same reqwest 0.13, but it adds
//! 19 crates to the tree, five of them proc-macro crates (`oci-spec` brings `derive_builder`,
//! `darling`, `getset`, `strum_macros`, `const_format`), a noticeable build cost on the two
//! cores our builders share, for three GET requests. What matters for safety here — bounding
//! every body before it is read, hashing the blob as it is streamed to disk, and refusing it
//! past its declared size — is what we need our own control of anyway.
//!
//! Authentication: a registry that answers 401 with a `Bearer` challenge gets a token from its
//! realm (with the operator's credentials for that registry as HTTP basic auth when there are
//! some, anonymously otherwise); one with a `Basic` challenge (a `docker-registry` with
//! `htpasswd`) gets the credentials on every request. The credentials never appear in an error
//! or a log line: errors name the registry and the setting, never the user or the secret.
use std::collections::HashMap;

use sha2::{Digest, Sha256};
use tokio::io::AsyncWriteExt;

use crate::ImageError;
use crate::config::RegistryCredential;
use crate::reference::Reference;

/// Media types of manifests and indexes we read.
pub const OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";
pub const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
pub const DOCKER_LIST: &str = "application/vnd.docker.distribution.manifest.list.v2+json";
pub const DOCKER_MANIFEST: &str = "application/vnd.docker.distribution.manifest.v2+json";

/// Largest manifest or index (containerd's limit).
pub const MAX_MANIFEST_BYTES: u64 = 4 * 1024 * 1024;

/// Largest token response.
const MAX_TOKEN_BYTES: u64 = 64 * 1024;

/// How this pull authenticates to the registry, once the registry has asked.
#[derive(Debug, Clone)]
enum Auth {
    None,
    Bearer(String),
    /// The operator's credentials on every request (a `Basic` challenge).
    Basic,
}

/// A registry reached with one client, the operator's credentials for it (if any), and how
/// this pull authenticates.
#[derive(Debug)]
pub(crate) struct Registry {
    pub client: reqwest::Client,
    pub base: String,
    /// `host[:port]` as the reference names it (the key of `environments.credentials`).
    name: String,
    credential: Option<RegistryCredential>,
    auth: std::sync::Mutex<Auth>,
    policy: toolexec_net::NetPolicy,
}

impl Registry {
    pub fn new(
        client: reqwest::Client,
        reference: &Reference,
        insecure: bool,
        credential: Option<RegistryCredential>,
        policy: toolexec_net::NetPolicy,
    ) -> Self {
        let scheme = if insecure { "http" } else { "https" };
        let host = if reference.registry == "docker.io" {
            "registry-1.docker.io"
        } else {
            reference.registry.as_str()
        };
        Self {
            client,
            base: format!("{scheme}://{host}"),
            name: reference.registry.clone(),
            credential,
            auth: std::sync::Mutex::new(Auth::None),
            policy,
        }
    }

    /// Refuses `url` unless the egress policy lets the service reach it (an IP-literal host
    /// public or allow-listed; a name is checked as it is dialled).
    fn check(&self, url: &str) -> Result<(), ImageError> {
        self.policy
            .check_url(url)
            .map(|_| ())
            .map_err(|r| self.refused(&r))
    }

    /// The error of a destination the egress policy refused: names the registry and the setting,
    /// not the address (which the log has).
    fn refused(&self, r: &toolexec_net::Refusal) -> ImageError {
        tracing::warn!(
            registry = %self.name,
            reason = r.reason(),
            address = ?r.address(),
            "a registry address refused by the egress policy"
        );
        match r {
            toolexec_net::Refusal::LocalName => ImageError::RegistryNotAllowed(format!(
                "{} names this host (a localhost name), which the service never reaches by \
                 name, whatever environments.allow_cidrs says: name the registry by its \
                 address instead (127.0.0.1:5000, say), and have the operator add that \
                 address to environments.allow_cidrs (and the reference's registry to \
                 environments.allow_registries)",
                self.name
            )),
            r if r.is_non_public() => ImageError::RegistryNotAllowed(format!(
                "{} is at a non-public address ({}), which the service reaches only when \
                 environments.allow_cidrs names it: if this registry is meant to be reached, \
                 have the operator add its address or network to environments.allow_cidrs \
                 (allow_cidrs = [\"10.0.0.0/8\"] in [environments], or \
                 TOOLEXEC_ENVIRONMENTS__ALLOW_CIDRS)",
                self.name,
                r.reason()
            )),
            r => ImageError::RegistryNotAllowed(format!("{}: {r}", self.name)),
        }
    }

    /// The operator's credentials for this registry: `(username, password)`.
    fn credentials(&self) -> Result<Option<(String, String)>, ImageError> {
        let Some(c) = &self.credential else {
            return Ok(None);
        };
        let password = c.password().map_err(|e| {
            ImageError::Unauthorized(format!(
                "the credentials for {} (environments.credentials) cannot be read: {e}",
                self.name
            ))
        })?;
        Ok(Some((c.username.clone(), password)))
    }

    /// GETs `url` with `accept`, authenticated as this pull is; on a 401 with a challenge,
    /// authenticates as it asks (a bearer token from its realm, or the operator's credentials
    /// for a `Basic` one) and tries once more.
    async fn get(&self, url: &str, accept: Option<&str>) -> Result<reqwest::Response, ImageError> {
        let mut retried = false;
        loop {
            let mut req = self.client.get(url);
            if let Some(accept) = accept {
                req = req.header(reqwest::header::ACCEPT, accept);
            }
            self.check(url)?;
            let auth = self.auth.lock().unwrap_or_else(|p| p.into_inner()).clone();
            match auth {
                Auth::None => {}
                Auth::Bearer(token) => req = req.bearer_auth(token),
                Auth::Basic => {
                    if let Some((user, password)) = self.credentials()? {
                        req = req.basic_auth(user, Some(password));
                    }
                }
            }
            let resp = req.send().await.map_err(|e| self.send_error(e))?;
            if resp.status() != reqwest::StatusCode::UNAUTHORIZED || retried {
                return Ok(resp);
            }
            let Some(header) = resp
                .headers()
                .get(reqwest::header::WWW_AUTHENTICATE)
                .and_then(|v| v.to_str().ok())
            else {
                return Ok(resp);
            };
            let next = if let Some(challenge) = bearer_challenge(header) {
                Auth::Bearer(self.token(&challenge).await?)
            } else if is_basic_challenge(header) && self.credential.is_some() {
                Auth::Basic
            } else {
                return Ok(resp);
            };
            *self.auth.lock().unwrap_or_else(|p| p.into_inner()) = next;
            retried = true;
        }
    }

    /// What to do about a refusal: give credentials, or check the ones given.
    fn refused_hint(&self) -> String {
        if self.credential.is_some() {
            format!(
                "it refused the credentials environments.credentials gives for {}; check them",
                self.name
            )
        } else {
            format!(
                "it may want credentials: give them for {} in environments.credentials",
                self.name
            )
        }
    }

    /// A bearer token from the challenge's realm, asked for with the operator's credentials
    /// for this registry when there are some (anonymously otherwise).
    async fn token(&self, challenge: &HashMap<String, String>) -> Result<String, ImageError> {
        let realm = challenge.get("realm").ok_or_else(|| {
            ImageError::Unauthorized(format!("{} asks for a token but names no realm", self.base))
        })?;
        let mut url = reqwest::Url::parse(realm).map_err(|e| {
            ImageError::Unauthorized(format!("{}: token realm '{realm}': {e}", self.base))
        })?;
        if !matches!(url.scheme(), "https" | "http") {
            return Err(ImageError::Unauthorized(format!(
                "{}: token realm '{realm}' is not HTTP(S)",
                self.base
            )));
        }
        for key in ["service", "scope"] {
            if let Some(v) = challenge.get(key) {
                url.query_pairs_mut().append_pair(key, v);
            }
        }
        let what = format!("a token from {}", url.origin().ascii_serialization());
        self.check(url.as_str())?;
        let mut req = self.client.get(url);
        if let Some((user, password)) = self.credentials()? {
            req = req.basic_auth(user, Some(password));
        }
        let resp = req.send().await.map_err(|e| match refusal(&e) {
            Some(r) => self.refused(r),
            None => ImageError::Unreachable(format!("{what}: {}", without_url(&e))),
        })?;
        if !resp.status().is_success() {
            return Err(ImageError::Unauthorized(format!(
                "{} refused {what} ({}); {}",
                self.base,
                resp.status(),
                self.refused_hint()
            )));
        }
        let body = read_capped(resp, MAX_TOKEN_BYTES, &what).await?;
        #[derive(serde::Deserialize)]
        struct Token {
            token: Option<String>,
            access_token: Option<String>,
        }
        let t: Token = serde_json::from_slice(&body)
            .map_err(|e| ImageError::Unauthorized(format!("{what}: not a token response: {e}")))?;
        t.token
            .or(t.access_token)
            .filter(|t| !t.is_empty())
            .ok_or_else(|| ImageError::Unauthorized(format!("{what}: the response has no token")))
    }

    fn status_error(&self, what: &str, status: reqwest::StatusCode) -> ImageError {
        match status.as_u16() {
            401 | 403 => ImageError::Unauthorized(format!(
                "{} refused {what} ({status}); {}",
                self.base,
                self.refused_hint()
            )),
            404 => ImageError::NotFound(format!("{} has no {what}", self.base)),
            _ => ImageError::Unreachable(format!("{} answered {status} for {what}", self.base)),
        }
    }

    fn send_error(&self, e: reqwest::Error) -> ImageError {
        match refusal(&e) {
            Some(r) => self.refused(r),
            None => ImageError::Unreachable(format!("{} cannot be reached: {e}", self.base)),
        }
    }

    /// The manifest or index `reference` names in `repository`: its bytes, media type and
    /// digest (the sha256 of the bytes; checked against `reference` when it is a digest).
    pub async fn manifest(
        &self,
        repository: &str,
        reference: &str,
    ) -> Result<(Vec<u8>, String, String), ImageError> {
        let url = format!("{}/v2/{repository}/manifests/{reference}", self.base);
        let what = format!("manifest {repository}:{reference}");
        let accept = format!("{OCI_INDEX}, {OCI_MANIFEST}, {DOCKER_LIST}, {DOCKER_MANIFEST}");
        let resp = self.get(&url, Some(&accept)).await?;
        if !resp.status().is_success() {
            return Err(self.status_error(&what, resp.status()));
        }
        let media_type = resp
            .headers()
            .get(reqwest::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .split(';')
            .next()
            .unwrap_or("")
            .trim()
            .to_string();
        let bytes = read_capped(resp, MAX_MANIFEST_BYTES, &what).await?;
        let digest = format!("sha256:{}", hex::encode(Sha256::digest(&bytes)));
        if reference.starts_with("sha256:") && digest != reference {
            return Err(ImageError::DigestMismatch(format!(
                "{what}: the registry sent content whose digest is {digest}"
            )));
        }
        Ok((bytes, media_type, digest))
    }

    /// A small blob (a config) in memory, checked against its digest and size.
    pub async fn small_blob(
        &self,
        repository: &str,
        digest: &str,
        size: u64,
    ) -> Result<Vec<u8>, ImageError> {
        let what = format!("blob {digest}");
        let resp = self.get_blob(repository, digest).await?;
        let bytes = read_capped(resp, size, &what).await?;
        let got = format!("sha256:{}", hex::encode(Sha256::digest(&bytes)));
        if bytes.len() as u64 != size || got != digest {
            return Err(ImageError::DigestMismatch(format!(
                "{what}: the registry sent {} bytes whose digest is {got} ({size} bytes were \
                 declared)",
                bytes.len()
            )));
        }
        Ok(bytes)
    }

    async fn get_blob(
        &self,
        repository: &str,
        digest: &str,
    ) -> Result<reqwest::Response, ImageError> {
        let url = format!("{}/v2/{repository}/blobs/{digest}", self.base);
        let resp = self.get(&url, None).await?;
        if !resp.status().is_success() {
            return Err(self.status_error(&format!("blob {digest}"), resp.status()));
        }
        Ok(resp)
    }

    /// Streams a blob to `dest` (created new), hashing it on the way; refused past `size`
    /// bytes, short of it, or when its digest is not `digest`. Calls `progress` with the bytes
    /// done.
    pub async fn blob_to_file(
        &self,
        repository: &str,
        digest: &str,
        size: u64,
        dest: &std::path::Path,
        mut progress: impl FnMut(u64),
    ) -> Result<(), ImageError> {
        let what = format!("blob {digest}");
        let mut resp = self.get_blob(repository, digest).await?;
        let mut file = tokio::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(dest)
            .await
            .map_err(|e| ImageError::Io(format!("{}: {e}", dest.display())))?;
        let mut hasher = Sha256::new();
        let mut done = 0u64;
        while let Some(chunk) = resp
            .chunk()
            .await
            .map_err(|e| ImageError::Unreachable(format!("{what}: the download failed: {e}")))?
        {
            done += chunk.len() as u64;
            if done > size {
                return Err(ImageError::DigestMismatch(format!(
                    "{what}: the registry sent more than the {size} bytes the manifest declares"
                )));
            }
            hasher.update(&chunk);
            file.write_all(&chunk)
                .await
                .map_err(|e| ImageError::Io(format!("{}: {e}", dest.display())))?;
            progress(done);
        }
        file.flush()
            .await
            .map_err(|e| ImageError::Io(format!("{}: {e}", dest.display())))?;
        let got = format!("sha256:{}", hex::encode(hasher.finalize()));
        if done != size || got != digest {
            return Err(ImageError::DigestMismatch(format!(
                "{what}: the registry sent {done} bytes whose digest is {got} ({size} bytes were \
                 declared)"
            )));
        }
        Ok(())
    }
}

/// Whether a `WWW-Authenticate` header is a `Basic` challenge.
fn is_basic_challenge(header: &str) -> bool {
    header
        .trim()
        .split(' ')
        .next()
        .is_some_and(|scheme| scheme.eq_ignore_ascii_case("basic"))
}

/// The egress policy's refusal behind a request's error (the client's resolver refused what a
/// name resolved to, or a redirect's target), if that is what it was.
fn refusal(e: &reqwest::Error) -> Option<&toolexec_net::Refusal> {
    let mut source: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(e);
    while let Some(s) = source {
        if let Some(r) = s.downcast_ref::<toolexec_net::Refusal>() {
            return Some(r);
        }
        if let Some(toolexec_net::ConnectError::Refused(r)) =
            s.downcast_ref::<toolexec_net::ConnectError>()
        {
            return Some(r);
        }
        source = s.source();
    }
    None
}

/// A request's error without its URL (a token realm's query may carry what the registry put
/// there).
fn without_url(e: &reqwest::Error) -> String {
    let mut text = e.to_string();
    if let Some(url) = e.url() {
        text = text.replace(url.as_str(), "(url)");
    }
    text
}

/// The parameters of a `Bearer` challenge (`realm`, `service`, `scope`), values unquoted.
fn bearer_challenge(header: &str) -> Option<HashMap<String, String>> {
    let (scheme, rest) = header.trim().split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("bearer") {
        return None;
    }
    let mut out = HashMap::new();
    let mut rest = rest.trim();
    while !rest.is_empty() {
        let (key, after) = rest.split_once('=')?;
        let key = key.trim().to_ascii_lowercase();
        let after = after.trim_start();
        let (value, next) = if let Some(quoted) = after.strip_prefix('"') {
            let end = quoted.find('"')?;
            (&quoted[..end], &quoted[end + 1..])
        } else {
            let end = after.find(',').unwrap_or(after.len());
            (&after[..end], &after[end..])
        };
        out.insert(key, value.to_string());
        rest = next.trim_start().trim_start_matches(',').trim_start();
    }
    Some(out)
}

/// A response body, refused past `cap` bytes (before it is all read).
async fn read_capped(
    mut resp: reqwest::Response,
    cap: u64,
    what: &str,
) -> Result<Vec<u8>, ImageError> {
    if resp.content_length().is_some_and(|n| n > cap) {
        return Err(ImageError::TooBig(format!(
            "{what} is larger than the {cap} bytes allowed for it"
        )));
    }
    let mut out = Vec::new();
    while let Some(chunk) = resp
        .chunk()
        .await
        .map_err(|e| ImageError::Unreachable(format!("{what}: the download failed: {e}")))?
    {
        if out.len() as u64 + chunk.len() as u64 > cap {
            return Err(ImageError::TooBig(format!(
                "{what} is larger than the {cap} bytes allowed for it"
            )));
        }
        out.extend_from_slice(&chunk);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bearer_challenges_are_read_as_registries_send_them() {
        let c = bearer_challenge(
            r#"Bearer realm="https://auth.docker.io/token",service="registry.docker.io",scope="repository:library/python:pull""#,
        )
        .unwrap();
        assert_eq!(c["realm"], "https://auth.docker.io/token");
        assert_eq!(c["service"], "registry.docker.io");
        assert_eq!(c["scope"], "repository:library/python:pull");
        assert!(bearer_challenge(r#"Basic realm="x""#).is_none());
    }
}
