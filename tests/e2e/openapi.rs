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
