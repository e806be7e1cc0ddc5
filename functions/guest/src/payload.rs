use crate::{Field, Scalar};
use serde_json::Value;

/// Flattens a JSON payload into its scalar leaves addressed by JSON pointer,
/// the form in which functions receive it (the host does the same).
pub fn flatten_payload(payload: &Value) -> Vec<Field> {
    let mut fields = Vec::new();
    let mut path = String::new();
    flatten_into(payload, &mut path, &mut fields);
    fields
}

fn flatten_into(value: &Value, path: &mut String, out: &mut Vec<Field>) {
    let scalar = match value {
        Value::Object(map) => {
            for (key, child) in map {
                let len = path.len();
                path.push('/');
                // RFC 6901 escaping: `~` -> `~0`, `/` -> `~1`.
                path.push_str(&key.replace('~', "~0").replace('/', "~1"));
                flatten_into(child, path, out);
                path.truncate(len);
            }
            return;
        }
        Value::Array(items) => {
            for (index, child) in items.iter().enumerate() {
                let len = path.len();
                path.push('/');
                path.push_str(&index.to_string());
                flatten_into(child, path, out);
                path.truncate(len);
            }
            return;
        }
        Value::Null => Scalar::Null,
        Value::Bool(b) => Scalar::Boolean(*b),
        Value::Number(n) => Scalar::Number(n.as_f64().unwrap_or(f64::NAN)),
        Value::String(s) => Scalar::Text(s.clone()),
    };
    out.push(Field {
        path: path.clone(),
        value: scalar,
    });
}
