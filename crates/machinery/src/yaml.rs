//! YAML bodies in and out. Output sorts map keys, as kube-apiserver's YAML encoder does.

use serde_json::{Map, Value};

/// Parses a YAML document into JSON. A key a mapping repeats takes its last value, as
/// upstream's (non-strict) `YAMLToJSON` does; [`duplicate_key`] reports it.
pub fn from_slice(bytes: &[u8]) -> Result<Value, String> {
    let text = std::str::from_utf8(bytes).map_err(|e| e.to_string())?;
    let options = serde_saphyr::options! {
        duplicate_keys: serde_saphyr::options::DuplicateKeyPolicy::LastWins,
    };
    serde_saphyr::from_str_with_options::<Value>(text, options).map_err(|e| go_yaml_error(&e))
}

/// A YAML syntax error as go-yaml words it (`yaml: line N: problem`): one line, no excerpt,
/// and no line on the first line (go-yaml's marks count from 0 and it leaves out line 0).
fn go_yaml_error(error: &serde_saphyr::Error) -> String {
    let text = error.without_snippet().to_string();
    let text = text.strip_prefix("error: ").unwrap_or(&text);
    // `line L column C: problem`
    let problem = text
        .strip_prefix("line ")
        .and_then(|rest| rest.split_once(": "))
        .map_or(text, |(_, problem)| problem);
    let problem = problem.lines().next().unwrap_or_default();
    // `problem at line L, column C`
    let problem = problem
        .rsplit_once(" at line ")
        .map_or(problem, |(problem, _)| problem);
    match error.location().map(|at| at.line()) {
        Some(line) if line > 1 => format!("yaml: line {line}: {problem}"),
        _ => format!("yaml: {problem}"),
    }
}

/// Strict decoding's complaint about a key a mapping of the document repeats, as upstream's
/// `YAMLToJSONStrict` words it (go-yaml v2: the line of the repeated key).
pub fn duplicate_key(bytes: &[u8]) -> Option<String> {
    let text = std::str::from_utf8(bytes).ok()?;
    let error = serde_saphyr::from_str::<Value>(text).err()?;
    let mut inner = error.without_snippet();
    while let serde_saphyr::Error::AliasError { error, .. } = inner {
        inner = error.without_snippet();
    }
    let serde_saphyr::Error::DuplicateMappingKey { key, location } = inner else {
        return None;
    };
    Some(format!(
        "error converting YAML to JSON: yaml: unmarshal errors:\n  line {}: key {} already set in map",
        location.line(),
        capstan_gostd::quote(key.as_deref().unwrap_or_default()),
    ))
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

    #[test]
    fn syntax_errors_read_as_go_yaml_writes_them() {
        assert_eq!(
            from_slice(b"a: b: c\n").expect_err("invalid"),
            "yaml: mapping values are not allowed in this context"
        );
        let later =
            from_slice(b"kind: Service\nmetadata:\n  name: x\n  a: b: c\n").expect_err("invalid");
        assert_eq!(
            later,
            "yaml: line 4: mapping values are not allowed in this context"
        );
    }
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

    #[test]
    fn a_repeated_key_takes_its_last_value_and_is_reported_with_its_line() {
        let yaml = "metadata:\n  name: a\n  labels: {x: z}\n  name: b\n";
        assert_eq!(
            from_slice(yaml.as_bytes()).expect("parses"),
            json!({"metadata": {"name": "b", "labels": {"x": "z"}}})
        );
        assert_eq!(
            duplicate_key(yaml.as_bytes()).as_deref(),
            Some(
                "error converting YAML to JSON: yaml: unmarshal errors:\n  line 4: key \"name\" already set in map"
            )
        );
        assert_eq!(duplicate_key(b"a: 1\nb: 2\n"), None);
    }
}
