//! The object under write keeps its forms in agreement: what the rules change through one
//! shared view is what each rule decoding the JSON on its own would have written.

use super::*;
use crate::decode::for_rules;
use crate::object::from_typed;
use crate::typed::mutate;
use crate::typed::tests::stored;
use k8s_openapi::Metadata;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::jiff::Timestamp;

fn affinity(s: &mut Service) {
    s.spec.get_or_insert_default().session_affinity = Some("ClientIP".into());
}

fn generation(s: &mut Service) {
    s.metadata.generation = Some(1);
}

fn text(object: &Value) -> String {
    object.to_string()
}

#[test]
fn rules_sharing_a_view_write_what_each_decoding_on_its_own_writes() {
    let mut object = from_typed(&for_rules::<Service>(&stored()).expect("decodes"));
    object["metadata"]["managedFields"] = stored()["metadata"]["managedFields"].clone();
    let created = Timestamp::from_second(1_700_000_000).expect("a time");
    // Each rule on its own: decoded, changed, written back; the registry's identity between.
    let mut one_by_one = object.clone();
    mutate(&mut one_by_one, affinity);
    meta::set_meta_str(&mut one_by_one, "uid", "u-1");
    let created_text = meta::format_timestamp(created);
    meta::set_meta_str(&mut one_by_one, "creationTimestamp", &created_text);
    mutate(&mut one_by_one, generation);
    // The same through one owner: one decode, the identity set in both forms.
    let mut shared = UnderWrite::normal(object.clone());
    affinity(shared.rules::<Service>().expect("decodes"));
    shared.set_identity("u-1", created);
    generation(shared.rules::<Service>().expect("held"));
    // Read before the rules are done: the JSON has their changes already.
    let copy = shared.clone();
    assert_eq!(text(shared.json()), text(&one_by_one));
    assert_eq!(
        shared.json()["metadata"]["managedFields"],
        stored()["metadata"]["managedFields"]
    );
    // Finishing writes the same and spends the view, as does turning it into JSON.
    let mut finished = copy.clone();
    finished.finish();
    assert_eq!(text(finished.json()), text(&one_by_one));
    assert_eq!(text(&copy.into_json()), text(&one_by_one));
    // Spent: the next rule decodes the JSON as it is by then (not a copy held from before).
    meta::set_meta_str(&mut finished.json, "uid", "u-2");
    let decoded = finished.rules::<Service>().expect("decodes");
    assert_eq!(decoded.metadata().uid.as_deref(), Some("u-2"));
    assert_eq!(decoded.metadata().generation, Some(1));
}

#[test]
fn an_edit_of_the_json_alone_is_what_the_next_rule_sees() {
    let mut under = UnderWrite::normal(stored());
    affinity(under.rules::<Service>().expect("decodes"));
    // The edit sees the rule's change, and the next rule sees the edit.
    under.edit_json(|json| {
        assert_eq!(json["spec"]["sessionAffinity"], "ClientIP");
        json["spec"]["externalName"] = json!("edited.example");
        ((), true)
    });
    let typed = under.rules::<Service>().expect("decodes");
    let spec = typed.spec.as_ref().expect("a spec");
    assert_eq!(spec.external_name.as_deref(), Some("edited.example"));
    assert_eq!(spec.session_affinity.as_deref(), Some("ClientIP"));
}

#[test]
fn metadata_the_registry_sets_reaches_both_forms() {
    let typed: Service = for_rules(&stored()).expect("decodes");
    let mut under = UnderWrite::typed(typed.clone(), from_typed(&typed));
    under.set_name("web-x1");
    under.set_resource_version("42");
    let view = under.rules::<Service>().expect("held");
    assert_eq!(view.metadata().name.as_deref(), Some("web-x1"));
    assert_eq!(view.metadata().resource_version.as_deref(), Some("42"));
    assert_eq!(meta::name(under.json()), "web-x1");
    // An update's metadata comes from the stored object; the view follows.
    let stored_meta = json!({"metadata": {"uid": "u-9", "creationTimestamp": "2024-01-01T00:00:00Z",
        "generation": 3}});
    under.before_update(Some("other"), &stored_meta);
    let view = under.rules::<Service>().expect("held");
    assert_eq!(view.metadata().uid.as_deref(), Some("u-9"));
    assert_eq!(view.metadata().namespace.as_deref(), Some("other"));
    assert_eq!(meta::meta_str(under.json(), "uid"), "u-9");
    assert_eq!(under.json()["metadata"].get("generation"), None);
    under.set_resource_version("");
    assert_eq!(meta::resource_version(under.json()), "");
    assert_eq!(
        under
            .rules::<Service>()
            .expect("held")
            .metadata()
            .resource_version,
        None
    );
}
