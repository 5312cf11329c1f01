//! JSON as JSON Schema reads it, for the typed structs behind it.

/// Rewrites every number with no fractional part (`1.0`, `2e3`) as an integer, in place. JSON
/// Schema counts `1.0` as an integer, so a value a schema accepted must also deserialize into
/// the `u64` field behind it (serde refuses a float there). A float field still accepts the
/// integer; numbers beyond 64 bits are left alone.
pub fn integral_floats_as_integers(value: &mut serde_json::Value) {
    use serde_json::Value;
    match value {
        Value::Number(n) if n.is_f64() => {
            if let Some(f) = n.as_f64()
                && f.fract() == 0.0
            {
                if f >= 0.0 && f <= u64::MAX as f64 {
                    *value = Value::from(f as u64);
                } else if f < 0.0 && f >= i64::MIN as f64 {
                    *value = Value::from(f as i64);
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(integral_floats_as_integers),
        Value::Object(fields) => fields.values_mut().for_each(integral_floats_as_integers),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn whole_floats_become_integers_and_others_stay() {
        let mut v = json!({"a": 1.0, "b": [2.0, 2.5, -3.0], "c": {"d": 1e3}, "e": "1.0", "f": 7});
        integral_floats_as_integers(&mut v);
        assert_eq!(
            v,
            json!({"a": 1, "b": [2, 2.5, -3], "c": {"d": 1000}, "e": "1.0", "f": 7})
        );
        assert!(v["a"].is_u64());
    }
}
