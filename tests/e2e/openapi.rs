//! The checked-in OpenAPI document is the one the code generates.
use serde_json::Value;

const REWRITE: &str = "cargo run -p toolexec-server -- openapi --write openapi/openapi.json";

#[test]
fn the_checked_in_openapi_document_matches_the_code() {
    let registry = toolexec_tools::Registry::builtin().unwrap();
    let generated = toolexec_api::openapi_json(&registry);
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../openapi/openapi.json");
    let checked_in = std::fs::read_to_string(&path).unwrap_or_default();
    if generated != checked_in {
        let diff = similar::TextDiff::from_lines(&checked_in, &generated)
            .unified_diff()
            .header("openapi/openapi.json (checked in)", "generated")
            .to_string();
        panic!("openapi/openapi.json is out of date. Rewrite it with:\n    {REWRITE}\n\n{diff}");
    }
}

#[test]
fn every_endpoint_documents_its_error_responses() {
    let registry = toolexec_tools::Registry::builtin().unwrap();
    let doc: Value = serde_json::from_str(&toolexec_api::openapi_json(&registry)).unwrap();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for (method, op) in item.as_object().unwrap() {
            let responses = op["responses"].as_object().unwrap();
            for code in ["500", "503"] {
                assert!(responses.contains_key(code), "{method} {path} lacks {code}");
            }
            if path.starts_with("/v1/") {
                assert!(responses.contains_key("401"), "{method} {path} lacks 401");
            }
            if op.get("requestBody").is_some() {
                for code in ["400", "413", "415", "422"] {
                    assert!(responses.contains_key(code), "{method} {path} lacks {code}");
                }
            }
            for (code, r) in responses {
                if code.starts_with('4') || code.starts_with('5') {
                    let content = r["content"].as_object();
                    let ok = content.is_some_and(|c| c.contains_key("application/problem+json"))
                        || path == "/readyz";
                    assert!(ok, "{method} {path} {code} is not a problem+json response");
                }
            }
        }
    }
}

#[test]
fn the_checked_in_tools_reference_matches_the_catalog() {
    let registry = toolexec_tools::Registry::builtin().unwrap();
    let generated = toolexec_server::tools_markdown(&registry);
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/tools.md");
    let checked_in = std::fs::read_to_string(&path).unwrap_or_default();
    if generated != checked_in {
        let diff = similar::TextDiff::from_lines(&checked_in, &generated)
            .unified_diff()
            .header("docs/tools.md (checked in)", "generated")
            .to_string();
        panic!(
            "docs/tools.md is out of date. Rewrite it with:\n    cargo run -p toolexec-server -- tools-doc --write docs/tools.md\n\n{diff}"
        );
    }
}

#[test]
fn the_checked_in_problem_codes_match_the_table() {
    let generated = toolexec_server::problems_markdown();
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/problems.md");
    let checked_in = std::fs::read_to_string(&path).unwrap_or_default();
    if generated != checked_in {
        let diff = similar::TextDiff::from_lines(&checked_in, &generated)
            .unified_diff()
            .header("docs/problems.md (checked in)", "generated")
            .to_string();
        panic!(
            "docs/problems.md is out of date. Rewrite it with:\n    cargo run -p toolexec-server -- problems-doc --write docs/problems.md\n\n{diff}"
        );
    }
}

