//! The OpenAPI document: paths from the handlers' `#[utoipa::path]`, plus the error responses
//! every endpoint shares, added in one place so none can be forgotten.
use toolexec_tools::Registry;
use utoipa::openapi::path::Operation;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::openapi::{ContentBuilder, OpenApi, Ref, RefOr, ResponseBuilder, Schema};
use utoipa::{Modify, OpenApi as _};
use utoipa_axum::router::OpenApiRouter;

use crate::SharedState;
use crate::problem::PROBLEM_JSON;
use crate::routes;
use toolexec_core::ProblemCode;

#[derive(utoipa::OpenApi)]
#[openapi(
    info(
        title = "toolexec",
        description = "Runs tools for remote LLM agent loops: sessions (a sandboxed workspace plus a policy), batches of tool calls validated against each tool's JSON Schema, and an append-only log of every invocation and side effect.\n\nErrors are `application/problem+json` with a stable `code`. A tool that fails is not an HTTP error: it is a result with `is_error: true` and a `content` the model can act on.\n\nEach session is also an MCP server (Streamable HTTP, JSON-RPC as the Model Context Protocol specifies it, so not described here): `POST /v1/sessions/{id}/mcp`, with the same authentication; its `tools/call` runs and records calls like `POST /v1/sessions/{id}/calls`.\n\nEach session also speaks the SWE-ReX remote API under `/v1/sessions/{id}/swerex` (its own client's shapes and errors, so not described here either; docs/swerex.md): every request runs and records calls of the session's tools.",
        license(name = "Apache-2.0", identifier = "Apache-2.0"),
    ),
    // Relative: the document is served by each deployment (`GET /openapi.json`), whose address
    // only the deployment knows; a client is given its base URL.
    servers((url = "/", description = "The service that serves this document")),
    modifiers(&Common),
    tags(
        (name = "health", description = "Liveness and readiness"),
        (name = "tools", description = "The tool catalog"),
        (name = "sessions", description = "Sessions: a workspace, a policy and a tool set"),
        (name = "calls", description = "Running tool calls, and cancelling them"),
        (name = "log", description = "The recorded log: events (paged, or live), invocations, outputs"),
        (name = "history", description = "Time travel: the workspace at any event, rewind, fork, verify replay"),
        (name = "environments", description = "OCI images sessions run in: pulling one ahead of its sessions"),
    )
)]
struct ApiDoc;

/// The router with every documented route.
pub(crate) fn router() -> OpenApiRouter<SharedState> {
    OpenApiRouter::with_openapi(ApiDoc::openapi())
        .merge(routes::health::router())
        .merge(routes::tools::router())
        .merge(routes::sessions::router())
        .merge(routes::calls::router())
        .merge(routes::cancel::router())
        .merge(routes::approvals::router())
        .merge(routes::log::router())
        .merge(routes::history::router())
        .merge(routes::todos::router())
        .merge(routes::archive::router())
        .merge(routes::environments::router())
}

/// The router and its finished document: shared errors and the tool catalog's schemas added.
pub(crate) fn parts(registry: &Registry) -> (axum::Router<SharedState>, OpenApi) {
    let (router, mut api) = router().split_for_parts();
    add_common_errors(&mut api);
    mark_public_routes(&mut api);
    add_tool_schemas(&mut api, registry);
    (router, api)
}

/// The OpenAPI document the server serves and `openapi/openapi.json` holds.
pub fn openapi(registry: &Registry) -> OpenApi {
    parts(registry).1
}

/// The document as checked in: pretty JSON with a trailing newline.
pub fn openapi_json(registry: &Registry) -> String {
    let mut s = openapi(registry).to_pretty_json().unwrap_or_default();
    s.push('\n');
    s
}

