//! Canonical JSON: sorted keys, no whitespace. Hashes (capabilities, policy, hardware) are
//! taken over this form so that key order or formatting in a file never changes them.

use serde_json::Value;

/// Writes `value` canonically.
pub fn to_string(value: &Value) -> String {
    let mut out = String::new();
    write(value, &mut out);
    out
}

/// blake3 of the canonical form, as 64 hex digits.
pub fn hash(value: &Value) -> String {
    blake3::hash(to_string(value).as_bytes()).to_hex().to_string()
}

fn write(value: &Value, out: &mut String) {
    match value {
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            out.push('{');
            for (i, k) in keys.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&Value::String((*k).clone()).to_string());
                out.push(':');
                write(&map[*k], out);
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (i, v) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write(v, out);
            }
            out.push(']');
        }
        other => out.push_str(&other.to_string()),
    }
}