/// A code named in an error response of the document (`` `code` ``) is one of the table's, with
/// the response's status: hand-written descriptions cannot promise a code the service does not
/// answer with.
#[test]
fn every_code_an_error_response_names_is_in_the_table_with_its_status() {
    let registry = toolexec_tools::Registry::builtin().unwrap();
    let doc: serde_json::Value =
        serde_json::from_str(&toolexec_api::openapi_json(&registry)).unwrap();
    let table: std::collections::HashMap<&str, u16> = toolexec_core::ProblemCode::ALL
        .iter()
        .map(|c| (c.as_str(), c.status()))
        .collect();
    // Settings are named in backticks too (`max_concurrent_requests`, `limits.…`).
    let settings = toolexec_server::config::setting_keys();
    let mut checked = 0;
    for (path, item) in doc["paths"].as_object().unwrap() {
        for (method, op) in item.as_object().unwrap() {
            for (status, r) in op["responses"].as_object().into_iter().flatten() {
                let Ok(status) = status.parse::<u16>() else {
                    continue;
                };
                if status < 400 || r["content"].get("application/problem+json").is_none() {
                    continue;
                }
                let text = r["description"].as_str().unwrap_or_default();
                for token in text.split('`').skip(1).step_by(2) {
                    let looks_like_code = !token.is_empty()
                        && token.chars().all(|c| c.is_ascii_lowercase() || c == '_')
                        && token.contains('_')
                        && !settings.contains(token);
                    if looks_like_code {
                        assert_eq!(
                            table.get(token),
                            Some(&status),
                            "{method} {path} {status} names `{token}`"
                        );
                        checked += 1;
                    }
                }
            }
        }
    }
    assert!(checked > 20, "only {checked} codes found in the document");
}

fn document() -> Value {
    let registry = toolexec_tools::Registry::builtin().unwrap();
    serde_json::from_str(&toolexec_api::openapi_json(&registry)).unwrap()
}

/// Every operation of the document, as (method, path, operation).
fn operations(doc: &Value) -> Vec<(String, String, Value)> {
    let mut ops = Vec::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for (method, op) in item.as_object().unwrap() {
            ops.push((method.clone(), path.clone(), op.clone()));
        }
    }
    ops
}

/// What public linters refuse (`.ci/openapi-lint`: Redocly's `recommended`, Spectral's
/// `spectral:oas`) and what public generators need (openapi-generator refuses a license without
/// an `identifier` or `url`): a server, the license's SPDX identifier, a one-line summary and a
/// description on every operation, and security stated on every operation — none on the probes
/// and metrics, the API key on every `/v1` route.
#[test]
fn the_document_gives_what_public_linters_and_generators_ask_for() {
    let doc = document();
    assert!(
        doc["servers"].as_array().is_some_and(|s| !s.is_empty()),
        "no servers: {}",
        doc["servers"]
    );
    assert_eq!(doc["info"]["license"]["identifier"], "Apache-2.0");
    for (method, path, op) in operations(&doc) {
        let summary = op["summary"].as_str().unwrap_or_default();
        assert!(
            !summary.is_empty() && !summary.contains('\n'),
            "{method} {path}: the summary is not one line: {summary:?}"
        );
        let description = op["description"].as_str().unwrap_or_default();
        assert!(
            !description.trim().is_empty(),
            "{method} {path} has no description"
        );
        let security = &op["security"];
        if path.starts_with("/v1/") {
            assert_eq!(
                *security,
                serde_json::json!([{"bearer": []}]),
                "{method} {path}"
            );
        } else {
            assert_eq!(
                *security,
                serde_json::json!([]),
                "{method} {path} is public: `security: []`"
            );
        }
    }
}

/// Generators copy descriptions into code comments, and openapi-generator's TypeScript
/// generators do not escape them: a `*/` (`**/*.rs` in a glob's manual) ends the comment and the
/// generated client does not compile.
#[test]
fn no_text_of_the_document_ends_a_code_comment() {
    fn walk(v: &Value, at: &str, found: &mut Vec<String>) {
        match v {
            Value::Object(map) => {
                for (k, v) in map {
                    let here = format!("{at}/{k}");
                    if let Value::String(s) = v
                        && matches!(k.as_str(), "description" | "summary" | "title" | "example")
                        && s.contains("*/")
                    {
                        found.push(here.clone());
                    }
                    walk(v, &here, found);
                }
            }
            Value::Array(items) => {
                for (i, v) in items.iter().enumerate() {
                    walk(v, &format!("{at}/{i}"), found);
                }
            }
            _ => {}
        }
    }
    let mut found = Vec::new();
    walk(&document(), "#", &mut found);
    assert!(found.is_empty(), "`*/` in {found:#?}");
}