/// Each tool's argument schema as a component (`tool.<name>.arguments`), so the docs show what
/// every tool accepts. The schemas are JSON Schema 2020-12, which OpenAPI 3.1 embeds as is.
fn add_tool_schemas(api: &mut OpenApi, registry: &Registry) {
    // The catalog's names as the `name` parameter's enum: a client (or a fuzzer) can see which
    // tools exist from the document alone.
    let names: Vec<String> = registry.specs().map(|s| s.name.clone()).collect();
    if let Some(op) = api
        .paths
        .paths
        .get_mut("/v1/tools/{name}")
        .and_then(|item| item.get.as_mut())
    {
        for param in op.parameters.iter_mut().flatten() {
            if let RefOr::T(param) = param
                && param.name == "name"
            {
                param.schema = Some(RefOr::T(Schema::Object(
                    utoipa::openapi::ObjectBuilder::new()
                        .schema_type(utoipa::openapi::schema::Type::String)
                        .enum_values(Some(names.clone()))
                        .build(),
                )));
            }
        }
    }
    let components = api.components.get_or_insert_with(Default::default);
    for spec in registry.specs() {
        let mut schema = spec.input_schema.clone();
        if let Some(obj) = schema.as_object_mut() {
            obj.entry("title")
                .or_insert_with(|| format!("{} arguments", spec.name).into());
            obj.entry("description")
                .or_insert_with(|| spec.description.clone().into());
        }
        comment_safe(&mut schema);
        match serde_json::from_value::<RefOr<Schema>>(schema) {
            Ok(s) => {
                components
                    .schemas
                    .insert(format!("tool.{}.arguments", spec.name), s);
            }
            Err(e) => {
                tracing::warn!(tool = %spec.name, error = %e, "tool schema not representable in OpenAPI");
            }
        }
    }
}

/// Generators copy descriptions into code comments, and some (openapi-generator's TypeScript
/// ones) do not escape them: a `*/` in a tool's manual (`**/*.rs`) would end the comment and the
/// generated client would not compile. In the document (only: the catalog and MCP serve the
/// manuals as written), a zero-width space goes between the two characters; the text reads the
/// same.
fn comment_safe(value: &mut serde_json::Value) {
    match value {
        serde_json::Value::Object(map) => {
            for (key, v) in map.iter_mut() {
                match v {
                    serde_json::Value::String(text)
                        if matches!(key.as_str(), "description" | "title") =>
                    {
                        if text.contains("*/") {
                            *text = text.replace("*/", "*\u{200B}/");
                        }
                    }
                    _ => comment_safe(v),
                }
            }
        }
        serde_json::Value::Array(items) => items.iter_mut().for_each(comment_safe),
        _ => {}
    }
}

/// The probes and the metrics need no key: they say so (`security: []`) instead of leaving it
/// unsaid, which linters (and readers) take for a forgotten requirement.
fn mark_public_routes(api: &mut OpenApi) {
    for (path, item) in api.paths.paths.iter_mut() {
        if path.starts_with("/v1/") {
            continue;
        }
        for op in [
            &mut item.get,
            &mut item.post,
            &mut item.put,
            &mut item.delete,
        ]
        .into_iter()
        .flatten()
        {
            op.security = Some(Vec::new());
        }
    }
}

struct Common;

/// Problems every endpoint of a kind can answer with; the response's description is made from
/// the codes' rows of the table ([`ProblemCode`]).
struct CommonError {
    codes: &'static [ProblemCode],
    /// Only for operations with a request body.
    with_body: bool,
    /// Only for authenticated `/v1` routes.
    v1_only: bool,
}

const COMMON: &[CommonError] = &[
    CommonError {
        codes: &[ProblemCode::MalformedJson, ProblemCode::UnreadableBody],
        with_body: true,
        v1_only: false,
    },
    CommonError {
        codes: &[ProblemCode::InvalidQuery],
        with_body: false,
        v1_only: false,
    },
    CommonError {
        codes: &[ProblemCode::Unauthorized],
        with_body: false,
        v1_only: true,
    },
    CommonError {
        codes: &[ProblemCode::RequestTimeout],
        with_body: true,
        v1_only: false,
    },
    CommonError {
        codes: &[ProblemCode::BodyTooLarge],
        with_body: true,
        v1_only: false,
    },
    CommonError {
        codes: &[ProblemCode::UnsupportedMediaType],
        with_body: true,
        v1_only: false,
    },
    CommonError {
        codes: &[ProblemCode::InvalidRequest],
        with_body: true,
        v1_only: false,
    },
    CommonError {
        codes: &[ProblemCode::RateLimited, ProblemCode::TooManyAuthFailures],
        with_body: false,
        v1_only: true,
    },
    CommonError {
        codes: &[ProblemCode::Internal],
        with_body: false,
        v1_only: false,
    },
    CommonError {
        codes: &[ProblemCode::Unavailable, ProblemCode::Overloaded],
        with_body: false,
        v1_only: false,
    },
];

