//! managedFields and server-side apply, case by case.

use super::apply::render_path;
use super::*;

fn service_schema() -> Option<&'static Value> {
    capstan_machinery::schema::named("io.k8s.api.core.v1.Service")
}

#[test]
fn create_records_fields_as_upstream() {
    // The reference transcript: kube-apiserver 1.36's managedFields for this create.
    let mut object = json!({"metadata":{"name":"web","labels":{"app":"web"}},
        "spec":{"ports":[{"name":"http","protocol":"TCP","port":80,"targetPort":8080}],
                "selector":{"app":"web"},"type":"ClusterIP","sessionAffinity":"None","internalTrafficPolicy":"Cluster"},
        "status":{"loadBalancer":{}}});
    record_update(&mut object, None, "curl", "v1", None, service_schema());
    let entry = &object["metadata"]["managedFields"][0];
    assert_eq!(entry["manager"], "curl");
    assert_eq!(
        entry["fieldsV1"],
        json!({"f:metadata":{"f:labels":{".":{},"f:app":{}}},
               "f:spec":{"f:internalTrafficPolicy":{},
                         "f:ports":{".":{},"k:{\"port\":80,\"protocol\":\"TCP\"}":{".":{},"f:name":{},"f:port":{},"f:protocol":{},"f:targetPort":{}}},
                         "f:selector":{},"f:sessionAffinity":{},"f:type":{}}})
    );
}

#[test]
fn update_moves_changed_fields_to_the_new_manager() {
    let mut old = json!({"metadata":{"labels":{"a":"1"}},"spec":{"type":"ClusterIP"}});
    record_update(&mut old, None, "first", "v1", None, service_schema());
    let mut new = old.clone();
    new["metadata"]["labels"]["a"] = json!("2");
    record_update(&mut new, Some(&old), "second", "v1", None, service_schema());
    let entries = new["metadata"]["managedFields"]
        .as_array()
        .expect("entries");
    assert_eq!(entries.len(), 2);
    // The map itself stays with its first manager; the changed key moves.
    assert_eq!(
        entries[0]["fieldsV1"],
        json!({"f:metadata":{"f:labels":{".":{}}},"f:spec":{"f:type":{}}})
    );
    assert_eq!(
        entries[1]["fieldsV1"],
        json!({"f:metadata":{"f:labels":{"f:a":{}}}})
    );
}
fn applied(
    live: Option<&Value>,
    config: Value,
    manager: &str,
    force: bool,
) -> Result<Value, Vec<Conflict>> {
    apply(live, &config, manager, "v1", None, service_schema(), force)
}

fn owned(object: &Value, manager: &str) -> Value {
    object["metadata"]["managedFields"]
        .as_array()
        .and_then(|l| l.iter().find(|e| e["manager"] == manager))
        .map(|e| e["fieldsV1"].clone())
        .unwrap_or(Value::Null)
}

fn web(target: i64) -> Value {
    json!({"metadata": {"name": "web"}, "spec": {"selector": {"app": "web"},
           "ports": [{"name": "http", "port": 80, "targetPort": target}]}})
}

#[test]
fn apply_creates_and_owns_what_it_sent_with_defaulted_keys() {
    let object = applied(None, web(8080), "alice", false).expect("no conflicts");
    let entry = &object["metadata"]["managedFields"][0];
    assert_eq!(entry["operation"], "Apply");
    assert_eq!(entry["manager"], "alice");
    // The entry is named with the defaulted protocol; the protocol field itself is not owned.
    assert_eq!(
        entry["fieldsV1"],
        json!({"f:spec": {"f:ports": {".": {}, "k:{\"port\":80,\"protocol\":\"TCP\"}":
            {".": {}, "f:name": {}, "f:port": {}, "f:targetPort": {}}}, "f:selector": {}}})
    );
    // Applying the same again changes nothing, not even the time.
    let again = applied(Some(&object), web(8080), "alice", false).expect("no conflicts");
    assert_eq!(again, object);
}