/// The schema of a media type, `$ref`s to components followed.
fn resolved<'a>(doc: &'a Value, schema: &'a Value) -> &'a Value {
    match schema["$ref"].as_str() {
        Some(r) => {
            let name = r.trim_start_matches("#/components/schemas/");
            &doc["components"]["schemas"][name]
        }
        None => schema,
    }
}

/// Bytes are `type: string, format: binary` in every media type they are sent as; utoipa's
/// rendering of `Vec<u8>` (an array of integers) made generated clients parse a file's bytes as
/// JSON and fail.
#[test]
fn byte_bodies_are_binary_strings_in_each_media_type_they_are_sent_as() {
    let doc = document();
    let structured = [
        "application/json",
        "application/problem+json",
        "text/event-stream",
    ];
    let mut checked = 0;
    for (method, path, op) in operations(&doc) {
        let mut contents: Vec<(String, &Value)> = Vec::new();
        if op["requestBody"]["content"].is_object() {
            contents.push(("request".into(), &op["requestBody"]["content"]));
        }
        for (status, r) in op["responses"].as_object().unwrap() {
            contents.push((status.clone(), &r["content"]));
        }
        for (what, content) in contents {
            for (media, m) in content.as_object().into_iter().flatten() {
                let schema = resolved(&doc, &m["schema"]);
                assert_ne!(
                    schema["type"], "array",
                    "{method} {path} {what} {media}: bytes as an array: {schema}"
                );
                if structured.contains(&media.as_str()) {
                    continue;
                }
                assert_eq!(schema["type"], "string", "{method} {path} {what} {media}");
                if !media.starts_with("text/") {
                    assert_eq!(schema["format"], "binary", "{method} {path} {what} {media}");
                }
                checked += 1;
            }
        }
    }
    // A file (two media types), the archive down and up, the metrics.
    assert!(checked >= 5, "only {checked} byte bodies found");
    let file = &doc["paths"]["/v1/sessions/{id}/files/{path}"]["get"]["responses"]["200"];
    for media in ["text/plain", "application/octet-stream"] {
        assert!(
            file["content"][media].is_object(),
            "GET …/files/{{path}} is sent as {media}: {}",
            file["content"]
        );
    }
}

/// Each header a byte body comes with, as the service sends it, is in the document; each media
/// type it is sent as too (without parameters).
#[tokio::test]
async fn the_headers_and_media_types_of_byte_bodies_are_the_ones_the_service_sends() {
    let doc = document();
    let app = toolexec_tests::app::spawn_app().await;
    let sid = app
        .session(serde_json::json!({"files": {"notes.txt": "text\n"}}))
        .await["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let w = app
        .call(
            &sid,
            "bin-1",
            "shell",
            serde_json::json!({"command": "printf '\\377\\376' > blob.bin"}),
        )
        .await;
    assert_eq!(w["status"], "ok", "{w}");
    let requests = [
        (
            "/v1/sessions/{id}/files/{path}",
            format!("/v1/sessions/{sid}/files/notes.txt"),
        ),
        (
            "/v1/sessions/{id}/files/{path}",
            format!("/v1/sessions/{sid}/files/blob.bin"),
        ),
        (
            "/v1/sessions/{id}/archive",
            format!("/v1/sessions/{sid}/archive"),
        ),
    ];
    for (template, url) in requests {
        let r = app.get(&url).await;
        assert_eq!(r.status(), 200, "{url}");
        let declared = &doc["paths"][template]["get"]["responses"]["200"];
        let media = r.headers()["content-type"].to_str().unwrap();
        let media = media.split(';').next().unwrap().trim();
        assert!(
            declared["content"][media].is_object(),
            "{url} is sent as {media}, the document says {}",
            declared["content"]
        );
        let headers = declared["headers"].as_object().cloned().unwrap_or_default();
        let declared_names: Vec<String> = headers.keys().map(|k| k.to_ascii_lowercase()).collect();
        for name in r.headers().keys() {
            let name = name.as_str();
            if name.starts_with("x-toolexec-") || name == "etag" || name == "content-disposition" {
                assert!(
                    declared_names.iter().any(|d| d == name),
                    "{url} sends `{name}`, the document declares {declared_names:?}"
                );
            }
        }
    }
}
