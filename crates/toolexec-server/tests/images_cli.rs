//! `toolexec images pull|list|rm`, run as a process against a registry served on loopback by
//! the test (the read side of the distribution API), configured the way an operator does:
//! `TOOLEXEC_ENVIRONMENTS__*` variables.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::io::Write;
use std::process::{Command, Output};
use std::sync::Arc;

use axum::body::Body;
use axum::http::{Response, StatusCode, Uri};
use sha2::{Digest, Sha256};

fn digest(bytes: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(bytes)))
}

/// Serves `paths` (`/v2/...` -> content type and bytes) on loopback; its `host:port`.
async fn registry(paths: HashMap<String, (String, Vec<u8>)>) -> String {
    registry_at("127.0.0.1", paths).await
}

/// [`registry`] on `ip`. A path whose content type is `redirect` answers 307 to its bytes (a
/// URL), as registries send blobs to a CDN.
async fn registry_at(ip: &str, paths: HashMap<String, (String, Vec<u8>)>) -> String {
    let paths = Arc::new(paths);
    let listener = tokio::net::TcpListener::bind((ip, 0)).await.unwrap();
    let host = listener.local_addr().unwrap().to_string();
    let app = axum::Router::new().fallback(move |uri: Uri| {
        let paths = paths.clone();
        async move {
            match paths.get(uri.path()) {
                Some((ct, to)) if ct == "redirect" => Response::builder()
                    .status(StatusCode::TEMPORARY_REDIRECT)
                    .header("location", String::from_utf8_lossy(to).as_ref())
                    .body(Body::empty())
                    .unwrap(),
                Some((ct, bytes)) => Response::builder()
                    .header("content-type", ct.as_str())
                    .body(Body::from(bytes.clone()))
                    .unwrap(),
                None if uri.path() == "/v2/" => Response::new(Body::from("{}")),
                None => Response::builder()
                    .status(StatusCode::NOT_FOUND)
                    .body(Body::empty())
                    .unwrap(),
            }
        }
    });
    tokio::spawn(async move { axum::serve(listener, app).await });
    host
}

/// An image of one gzipped layer holding `hello` and a symlink aimed at the host's `/etc`
/// with a file written beneath it; its manifest digest.
fn image(paths: &mut HashMap<String, (String, Vec<u8>)>) -> String {
    let mut tar = tar::Builder::new(Vec::new());
    let mut add = |kind: tar::EntryType, name: &str, link: &str, data: &[u8]| {
        let mut h = tar::Header::new_gnu();
        h.as_old_mut().name[..name.len()].copy_from_slice(name.as_bytes());
        h.as_old_mut().linkname[..link.len()].copy_from_slice(link.as_bytes());
        h.set_entry_type(kind);
        h.set_mode(0o644);
        h.set_size(data.len() as u64);
        h.set_cksum();
        tar.append(&h, data).unwrap();
    };
    add(tar::EntryType::Regular, "hello", "", b"from the image\n");
    add(tar::EntryType::Symlink, "etc-link", "/etc", b"");
    add(
        tar::EntryType::Regular,
        "etc-link/toolexec-test-owned",
        "",
        b"x",
    );
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(&tar.into_inner().unwrap()).unwrap();
    let layer = gz.finish().unwrap();
    let config = serde_json::to_vec(&serde_json::json!({
        "architecture": "amd64", "os": "linux",
        "config": {"Env": ["PATH=/bin"]}, "rootfs": {"type": "layers", "diff_ids": []}
    }))
    .unwrap();
    let manifest = serde_json::to_vec(&serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                   "digest": digest(&config), "size": config.len()},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
                    "digest": digest(&layer), "size": layer.len()}]
    }))
    .unwrap();
    let d = digest(&manifest);
    let oct = "application/octet-stream".to_string();
    paths.insert(
        format!("/v2/demo/hello/blobs/{}", digest(&layer)),
        (oct.clone(), layer),
    );
    paths.insert(
        format!("/v2/demo/hello/blobs/{}", digest(&config)),
        (oct, config),
    );
    let mt = "application/vnd.oci.image.manifest.v1+json".to_string();
    for r in ["1".to_string(), d.clone()] {
        paths.insert(
            format!("/v2/demo/hello/manifests/{r}"),
            (mt.clone(), manifest.clone()),
        );
    }
    d
}

fn images(dir: &std::path::Path, host: &str, args: &[&str]) -> Output {
    images_allowing(dir, host, "127.0.0.1", args)
}

