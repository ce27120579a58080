//! The `meta.k8s.io/v1` Table that `kubectl get` asks for, and the age column's format.

use serde_json::{Map, Value, json};

/// One column of a Table.
#[derive(Debug, Clone)]
pub struct Column {
    /// Column title (`Name`, `Cluster-IP`…).
    pub name: &'static str,
    /// `string`, `integer`, `date`…
    pub kind: &'static str,
    /// `name` for the name column, else empty.
    pub format: &'static str,
    /// Upstream's description (from the API field documentation).
    pub description: &'static str,
    /// 0: default columns; 1: `-o wide` only.
    pub priority: i32,
}

impl Column {
    /// A `string` column.
    pub const fn text(name: &'static str, description: &'static str, priority: i32) -> Self {
        Column {
            name,
            kind: "string",
            format: "",
            description,
            priority,
        }
    }
}

impl Column {
    /// The JSON column definition.
    pub fn to_json(&self) -> Value {
        json!({
            "name": self.name,
            "type": self.kind,
            "format": self.format,
            "description": self.description,
            "priority": self.priority,
        })
    }
}

/// Description upstream gives the `Name` column.
pub const NAME_DESCRIPTION: &str = "Name must be unique within a namespace. Is required when creating resources, although some resources may allow a client to request the generation of an appropriate name automatically. Name is primarily intended for creation idempotence and configuration definition. Cannot be updated. More info: https://kubernetes.io/docs/concepts/overview/working-with-objects/names#names";
/// Description upstream gives the `Age` column.
pub const AGE_DESCRIPTION: &str = "CreationTimestamp is a timestamp representing the server time when this object was created. It is not guaranteed to be set in happens-before order across separate operations. Clients may not set this value. It is represented in RFC3339 form and is in UTC.\n\nPopulated by the system. Read-only. Null for lists. More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#metadata";

/// The `Name` column.
pub const NAME_COLUMN: Column = Column {
    name: "Name",
    kind: "string",
    format: "name",
    description: NAME_DESCRIPTION,
    priority: 0,
};

/// The `Age` column.
pub const AGE_COLUMN: Column = Column {
    name: "Age",
    kind: "string",
    format: "",
    description: AGE_DESCRIPTION,
    priority: 0,
};

/// Builds a Table. `rows` are (cells, row object) pairs; the object is `null` where it is not
/// included (upstream's `TableRow.object` is a RawExtension, which has no omitempty).
pub fn table(
    api_version: &str,
    metadata: Map<String, Value>,
    columns: Option<&[Column]>,
    rows: Vec<(Vec<Value>, Value)>,
) -> Value {
    let rows: Vec<Value> = rows
        .into_iter()
        .map(|(cells, object)| json!({"cells": cells, "object": object}))
        .collect();
    let mut out = Map::new();
    out.insert("kind".into(), json!("Table"));
    out.insert(
        "apiVersion".into(),
        json!(format!("meta.k8s.io/{api_version}")),
    );
    out.insert("metadata".into(), Value::Object(metadata));
    out.insert(
        "columnDefinitions".into(),
        match columns {
            Some(columns) => Value::Array(columns.iter().map(Column::to_json).collect()),
            None => Value::Null,
        },
    );
    out.insert("rows".into(), Value::Array(rows));
    Value::Object(out)
}

/// kubectl's human duration (`duration.HumanDuration`), used for AGE cells.
pub fn human_duration(seconds: i64) -> String {
    if seconds < -1 {
        return "<invalid>".into();
    }
    let seconds = seconds.max(0);
    let minutes = seconds / 60;
    let hours = seconds / 3600;
    if seconds < 120 {
        return format!("{seconds}s");
    }
    // "3m", or "3m20s" when the smaller unit is not zero.
    let two_units = |major: i64, unit: &str, minor: i64, minor_unit: &str| match minor {
        0 => format!("{major}{unit}"),
        _ => format!("{major}{unit}{minor}{minor_unit}"),
    };
    if minutes < 10 {
        return two_units(minutes, "m", seconds % 60, "s");
    }
    if minutes < 180 {
        return format!("{minutes}m");
    }
    if hours < 8 {
        return two_units(hours, "h", minutes % 60, "m");
    }
    if hours < 48 {
        return format!("{hours}h");
    }
    let days = hours / 24;
    if hours < 24 * 8 {
        return two_units(days, "d", hours % 24, "h");
    }
    if hours < 24 * 365 * 2 {
        return format!("{days}d");
    }
    let years = hours / 24 / 365;
    if hours < 24 * 365 * 8 {
        return two_units(years, "y", days % 365, "d");
    }
    format!("{years}y")
}

/// The AGE cell for an RFC 3339 creation timestamp.
pub fn age(creation_timestamp: &str) -> String {
    match creation_timestamp.parse::<jiff::Timestamp>() {
        Ok(created) => {
            let elapsed = jiff::Timestamp::now().as_second() - created.as_second();
            human_duration(elapsed)
        }
        Err(_) => "<unknown>".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::human_duration;

    #[test]
    fn durations_match_kubectl() {
        assert_eq!(human_duration(5), "5s");
        assert_eq!(human_duration(119), "119s");
        assert_eq!(human_duration(345), "5m45s");
        assert_eq!(human_duration(600), "10m");
        assert_eq!(human_duration(3 * 3600 + 60), "3h1m");
        assert_eq!(human_duration(20 * 3600), "20h");
        assert_eq!(human_duration(3 * 86400 + 3600), "3d1h");
        assert_eq!(human_duration(100 * 86400), "100d");
        assert_eq!(human_duration(3 * 365 * 86400 + 86400), "3y1d");
        assert_eq!(human_duration(-5), "<invalid>");
    }
}
