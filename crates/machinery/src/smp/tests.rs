//! Strategic merge patch, case by case as apimachinery's tests have them.

use super::*;
use serde_json::json;

fn service() -> Option<&'static Value> {
    crate::testdata::service()
}

fn ports(out: &Value) -> Vec<i64> {
    out["spec"]["ports"]
        .as_array()
        .map(|ports| ports.iter().filter_map(|p| p["port"].as_i64()).collect())
        .unwrap_or_default()
}

fn patched(original: Value, patch: Value) -> Value {
    apply(original.clone(), &patch, service()).expect("applies")
}

#[test]
fn a_new_list_item_goes_before_the_live_ones_unless_a_live_patch_item_leads() {
    // Upstream's mergeSortedSlice: the example, a port added to one port.
    let one = json!({"spec": {"ports": [{"port": 80}]}});
    let out = patched(one.clone(), json!({"spec": {"ports": [{"port": 443}]}}));
    assert_eq!(ports(&out), [443, 80]);
    let two = json!({"spec": {"ports": [{"port": 80}, {"port": 81}]}});
    let out = patched(
        two.clone(),
        json!({"spec": {"ports": [{"port": 81, "name": "b"}, {"port": 443}]}}),
    );
    assert_eq!(ports(&out), [80, 81, 443]);
    assert_eq!(out["spec"]["ports"][1]["name"], "b");
    let out = patched(
        two,
        json!({"spec": {"ports": [{"port": 443}, {"port": 81}]}}),
    );
    assert_eq!(ports(&out), [443, 80, 81]);
    // Items merged in place keep their fields; the patch's order wins among its items.
    let out = patched(
        json!({"spec": {"ports": [{"port": 80, "targetPort": 8080}]}}),
        json!({"spec": {"ports": [{"port": 443}, {"port": 80, "name": "http"}]}}),
    );
    assert_eq!(
        out["spec"]["ports"],
        json!([{"port": 443}, {"port": 80, "targetPort": 8080, "name": "http"}])
    );
}

#[test]
fn primitive_merge_lists_put_new_values_first_and_drop_duplicates() {
    let live = json!({"metadata": {"finalizers": ["a", "b"]}});
    let out = patched(live.clone(), json!({"metadata": {"finalizers": ["c"]}}));
    assert_eq!(out["metadata"]["finalizers"], json!(["c", "a", "b"]));
    let out = patched(
        live.clone(),
        json!({"metadata": {"finalizers": ["b", "c"]}}),
    );
    assert_eq!(out["metadata"]["finalizers"], json!(["a", "b", "c"]));
    let out = patched(
        live,
        json!({"metadata": {"$deleteFromPrimitiveList/finalizers": ["a"], "finalizers": ["c"]}}),
    );
    assert_eq!(out["metadata"]["finalizers"], json!(["c", "b"]));
}

#[test]
fn lists_without_a_strategy_are_replaced_and_maps_merge() {
    let out = patched(
        json!({"metadata": {"labels": {"a": "1"}}, "spec": {"externalIPs": ["1.1.1.1"]}}),
        json!({"metadata": {"labels": {"b": "2"}}, "spec": {"externalIPs": ["2.2.2.2"]}}),
    );
    assert_eq!(out["metadata"]["labels"], json!({"a": "1", "b": "2"}));
    assert_eq!(out["spec"]["externalIPs"], json!(["2.2.2.2"]));
}

#[test]
fn directives_delete_replace_retain_and_order() {
    let live =
        json!({"spec": {"ports": [{"port": 80}, {"port": 81}], "selector": {"x": "1", "y": "2"}}});
    let out = patched(
        live.clone(),
        json!({"spec": {"ports": [{"port": 80, "$patch": "delete"}], "selector": {"$patch": "replace", "z": "3"}}}),
    );
    assert_eq!(ports(&out), [81]);
    assert_eq!(out["spec"]["selector"], json!({"z": "3"}));
    let out = patched(
        live.clone(),
        json!({"spec": {"ports": [{"$patch": "replace"}, {"port": 9}]}}),
    );
    assert_eq!(ports(&out), [9]);
    // $setElementOrder wins over both the patch's and the live order.
    let out = patched(
        live.clone(),
        json!({"spec": {"$setElementOrder/ports": [{"port": 81}, {"port": 80}], "ports": [{"port": 80, "name": "a"}]}}),
    );
    assert_eq!(
        out["spec"]["ports"],
        json!([{"port": 81}, {"port": 80, "name": "a"}])
    );
    // kubectl apply's patch: the manifest names only port 80; 443 (added by a patch
    // earlier, so first) stays where it is.
    let out = patched(
        json!({"spec": {"ports": [{"port": 443}, {"port": 80, "targetPort": 8080}]}}),
        json!({"spec": {"$setElementOrder/ports": [{"port": 80}], "ports": [{"port": 80, "targetPort": 9090}]}}),
    );
    assert_eq!(ports(&out), [443, 80]);
    assert_eq!(out["spec"]["ports"][1]["targetPort"], 9090);
    // An empty order list leaves every item to the live order (Go's stable sort, with
    // the new item unranked).
    let out = patched(
        json!({"spec": {"ports": [{"port": 80}]}}),
        json!({"spec": {"$setElementOrder/ports": [], "ports": [{"port": 443}]}}),
    );
    assert_eq!(ports(&out), [80, 443]);
    let out = patched(
        live,
        json!({"spec": {"selector": {"$retainKeys": ["y", "z"], "z": "3"}}}),
    );
    assert_eq!(out["spec"]["selector"], json!({"y": "2", "z": "3"}));
}