#[test]
fn a_different_value_conflicts_and_force_moves_ownership() {
    let mut live = applied(None, web(8080), "alice", false).expect("no conflicts");
    live["spec"]["ports"][0]["protocol"] = json!("TCP"); // as defaulting stores it
    let conflicts = applied(Some(&live), web(9999), "bob", false).expect_err("conflict");
    assert_eq!(
        conflicts,
        [Conflict {
            manager: "\"alice\"".into(),
            field: ".spec.ports[port=80,protocol=\"TCP\"].targetPort".into(),
        }]
    );
    let forced = applied(Some(&live), web(9999), "bob", true).expect("forced");
    assert_eq!(forced["spec"]["ports"][0]["targetPort"], 9999);
    assert_eq!(forced["spec"]["ports"].as_array().map(Vec::len), Some(1));
    let alice = owned(&forced, "alice").to_string();
    assert!(!alice.contains("targetPort"), "{alice}");
    assert!(owned(&forced, "bob").to_string().contains("targetPort"));
}

#[test]
fn the_same_value_is_shared_and_a_field_dropped_by_one_owner_stays() {
    let live = applied(None, web(8080), "alice", false).expect("no conflicts");
    let shared = applied(Some(&live), web(8080), "bob", false).expect("same value: shared");
    assert!(owned(&shared, "alice").to_string().contains("targetPort"));
    assert!(owned(&shared, "bob").to_string().contains("targetPort"));
    // Alice stops applying the ports; Bob still owns them, so they stay.
    let without = json!({"metadata": {"name": "web"}, "spec": {"selector": {"app": "web"}}});
    let after = applied(Some(&shared), without.clone(), "alice", false).expect("ok");
    assert_eq!(after["spec"]["ports"][0]["targetPort"], 8080);
    // Once no one else owns them, dropping them removes them.
    let alone = applied(Some(&live), without, "alice", false).expect("ok");
    assert!(alone["spec"].get("ports").is_none(), "{alone}");
}

#[test]
fn update_managers_are_named_with_their_version_in_conflicts() {
    let mut live = web(8080);
    live["spec"]["ports"][0]["protocol"] = json!("TCP");
    record_update(
        &mut live,
        None,
        "kubectl-client-side-apply",
        "v1",
        None,
        service_schema(),
    );
    let conflicts = applied(Some(&live), web(1234), "kubectl", false).expect_err("conflict");
    assert_eq!(
        conflicts[0].manager,
        "\"kubectl-client-side-apply\" using v1"
    );
    assert_eq!(
        render_path(&vec![
            "f:spec".into(),
            "f:externalIPs".into(),
            "v:\"1.2.3.4\"".into()
        ]),
        ".spec.externalIPs[=\"1.2.3.4\"]"
    );
}

#[test]
fn writes_through_status_own_status_only() {
    let old = json!({"metadata": {"name": "web"}, "spec": {"type": "ClusterIP"}, "status": {}});
    let mut new = old.clone();
    new["status"] = json!({"loadBalancer": {"ingress": [{"ip": "192.0.2.1"}]}});
    record_update(
        &mut new,
        Some(&old),
        "lb",
        "v1",
        Some("status"),
        service_schema(),
    );
    let entry = &new["metadata"]["managedFields"][0];
    assert_eq!(entry["subresource"], "status");
    assert_eq!(
        entry["fieldsV1"],
        json!({"f:status": {"f:loadBalancer": {"f:ingress": {}}}})
    );
    let config = json!({"metadata": {"name": "web"}, "spec": {"type": "NodePort"},
                        "status": {"loadBalancer": {"ingress": [{"ip": "192.0.2.2"}]}}});
    let applied = apply(
        Some(&old),
        &config,
        "lb",
        "v1",
        Some("status"),
        service_schema(),
        false,
    )
    .expect("no conflicts");
    assert_eq!(
        applied["spec"]["type"], "ClusterIP",
        "spec is not applied through /status"
    );
    assert_eq!(
        applied["status"]["loadBalancer"]["ingress"][0]["ip"],
        "192.0.2.2"
    );
}

