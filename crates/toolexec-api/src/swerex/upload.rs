//! `upload`: a file (`unzip: false`) or a directory the client zipped (`unzip: true`) put at
//! `target_path`, through the archive import (`PUT /v1/sessions/{id}/archive`): the same
//! checks (paths, types, sizes, counts, what is in the way, the disk) before anything is
//! written, and the same record (the files' events in the session's log).
//!
//! The body is read whole within the API's body limit; a zip is turned into the tar the import
//! takes, entry by entry, bounded by the import's own limits on files and unpacked bytes.
use std::io::{Read, Write};

use axum::extract::{Request, State};
use axum::http::{StatusCode, header};
use axum::response::Response;
use serde_json::{Value, json};

use super::multipart;
use super::{Ctx, Failure, class, handle, py_repr, workspace_path};
use crate::SharedState;

pub(crate) async fn upload(State(state): State<SharedState>, req: Request) -> Response {
    let content_type = req
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    handle(state.clone(), req, |ctx, body| async move {
        let boundary = multipart::boundary(&content_type).ok_or_else(|| {
            Failure::http(
                StatusCode::UNPROCESSABLE_ENTITY,
                "send the upload as multipart/form-data (fields file, target_path, unzip)",
            )
        })?;
        let bytes = axum::body::to_bytes(body, state.config.body_limit_bytes)
            .await
            .map_err(|_| {
                Failure::http(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    format!(
                        "the upload is over {} bytes, the most one request may be; upload it in parts",
                        state.config.body_limit_bytes
                    ),
                )
            })?;
        // Off the async workers: the search for boundaries reads the whole body.
        let fields = tokio::task::spawn_blocking(move || {
            let parts = multipart::parts(&bytes, &boundary)?;
            let field = |name: &str| {
                parts
                    .iter()
                    .find(|p| p.name == name)
                    .map(|p| bytes.slice_ref(p.data))
            };
            Ok::<_, String>((field("file"), field("target_path"), field("unzip")))
        })
        .await
        .map_err(|e| Failure::http(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?;
        let (file, target, unzip) =
            fields.map_err(|e| Failure::http(StatusCode::UNPROCESSABLE_ENTITY, e))?;
        let file = file.ok_or_else(|| {
            Failure::http(StatusCode::UNPROCESSABLE_ENTITY, "body/file: field required")
        })?;
        let target = target
            .as_deref()
            .and_then(|t| std::str::from_utf8(t).ok())
            .ok_or_else(|| {
                Failure::http(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    "body/target_path: field required",
                )
            })?
            .to_owned();
        let unzip = unzip
            .map(|v| String::from_utf8_lossy(&v).trim().to_ascii_lowercase())
            .is_some_and(|v| matches!(v.as_str(), "true" | "1" | "yes" | "on"));
        let rel = workspace_path(&target)?;
        if rel.is_empty() && !unzip {
            return Err(Failure::exception(
                class::IS_A_DIRECTORY,
                format!("[Errno 21] Is a directory: {}", py_repr(&target)),
            ));
        }
        import(&ctx, file, rel, unzip).await
    })
    .await
}

/// Writes the tar of the upload to a spool, then imports it.
async fn import(ctx: &Ctx, data: bytes::Bytes, rel: String, unzip: bool) -> Result<Value, Failure> {
    let engine = ctx.state.engine.clone();
    let _slot = engine
        .archives()
        .archive_slot(ctx.tenant.id)
        .map_err(|e| Failure::from(crate::problem::ApiError::from(e)))?;
    let Some(_upload) = engine.archives().archive_upload() else {
        return Err(Failure::http(
            StatusCode::SERVICE_UNAVAILABLE,
            "this node has as many uploads under way as it takes at once; retry shortly",
        ));
    };
    let (spool, file) = engine.archives().archive_spool().map_err(|e| {
        tracing::error!(error = %e, "cannot spool a SWE-ReX upload");
        Failure::http(
            StatusCode::INTERNAL_SERVER_ERROR,
            "the upload could not be spooled",
        )
    })?;
    let (max_files, max_bytes) = {
        let l = &engine.config().limits;
        (l.max_archive_files, l.max_archive_unpacked_bytes)
    };
    let written = tokio::task::spawn_blocking(move || {
        let mut tar = tar::Builder::new(std::io::BufWriter::new(file));
        if unzip {
            zip_to_tar(&data, &rel, &mut tar, max_files, max_bytes)?;
        } else {
            append(&mut tar, &rel, 0o644, &mut data.as_ref(), data.len() as u64)?;
        }
        tar.into_inner()
            .and_then(|mut w| w.flush())
            .map_err(|e| e.to_string())
    })
    .await
    .map_err(|e| Failure::http(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?;
    if let Err(e) = written {
        return Err(Failure::exception(class::VALUE, e));
    }
    let (tenant, session) = (ctx.tenant.id, ctx.session.id);
    // In a task of its own, as the archive route: a client that goes away does not stop it
    // between a batch written and its record.
    tokio::spawn(async move { engine.upload_archive(tenant, session, spool).await })
        .await
        .map_err(|e| Failure::http(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?
        .map_err(|e| match crate::problem::ApiError::from(e) {
            // The archive's checks refused it: what it would have written, said.
            e if e.status().is_client_error() && e.status() != StatusCode::NOT_FOUND => {
                Failure::exception(class::OS_ERROR, e.detail)
            }
            e => Failure::from(e),
        })?;
    Ok(json!({}))
}

fn append<W: Write>(
    tar: &mut tar::Builder<W>,
    path: &str,
    mode: u32,
    data: &mut dyn Read,
    size: u64,
) -> Result<(), String> {
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(tar::EntryType::Regular);
    h.set_mode(mode & 0o777);
    h.set_size(size);
    h.set_mtime(0);
    tar.append_data(&mut h, path, data)
        .map_err(|e| format!("{path}: {e}"))
}

/// Each entry of the zip, under `under`, into the tar (directories as such, files with their
/// permission bits); refused past `max_files` entries or `max_bytes` unpacked.
fn zip_to_tar<W: Write>(
    data: &[u8],
    under: &str,
    tar: &mut tar::Builder<W>,
    max_files: u64,
    max_bytes: u64,
) -> Result<(), String> {
    let mut zip = zip::ZipArchive::new(std::io::Cursor::new(data))
        .map_err(|e| format!("the upload is not a zip archive: {e}"))?;
    if zip.len() as u64 > max_files {
        return Err(format!(
            "the zip has {} entries, over the {max_files} one upload may have",
            zip.len()
        ));
    }
    let mut total = 0u64;
    for i in 0..zip.len() {
        let mut entry = zip.by_index(i).map_err(|e| e.to_string())?;
        let name = entry
            .name()
            .map_err(|e| e.to_string())?
            .trim_end_matches('/')
            .to_owned();
        if name.is_empty() {
            continue;
        }
        let path = if under.is_empty() {
            name.clone()
        } else {
            format!("{under}/{name}")
        };
        if entry.is_dir() {
            let mut h = tar::Header::new_gnu();
            h.set_entry_type(tar::EntryType::Directory);
            h.set_mode(0o755);
            h.set_size(0);
            h.set_mtime(0);
            tar.append_data(&mut h, &path, std::io::empty())
                .map_err(|e| format!("{path}: {e}"))?;
            continue;
        }
        let size = entry.size();
        total = total.saturating_add(size);
        if total > max_bytes {
            return Err(format!(
                "the zip unpacks to more than {max_bytes} bytes, the most one upload may"
            ));
        }
        let mode = entry.unix_mode().unwrap_or(0o644);
        // The size the zip declares is what the tar entry holds: a stream that says less than
        // it inflates to is cut there (and refused by the header check of the next entry).
        let mut limited = (&mut entry).take(size);
        append(tar, &path, mode, &mut limited, size)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_zip_becomes_a_tar_under_its_target() {
        let mut buf = std::io::Cursor::new(Vec::new());
        {
            let mut z = zip::ZipWriter::new(&mut buf);
            let opts = zip::write::SimpleFileOptions::default()
                .compression_method(zip::CompressionMethod::Stored);
            z.add_directory("d/", opts).unwrap();
            z.start_file("d/a.txt", opts).unwrap();
            z.write_all(b"hello").unwrap();
            z.finish().unwrap();
        }
        let mut tar = tar::Builder::new(Vec::new());
        zip_to_tar(buf.get_ref(), "up", &mut tar, 10, 100).unwrap();
        let bytes = tar.into_inner().unwrap();
        let mut a = tar::Archive::new(bytes.as_slice());
        let names: Vec<String> = a
            .entries()
            .unwrap()
            .map(|e| e.unwrap().path().unwrap().display().to_string())
            .collect();
        assert_eq!(names, ["up/d", "up/d/a.txt"]);
        let mut tar = tar::Builder::new(Vec::new());
        assert!(zip_to_tar(buf.get_ref(), "up", &mut tar, 1, 100).is_err());
        assert!(zip_to_tar(b"not a zip", "up", &mut tar, 10, 100).is_err());
    }
}