fn refused(original: Value, patch: Value) -> SmpError {
    apply(original.clone(), &patch, service()).expect_err("refused")
}

#[test]
fn errors_are_upstreams() {
    let live = json!({"spec": {"ports": [{"port": 80}], "selector": {"a": "1"}}});
    let err = refused(
        json!({"spec": {"ports": []}}),
        json!({"spec": {"ports": [{"name": "x", "nodePort": 30000}]}}),
    );
    assert_eq!(
        err.message,
        "map: map[name:x nodePort:30000] does not contain declared merge key: port"
    );
    assert_eq!(err.kind, SmpErrorKind::Internal);
    let err = refused(
        live.clone(),
        json!({"spec": {"selector": {"$retainKeys": ["a"], "b": "2"}}}),
    );
    assert_eq!(
        (err.message.as_str(), err.kind),
        (
            "invalid patch format of retainKeys",
            SmpErrorKind::BadRequest
        )
    );
    let err = refused(
        json!({"metadata": {"finalizers": ["a"]}}),
        json!({"metadata": {"$deleteFromPrimitiveListfinalizers": ["a"]}}),
    );
    assert_eq!(err.message, "invalid patch format of primitive list");
    let err = refused(
        live.clone(),
        json!({"spec": {"$setElementOrder/ports": "x"}}),
    );
    assert_eq!(
        (err.message.as_str(), err.kind),
        (
            "expected a []interface {}, but received a string",
            SmpErrorKind::Internal
        )
    );
    let err = refused(
        live.clone(),
        json!({"spec": {"$setElementOrder/ports": [{"port": 81}], "ports": [{"port": 80}]}}),
    );
    assert!(err.message.starts_with("The order in patch list:\n[map[port:80]]\n doesn't match $setElementOrder list:\n[map[port:81]]"), "{}", err.message);
    let err = refused(
        json!({"metadata": {"finalizers": []}}),
        json!({"metadata": {"finalizers": [["b"]]}}),
    );
    assert_eq!(err.kind, SmpErrorKind::Unprocessable);
    let err = refused(
        json!({"metadata": {"finalizers": ["a"]}}),
        json!({"metadata": {"finalizers": [["b"]]}}),
    );
    assert_eq!(
        err.message,
        "list element types are not identical: [[a] [[b]]]"
    );
    let err = refused(
        live.clone(),
        json!({"spec": {"ports": [{"port": 9, "$patch": "merge"}]}}),
    );
    assert_eq!(
        err.message,
        "merging lists cannot yet be specified in the patch"
    );
    let err = refused(live, json!({"spec": {"$patch": "explode"}}));
    assert_eq!(
        err.message,
        "Unknown patch type: explode in map: map[$patch:explode]"
    );
    assert_eq!(go_format(&json!(1_000_000.5)), "1.0000005e+06");
    assert_eq!(go_format(&json!(0.25)), "0.25");
}

#[test]
fn long_lists_merge_in_linear_time() {
    // Long lists against long lists (quadratic scans took minutes at 200,000; the time is
    // measured by `capstan-bench abuse`, not asserted here).
    let stored: Vec<Value> = (0..50_000).map(|i| json!(format!("a{i}"))).collect();
    let added: Vec<Value> = (0..50_000).map(|i| json!(format!("b{i}"))).collect();
    let original = json!({"metadata": {"finalizers": stored}});
    let patch = json!({"metadata": {"finalizers": added,
        "$deleteFromPrimitiveList/finalizers": (0..25_000).map(|i| json!(format!("a{i}"))).collect::<Vec<_>>()}});
    let out = patched(original, patch);
    assert_eq!(
        out["metadata"]["finalizers"].as_array().map(Vec::len),
        Some(75_000)
    );
    let ports: Vec<Value> = (0..5_000)
        .map(|i| json!({"port": i, "name": format!("p{i}")}))
        .collect();
    let order: Vec<Value> = (0..5_000).rev().map(|i| json!({"port": i})).collect();
    let reversed: Vec<Value> = ports.iter().rev().cloned().collect();
    let patch = json!({"spec": {"ports": reversed, "$setElementOrder/ports": order}});
    let out = patched(json!({"spec": {"ports": ports}}), patch);
    assert_eq!(out["spec"]["ports"][0]["port"], 4_999);
    assert_eq!(out["spec"]["ports"][4_999]["port"], 0);
}

#[test]
fn go_stable_sort_is_stable_and_sorts() {
    let mut items: Vec<(u32, usize)> = (0..1_000).map(|i| ((i * 7919 % 13) as u32, i)).collect();
    go_stable_sort(&mut items, |a, b| a.0 < b.0);
    assert!(
        items
            .windows(2)
            .all(|w| w[0].0 < w[1].0 || (w[0].0 == w[1].0 && w[0].1 < w[1].1))
    );
}

#[test]
fn value_keys_ignore_object_key_order() {
    assert_eq!(
        value_key(&json!({"a": 1, "b": [2, {"d": 1, "c": 2}]})),
        value_key(&json!({"b": [2, {"c": 2, "d": 1}], "a": 1}))
    );
    assert_ne!(value_key(&json!("1")), value_key(&json!(1)));
}