#[test]
fn applying_and_dropping_long_lists_is_linear() {
    // Long lists: every step (field sets, comparisons, merge, removal of what the manager
    // stopped applying) is a hash or ordered lookup; `capstan-bench abuse` times it.
    let finalizers: Vec<Value> = (0..20_000).map(|i| json!(format!("f{i}"))).collect();
    let ports: Vec<Value> = (0..4_000)
        .map(|i| json!({"port": i + 1, "protocol": "TCP", "targetPort": 80}))
        .collect();
    let config = json!({"metadata": {"name": "web", "finalizers": finalizers},
                        "spec": {"ports": ports}});
    let live = applied(None, config, "alice", false).expect("created");
    let half = json!({"metadata": {"name": "web", "finalizers": finalizers[..10_000]},
                      "spec": {"ports": ports[..2_000]}});
    let after = applied(Some(&live), half, "alice", false).expect("applied");
    assert_eq!(
        after["metadata"]["finalizers"].as_array().map(Vec::len),
        Some(10_000)
    );
    assert_eq!(after["spec"]["ports"].as_array().map(Vec::len), Some(2_000));
    // A second manager sharing the same values owns them too: nothing conflicts.
    let mut shared = after.clone();
    record_update(
        &mut shared,
        Some(&after),
        "bob",
        "v1",
        None,
        service_schema(),
    );
    assert!(
        applied(
            Some(&shared),
            json!({"metadata": {"name": "web"}}),
            "carol",
            false
        )
        .is_ok()
    );
}

#[test]
fn more_than_ten_update_managers_fold_into_ancient_changes() {
    let mut object = json!({"metadata": {"name": "web", "labels": {}}});
    for i in 0..12 {
        let old = object.clone();
        object["metadata"]["labels"][format!("l{i}")] = json!("x");
        record_update(
            &mut object,
            Some(&old),
            &format!("m{i:02}"),
            "v1",
            None,
            service_schema(),
        );
    }
    let entries = object["metadata"]["managedFields"]
        .as_array()
        .expect("entries");
    assert_eq!(entries.len(), 10);
    let ancient: Vec<&Value> = entries
        .iter()
        .filter(|e| e["manager"] == "ancient-changes")
        .collect();
    assert_eq!(ancient.len(), 1);
    let owned = ancient[0]["fieldsV1"].to_string();
    assert!(
        owned.contains("f:l0") && owned.contains("f:l1") && owned.contains("f:l2"),
        "{owned}"
    );
}

#[test]
fn the_first_apply_to_an_unmanaged_object_meets_before_first_apply() {
    let live = json!({"metadata": {"name": "web"}, "spec": {"type": "ClusterIP",
        "ports": [{"port": 80, "protocol": "TCP", "targetPort": 8080}]}});
    let kubectl_applies = |force| {
        apply(
            Some(&live),
            &web(9090),
            "kubectl",
            "v1",
            None,
            service_schema(),
            force,
        )
    };
    let conflicts = kubectl_applies(false).expect_err("the existing value conflicts");
    assert_eq!(conflicts[0].manager, "\"before-first-apply\" using v1");
    let forced = kubectl_applies(true).expect("forced");
    let managers: Vec<&str> = forced["metadata"]["managedFields"]
        .as_array()
        .map(|l| l.iter().filter_map(|e| e["manager"].as_str()).collect())
        .unwrap_or_default();
    assert_eq!(managers, ["before-first-apply", "kubectl"]);
}

#[test]
fn a_status_write_keeps_the_main_resource_managers_and_the_reverse() {
    let mut object = applied(None, web(8080), "alice", false).expect("created");
    object["status"] = json!({});
    let old = object.clone();
    object["status"] = json!({"loadBalancer": {"ingress": [{"ip": "192.0.2.1"}]}});
    record_update(
        &mut object,
        Some(&old),
        "lb",
        "v1",
        Some("status"),
        service_schema(),
    );
    assert!(
        owned(&object, "alice").to_string().contains("targetPort"),
        "{object}"
    );
    let old = object.clone();
    object["metadata"]["labels"] = json!({"a": "b"});
    record_update(
        &mut object,
        Some(&old),
        "labeller",
        "v1",
        None,
        service_schema(),
    );
    assert!(
        owned(&object, "lb").to_string().contains("f:loadBalancer"),
        "{object}"
    );
    // Apply again after the status write: still the owner, so dropping a port removes it.
    let mut config = web(8080);
    config["spec"]["ports"] = json!([]);
    let after = applied(Some(&object), config, "alice", false).expect("no conflict");
    assert!(
        after["spec"]["ports"].as_array().is_none_or(Vec::is_empty),
        "{after}"
    );
}