/// [`images`] with `environments.allow_cidrs` = `allow`.
fn images_allowing(dir: &std::path::Path, host: &str, allow: &str, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_toolexec"))
        .arg("images")
        .args(args)
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .env("TOOLEXEC_DATA_DIR", dir.join("data"))
        .env(
            "TOOLEXEC_ENVIRONMENTS__IMAGES",
            format!(r#"[{{"name": "hello", "image": "{host}/demo/hello:1"}}]"#),
        )
        .env("TOOLEXEC_ENVIRONMENTS__INSECURE_REGISTRIES", host)
        .env("TOOLEXEC_ENVIRONMENTS__ALLOW_CIDRS", allow)
        .current_dir(dir)
        .output()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn images_are_pulled_by_configured_name_listed_and_removed() {
    let mut paths = HashMap::new();
    let manifest = image(&mut paths);
    let host = registry(paths).await;
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_path_buf();
    let h = host.clone();
    let run = move |args: &'static [&'static str]| {
        let (d, h) = (d.clone(), h.clone());
        tokio::task::spawn_blocking(move || images(&d, &h, args))
    };

    let out = run(&["pull", "hello"]).await.unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let pulled: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(pulled["digest"], manifest.as_str());
    let rootfs = std::path::PathBuf::from(pulled["rootfs"].as_str().unwrap());
    assert!(rootfs.starts_with(dir.path().join("data/workspaces/.images/sha256")));
    assert_eq!(
        std::fs::read_to_string(rootfs.join("hello")).unwrap(),
        "from the image\n"
    );
    // Written beneath the link to `/etc`: inside the image, not on the host.
    assert!(rootfs.join("etc/toolexec-test-owned").is_file());
    assert!(!std::path::Path::new("/etc/toolexec-test-owned").exists());

    // A reference to a registry that is not allowed is refused, naming the setting.
    let out = {
        let (d, h) = (dir.path().to_path_buf(), host.clone());
        tokio::task::spawn_blocking(move || {
            let r = format!("{h}/demo/hello:1");
            images(&d, &h, &["pull", &r])
        })
        .await
        .unwrap()
    };
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("environments.allow_registries"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let out = run(&["list"]).await.unwrap();
    let list: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(list.as_array().unwrap().len(), 1);
    assert_eq!(list[0]["digest"], manifest.as_str());

    let m = manifest.clone();
    let (d, h) = (dir.path().to_path_buf(), host.clone());
    let out = tokio::task::spawn_blocking(move || images(&d, &h, &["rm", &m]))
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!rootfs.exists());
    let out = run(&["list"]).await.unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "[]");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redirect_to_an_address_the_operator_did_not_allow_is_not_followed() {
    // The registry sends its blobs to a "CDN" at 127.0.0.2, which serves them.
    let mut paths = HashMap::new();
    image(&mut paths);
    let cdn = registry_at("127.0.0.2", paths.clone()).await;
    let redirected: HashMap<String, (String, Vec<u8>)> = paths
        .into_iter()
        .map(|(path, served)| {
            if path.contains("/blobs/") {
                let to = format!("http://{cdn}{path}").into_bytes();
                (path, ("redirect".to_string(), to))
            } else {
                (path, served)
            }
        })
        .collect();
    let host = registry(redirected).await;
    let pull = |allow: &'static str| {
        let dir = tempfile::tempdir().unwrap();
        let h = host.clone();
        tokio::task::spawn_blocking(move || {
            let out = images_allowing(dir.path(), &h, allow, &["pull", "hello"]);
            (out, dir)
        })
    };

    // Only the registry's address allowed: the redirect's target is refused before it is asked.
    let (out, _dir) = pull("127.0.0.1").await.unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("environments.allow_cidrs"), "{stderr}");
    assert!(stderr.contains("loopback"), "{stderr}");

    // Both allowed: the redirect is followed and the image pulled.
    let (out, _dir) = pull("127.0.0.1,127.0.0.2").await.unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The service's image cache (`toolexec_server::image_store`, its client, redirect policy and
