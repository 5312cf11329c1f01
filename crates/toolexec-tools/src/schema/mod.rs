//! Tool argument schemas: one source of truth per tool — the argument struct the tool
//! deserializes, with `schemars` deriving its JSON Schema — in toolexec's own form and in the
//! strict forms OpenAI and Anthropic accept as they are.
//!
//! **toolexec's form** ([`arguments_schema`]) is draft 2020-12, inlined (no `$ref`), every
//! object closed (`additionalProperties: false`), optional properties not `required` and
//! nullable (`["integer", "null"]`: a model that fills every property with `null` for "not
//! given", as strict mode makes it, is understood). It is what calls are validated against,
//! whatever format a client reads the catalog in.
//!
//! **Strict forms** ([`strict_schema`]) list every property in `required` (optional ones stay
//! nullable, so `null` means "not given"), keep only the keywords the provider's strict mode
//! supports, and move the constraints it does not (lengths, ranges, item counts) into the
//! property's description, as the providers' own SDKs do: the service still enforces them.
pub(crate) mod import;
use schemars::JsonSchema;
use serde_json::{Map, Value};

/// Which provider's strict tool-schema rules.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    /// OpenAI function calling with `strict: true` (Responses and Chat Completions).
    OpenAi,
    /// Anthropic tool use with `strict: true`.
    Anthropic,
}

/// The schema of `T` (a tool's argument struct) in toolexec's form.
pub fn arguments_schema<T: JsonSchema>() -> Value {
    let generator = schemars::generate::SchemaSettings::draft2020_12()
        .with(|s| {
            s.inline_subschemas = true;
            s.meta_schema = None;
        })
        .into_generator();
    let mut schema = generator.into_root_schema_for::<T>().to_value();
    tidy(&mut schema);
    // The struct's own doc comment says nothing the tool's description does not.
    if let Value::Object(map) = &mut schema {
        map.remove("description");
    }
    schema
}

/// Drops what says nothing to a validator or a model (titles, integer formats like `uint64`,
/// which JSON Schema does not define and providers reject) and closes every object.
fn tidy(schema: &mut Value) {
    let Value::Object(map) = schema else {
        return;
    };
    map.remove("title");
    map.remove("$schema");
    if is_type(map, "integer") {
        map.remove("format");
    }
    if is_type(map, "object") {
        map.entry("additionalProperties")
            .or_insert(Value::Bool(false));
        map.entry("required")
            .or_insert_with(|| Value::Array(Vec::new()));
    }
    for key in ["properties"] {
        if let Some(Value::Object(props)) = map.get_mut(key) {
            for (_, v) in props.iter_mut() {
                tidy(v);
            }
        }
    }
    if let Some(items) = map.get_mut("items") {
        tidy(items);
    }
    for key in ["anyOf", "oneOf"] {
        if let Some(Value::Array(all)) = map.get_mut(key) {
            for v in all.iter_mut() {
                tidy(v);
            }
        }
    }
}

/// Whether a schema's `type` is (or includes) `t`.
fn is_type(map: &Map<String, Value>, t: &str) -> bool {
    match map.get("type") {
        Some(Value::String(s)) => s == t,
        Some(Value::Array(a)) => a.iter().any(|v| v == t),
        _ => false,
    }
}

/// Keywords a strict mode accepts on a property, besides `type`, `description`, `properties`,
/// `required`, `additionalProperties`, `items`, `enum` and `const`.
fn kept_keywords(dialect: Dialect) -> &'static [&'static str] {
    match dialect {
        // OpenAI's structured outputs: number ranges, array item counts and string patterns
        // and (some) formats are supported; string lengths are not.
        Dialect::OpenAi => &[
            "minimum",
            "maximum",
            "exclusiveMinimum",
            "exclusiveMaximum",
            "multipleOf",
            "minItems",
            "maxItems",
            "pattern",
            "format",
        ],
        // Anthropic's strict tool use: no numeric, length or item-count constraints.
        Dialect::Anthropic => &["format"],
    }
}

/// String formats OpenAI's strict mode accepts.
const OPENAI_FORMATS: &[&str] = &[
    "date-time",
    "time",
    "date",
    "duration",
    "email",
    "hostname",
    "ipv4",
    "ipv6",
    "uuid",
];

