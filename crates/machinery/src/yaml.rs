//! YAML bodies in and out. Output sorts map keys, as kube-apiserver's YAML encoder does.

use serde_json::{Map, Value};

/// Parses a YAML document into JSON.
pub fn from_slice(bytes: &[u8]) -> Result<Value, String> {
    let text = std::str::from_utf8(bytes).map_err(|e| e.to_string())?;
    serde_saphyr::from_str::<Value>(text).map_err(|e| e.to_string())
}

fn sorted(value: &Value) -> Value {
    match value {
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            let mut out = Map::new();
            for key in keys {
                out.insert(key.clone(), sorted(&map[key]));
            }
            Value::Object(out)
        }
        Value::Array(items) => Value::Array(items.iter().map(sorted).collect()),
        other => other.clone(),
    }
}

/// Renders JSON as YAML with sorted keys.
pub fn to_string(value: &Value) -> Result<String, String> {
    serde_saphyr::to_string(&sorted(value)).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn round_trips_a_service() {
        let yaml = "apiVersion: v1\nkind: Service\nmetadata:\n  name: web\nspec:\n  ports:\n  - port: 80\n";
        let value = from_slice(yaml.as_bytes()).expect("parses");
        assert_eq!(
            value,
            json!({"apiVersion":"v1","kind":"Service","metadata":{"name":"web"},"spec":{"ports":[{"port":80}]}})
        );
        let back = to_string(&value).expect("renders");
        assert_eq!(from_slice(back.as_bytes()).expect("parses again"), value);
        assert!(back.starts_with("apiVersion: v1\n"));
    }
}
