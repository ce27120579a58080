//! The rules' view of an object, and the JSON it is written back to.

use super::*;
use crate::decode::from_json_without_managed_fields;
use k8s_openapi::Metadata;
use k8s_openapi::api::core::v1::Service;
use serde_json::json;

pub(crate) fn stored() -> Value {
    json!({
        "metadata": {
            "name": "web", "namespace": "default", "labels": {"app": "web"},
            "managedFields": [{"manager": "kubectl", "operation": "Update", "apiVersion": "v1",
                "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {"f:type": {}}}}]
        },
        "spec": {"type": "ClusterIP", "ports": [{"port": 80}]},
    })
}

#[test]
fn rules_see_everything_but_managed_fields() {
    let service: Service = for_rules(&stored()).expect("decodes");
    assert_eq!(service.metadata.managed_fields, None);
    assert_eq!(service.metadata.name.as_deref(), Some("web"));
    assert_eq!(
        service.metadata.labels.and_then(|l| l.get("app").cloned()),
        Some("web".into())
    );
    let spec = service.spec.expect("spec");
    assert_eq!(spec.type_.as_deref(), Some("ClusterIP"));
    assert_eq!(spec.ports.map(|p| p[0].port), Some(80));
    // Wrong types are still refused.
    let wrong = json!({"metadata": {"name": 5}});
    assert!(for_rules::<Service>(&wrong).is_err());
    let wrong = json!({"metadata": {"name": "x"}, "spec": {"ports": "80"}});
    assert!(for_rules::<Service>(&wrong).is_err());
}

#[test]
fn stored_json_decodes_without_its_managed_fields() {
    let json = serde_json::to_vec(&stored()).unwrap_or_default();
    let service: Service = from_json_without_managed_fields(&json).expect("decodes");
    assert_eq!(service, for_rules::<Service>(&stored()).expect("decodes"));
    assert_eq!(service.metadata.managed_fields, None);
    assert_eq!(service.metadata.name.as_deref(), Some("web"));
    // A metadata-level `managedFields` only: the same key elsewhere is the type's business.
    let spec_only = br#"{"spec": {"type": "ClusterIP"}, "metadata": {"name": "a"}}"#;
    let service: Service = from_json_without_managed_fields(spec_only).expect("decodes");
    assert_eq!(service.metadata.name.as_deref(), Some("a"));
    // Wrong types, bad JSON and trailing bytes are still refused.
    for bad in [
        &br#"{"metadata": {"name": 5}}"#[..],
        br#"{"metadata": {"name": "x"}, "spec": {"ports": "80"}}"#,
        br#"{"metadata": {"managedFields": [}}"#,
        br#"{"metadata": {}} x"#,
        br#"[]"#,
    ] {
        assert!(from_json_without_managed_fields::<Service>(bad).is_err());
    }
}

#[test]
fn a_rule_that_changes_metadata_keeps_the_managed_fields() {
    let mut object = stored();
    mutate(&mut object, |s: &mut Service| {
        s.metadata
            .annotations
            .get_or_insert_default()
            .insert("a".into(), "b".into());
    });
    assert_eq!(object["metadata"]["annotations"], json!({"a": "b"}));
    assert_eq!(
        object["metadata"]["managedFields"],
        stored()["metadata"]["managedFields"]
    );
}

#[test]
fn a_rule_that_leaves_metadata_alone_leaves_it_byte_for_byte() {
    let mut object = stored();
    object["metadata"]["creationTimestamp"] = json!("2026-01-01T00:00:00Z");
    let metadata = object["metadata"].clone();
    mutate(&mut object, |s: &mut Service| {
        s.spec.get_or_insert_default().session_affinity = Some("None".into());
    });
    assert_eq!(object["metadata"], metadata);
    assert_eq!(object["spec"]["sessionAffinity"], "None");
    assert_eq!(
        serde_json::to_string(&object["metadata"]).ok(),
        serde_json::to_string(&metadata).ok()
    );
}

/// What `write_back` makes of `object` after `rule`, and what `write_changes` makes of it.
fn both_ways(object: &Value, rule: impl Fn(&mut Service)) -> (Value, Value) {
    let untouched: Service = for_rules(object).expect("decodes");
    let mut changed = untouched.clone();
    rule(&mut changed);
    let mut full = object.clone();
    write_back(&mut full, &changed, untouched.metadata());
    let mut partial = object.clone();
    write_changes(&mut partial, &mut changed.clone(), &mut untouched.clone());
    (full, partial)
}

#[test]
fn writing_back_only_the_changes_gives_what_writing_back_everything_gives() {
    let mut object = from_typed(&for_rules::<Service>(&stored()).expect("decodes"));
    object["metadata"]["managedFields"] = stored()["metadata"]["managedFields"].clone();
    let rules: [fn(&mut Service); 10] = [
        |_| {},
        |s| s.metadata.generation = Some(2),
        |s| s.spec.get_or_insert_default().session_affinity = Some("None".into()),
        |s| {
            s.metadata.generation = Some(3);
            s.spec.get_or_insert_default().ports = None;
        },
        // Members the metadata gains, loses, or keeps empty (an empty list is left out).
        |s| {
            s.metadata.labels = None;
            s.metadata.finalizers = Some(vec![]);
            s.metadata.annotations = Some([("a".to_string(), "b".to_string())].into());
        },
        |s| s.metadata.finalizers = Some(vec!["example.com/f".into()]),
        |s| {
            s.metadata.owner_references = Some(vec![Default::default()]);
            s.metadata.deletion_grace_period_seconds = Some(0);
            s.metadata.deletion_timestamp =
                serde_json::from_value(json!("2026-01-01T00:00:00Z")).ok();
        },
        |s| {
            s.metadata.uid = None;
            s.metadata.name = Some("renamed".into());
            s.metadata.self_link = Some(String::new());
        },
        |s| {
            s.metadata.labels.get_or_insert_default().clear();
            s.spec = None;
        },
        // A managedFields a rule sets is kept as write_back keeps it.
        |s| s.metadata.managed_fields = Some(vec![Default::default()]),
    ];
    // Stored metadata in another order than encoding's: both put it in encoding's.
    let mut shuffled = object.clone();
    let metadata = shuffled["metadata"].as_object_mut().expect("metadata");
    let name = metadata.shift_remove("name").expect("name");
    metadata.insert("name".into(), name);
    // Stored metadata with members encoding leaves out: both leave them out.
    let mut unencoded = object.clone();
    unencoded["metadata"]["finalizers"] = json!([]);
    unencoded["metadata"]["annotations"] = Value::Null;
    for object in [&object, &shuffled, &unencoded] {
        for rule in rules {
            let (full, partial) = both_ways(object, rule);
            assert_eq!(
                serde_json::to_string(&full).ok(),
                serde_json::to_string(&partial).ok()
            );
        }
    }
    let (_, generation) = both_ways(&object, |s| s.metadata.generation = Some(2));
    assert_eq!(generation["metadata"]["generation"], 2);
    assert_eq!(
        generation["metadata"]["managedFields"],
        stored()["metadata"]["managedFields"]
    );
}