/// String formats Anthropic's strict tool use accepts.
const ANTHROPIC_FORMATS: &[&str] = &[
    "date-time",
    "time",
    "date",
    "duration",
    "email",
    "hostname",
    "uri",
    "ipv4",
    "ipv6",
    "uuid",
];

/// `schema` (toolexec's form) as `dialect`'s strict mode accepts it.
pub fn strict_schema(schema: &Value, dialect: Dialect) -> Value {
    let mut out = schema.clone();
    strictify(&mut out, dialect);
    out
}

fn strictify(schema: &mut Value, dialect: Dialect) {
    let Value::Object(map) = schema else {
        return;
    };
    // Constraints the mode does not take go into the description (the service enforces them).
    let mut notes = Vec::new();
    let kept = kept_keywords(dialect);
    let keys: Vec<String> = map.keys().cloned().collect();
    for key in keys {
        let structural = matches!(
            key.as_str(),
            "type"
                | "description"
                | "properties"
                | "required"
                | "additionalProperties"
                | "items"
                | "enum"
                | "const"
                | "anyOf"
        );
        if structural {
            continue;
        }
        let keep = kept.contains(&key.as_str())
            && (key != "format"
                || map
                    .get("format")
                    .and_then(Value::as_str)
                    .is_some_and(|f| match dialect {
                        Dialect::OpenAi => OPENAI_FORMATS.contains(&f),
                        Dialect::Anthropic => ANTHROPIC_FORMATS.contains(&f),
                    }));
        if keep {
            continue;
        }
        if let Some(value) = map.remove(&key)
            && let Some(note) = constraint_note(&key, &value)
        {
            notes.push(note);
        }
    }
    if !notes.is_empty() {
        let described = map
            .get("description")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_owned();
        let sep = if described.is_empty() { "" } else { " " };
        map.insert(
            "description".into(),
            Value::String(format!("{described}{sep}({})", notes.join(", "))),
        );
    }
    if let Some(Value::Object(props)) = map.get_mut("properties") {
        for (_, v) in props.iter_mut() {
            strictify(v, dialect);
        }
    }
    if let Some(items) = map.get_mut("items") {
        strictify(items, dialect);
    }
    if is_type(map, "object") {
        // Every property required; the optional ones were nullable already.
        let names: Vec<Value> = map
            .get("properties")
            .and_then(Value::as_object)
            .map(|p| p.keys().cloned().map(Value::String).collect())
            .unwrap_or_default();
        let required: Vec<String> = map
            .get("required")
            .and_then(Value::as_array)
            .map(|r| {
                r.iter()
                    .filter_map(Value::as_str)
                    .map(str::to_owned)
                    .collect()
            })
            .unwrap_or_default();
        if let Some(Value::Object(props)) = map.get_mut("properties") {
            for (name, prop) in props.iter_mut() {
                if !required.contains(name) {
                    make_nullable(prop);
                }
            }
        }
        map.insert("required".into(), Value::Array(names));
        map.insert("additionalProperties".into(), Value::Bool(false));
    }
}

/// Lets `null` through a property schema (its type, and its `enum` if it has one).
fn make_nullable(schema: &mut Value) {
    let Value::Object(map) = schema else {
        return;
    };
    match map.get_mut("type") {
        Some(Value::String(t)) if t != "null" => {
            let t = t.clone();
            map.insert("type".into(), serde_json::json!([t, "null"]));
        }
        Some(Value::Array(types)) if !types.iter().any(|t| t == "null") => {
            types.push(Value::String("null".into()));
        }
        _ => {}
    }
    // A `const` would refuse the `null`: it becomes a choice of itself or `null`.
    if let Some(c) = map.remove("const") {
        map.insert("enum".into(), Value::Array(vec![c, Value::Null]));
    }
    if let Some(Value::Array(values)) = map.get_mut("enum")
        && !values.iter().any(Value::is_null)
    {
        values.push(Value::Null);
    }
}

