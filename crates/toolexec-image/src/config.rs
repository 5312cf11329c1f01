//! What the operator configures (`[environments]`): images by name, the registries any other
//! reference may name, and those reached over plain HTTP.
use serde::{Deserialize, Serialize};

use crate::{ImageError, reference};

/// `[environments]`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EnvironmentsConfig {
    /// Images by name (`[[environments.images]] name = "py312", image = "…"`): always allowed,
    /// whatever `allow_registries` says.
    pub images: Vec<NamedImage>,
    /// Registries (`host` or `host:port`) any reference may name; default none: only the
    /// configured names.
    pub allow_registries: Vec<String>,
    /// Registries reached over plain HTTP (a registry on the cluster's own network).
    pub insecure_registries: Vec<String>,
    /// The image (a configured name) of sessions that name none.
    pub default: Option<String>,
    /// The most the node's image cache may take unpacked (`<workspace_root>/.images`): past
    /// it, the least recently used images no session runs in are evicted.
    pub max_cache_bytes: u64,
    /// Networks beyond the public internet the service may pull from (CIDRs or addresses: a
    /// registry on the cluster's own network, or on loopback in a test). The registry's
    /// addresses (and its token service's, and every redirect's) are checked by the same egress
    /// classification as the web tools'; default none: public registries only.
    pub allow_cidrs: Vec<String>,
    /// Credentials per registry (`[[environments.credentials]] registry = "host:port",
    /// username = "…", password_file = "/run/secrets/…"`). Never logged, never in an error, a
    /// result or the record.
    pub credentials: Vec<RegistryCredential>,
}

/// The credentials the service pulls from one registry with: HTTP basic auth on a `Basic`
/// challenge, or to get a token on a `Bearer` one.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RegistryCredential {
    /// `host` or `host:port`, as image references name it (`docker.io` for Docker Hub).
    pub registry: String,
    pub username: String,
    /// The password or token itself; or
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub password: Option<String>,
    /// a file holding it (a mounted secret), read at each pull so that a rotated secret is
    /// taken without a restart; a trailing newline is not part of it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub password_file: Option<std::path::PathBuf>,
}

impl std::fmt::Debug for RegistryCredential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RegistryCredential")
            .field("registry", &self.registry)
            .field("username", &self.username)
            .field("password", &self.password.as_ref().map(|_| "***"))
            .field("password_file", &self.password_file)
            .finish()
    }
}

impl RegistryCredential {
    /// The password: given, or read from its file now. The error names the file, never what
    /// it holds.
    pub fn password(&self) -> Result<String, String> {
        match (&self.password, &self.password_file) {
            (Some(p), _) => Ok(p.clone()),
            (None, Some(path)) => std::fs::read_to_string(path)
                .map(|p| p.trim_end_matches(['\n', '\r']).to_owned())
                .map_err(|e| format!("{}: {}", path.display(), e.kind())),
            (None, None) => Err("neither password nor password_file is set".into()),
        }
    }
}

impl Default for EnvironmentsConfig {
    fn default() -> Self {
        Self {
            images: Vec::new(),
            allow_registries: Vec::new(),
            insecure_registries: Vec::new(),
            default: None,
            max_cache_bytes: crate::DEFAULT_MAX_CACHE_BYTES,
            allow_cidrs: Vec::new(),
            credentials: Vec::new(),
        }
    }
}

/// One configured image.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NamedImage {
    pub name: String,
    /// `host/repo:tag` or `host/repo@sha256:…`.
    pub image: String,
}

impl EnvironmentsConfig {
    /// The egress policy registries are reached under: the public internet and `allow_cidrs`,
    /// this host's own addresses refused unless allow-listed (as for the web tools).
    pub fn policy(&self) -> Result<toolexec_net::NetPolicy, ImageError> {
        toolexec_net::NetPolicy::new(&self.allow_cidrs)
            .map(toolexec_net::NetPolicy::refusing_this_host)
            .map_err(|e| ImageError::InvalidReference(format!("environments.allow_cidrs: {e}")))
    }

