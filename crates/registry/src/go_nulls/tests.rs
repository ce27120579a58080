//! `null` read as Go reads it, where the kinds' types refuse it.

use super::*;
use crate::decode::for_rules;
use crate::object::from_typed;
use k8s_openapi::api::core::v1::Service;
use serde_json::json;

fn service_with(conditions: Value) -> Value {
    json!({
        "metadata": {"name": "web", "namespace": "default", "finalizers": ["a", null]},
        "spec": {"ports": [{"port": 80}], "selector": {"app": null}},
        "status": {"conditions": conditions},
    })
}

#[test]
fn a_null_or_missing_condition_time_is_gos_zero_time_written_back_as_null() {
    for condition in [
        json!({"type": "Ready", "status": "True", "reason": "R", "message": "m", "lastTransitionTime": null}),
        json!({"type": "Ready", "status": "True", "reason": "R", "message": "m"}),
    ] {
        let object = service_with(json!([condition]));
        assert!(
            serde_json::from_value::<Service>(object.clone()).is_err(),
            "strictly refused"
        );
        let service: Service = for_rules(&object).expect("read as Go reads it");
        let conditions = service.status.as_ref().and_then(|s| s.conditions.clone());
        let time = &conditions.expect("conditions")[0].last_transition_time;
        assert_eq!(time.0.to_string(), ZERO_TIME);
        // Written as Go's metav1.Time marshals its zero value.
        let written = from_typed(&service);
        assert_eq!(
            written["status"]["conditions"][0]["lastTransitionTime"],
            Value::Null
        );
        assert_eq!(written["status"]["conditions"][0]["reason"], "R");
        // A list's null item and a map's null value are their type's zero value.
        assert_eq!(written["metadata"]["finalizers"], json!(["a", ""]));
        assert_eq!(written["spec"]["selector"], json!({"app": ""}));
        // And read back, the null time again.
        let again: Service = for_rules(&written).expect("reads back");
        assert_eq!(again, service);
    }
}

#[test]
fn the_reading_is_otherwise_serdes() {
    let object = service_with(json!([{"type": "Ready", "status": 1}]));
    let refused = for_rules::<Service>(&object).expect_err("a number is no string");
    assert!(refused.contains("invalid type"), "{refused}");
    let plain = json!({"metadata": {"name": "web"}, "spec": {"ports": [{"port": 80}]}});
    let strict: Service = serde_json::from_value(plain.clone()).expect("decodes");
    assert_eq!(for_rules::<Service>(&plain).expect("decodes"), strict);
}