/// "`code` (Title): when." for each code, one sentence after another.
fn describe_codes(codes: &[ProblemCode]) -> String {
    codes
        .iter()
        .map(|c| format!("`{}` ({}): {}", c.as_str(), c.title(), c.when()))
        .collect::<Vec<_>>()
        .join(" ")
}

impl Modify for Common {
    fn modify(&self, api: &mut OpenApi) {
        let components = api.components.get_or_insert_with(Default::default);
        // The code enum with every code's status and meaning, from the table.
        let mut codes = utoipa::openapi::ObjectBuilder::new()
            .schema_type(utoipa::openapi::schema::Type::String)
            .enum_values(Some(ProblemCode::ALL.iter().map(|c| c.as_str())))
            .description(Some(format!(
                "A problem's stable code. {}",
                ProblemCode::ALL
                    .iter()
                    .map(|c| format!(
                        "`{}` ({}, {}): {}",
                        c.as_str(),
                        c.status(),
                        c.title(),
                        c.when()
                    ))
                    .collect::<Vec<_>>()
                    .join(" ")
            )))
            .build();
        codes.title = Some("ProblemCode".into());
        components
            .schemas
            .insert("ProblemCode".into(), RefOr::T(Schema::Object(codes)));
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .description(Some("An API key from `toolexec keys create --tenant NAME`. Not needed in local single-tenant mode."))
                    .build(),
            ),
        );
    }
}

/// Adds the shared problem responses to every operation. Runs after all paths are merged.
fn add_common_errors(api: &mut OpenApi) {
    for (path, item) in api.paths.paths.iter_mut() {
        let is_v1 = path.starts_with("/v1/");
        let ops: [&mut Option<Operation>; 4] = [
            &mut item.get,
            &mut item.post,
            &mut item.put,
            &mut item.delete,
        ];
        for op in ops.into_iter().flatten() {
            let has_body = op.request_body.is_some();
            // Statuses of the same code list merge into one response (400 has two lists).
            let mut by_status: std::collections::BTreeMap<u16, Vec<ProblemCode>> =
                Default::default();
            for e in COMMON {
                if (e.with_body && !has_body) || (e.v1_only && !is_v1) {
                    continue;
                }
                for code in e.codes {
                    by_status.entry(code.status()).or_default().push(*code);
                }
            }
            // Every route but the probes is behind the door (Host and Origin).
            if !crate::door::unchecked(path) {
                by_status
                    .entry(ProblemCode::Forbidden.status())
                    .or_default()
                    .push(ProblemCode::Forbidden);
            }
            for (status, codes) in by_status {
                op.responses
                    .responses
                    .entry(status.to_string())
                    .or_insert_with(|| problem_response(&describe_codes(&codes)));
            }
        }
    }
}

pub(crate) fn problem_response(desc: &str) -> RefOr<utoipa::openapi::Response> {
    RefOr::T(
        ResponseBuilder::new()
            .description(desc)
            .content(
                PROBLEM_JSON,
                ContentBuilder::new()
                    .schema(Some(Ref::from_schema_name("Problem")))
                    .build(),
            )
            .build(),
    )
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// The maxima the document states for page sizes are the ones the engine applies.
    #[test]
    fn documented_page_limits_are_the_engines() {
        let registry = Registry::builtin().unwrap();
        let doc = serde_json::to_value(openapi(&registry)).unwrap();
        let maximum = |path: &str, param: &str| {
            doc["paths"][path]["get"]["parameters"]
                .as_array()
                .unwrap()
                .iter()
                .find(|p| p["name"] == param)
                .and_then(|p| p["schema"]["maximum"].as_u64())
                .unwrap()
        };
        assert_eq!(
            maximum("/v1/sessions", "limit"),
            u64::from(toolexec_engine::MAX_SESSIONS_PAGE)
        );
        assert_eq!(
            maximum("/v1/sessions/{id}/events", "limit"),
            u64::from(toolexec_engine::MAX_EVENTS_PAGE)
        );
        assert_eq!(
            maximum("/v1/invocations/{id}/output", "limit"),
            toolexec_engine::MAX_OUTPUT_SLICE as u64
        );
        assert_eq!(
            maximum("/v1/invocations/{id}", "limit"),
            u64::from(toolexec_store::SIDE_EFFECTS_PAGE)
        );
    }
}
