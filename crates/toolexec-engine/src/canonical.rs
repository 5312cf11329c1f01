//! The identity of a call's arguments: SHA-256 of their canonical JSON (object keys sorted at
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

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

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