/// checked resolver) with names resolved by a resolver the test controls, allowing `allow`.
fn store_resolving(
    dir: &std::path::Path,
    registries: &[&str],
    allow: &[&str],
    names: &[(&str, &[std::net::IpAddr])],
) -> toolexec_image::ImageStore {
    let mut config = toolexec_server::config::Config {
        data_dir: dir.to_path_buf(),
        ..Default::default()
    };
    config.environments.allow_registries = registries.iter().map(|r| r.to_string()).collect();
    config.environments.insecure_registries = config.environments.allow_registries.clone();
    config.environments.allow_cidrs = allow.iter().map(|a| a.to_string()).collect();
    let mut resolver = toolexec_net::StaticResolver::new();
    for (name, addrs) in names {
        resolver = resolver.with(name, addrs.iter().copied());
    }
    toolexec_server::image_store_resolving(&config, Arc::new(resolver)).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_registry_name_that_resolves_to_a_refused_address_is_not_reached() {
    let mut paths = HashMap::new();
    let manifest = image(&mut paths);
    let host = registry(paths).await;
    let port = host.rsplit_once(':').unwrap().1;
    let loopback: std::net::IpAddr = "127.0.0.1".parse().unwrap();
    let link_local: std::net::IpAddr = "169.254.169.254".parse().unwrap();
    let public: std::net::IpAddr = "93.184.215.14".parse().unwrap();
    let names: &[(&str, &[std::net::IpAddr])] = &[
        ("registry.test", &[loopback]),
        ("metadata.test", &[link_local]),
        // One public address and one refused: the whole answer is checked.
        ("mixed.test", &[public, loopback]),
    ];
    let regs: Vec<String> = ["registry.test", "metadata.test", "mixed.test"]
        .iter()
        .map(|n| format!("{n}:{port}"))
        .collect();
    let regs: Vec<&str> = regs.iter().map(String::as_str).collect();

    // Nothing allowed beyond the public internet: each name is refused as it is resolved,
    // before anything is connected, with what to do.
    let dir = tempfile::tempdir().unwrap();
    let store = store_resolving(dir.path(), &regs, &[], names);
    for (reg, class) in [
        (regs[0], "loopback"),
        (regs[1], "metadata"),
        (regs[2], "loopback"),
    ] {
        let started = std::time::Instant::now();
        let err = store
            .pull(&format!("{reg}/demo/hello:1"))
            .await
            .unwrap_err();
        let text = err.to_string();
        assert!(
            matches!(err, toolexec_image::ImageError::RegistryNotAllowed(_)),
            "{reg}: {text}"
        );
        assert!(text.contains(class), "{reg}: {text}");
        assert!(text.contains("environments.allow_cidrs"), "{reg}: {text}");
        assert!(
            !text.contains("127.0.0.1") && !text.contains("169.254"),
            "{text}"
        );
        assert!(
            started.elapsed() < std::time::Duration::from_secs(5),
            "{reg}: {:?}",
            started.elapsed()
        );
    }
    assert!(store.list().unwrap().is_empty());

    // The same name with its address allowed reaches the registry: the refusal above was the
    // classification of what the name resolved to, not a name that resolves to nothing.
    let dir = tempfile::tempdir().unwrap();
    let store = store_resolving(dir.path(), &regs, &["127.0.0.1"], names);
    let image = store
        .pull(&format!("{}/demo/hello:1", regs[0]))
        .await
        .unwrap();
    assert_eq!(image.digest, manifest);
    let err = store
        .pull(&format!("{}/demo/hello:1", regs[1]))
        .await
        .unwrap_err();
    assert!(
        matches!(err, toolexec_image::ImageError::RegistryNotAllowed(_)),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_processes_pulling_one_digest_into_one_folder_download_it_once() {
    let mut paths = HashMap::new();
    let manifest = image(&mut paths);
    // The registry counts what it serves and takes its time with blobs, so that both
    // processes are pulling at once.
    let paths = Arc::new(paths);
    let served: Arc<std::sync::Mutex<HashMap<String, usize>>> = Arc::default();
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0))
        .await
        .unwrap();
    let host = listener.local_addr().unwrap().to_string();
    let counts = served.clone();
    let app = axum::Router::new().fallback(move |uri: Uri| {
        let (paths, counts) = (paths.clone(), counts.clone());
        async move {
            let path = uri.path().to_owned();
            *counts.lock().unwrap().entry(path.clone()).or_default() += 1;
            if path.contains("/blobs/") {
                tokio::time::sleep(std::time::Duration::from_millis(700)).await;
            }
            match paths.get(&path) {
                Some((ct, bytes)) => Response::builder()
                    .header("content-type", ct.as_str())
                    .body(Body::from(bytes.clone()))
                    .unwrap(),
                None => Response::builder()
                    .status(StatusCode::NOT_FOUND)
                    .body(Body::empty())
                    .unwrap(),
            }
        }
    });
    tokio::spawn(async move { axum::serve(listener, app).await });
    let dir = tempfile::tempdir().unwrap();
    let pulls: Vec<_> = (0..2)
        .map(|_| {
            let (d, h) = (dir.path().to_path_buf(), host.clone());
            tokio::task::spawn_blocking(move || images(&d, &h, &["pull", "hello"]))
        })
        .collect();
    for p in pulls {
        let out = p.await.unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let pulled: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(pulled["digest"], manifest.as_str());
    }
    let served = served.lock().unwrap();
    let blobs: Vec<(&String, &usize)> = served
        .iter()
        .filter(|(p, _)| p.contains("/blobs/"))
        .collect();
    // The config and the layer, once each: the second process waited for the first's pull.
    assert_eq!(blobs.len(), 2, "{served:?}");
    assert!(blobs.iter().all(|(_, n)| **n == 1), "{served:?}");
}
