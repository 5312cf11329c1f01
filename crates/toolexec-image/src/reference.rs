//! Image references: `host[:port]/repo[:tag]` or `…@sha256:<hex>`, as Docker spells them.
use crate::ImageError;

/// A parsed reference.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reference {
    /// `host` or `host:port`.
    pub registry: String,
    pub repository: String,
    /// A tag, or a digest (`sha256:…`).
    pub reference: String,
}

impl Reference {
    pub fn is_digest(&self) -> bool {
        self.reference.starts_with("sha256:")
    }
}

impl std::fmt::Display for Reference {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let sep = if self.is_digest() { '@' } else { ':' };
        write!(
            f,
            "{}/{}{sep}{}",
            self.registry, self.repository, self.reference
        )
    }
}

/// Whether `s` is `sha256:` and 64 lower-case hex digits.
pub fn is_sha256_digest(s: &str) -> bool {
    s.strip_prefix("sha256:").is_some_and(|h| {
        h.len() == 64
            && h.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    })
}

/// Parses `reference`. A first component without a dot, a colon or `localhost` is a Docker
/// Hub name (`python:3.12` is `docker.io/library/python:3.12`).
pub fn parse(reference: &str) -> Result<Reference, ImageError> {
    let bad = |why: &str| ImageError::InvalidReference(format!("'{reference}': {why}"));
    if reference.is_empty() || reference.len() > 1024 {
        return Err(bad("a reference is 1 to 1024 bytes"));
    }
    let (name, digest) = match reference.split_once('@') {
        Some((n, d)) => {
            if !is_sha256_digest(d) {
                return Err(bad("a digest is sha256: and 64 lower-case hex digits"));
            }
            (n, Some(d))
        }
        None => (reference, None),
    };
    // A tag is after the last colon that follows the last slash.
    let last_slash = name.rfind('/').map_or(0, |i| i + 1);
    let (name, tag) = match name[last_slash..].rfind(':') {
        Some(i) => (&name[..last_slash + i], Some(&name[last_slash + i + 1..])),
        None => (name, None),
    };
    let (registry, repository) = match name.split_once('/') {
        Some((first, rest))
            if first.contains('.') || first.contains(':') || first == "localhost" =>
        {
            (first.to_string(), rest.to_string())
        }
        Some(_) => ("docker.io".to_string(), name.to_string()),
        None => ("docker.io".to_string(), format!("library/{name}")),
    };
    let component_ok = |c: &str| {
        !c.is_empty()
            && c.bytes().all(|b| {
                b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'.' | b'_' | b'-')
            })
            && c.bytes().next().is_some_and(|b| b.is_ascii_alphanumeric())
    };
    if repository.is_empty() || !repository.split('/').all(component_ok) {
        return Err(bad(
            "a repository is lower-case letters, digits, '.', '_' and '-' between slashes",
        ));
    }
    if registry.is_empty()
        || !registry
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b':' | b'[' | b']'))
    {
        return Err(bad("not a registry host"));
    }
    let reference = match (tag, digest) {
        (_, Some(d)) => d.to_string(),
        (Some(t), None) => {
            let ok = !t.is_empty()
                && t.len() <= 128
                && t.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
                && !t.starts_with(['.', '-']);
            if !ok {
                return Err(bad("a tag is 1 to 128 letters, digits, '.', '_' and '-'"));
            }
            t.to_string()
        }
        (None, None) => "latest".to_string(),
    };
    Ok(Reference {
        registry,
        repository,
        reference,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_parse_as_docker_spells_them() {
        let r = parse("127.0.0.1:5000/tools/py:3.12").unwrap();
        assert_eq!(
            (
                r.registry.as_str(),
                r.repository.as_str(),
                r.reference.as_str()
            ),
            ("127.0.0.1:5000", "tools/py", "3.12")
        );
        let r = parse("python").unwrap();
        assert_eq!(r.to_string(), "docker.io/library/python:latest");
        let d = format!("sha256:{}", "a".repeat(64));
        let r = parse(&format!("localhost/x@{d}")).unwrap();
        assert!(r.is_digest());
        assert_eq!(r.to_string(), format!("localhost/x@{d}"));
        for bad in ["", "Host.x/UPPER", "h.x/r:", "h.x/r@sha256:12", "h.x/a b"] {
            assert!(parse(bad).is_err(), "{bad}");
        }
    }
}