    /// The operator's credentials for `registry`, if any.
    pub fn credential(&self, registry: &str) -> Option<&RegistryCredential> {
        self.credentials.iter().find(|c| c.registry == registry)
    }

    /// Checks the configuration: every configured image a valid reference, names unique, the
    /// default one of them.
    pub fn validate(&self) -> Result<(), ImageError> {
        let mut seen = std::collections::BTreeSet::new();
        for named in &self.images {
            if named.name.is_empty() || !seen.insert(named.name.as_str()) {
                return Err(ImageError::InvalidReference(format!(
                    "environments.images: the name '{}' is empty or given twice",
                    named.name
                )));
            }
            reference::parse(&named.image).map_err(|e| {
                ImageError::InvalidReference(format!("environments.images '{}': {e}", named.name))
            })?;
        }
        if let Some(default) = &self.default
            && !self.images.iter().any(|i| i.name == *default)
        {
            return Err(ImageError::InvalidReference(format!(
                "environments.default '{default}' is not a name of environments.images"
            )));
        }
        self.policy()?;
        let mut with_credentials = std::collections::BTreeSet::new();
        for c in &self.credentials {
            if !with_credentials.insert(c.registry.as_str()) {
                return Err(ImageError::InvalidReference(format!(
                    "environments.credentials: {} is given twice",
                    c.registry
                )));
            }
            if c.password.is_some() == c.password_file.is_some() {
                return Err(ImageError::InvalidReference(format!(
                    "environments.credentials for {}: give password or password_file, one of \
                     them",
                    c.registry
                )));
            }
        }
        for host in self
            .allow_registries
            .iter()
            .chain(&self.insecure_registries)
            .chain(self.credentials.iter().map(|c| &c.registry))
        {
            if host.is_empty() || host.contains('/') {
                return Err(ImageError::InvalidReference(format!(
                    "'{host}' in environments.allow_registries, insecure_registries or \
                     credentials is not a registry (host or host:port)"
                )));
            }
        }
        Ok(())
    }

    /// The reference a caller's `image` stands for: a configured name's image, or a reference
    /// to a registry the operator allows.
    pub fn resolve(&self, image: &str) -> Result<String, ImageError> {
        if let Some(named) = self.images.iter().find(|i| i.name == image) {
            return Ok(named.image.clone());
        }
        let r = reference::parse(image)?;
        if self.allow_registries.contains(&r.registry) {
            return Ok(image.to_string());
        }
        let names: Vec<&str> = self.images.iter().map(|i| i.name.as_str()).collect();
        Err(ImageError::RegistryNotAllowed(format!(
            "'{image}' is not a configured image ({}) and its registry {} is not in \
             environments.allow_registries",
            if names.is_empty() {
                "there are none".to_string()
            } else {
                names.join(", ")
            },
            r.registry
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_allowed_registries_resolve_and_others_are_refused() {
        let c = EnvironmentsConfig {
            images: vec![NamedImage {
                name: "py312".into(),
                image: "registry.local:5000/py:3.12".into(),
            }],
            allow_registries: vec!["ghcr.io".into()],
            insecure_registries: vec![],
            default: Some("py312".into()),
            ..EnvironmentsConfig::default()
        };
        c.validate().unwrap();
        assert_eq!(c.resolve("py312").unwrap(), "registry.local:5000/py:3.12");
        assert_eq!(c.resolve("ghcr.io/o/r:1").unwrap(), "ghcr.io/o/r:1");
        let err = c.resolve("registry.local:5000/py:3.12").unwrap_err();
        assert!(matches!(err, ImageError::RegistryNotAllowed(_)), "{err}");
        let err = c.resolve("python:3").unwrap_err();
        assert!(err.to_string().contains("docker.io"), "{err}");
        let bad = EnvironmentsConfig {
            default: Some("nope".into()),
            ..c
        };
        assert!(bad.validate().is_err());
    }
}
