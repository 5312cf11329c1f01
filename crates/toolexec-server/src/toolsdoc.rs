//! The tools reference (`docs/tools.md`), rendered from the catalog so it cannot drift from what
//! the service serves at `GET /v1/tools`.
use std::fmt::Write as _;

use toolexec_tools::Registry;

/// Markdown for every tool: its manual, flags, limits and argument schema.
pub fn tools_markdown(registry: &Registry) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "# Tools reference\n\n\
         Generated from the tool catalog by `cargo run -p toolexec-server -- tools-doc --write docs/tools.md`;\n\
         a test fails when it differs from the code. The same data is served at `GET /v1/tools`\n\
         (also as `?format=openai|openai_chat|anthropic|mcp`).\n\n\
         Every call's arguments are validated against the tool's schema before it runs; a call that\n\
         fails validation is recorded with status `invalid_arguments` and a message naming the JSON\n\
         pointer and the schema rule. Output longer than the tool's limit is cut (head, tail or both)\n\
         with a marker that says how to read the rest; the full output is kept\n\
         (`GET /v1/invocations/{{id}}/output`).\n\n\
         | tool | read-only | capabilities | output limit |\n|---|---|---|---|"
    );
    for spec in registry.specs() {
        let caps: Vec<&str> = spec.capabilities.iter().map(|c| c.as_str()).collect();
        let _ = writeln!(
            out,
            "| [`{0}`](#{0}) | {1} | {2} | {3} chars, {4} |",
            spec.name,
            if spec.read_only { "yes" } else { "no" },
            caps.join(", "),
            spec.output_limit.max_chars,
            mode_name(spec.output_limit.mode),
        );
    }
    for spec in registry.specs() {
        let schema = serde_json::to_string_pretty(&spec.input_schema).unwrap_or_default();
        let _ = write!(
            out,
            "\n## {}\n\n{}\n\n**Arguments** (JSON Schema):\n\n```json\n{}\n```\n",
            spec.name,
            spec.description.trim(),
            schema
        );
    }
    out
}

/// `toolexec tools list`: one line per tool, with whether this configuration can run it.
pub fn tools_list(registry: &Registry, web: &toolexec_tools::web::WebAccess) -> String {
    let specs: Vec<_> = registry.specs().collect();
    let width = specs.iter().map(|s| s.name.len()).max().unwrap_or(4).max(4);
    let caps_of = |spec: &toolexec_core::ToolSpec| {
        let caps: Vec<&str> = spec.capabilities.iter().map(|c| c.as_str()).collect();
        if caps.is_empty() {
            "-".to_owned()
        } else {
            caps.join(",")
        }
    };
    let cw = specs
        .iter()
        .map(|s| caps_of(s).len())
        .max()
        .unwrap_or(12)
        .max(12);
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:width$}  {:9}  {:cw$}  {:9}  summary",
        "tool", "read-only", "capabilities", "available"
    );
    for spec in specs {
        let available = match registry.get(&spec.name).and_then(|t| t.unavailable(web)) {
            None => "yes",
            Some(_) => "no",
        };
        let summary = first_sentence(&spec.description);
        let summary = match summary.char_indices().nth(100) {
            Some((i, _)) => format!("{}…", &summary[..i]),
            None => summary.to_owned(),
        };
        let _ = writeln!(
            out,
            "{:width$}  {:9}  {:cw$}  {:9}  {}",
            spec.name,
            if spec.read_only { "yes" } else { "no" },
            caps_of(spec),
            available,
            summary
        );
    }
    let _ = writeln!(
        out,
        "\n`toolexec tools describe NAME` prints a tool's manual and schema (--format openai|openai_chat|anthropic|mcp: its definition for that provider)."
    );
    out
}

/// `toolexec tools describe NAME`: the manual, flags, limits and schema of one tool.
pub fn tool_manual(spec: &toolexec_core::ToolSpec, unavailable: Option<String>) -> String {
    let caps: Vec<&str> = spec.capabilities.iter().map(|c| c.as_str()).collect();
    let mut out = String::new();
    let _ = writeln!(out, "{}\n", spec.name);
    let _ = writeln!(out, "{}\n", spec.description.trim());
    let _ = writeln!(
        out,
        "read-only: {}\ncapabilities: {}\noutput limit: {} chars, {}",
        if spec.read_only { "yes" } else { "no" },
        if caps.is_empty() {
            "none".to_owned()
        } else {
            caps.join(", ")
        },
        spec.output_limit.max_chars,
        mode_name(spec.output_limit.mode)
    );
    if let Some(why) = unavailable {
        let _ = writeln!(out, "available: no ({why})");
    } else {
        let _ = writeln!(out, "available: yes");
    }
    let schema = serde_json::to_string_pretty(&spec.input_schema).unwrap_or_default();
    let _ = writeln!(out, "\narguments (JSON Schema):\n{schema}");
    out
}

fn first_sentence(text: &str) -> &str {
    let text = text.trim();
    let line = text.lines().next().unwrap_or_default();
    match line.find(". ") {
        Some(i) => &line[..=i],
        None => line,
    }
}

fn mode_name(mode: toolexec_core::TruncationMode) -> &'static str {
    match mode {
        toolexec_core::TruncationMode::Head => "head",
        toolexec_core::TruncationMode::Tail => "tail",
        toolexec_core::TruncationMode::HeadTail => "head+tail",
    }
}

/// Markdown for every problem code of the API (`docs/problems.md`), from the one table the
/// handlers use ([`toolexec_core::ProblemCode`]).
pub fn problems_markdown() -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "# Problem codes\n\n\
         Generated from the table in `crates/toolexec-core/src/problem.rs` by\n\
         `cargo run -p toolexec-server -- problems-doc --write docs/problems.md`; a test fails when it\n\
         differs from the code, and the OpenAPI document's `ProblemCode` schema and error responses\n\
         are made from the same table.\n\n\
         Every request the service cannot act on is answered with `application/problem+json`:\n\
         `{{\"type\": \"urn:toolexec:problem:<code>\", \"title\", \"status\", \"detail\", \"code\"}}`.\n\
         Branch on `code`; `detail` is for people (on a 5xx it is generic and names the request id,\n\
         under which the service's log has the cause). 429 and 503 carry `Retry-After`. A tool that\n\
         fails is not a problem: it is a result with `is_error: true`.\n\n\
         | code | status | title | when |\n|---|---|---|---|"
    );
    for code in toolexec_core::ProblemCode::ALL {
        let _ = writeln!(
            out,
            "| `{}` | {} | {} | {} |",
            code.as_str(),
            code.status(),
            code.title(),
            code.when().replace('|', "\\|")
        );
    }
    out
}
