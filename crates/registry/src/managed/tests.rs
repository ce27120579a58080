//! managedFields and server-side apply, case by case.

use super::apply::render_path;
use super::*;
use crate::current::Current;
use crate::detached::Detached;

use capstan_machinery::testdata::{self, ENDPOINT_SLICE, service as service_schema};
use k8s_openapi::api::core::v1::Service;

static SERVICE: ResourceInfo =
    ResourceInfo::of::<Service>(&testdata::SERVICE, "io.k8s.api.core.v1.Service")
        .with_status()
        .zero(r#"{"metadata":{"creationTimestamp":null},"spec":{},"status":{"loadBalancer":{}}}"#);

fn tracking(subresource: Subresource) -> Tracking {
    Tracking::new(&SERVICE, service_schema(), subresource)
}

fn update(new: &mut Value, old: Option<&Value>, manager: &str) {
    same_from_current(new, old, manager, &tracking(Subresource::Main));
    record_update(new, old, manager, &tracking(Subresource::Main));
}

fn update_status(new: &mut Value, old: Option<&Value>, manager: &str) {
    same_from_current(new, old, manager, &tracking(Subresource::Status));
    record_update(new, old, manager, &tracking(Subresource::Status));
}

/// `old` as the store holds it (with `kind` and `apiVersion`, at revision 7).
fn stored(old: &Value) -> capstan_storage::KeyValue {
    let mut typed = meta::with_type_meta(old, "v1", "Service");
    if let Some(metadata) = typed.get_mut("metadata").and_then(Value::as_object_mut) {
        metadata.shift_remove("resourceVersion");
    }
    capstan_storage::KeyValue {
        key: "/services/specs/default/web".into(),
        value: serde_json::to_vec(&typed).expect("encodes").into(),
        create_revision: 2,
        mod_revision: 7,
        version: 3,
    }
}

/// Checks that an update recorded against the stored object as a write reads it
/// ([`Current`]) is the one recorded against the whole decoded object.
fn same_from_current(new: &Value, old: Option<&Value>, manager: &str, tracking: &Tracking) {
    let Some(old) = old else { return };
    let kv = stored(old);
    let current = Current::read(&kv).expect("reads");
    let whole = crate::current::decode(&kv).expect("decodes");
    let (mut by_whole, mut by_current) = (new.clone(), new.clone());
    // And with the kind's atomic lists kept as encoded JSON, as a typed write keeps them.
    let mut by_detached = new.clone();
    let atomic = |key: &str| crate::detached::atomic_member(tracking.schema, key);
    let mut detached = crate::detached::detach(&mut by_detached, &atomic);
    let unchanged = {
        let mut versioned = by_detached.clone();
        meta::set_meta_str(&mut versioned, "resourceVersion", "7");
        same_ignoring_times_current((&versioned, &detached), &current, tracking.schema)
    };
    let started = meta::now_rfc3339();
    record_update(&mut by_whole, Some(&whole), manager, tracking);
    record_update_current(
        (&mut by_current, &Detached::default()),
        &current,
        manager,
        tracking,
    )
    .expect("records");
    record_update_current((&mut by_detached, &detached), &current, manager, tracking)
        .expect("records");
    // The clock may tick between the two: a time counts only as kept or taken anew.
    let untimed = |mut object: Value| {
        for entry in object["metadata"]["managedFields"]
            .as_array_mut()
            .into_iter()
            .flatten()
        {
            let fresh = entry["time"].as_str() >= Some(started.as_str());
            entry["time"] = json!(fresh);
        }
        object
    };
    detached.restore(&mut by_detached);
    assert_eq!(untimed(by_detached), untimed(by_whole.clone()));
    assert_eq!(untimed(by_current), untimed(by_whole));
    let mut versioned = new.clone();
    meta::set_meta_str(&mut versioned, "resourceVersion", "7");
    let whole_unchanged = same_ignoring_times(&versioned, &whole);
    assert_eq!(
        same_ignoring_times_current(
            (&versioned, &Detached::default()),
            &current,
            tracking.schema,
        ),
        whole_unchanged
    );
    assert_eq!(unchanged, whole_unchanged);
}

#[test]
fn create_records_fields_as_upstream() {
    // The reference transcript: kube-apiserver 1.36's managedFields for this create.
    let mut object = json!({"metadata":{"name":"web","labels":{"app":"web"}},
        "spec":{"ports":[{"name":"http","protocol":"TCP","port":80,"targetPort":8080}],
                "selector":{"app":"web"},"type":"ClusterIP","sessionAffinity":"None","internalTrafficPolicy":"Cluster"},
        "status":{"loadBalancer":{}}});
    update(&mut object, None, "curl");
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
    update(&mut old, None, "first");
    let mut new = old.clone();
    new["metadata"]["labels"]["a"] = json!("2");
    update(&mut new, Some(&old), "second");
    let entries = new["metadata"]["managedFields"]
        .as_array()
        .expect("entries");
    assert_eq!(entries.len(), 2);
    // The map itself (added by the create) stays with its first manager, now with nothing
    // below it: `{}`, not `.`; the changed key moves.
    assert_eq!(
        entries[0]["fieldsV1"],
        json!({"f:metadata":{"f:labels":{}},"f:spec":{"f:type":{}}})
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
    apply(live, &config, manager, &tracking(Subresource::Main), force)
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
    // The entry is named with the defaulted protocol; the protocol field itself is not owned,
    // nor is the list holding the entry (an applied set has no `.` for lists and maps).
    assert_eq!(
        entry["fieldsV1"],
        json!({"f:spec": {"f:ports": {"k:{\"port\":80,\"protocol\":\"TCP\"}":
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
    update(&mut live, None, "kubectl-client-side-apply");
    let conflicts = applied(Some(&live), web(1234), "kubectl", false).expect_err("conflict");
    assert_eq!(
        conflicts[0].manager,
        "\"kubectl-client-side-apply\" using v1"
    );
    assert_eq!(
        render_path(&[
            "f:spec".into(),
            "f:externalIPs".into(),
            "v:\"1.2.3.4\"".into()
        ]),
        ".spec.externalIPs[=\"1.2.3.4\"]"
    );
}

#[test]
fn writes_through_status_own_status_only() {
    let old = json!({"metadata": {"name": "web"}, "spec": {"type": "ClusterIP"},
                     "status": {"loadBalancer": {}}});
    let mut new = old.clone();
    new["status"] = json!({"loadBalancer": {"ingress": [{"ip": "192.0.2.1"}]}});
    update_status(&mut new, Some(&old), "lb");
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
        &tracking(Subresource::Status),
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
    update(&mut shared, Some(&after), "bob");
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
        update(&mut object, Some(&old), &format!("m{i:02}"));
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
            &tracking(Subresource::Main),
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
    // Upstream's order: Apply entries first.
    assert_eq!(managers, ["kubectl", "before-first-apply"]);
}

#[test]
fn a_status_write_keeps_the_main_resource_managers_and_the_reverse() {
    let mut object = applied(None, web(8080), "alice", false).expect("created");
    object["status"] = json!({});
    let old = object.clone();
    object["status"] = json!({"loadBalancer": {"ingress": [{"ip": "192.0.2.1"}]}});
    update_status(&mut object, Some(&old), "lb");
    assert!(
        owned(&object, "alice").to_string().contains("targetPort"),
        "{object}"
    );
    let old = object.clone();
    object["metadata"]["labels"] = json!({"a": "b"});
    update(&mut object, Some(&old), "labeller");
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

#[test]
fn a_status_write_records_the_labels_it_changes_and_takes_them_over() {
    // The status strategy keeps the request's metadata, so upstream's comparison for a
    // `/status` write covers metadata too (only spec is reset).
    let mut object = json!({"metadata": {"name": "web", "labels": {"a": "1", "b": "1"}},
        "spec": {"type": "ClusterIP"}, "status": {"loadBalancer": {}}});
    update(&mut object, None, "alice");
    let old = object.clone();
    object["metadata"]["labels"]["a"] = json!("2");
    object["spec"]["type"] = json!("NodePort"); // reset by the status strategy: not recorded
    object["status"]["loadBalancer"] = json!({"ingress": [{"ip": "192.0.2.1"}]});
    update_status(&mut object, Some(&old), "lb");
    assert_eq!(
        owned(&object, "lb"),
        json!({"f:metadata": {"f:labels": {"f:a": {}}},
               "f:status": {"f:loadBalancer": {"f:ingress": {}}}})
    );
    assert_eq!(
        owned(&object, "alice"),
        json!({"f:metadata": {"f:labels": {".": {}, "f:b": {}}}, "f:spec": {"f:type": {}}})
    );
}

#[test]
fn a_create_adds_nodes_go_does_not_have_and_keys_sort_as_values() {
    // sessionAffinityConfig is a pointer in Go: new, so it is marked; spec is not.
    let mut object = json!({"metadata": {"name": "web"}, "spec": {
        "ports": [{"port": 443, "protocol": "TCP"}, {"port": 80, "protocol": "TCP"}],
        "sessionAffinity": "ClientIP",
        "sessionAffinityConfig": {"clientIP": {"timeoutSeconds": 60}}}});
    update(&mut object, None, "curl");
    let fields = owned(&object, "curl");
    assert_eq!(
        fields["f:spec"]["f:sessionAffinityConfig"],
        json!({".": {}, "f:clientIP": {".": {}, "f:timeoutSeconds": {}}})
    );
    let keys: Vec<&String> = fields["f:spec"]["f:ports"]
        .as_object()
        .map(|m| m.keys().collect())
        .unwrap_or_default();
    assert_eq!(
        keys,
        [
            ".",
            "k:{\"port\":80,\"protocol\":\"TCP\"}",
            "k:{\"port\":443,\"protocol\":\"TCP\"}"
        ]
    );
    // Labels added later by another manager: the map is new, so it is marked.
    let old = object.clone();
    object["metadata"]["labels"] = json!({"x": "1"});
    update(&mut object, Some(&old), "labeller");
    assert_eq!(
        owned(&object, "labeller"),
        json!({"f:metadata": {"f:labels": {".": {}, "f:x": {}}}})
    );
}

#[test]
fn only_managed_fields_times_are_ignored() {
    let object = |time: &str, replicas: u32, extra: Option<&str>| {
        let mut entry = json!({"manager": "m", "operation": "Update", "time": time});
        if let Some(extra) = extra {
            entry["subresource"] = json!(extra);
        }
        json!({
            "metadata": {"name": "a", "managedFields": [entry]},
            "spec": {"replicas": replicas},
        })
    };
    let old = object("2026-01-01T00:00:00Z", 1, None);
    // Each comparison as well from the stored object as a write reads it.
    for new in [
        object("2026-01-02T00:00:00Z", 1, None),
        object("2026-01-02T00:00:00Z", 2, None),
        object("2026-01-01T00:00:00Z", 1, Some("status")),
        json!({"metadata": {"name": "a"}}),
        json!({"metadata": {"name": "a", "managedFields": []}, "spec": {"replicas": 1}, "status": {}}),
    ] {
        same_from_current(&new, Some(&old), "m", &tracking(Subresource::Main));
    }
    assert!(super::same_ignoring_times(
        &object("2026-01-02T00:00:00Z", 1, None),
        &old
    ));
    assert!(!super::same_ignoring_times(
        &object("2026-01-02T00:00:00Z", 2, None),
        &old
    ));
    assert!(!super::same_ignoring_times(
        &object("2026-01-01T00:00:00Z", 1, Some("status")),
        &old
    ));
    let mut untimed = old.clone();
    untimed["metadata"]["managedFields"][0]
        .as_object_mut()
        .map(|entry| entry.remove("time"));
    assert!(super::same_ignoring_times(&untimed, &old));
    let mut labelled = old.clone();
    labelled["metadata"]["labels"] = json!({"a": "b"});
    assert!(!super::same_ignoring_times(&labelled, &old));
    assert!(!super::same_ignoring_times(&old, &labelled));
}

mod from_current {
    use proptest::prelude::*;
    use serde_json::{Value, json};

    use super::{ResourceInfo, Subresource, Tracking, same_from_current, tracking};

    /// A member no schema names: atomic unless an object.
    fn extra() -> impl Strategy<Value = Option<Value>> {
        prop_oneof![
            Just(None),
            Just(Some(json!(1))),
            Just(Some(json!([1, 2]))),
            Just(Some(json!({"a": 1}))),
            Just(Some(json!({"a": [1]}))),
        ]
    }

    fn managed_fields(owner: Option<&str>) -> Value {
        owner.map_or(Value::Null, |manager| {
            json!([{
                "manager": manager, "operation": "Update", "apiVersion": "v1",
                "time": "2026-01-01T00:00:00Z", "fieldsType": "FieldsV1",
                "fieldsV1": {"f:spec": {"f:type": {}}, "f:metadata": {"f:labels": {}}},
            }])
        })
    }

    fn owner() -> impl Strategy<Value = Option<&'static str>> {
        prop_oneof![Just(None), Just(Some("m")), Just(Some("other"))]
    }

    /// A Service from a few choices, so that two of them share some members and not others
    /// (with `spec`'s members in either order: equal JSON that encodes differently).
    fn service() -> impl Strategy<Value = Value> {
        (
            proptest::collection::btree_map("[ab]", "[xy]", 0..3),
            proptest::collection::vec((79u16..82, prop_oneof!["TCP", "UDP"]), 0..3),
            (proptest::option::of("[ab]"), any::<bool>()),
            0u8..3,
            owner(),
            extra(),
        )
            .prop_map(
                |(labels, ports, (selector, reversed), status, owner, extra)| {
                    let ports: Vec<Value> = ports
                        .into_iter()
                        .map(|(port, protocol)| json!({"port": port, "protocol": protocol}))
                        .collect();
                    let mut spec = serde_json::Map::new();
                    let mut members = vec![
                        ("ports", json!(ports)),
                        (
                            "selector",
                            selector.map_or(Value::Null, |s| json!({"app": s})),
                        ),
                        ("type", json!("ClusterIP")),
                    ];
                    if reversed {
                        members.reverse();
                    }
                    for (key, value) in members {
                        if !value.is_null() {
                            spec.insert(key.into(), value);
                        }
                    }
                    let mut object =
                        json!({"metadata": {"name": "web", "labels": labels}, "spec": spec});
                    match status {
                        1 => object["status"] = json!({"loadBalancer": {}}),
                        2 => {
                            object["status"] =
                                json!({"loadBalancer": {"ingress": [{"ip": "1.2.3.4"}]}})
                        }
                        _ => {}
                    }
                    if owner.is_some() {
                        object["metadata"]["managedFields"] = managed_fields(owner);
                    }
                    if let Some(extra) = extra {
                        object["extra"] = extra;
                    }
                    object
                },
            )
    }

    use k8s_openapi::api::discovery::v1::EndpointSlice;
    const SLICE_SCHEMA: &str = "io.k8s.api.discovery.v1.EndpointSlice";
    static SLICE: ResourceInfo =
        ResourceInfo::of::<EndpointSlice>(&super::ENDPOINT_SLICE, SLICE_SCHEMA);

    /// Entries owning a slice's atomic lists: none, the writing manager's alone, another's
    /// alone, both, or two of the writer's (the lists are compared last only when the writer's
    /// first entry owns them alone).
    fn slice_owners(owners: u8) -> Option<Value> {
        let owning = |manager: &str, fields: Value| {
            json!({
                "manager": manager, "operation": "Update", "apiVersion": "discovery.k8s.io/v1",
                "time": "2026-01-01T00:00:00Z", "fieldsType": "FieldsV1", "fieldsV1": fields,
            })
        };
        let entry = |manager: &str| {
            owning(
                manager,
                json!({"f:endpoints": {}, "f:ports": {}, "f:metadata": {"f:labels": {}}}),
            )
        };
        match owners {
            1 => Some(json!([entry("m")])),
            2 => Some(json!([entry("other")])),
            3 => Some(json!([entry("m"), entry("other")])),
            // Two entries of the writer (Capstan never makes them; another server might).
            4 => Some(json!([
                owning("m", json!({"f:metadata": {"f:labels": {}}})),
                entry("m")
            ])),
            _ => None,
        }
    }

    /// An EndpointSlice from a few choices: its endpoints and ports are atomic lists.
    fn slice() -> impl Strategy<Value = Value> {
        (
            proptest::collection::vec((0u8..3, any::<bool>()), 0..3),
            proptest::option::of(79u16..81),
            (any::<bool>(), proptest::option::of("[xy]")),
            (owner(), 0u8..5),
            extra(),
        )
            .prop_map(|(endpoints, port, (reversed, label), (owner, owners), extra)| {
                let endpoints: Vec<Value> = endpoints
                    .into_iter()
                    .map(|(ip, ready)| {
                        let mut endpoint = json!({"addresses": [format!("10.0.0.{ip}")], "conditions": {"ready": ready}});
                        if reversed {
                            endpoint = json!({"conditions": {"ready": ready}, "addresses": [format!("10.0.0.{ip}")]});
                        }
                        endpoint
                    })
                    .collect();
                let mut object = json!({"metadata": {"name": "web-x"}, "addressType": "IPv4", "endpoints": endpoints});
                if let Some(port) = port {
                    object["ports"] = json!([{"port": port}]);
                }
                if owner.is_some() {
                    object["metadata"]["managedFields"] = managed_fields(owner);
                }
                if let Some(entries) = slice_owners(owners) {
                    object["metadata"]["managedFields"] = entries;
                }
                if let Some(label) = label {
                    object["metadata"]["labels"] = json!({"a": label});
                }
                if let Some(extra) = extra {
                    object["extra"] = extra;
                }
                object
            })
    }

    proptest! {
        /// An update records the same managedFields, and finds the same objects unchanged,
        /// from the stored object as a write reads it as from the whole decoded object.
        #[test]
        fn an_update_from_the_stored_parts_is_the_update_from_the_whole(
            old in service(),
            new in service(),
            status in any::<bool>(),
        ) {
            let tracking = tracking(if status { Subresource::Status } else { Subresource::Main });
            same_from_current(&new, Some(&old), "m", &tracking);
            same_from_current(&old, Some(&old), "m", &tracking);
        }

        /// The same for a kind whose members are atomic lists (compared without decoding).
        #[test]
        fn a_slice_update_from_the_stored_parts_is_the_update_from_the_whole(
            old in slice(),
            new in slice(),
        ) {
            let schema = capstan_machinery::testdata::endpoint_slice();
            assert!(crate::detached::atomic_member(schema, "endpoints"));
            let tracking = Tracking::new(&SLICE, schema, Subresource::Main);
            same_from_current(&new, Some(&old), "m", &tracking);
            same_from_current(&old, Some(&old), "m", &tracking);
        }
    }
}

#[test]
fn a_stored_entry_with_steps_of_any_shape_is_rewritten_without_a_panic() {
    // A client may store any keys in fieldsV1: one byte long, or a multi-byte character
    // where a prefix would end.
    let mut old = json!({"metadata": {"name": "web", "labels": {"a": "1"}, "managedFields": [
        {"manager": "odd", "operation": "Update", "apiVersion": "v1", "fieldsType": "FieldsV1",
         "fieldsV1": {"x": {}, "y": {}, "aé": {}, "f:metadata": {"f:labels": {"f:a": {}}}}}]},
        "spec": {"type": "ClusterIP"}});
    meta::set_meta_str(&mut old, "resourceVersion", "7");
    let mut new = old.clone();
    new["metadata"]["labels"]["a"] = json!("2");
    record_update(
        &mut new,
        Some(&old),
        "kubectl-edit",
        &tracking(Subresource::Main),
    );
    let entries = new["metadata"]["managedFields"]
        .as_array()
        .expect("entries");
    let odd = entries
        .iter()
        .find(|e| e["manager"] == "odd")
        .expect("kept");
    assert_eq!(odd["fieldsV1"], json!({"aé": {}, "x": {}, "y": {}}));
}
