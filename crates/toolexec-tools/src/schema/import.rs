//! Importing a JSON Schema someone else wrote (an OpenAPI operation's parameters, an MCP server's
//! tools) into toolexec's schema form: local `$ref`s resolved, closed objects, optional
//! properties nullable, so that it passes the providers' strict modes like the built-ins; what
//! cannot be typed that way is refused with the reason. Bounded in depth, `$ref` hops and nodes.
use serde_json::{Map, Value, json};

/// How deep a schema may nest (the providers' strict modes take 10 levels; the tool's own
/// object and `body` take two of them).
pub(crate) const MAX_SCHEMA_DEPTH: usize = 8;
/// Longest chain of `$ref`s followed to one definition.
pub(crate) const MAX_REF_HOPS: usize = 32;
/// Most schema nodes one conversion may expand (each `$ref` is expanded where it is used, so a
/// small document can describe an enormous schema): OpenAI's strict mode takes 5,000
/// properties in all, and a schema past this is no tool a model can fill in.
pub(crate) const MAX_SCHEMA_NODES: usize = 10_000;

/// `value`, or what its `$ref` (a local `#/…` pointer) names, followed to the end.
pub(crate) fn resolve<'a>(doc: &'a Value, mut value: &'a Value) -> Result<&'a Value, String> {
    for _ in 0..MAX_REF_HOPS {
        let Some(r) = value.get("$ref").and_then(Value::as_str) else {
            return Ok(value);
        };
        value = pointer(doc, r)?;
    }
    Err("a chain of $refs is too long (a loop?)".to_owned())
}

/// The definition a local `$ref` names.
pub(crate) fn pointer<'a>(doc: &'a Value, r: &str) -> Result<&'a Value, String> {
    let Some(p) = r.strip_prefix('#') else {
        return Err(format!(
            "$ref {r:?} points outside the document (only local #/… references are resolved)"
        ));
    };
    doc.pointer(p)
        .ok_or_else(|| format!("$ref {r:?} names nothing in the document"))
}

/// Property names the providers accept (`^[a-zA-Z0-9_.-]{1,64}$`, Anthropic's rule).
pub(crate) fn check_property_name(name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(format!(
            "the name {name:?} is not 1 to 64 letters, digits, '_', '.' or '-' (the providers' rule for argument names)"
        ))
    }
}

/// The types a converted schema allows.
pub(crate) fn types_of(schema: &Value) -> Vec<String> {
    match schema.get("type") {
        Some(Value::String(t)) => vec![t.clone()],
        Some(Value::Array(ts)) => ts
            .iter()
            .filter_map(Value::as_str)
            .map(str::to_owned)
            .collect(),
        _ => Vec::new(),
    }
}

