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