/// A dropped constraint in words, for the description.
fn constraint_note(key: &str, value: &Value) -> Option<String> {
    Some(match key {
        "minLength" => format!("at least {value} characters"),
        "maxLength" => format!("at most {value} characters"),
        "minimum" => format!("at least {value}"),
        "maximum" => format!("at most {value}"),
        "exclusiveMinimum" => format!("more than {value}"),
        "exclusiveMaximum" => format!("less than {value}"),
        "minItems" => format!("at least {value} items"),
        "maxItems" => format!("at most {value} items"),
        "pattern" => format!("matching {value}"),
        "multipleOf" => format!("a multiple of {value}"),
        "default" => format!("default {value}"),
        "format" => format!("format {value}"),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;
    use serde_json::json;

    /// An argument struct like the tools'.
    #[derive(Deserialize, JsonSchema)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Sample {
        /// The file.
        #[schemars(length(min = 1, max = 100))]
        file_path: String,
        /// How many.
        #[schemars(range(min = 1, max = 50))]
        limit: Option<u32>,
        /// Things.
        items: Vec<Item>,
    }

    #[derive(Deserialize, JsonSchema)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Item {
        name: String,
        state: Option<State>,
    }

    #[derive(Deserialize, JsonSchema)]
    #[serde(rename_all = "snake_case")]
    #[allow(dead_code)]
    enum State {
        Open,
        Done,
    }

    #[test]
    fn toolexecs_form_is_closed_inlined_and_optional_properties_are_nullable() {
        let s = arguments_schema::<Sample>();
        assert_eq!(s["type"], "object");
        assert_eq!(s["additionalProperties"], false);
        assert_eq!(s["required"], json!(["file_path", "items"]));
        assert_eq!(s["properties"]["limit"]["type"], json!(["integer", "null"]));
        assert!(s["properties"]["limit"].get("format").is_none(), "{s}");
        assert_eq!(s["properties"]["file_path"]["minLength"], 1);
        assert_eq!(s["properties"]["file_path"]["description"], "The file.");
        let item = &s["properties"]["items"]["items"];
        assert_eq!(item["additionalProperties"], false, "{s}");
        assert!(
            s.get("$defs").is_none() && !s.to_string().contains("$ref"),
            "{s}"
        );
        assert!(s.get("title").is_none());
    }

    #[test]
    fn strict_forms_require_everything_and_say_the_constraints_they_drop() {
        let s = arguments_schema::<Sample>();
        let openai = strict_schema(&s, Dialect::OpenAi);
        let mut required: Vec<&str> = openai["required"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap())
            .collect();
        required.sort_unstable();
        assert_eq!(required, ["file_path", "items", "limit"]);
        assert_eq!(openai["properties"]["limit"]["maximum"], 50);
        let path = &openai["properties"]["file_path"];
        assert!(path.get("minLength").is_none());
        assert!(
            path["description"]
                .as_str()
                .unwrap()
                .contains("at least 1 characters"),
            "{path}"
        );
        let item = &openai["properties"]["items"]["items"];
        assert_eq!(item["required"].as_array().unwrap().len(), 2, "{item}");
        let anthropic = strict_schema(&s, Dialect::Anthropic);
        let limit = &anthropic["properties"]["limit"];
        assert!(limit.get("maximum").is_none());
        assert!(
            limit["description"]
                .as_str()
                .unwrap()
                .contains("at most 50"),
            "{limit}"
        );
        // toolexec's own form still validates what a strict client sends.
        let validator = jsonschema::validator_for(&s).unwrap();
        assert!(validator.is_valid(
            &json!({"file_path": "a", "limit": null, "items": [{"name": "x", "state": null}]})
        ));
        assert!(!validator.is_valid(&json!({"file_path": "", "items": []})));
    }

    #[test]
    fn an_optional_const_stays_optional_in_the_strict_forms() {
        let s = json!({"type": "object", "required": [], "additionalProperties": false,
            "properties": {"kind": {"type": "string", "const": "x"}}});
        for dialect in [Dialect::OpenAi, Dialect::Anthropic] {
            let strict = strict_schema(&s, dialect);
            let kind = &strict["properties"]["kind"];
            assert_eq!(kind["enum"], json!(["x", null]), "{strict}");
            assert!(kind.get("const").is_none(), "{strict}");
            let v = jsonschema::validator_for(&strict).unwrap();
            assert!(v.is_valid(&json!({"kind": null})));
            assert!(!v.is_valid(&json!({"kind": "y"})));
        }
    }
}