/// Lets `null` through (toolexec's form of an optional property: `null` means not given).
pub(crate) fn make_nullable(schema: &mut Value) {
    let Value::Object(map) = schema else {
        return;
    };
    match map.get_mut("type") {
        Some(Value::String(t)) if t != "null" => {
            let t = t.clone();
            map.insert("type".into(), json!([t, "null"]));
        }
        Some(Value::Array(types)) if !types.iter().any(|t| t == "null") => {
            types.push(json!("null"));
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

/// Keywords of a document's schema carried into the tool's schema as they are.
pub(crate) const KEPT: &[&str] = &[
    "description",
    "format",
    "minimum",
    "maximum",
    "multipleOf",
    "minLength",
    "maxLength",
    "pattern",
    "minItems",
    "maxItems",
    "uniqueItems",
    "enum",
    "const",
];

/// Keywords that annotate and do not constrain: left out.
pub(crate) const ANNOTATIONS: &[&str] = &[
    "title",
    "default",
    "example",
    "examples",
    "deprecated",
    "readOnly",
    "writeOnly",
    "xml",
    "externalDocs",
    "$comment",
    "$schema",
    "$id",
    "$defs",
    "definitions",
    "discriminator",
    "contentMediaType",
    "contentEncoding",
];

/// Converts a document's schema into toolexec's form, or says why it cannot be typed.
pub(crate) struct Typer<'a> {
    doc: &'a Value,
    /// The `$ref`s being expanded (a schema that refers to itself cannot be typed strictly).
    stack: Vec<String>,
    /// Schema nodes expanded so far (see [`MAX_SCHEMA_NODES`]).
    nodes: usize,
}

impl<'a> Typer<'a> {
    pub(crate) fn new(doc: &'a Value) -> Self {
        Self {
            doc,
            stack: Vec::new(),
            nodes: 0,
        }
    }

    /// Counts one more expanded node, refusing past the budget.
    fn spend(&mut self) -> Result<(), String> {
        self.nodes += 1;
        if self.nodes > MAX_SCHEMA_NODES {
            return Err(format!(
                "the schema expands to more than {MAX_SCHEMA_NODES} schema nodes (its $refs, expanded where they are used, make it too large for a tool's arguments)"
            ));
        }
        Ok(())
    }

    pub(crate) fn typed(&mut self, schema: &Value, depth: usize) -> Result<Value, String> {
        self.spend()?;
        if depth > MAX_SCHEMA_DEPTH {
            return Err(format!(
                "the schema nests deeper than {MAX_SCHEMA_DEPTH} levels (the providers' strict modes take 10 in all)"
            ));
        }
        let Value::Object(map) = schema else {
            return Err("a schema is not an object (true/false schemas cannot be typed)".into());
        };
        if let Some(r) = map.get("$ref").and_then(Value::as_str) {
            if self.stack.iter().any(|s| s == r) {
                return Err(format!(
                    "{r} refers to itself (a recursive schema cannot be typed for the providers' strict modes)"
                ));
            }
            let target = pointer(self.doc, r)?;
            self.stack.push(r.to_owned());
            let out = self.typed(target, depth);
            self.stack.pop();
            // Siblings of a $ref (3.1): a description is kept, 3.0's `nullable` applied,
            // anything else that constrains refused (it would be dropped, loosening the schema).
            return siblings_kept(out?, map, "$ref");
        }
        if let Some(Value::Array(all)) = map.get("allOf") {
            let merged = self.merged(map, all)?;
            return self.typed(&merged, depth);
        }
        for key in ["anyOf", "oneOf"] {
            if let Some(Value::Array(choices)) = map.get(key) {
                let real: Vec<&Value> = choices
                    .iter()
                    .filter(|c| c.get("type").and_then(Value::as_str) != Some("null"))
                    .collect();
                if real.len() != 1 {
                    return Err(format!(
                        "{key} with {} choices cannot be typed for the providers' strict modes",
                        real.len()
                    ));
                }
                let mut out = self.typed(real[0], depth)?;
                if real.len() < choices.len() {
                    make_nullable(&mut out);
                }
                return siblings_kept(out, map, key);
            }
        }
        let mut out = Map::new();
        let mut types = match map.get("type") {
            Some(Value::String(t)) => vec![t.clone()],
            Some(Value::Array(ts)) => ts
                .iter()
                .map(|t| {
                    t.as_str()
                        .map(str::to_owned)
                        .ok_or("a type is not a string")
                })
                .collect::<Result<_, _>>()?,
            None if map.contains_key("properties") => vec!["object".to_owned()],
            None if map.contains_key("items") => vec!["array".to_owned()],
            None => match map.get("enum").or(map.get("const")) {
                Some(Value::Array(values)) => {
                    let mut ts: Vec<String> = values.iter().map(json_type).collect();
                    ts.sort();
                    ts.dedup();
                    ts
                }
                Some(v) => vec![json_type(v)],
                None => {
                    return Err(
                        "a schema has no type (an \"any value\" cannot be typed for the providers' strict modes)"
                            .into(),
                    );
                }
            },
            Some(_) => return Err("a type is not a string".into()),
        };
        if map.get("nullable").and_then(Value::as_bool) == Some(true)
            && !types.iter().any(|t| t == "null")
        {
            types.push("null".to_owned());
        }
        for (key, value) in map {
            let k = key.as_str();
            if matches!(
                k,
                "type"
                    | "nullable"
                    | "properties"
                    | "required"
                    | "additionalProperties"
                    | "items"
                    | "exclusiveMinimum"
                    | "exclusiveMaximum"
            ) || ANNOTATIONS.contains(&k)
                || k.starts_with("x-")
            {
                continue;
            }
            if KEPT.contains(&k) {
                out.insert(key.clone(), value.clone());
                continue;
            }
            return Err(format!(
                "the keyword {k:?} cannot be carried into a strict tool schema"
            ));
        }
        // 3.0 writes exclusive bounds as booleans beside minimum/maximum; 3.1 as numbers.
        for (key, bound) in [
            ("exclusiveMinimum", "minimum"),
            ("exclusiveMaximum", "maximum"),
        ] {
            match map.get(key) {
                Some(Value::Bool(true)) => {
                    if let Some(b) = out.remove(bound) {
                        out.insert(key.into(), b);
                    }
                }
                Some(Value::Number(n)) => {
                    out.insert(key.into(), Value::Number(n.clone()));
                }
                _ => {}
            }
        }
        let is = |t: &str| types.iter().any(|x| x == t);
        if is("object") {
            let props = map
                .get("properties")
                .and_then(Value::as_object)
                .cloned()
                .unwrap_or_default();
            if props.is_empty() && map.get("additionalProperties") != Some(&Value::Bool(false)) {
                return Err(
                    "a free-form object (no properties) cannot be typed for the providers' strict modes"
                        .into(),
                );
            }
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
            let mut properties = Map::new();
            let mut kept_required = Vec::new();
            for (name, prop) in &props {
                check_property_name(name)?;
                // A server-set property is not sent.
                if resolve(self.doc, prop)?.get("readOnly") == Some(&Value::Bool(true)) {
                    continue;
                }
                let mut p = self
                    .typed(prop, depth + 1)
                    .map_err(|e| format!("{name}: {e}"))?;
                if required.contains(name) {
                    kept_required.push(json!(name));
                } else {
                    make_nullable(&mut p);
                }
                properties.insert(name.clone(), p);
            }
            out.insert("properties".into(), Value::Object(properties));
            out.insert("required".into(), Value::Array(kept_required));
            out.insert("additionalProperties".into(), Value::Bool(false));
        }
        if is("array") {
            let items = map
                .get("items")
                .ok_or("an array without `items` cannot be typed")?;
            out.insert("items".into(), self.typed(items, depth + 1)?);
        }
        out.insert(
            "type".into(),
            if types.len() == 1 {
                json!(types[0])
            } else {
                json!(types)
            },
        );
        if let Some(Value::Array(values)) = out.get_mut("enum")
            && is("null")
            && !values.iter().any(Value::is_null)
        {
            values.push(Value::Null);
        }
        Ok(Value::Object(out))
    }

    /// An `allOf` of object schemas as one object schema (properties and required joined).
    fn merged(&mut self, map: &Map<String, Value>, all: &[Value]) -> Result<Value, String> {
        let mut out = map.clone();
        out.remove("allOf");
        let mut properties = out
            .get("properties")
            .and_then(Value::as_object)
            .cloned()
            .unwrap_or_default();
        let mut required: Vec<Value> = out
            .get("required")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        for part in all {
            self.spend()?;
            // A part's own $ref and allOf are followed (an inheritance chain); the $refs
            // followed stay on the stack while the part's own allOf is merged, so a part that
            // comes back to itself is refused, however it gets there.
            let depth = self.stack.len();
            let merged_part = self.merged_part(part);
            self.stack.truncate(depth);
            let part = merged_part?;
            let Value::Object(part) = part else {
                return Err("an allOf part is not a schema object".into());
            };
            let object = part.get("type").is_none_or(|t| t == "object");
            if !object {
                return Err("allOf of schemas that are not objects cannot be typed".into());
            }
            for (key, value) in &part {
                match key.as_str() {
                    "properties" => {
                        for (k, v) in value.as_object().into_iter().flatten() {
                            properties.insert(k.clone(), v.clone());
                        }
                    }
                    "required" => required.extend(value.as_array().into_iter().flatten().cloned()),
                    "type" => {}
                    "additionalProperties" | "description" => {
                        out.entry(key.clone()).or_insert_with(|| value.clone());
                    }
                    k if ANNOTATIONS.contains(&k) || k.starts_with("x-") => {}
                    k => {
                        return Err(format!(
                            "the keyword {k:?} in an allOf part cannot be carried into a strict tool schema"
                        ));
                    }
                }
            }
        }
        out.insert("type".into(), json!("object"));
        out.insert("properties".into(), Value::Object(properties));
        out.insert("required".into(), Value::Array(required));
        // The parts' additionalProperties: false would refuse the other parts' properties.
        out.remove("additionalProperties");
        Ok(Value::Object(out))
    }

    /// One part of an `allOf`: its `$ref`s followed (each pushed on the stack; the caller pops
    /// them) and its own `allOf` merged.
    fn merged_part(&mut self, part: &Value) -> Result<Value, String> {
        let mut part = part;
        while let Some(r) = part.get("$ref").and_then(Value::as_str) {
            if self.stack.iter().any(|s| s == r) || self.stack.len() > MAX_REF_HOPS {
                return Err(format!("{r} refers to itself through allOf"));
            }
            self.stack.push(r.to_owned());
            part = pointer(self.doc, r)?;
        }
        match part.get("allOf").and_then(Value::as_array) {
            Some(inner) => {
                let Value::Object(m) = part else {
                    return Err("an allOf part is not a schema object".into());
                };
                self.merged(m, inner)
            }
            None => Ok(part.clone()),
        }
    }
}

/// `typed`, the conversion of the `$ref` or the single choice of `anyOf`/`oneOf` (`key`) of
/// `map`, with `map`'s other keywords: a `description` replaces the target's, `nullable: true`
/// (OpenAPI 3.0) lets `null` through, annotations are left out, and anything else is refused:
/// it would constrain the value, and dropping it would let through what the document refuses.
pub(crate) fn siblings_kept(
    mut typed: Value,
    map: &Map<String, Value>,
    key: &str,
) -> Result<Value, String> {
    for (k, v) in map {
        match k.as_str() {
            k2 if k2 == key => {}
            "description" => {
                if let Value::Object(m) = &mut typed {
                    m.insert("description".into(), v.clone());
                }
            }
            "nullable" if v == &Value::Bool(true) => make_nullable(&mut typed),
            "nullable" => {}
            k2 if ANNOTATIONS.contains(&k2) || k2.starts_with("x-") => {}
            k2 => {
                return Err(format!(
                    "the keyword {k2:?} beside {key} cannot be carried into a strict tool schema"
                ));
            }
        }
    }
    Ok(typed)
}

/// A tool's input schema from elsewhere (an upstream MCP server's `inputSchema`) in toolexec's
/// form, its local `$ref`s (`#/$defs/…`) resolved against itself; a root without properties is
/// a tool without arguments (`{}`).
pub(crate) fn typed_input_schema(schema: &Value) -> Result<Value, String> {
    // A root that is a `$ref` (`{"$ref": "#/$defs/Args", "$defs": …}`) is its target.
    let mut root = resolve(schema, schema)?.clone();
    if let Value::Object(m) = &mut root {
        if m.get("type").is_none() {
            m.insert("type".into(), json!("object"));
        }
        if m.get("type") != Some(&json!("object")) {
            return Err("the input schema is not an object schema".into());
        }
        let empty = m
            .get("properties")
            .and_then(Value::as_object)
            .is_none_or(|p| p.is_empty());
        if empty {
            m.insert("properties".into(), json!({}));
            m.insert("additionalProperties".into(), json!(false));
        }
    }
    Typer::new(schema).typed(&root, 1)
}

/// The JSON type of a value, as JSON Schema names it.
pub(crate) fn json_type(v: &Value) -> String {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
    .to_owned()
}

/// `value` without the properties a strict model filled with `null` for "not given": a `null`
/// for a property its object schema does not require is dropped, at every level.
pub(crate) fn without_absent(value: &Value, schema: &Value) -> Value {
    match value {
        Value::Object(map) => {
            let required: Vec<&str> = schema
                .get("required")
                .and_then(Value::as_array)
                .map(|r| r.iter().filter_map(Value::as_str).collect())
                .unwrap_or_default();
            let props = schema.get("properties");
            Value::Object(
                map.iter()
                    .filter(|(k, v)| !v.is_null() || required.contains(&k.as_str()))
                    .map(|(k, v)| {
                        let sub = props.and_then(|p| p.get(k)).unwrap_or(&Value::Null);
                        (k.clone(), without_absent(v, sub))
                    })
                    .collect(),
            )
        }
        Value::Array(items) => {
            let sub = schema.get("items").unwrap_or(&Value::Null);
            Value::Array(items.iter().map(|v| without_absent(v, sub)).collect())
        }
        other => other.clone(),
    }
}
