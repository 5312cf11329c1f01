//! The identity of a call's arguments, and what of them can be recorded: SHA-256 of their canonical JSON (object keys sorted at
//! every depth), so that `{"a":1,"b":2}` and `{"b":2,"a":1}` are the same call.
use serde_json::Value;

pub fn arguments_sha256(args: &Value) -> String {
    let mut out = String::new();
    write_canonical(args, &mut out);
    toolexec_core::sha256_hex(out.as_bytes())
}

fn write_canonical(v: &Value, out: &mut String) {
    match v {
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            out.push('{');
            for (i, k) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&Value::String(k.clone()).to_string());
                out.push(':');
                if let Some(val) = map.get(k) {
                    write_canonical(val, out);
                }
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_canonical(item, out);
            }
            out.push(']');
        }
        scalar => out.push_str(&scalar.to_string()),
    }
}

/// The JSON pointer of the first string (value or key) holding a NUL character.
pub(crate) fn nul_pointer(v: &serde_json::Value, at: String) -> Option<String> {
    use serde_json::Value;
    match v {
        Value::String(s) if s.contains('\0') => Some(at),
        Value::Array(items) => items
            .iter()
            .enumerate()
            .find_map(|(i, item)| nul_pointer(item, format!("{at}/{i}"))),
        Value::Object(map) => map.iter().find_map(|(k, item)| {
            let here = format!("{at}/{}", k.replace('~', "~0").replace('/', "~1"));
            if k.contains('\0') {
                Some(here)
            } else {
                nul_pointer(item, here)
            }
        }),
        _ => None,
    }
}

/// `v` with every NUL character in strings and keys replaced by U+FFFD.
pub(crate) fn without_nul(v: &serde_json::Value) -> serde_json::Value {
    use serde_json::Value;
    let clean = |s: &str| s.replace('\0', "\u{FFFD}");
    match v {
        Value::String(s) if s.contains('\0') => Value::String(clean(s)),
        Value::Array(items) => Value::Array(items.iter().map(without_nul).collect()),
        Value::Object(map) => Value::Object(
            map.iter()
                .map(|(k, item)| (clean(k), without_nul(item)))
                .collect(),
        ),
        other => other.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn nul_characters_are_found_by_pointer_and_replaced_for_the_record() {
        let v = json!({"a": ["x", "y\0z"], "b/c": "ok"});
        assert_eq!(nul_pointer(&v, String::new()).as_deref(), Some("/a/1"));
        assert_eq!(
            nul_pointer(&json!({"a~b\0": 1}), String::new()).as_deref(),
            Some("/a~0b\0")
        );
        assert_eq!(without_nul(&v)["a"][1], "y\u{FFFD}z");
        assert_eq!(nul_pointer(&without_nul(&v), String::new()), None);
    }

    #[test]
    fn key_order_does_not_change_the_identity_of_arguments() {
        assert_eq!(
            arguments_sha256(&json!({"a": 1, "b": {"x": [1, 2], "y": null}})),
            arguments_sha256(&json!({"b": {"y": null, "x": [1, 2]}, "a": 1}))
        );
        assert_ne!(
            arguments_sha256(&json!({"a": 1})),
            arguments_sha256(&json!({"a": 2}))
        );
    }
}
