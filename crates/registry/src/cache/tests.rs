//! The watch cache, case by case.

use capstan_machinery::fields::FieldSelector;
use capstan_machinery::labels::LabelSelector;
use capstan_machinery::meta;
use serde_json::json;

use bytes::Bytes;
use serde_json::Value;

use super::{CachedObject, Projection, Selectable};

fn projection() -> Projection {
    Projection::of_objects(|object: &Value| Selectable::new(object, []))
}

/// A cache of `/k/` keeping up to `events` changes and 1 MiB of them.
fn cache(events: usize) -> (tokio::sync::watch::Sender<i64>, super::WatchCache) {
    let (global, receiver) = tokio::sync::watch::channel(0);
    let cache = super::WatchCache::new(
        ("/k/".into(), projection()),
        super::Writer::Anyone,
        receiver,
        super::HistoryLimits {
            events,
            bytes: 1024 * 1024,
        },
    );
    (global, cache)
}

/// `metadata` without its `resourceVersion` and `managedFields` (what partial reads of the
/// metadata see of stored bytes: neither is there).
fn without_version(metadata: &Value) -> Value {
    let mut metadata = metadata.clone();
    if let Some(members) = metadata.as_object_mut() {
        members.remove("resourceVersion");
        members.remove("managedFields");
    }
    metadata
}

/// [`CachedObject::decode_metadata`] of the whole metadata, without its `resourceVersion`.
fn metadata_without_version(object: &CachedObject) -> Value {
    without_version(&object.decode_metadata::<Value>().expect("metadata decodes"))
}

/// [`CachedObject::lean_json`] decodes to the object without `metadata.managedFields` and
/// `resourceVersion` (and without `kind` and `apiVersion`, which partial reads skip).
fn assert_lean(object: &CachedObject, whole: &Value) {
    if !object.holds_stored_bytes() {
        // A re-encoded object is as held.
        assert_eq!(&*object.lean_json(), object.raw_json());
        return;
    }
    let lean: Value = serde_json::from_slice(&object.lean_json()).expect("lean JSON decodes");
    let expected = without_managed_fields(whole);
    let strip = |value: &Value| {
        let mut value = value.clone();
        meta::strip_type_meta(&mut value);
        if let Some(metadata) = value.get_mut("metadata").and_then(Value::as_object_mut) {
            metadata.remove("resourceVersion");
        }
        value
    };
    assert_eq!(strip(&lean), strip(&expected));
    // Stored bytes with managedFields are cut; anything else is the JSON as held.
    let held: Value = serde_json::from_slice(object.raw_json()).expect("held JSON decodes");
    if held["metadata"].get("managedFields").is_none() {
        assert_eq!(&*object.lean_json(), object.raw_json());
    }
}

fn without_managed_fields(object: &Value) -> Value {
    let mut object = object.clone();
    if let Some(metadata) = object.get_mut("metadata").and_then(Value::as_object_mut) {
        metadata.shift_remove("managedFields");
    }
    object
}

/// The same served JSON: byte for byte when the stored bytes are in the order this process
/// writes (`exact`), otherwise as JSON (a value stored in another order, by an earlier
/// version or another writer, is served as stored, and re-encoded in kube-apiserver's order).
fn same_served(exact: bool, a: &[u8], b: &[u8]) {
    if exact {
        assert_eq!(String::from_utf8_lossy(a), String::from_utf8_lossy(b));
    } else {
        let parsed = |json: &[u8]| serde_json::from_slice::<Value>(json).expect("served JSON");
        assert_eq!(parsed(a), parsed(b));
    }
}

/// The cached object served from the stored bytes equals the re-encoded one.
fn same_as_reencoded(stored: &Value) {
    let bytes = Bytes::from(serde_json::to_vec(stored).expect("encodes"));
    // Whether the bytes are what this process would have stored for the object.
    let exact = {
        let mut object = stored.clone();
        meta::strip_type_meta(&mut object);
        let type_meta = (
            stored["apiVersion"].as_str().unwrap_or_default(),
            stored["kind"].as_str().unwrap_or_default(),
        );
        meta::typed_json_bytes(&object, type_meta, true, None) == bytes
    };
    let project = projection();
    let cached = CachedObject::decode("/k".into(), &bytes, 42, &project).expect("decodes");
    // Read as this process's own value (its leading parts found, the rest not checked):
    // served the same.
    let own = CachedObject::decode_written(
        super::Writer::ThisProcess,
        "/k".into(),
        &bytes,
        42,
        &project,
    )
    .expect("decodes");
    let (mut a, mut b) = (Vec::new(), Vec::new());
    cached.write_item(&mut a);
    own.write_item(&mut b);
    assert_eq!(String::from_utf8_lossy(&a), String::from_utf8_lossy(&b));
    assert_eq!(own.object(), cached.object());
    assert_eq!(own.selectable, cached.selectable);
    for object in [&cached, &own] {
        if object.holds_stored_bytes() {
            assert_lean(object, &object.object());
            // The members after metadata, each read from the bytes as it decodes.
            let mut expected = object.object();
            meta::strip_type_meta(&mut expected);
            for (key, value) in expected.as_object().into_iter().flatten() {
                if key != "metadata" {
                    let raw = object.member(&[key.as_str()]).expect("a member");
                    let read: Value = serde_json::from_slice(raw).expect("member decodes");
                    assert_eq!(&read, value, "{key}");
                }
            }
        }
    }
    let mut object = stored.clone();
    let reencoded = CachedObject::from_object("/k".into(), &mut object, 42, &project);
    let (mut a, mut b) = (Vec::new(), Vec::new());
    cached.write_item(&mut a);
    reencoded.write_item(&mut b);
    same_served(exact, &a, &b);
    assert_eq!(cached.item_len(), a.len());
    same_served(
        exact,
        &cached.typed_json("Service", "v1"),
        &reencoded.typed_json("Service", "v1"),
    );
    assert_eq!(cached.object(), reencoded.object());
    assert_eq!(cached.object()["metadata"]["resourceVersion"], "42");
    // A Table row's metadata, and what its cells are read from.
    let (mut a, mut b) = (Vec::new(), Vec::new());
    cached.write_metadata(&mut a);
    reencoded.write_metadata(&mut b);
    same_served(exact, &a, &b);
    let metadata: Value = serde_json::from_slice(&a).expect("metadata is JSON");
    assert_eq!(metadata, cached.object()["metadata"]);
    // What a reader decodes of the metadata alone (the stored bytes' metadata member, when
    // they are held) is what the whole object has, `resourceVersion` aside.
    assert!(!reencoded.holds_stored_bytes());
    for object in [&cached, &reencoded] {
        assert_eq!(metadata_without_version(object), without_version(&metadata));
        // A partial type, as the controllers' watches read: the fields they name, nothing else.
        #[derive(serde::Deserialize, Default, PartialEq, Debug)]
        struct Partial {
            uid: Option<String>,
            generation: Option<i64>,
        }
        let partial: Partial = object.decode_metadata().expect("metadata decodes");
        assert_eq!(
            partial,
            Partial {
                uid: metadata["uid"].as_str().map(String::from),
                generation: metadata["generation"].as_i64(),
            }
        );
    }
    let mut for_rules = Vec::new();
    cached.write_item_for_rules(&mut for_rules);
    let mut for_rules: Value = serde_json::from_slice(&for_rules).expect("item is JSON");
    let mut expected = cached.object();
    // Left out from stored bytes (a re-encoded item may keep it: rules ignore it).
    for object in [&mut for_rules, &mut expected] {
        if let Some(metadata) = object["metadata"].as_object_mut() {
            metadata.shift_remove("managedFields");
        }
    }
    assert_eq!(for_rules, expected);
}

#[test]
fn a_scan_at_an_earlier_revision_undoes_the_later_changes() {
    use capstan_storage::{EventKind, KeyValue};
    let (_global, cache) = cache(1_000);
    let kv = |name: &str, label: &str, revision: i64| KeyValue {
        key: format!("/k/{name}").into(),
        value: Bytes::from(
            serde_json::to_vec(&json!({"metadata": {"name": name, "labels": {"v": label}}}))
                .expect("encodes"),
        ),
        create_revision: revision,
        mod_revision: revision,
        version: 1,
    };
    for (i, name) in ["a", "b", "c", "d"].iter().enumerate() {
        cache.apply(EventKind::Put, &kv(name, "1", i as i64 + 1), None, None);
    }
    // After revision 4: b changes twice, c goes, e comes, a changes.
    cache.apply(EventKind::Put, &kv("b", "2", 5), None, None);
    cache.apply(EventKind::Put, &kv("b", "3", 6), None, None);
    cache.apply(EventKind::Delete, &kv("c", "", 7), None, None);
    cache.apply(EventKind::Put, &kv("e", "1", 8), None, None);
    cache.apply(EventKind::Put, &kv("a", "2", 9), None, None);
    let seen = |start: Option<&str>, revision: i64| {
        let mut out = Vec::new();
        let reached = cache.scan_at("/k/", start, revision, |o| {
            let object = o.object();
            out.push(format!(
                "{}={}@{}",
                object["metadata"]["name"].as_str().unwrap_or_default(),
                object["metadata"]["labels"]["v"]
                    .as_str()
                    .unwrap_or_default(),
                o.revision
            ));
            true
        });
        reached.then_some(out)
    };
    assert_eq!(
        seen(None, 4).expect("in the history"),
        ["a=1@1", "b=1@2", "c=1@3", "d=1@4"]
    );
    assert_eq!(
        seen(Some("/k/b"), 6).expect("in the history"),
        ["c=1@3", "d=1@4"]
    );
    assert_eq!(
        seen(None, 9).expect("current"),
        ["a=2@9", "b=3@6", "d=1@4", "e=1@8"]
    );
    assert_eq!(seen(None, 10), None, "not reached yet");
    assert_eq!(seen(None, -1), None, "before the history");
}

#[test]
fn the_history_is_bounded_in_bytes_and_an_overrun_watcher_gets_nothing_stale() {
    use capstan_storage::{EventKind, KeyValue};
    let (_global, cache) = cache(100_000);
    let subscription = cache.subscribe(false, 0).expect("subscribes");
    let mut receiver = subscription.receiver;
    let big = "x".repeat(100 * 1024);
    for revision in 1..=100 {
        let object = json!({"metadata": {"name": "a", "annotations": {"a": big}}});
        let kv = KeyValue {
            key: "/k/a".into(),
            value: Bytes::from(serde_json::to_vec(&object).expect("encodes")),
            create_revision: 1,
            mod_revision: revision,
            version: revision,
        };
        cache.apply(EventKind::Put, &kv, None, None);
    }
    let state = cache.read();
    // 100 changes of ~100 KiB each would be 10 MiB (twice that with their watch lines).
    assert!(
        state.history_bytes <= 1024 * 1024,
        "{}",
        state.history_bytes
    );
    assert!(state.history.len() < 10, "{}", state.history.len());
    assert!(state.oldest > 90);
    drop(state);
    // The channel holds no object alive: the first changes are gone for a slow watcher.
    match receiver.try_recv() {
        Ok(super::CacheMessage::Event(event)) => assert!(event.upgrade().is_none()),
        other => panic!("expected an event, got {other:?}"),
    }
}

/// What this process stores is served byte for byte as the object re-encoded would be: in
/// kube-apiserver's order, `resourceVersion` after `uid`.
#[test]
fn stored_values_in_kube_apiservers_order_are_served_as_reencoded() {
    let object = json!({"metadata": {"labels": {"k": "v"}, "uid": "u-1", "name": "a",
        "managedFields": [{"manager": "m"}], "namespace": "n"}, "spec": {"type": "ClusterIP"}});
    let schema = capstan_machinery::testdata::service();
    let stored = meta::typed_json_bytes(&object, ("v1", "Service"), true, schema);
    let stored: Value = serde_json::from_slice(&stored).expect("stored JSON");
    same_as_reencoded(&stored);
    let bytes = Bytes::from(serde_json::to_vec(&stored).expect("encodes"));
    let cached = CachedObject::decode("/k".into(), &bytes, 42, &projection()).expect("decodes");
    assert!(cached.holds_stored_bytes());
    assert_eq!(
        String::from_utf8_lossy(&cached.typed_json("Service", "v1")),
        r#"{"kind":"Service","apiVersion":"v1","metadata":{"name":"a","namespace":"n","uid":"u-1","resourceVersion":"42","labels":{"k":"v"},"managedFields":[{"manager":"m"}]},"spec":{"type":"ClusterIP"}}"#
    );
}

#[test]
fn stored_values_are_served_without_reencoding() {
    same_as_reencoded(&json!({"kind": "Service", "apiVersion": "v1",
        "metadata": {"name": "a", "namespace": "n", "annotations": {"x": "{\"y\":[1,\"}\"]}"}},
        "spec": {"ports": [{"port": 80}], "selector": {"a": "b"}}, "status": {"loadBalancer": {}}}));
    same_as_reencoded(&json!({"kind": "Service", "apiVersion": "v1", "metadata": {}, "spec": {}}));
    // Held as stored (so a reader of the metadata reads that member alone), with the fields the
    // controllers' watches read.
    let shaped = json!({"kind": "Service", "apiVersion": "v1",
        "metadata": {"name": "a", "uid": "u-1", "generation": 3, "finalizers": ["f"]},
        "spec": {"selector": {"a": "b"}}});
    same_as_reencoded(&shaped);
    let bytes = Bytes::from(serde_json::to_vec(&shaped).expect("encodes"));
    let cached = CachedObject::decode("/k".into(), &bytes, 42, &projection()).expect("decodes");
    assert!(cached.holds_stored_bytes());
    same_as_reencoded(
        &json!({"kind": "Service", "apiVersion": "v1", "spec": {"a": [true, null, 1.5e3]}, "metadata": {"name": "z\\\"q"}}),
    );
    // managedFields first, in the middle, last and alone.
    let managed = json!([{"manager": "m", "fieldsV1": {"f:spec": {"f:a": {}}}}]);
    for metadata in [
        json!({"managedFields": managed, "name": "a", "labels": {"k": "v"}}),
        json!({"name": "a", "managedFields": managed, "labels": {"k": "v"}}),
        json!({"name": "a", "labels": {"k": "v"}, "managedFields": managed}),
        json!({"managedFields": managed}),
    ] {
        same_as_reencoded(
            &json!({"kind": "Service", "apiVersion": "v1", "metadata": metadata, "spec": {}}),
        );
    }
    // Other shapes take the re-encoding path and still agree.
    same_as_reencoded(&json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "a"}}));
    same_as_reencoded(
        &json!({"kind": "Service", "apiVersion": "v1", "metadata": {"name": "a", "resourceVersion": "7"}}),
    );
    same_as_reencoded(&json!({"kind": "Service", "apiVersion": "v1"}));
    same_as_reencoded(&json!({"kind": "Service", "apiVersion": "v1", "metadata": "odd"}));
    same_as_reencoded(
        &json!({"kind": "Service", "apiVersion": "v1", "metadata": {"name": "a", "resourceVersion": null}}),
    );
    // Stored as another type: served with the type asked for.
    same_as_reencoded(&json!({"kind": "Endpoints", "apiVersion": "v1", "metadata": {"name": "a"}}));
    same_as_reencoded(&json!({"kind": "Service", "apiVersion": "v2", "metadata": {}}));
}

/// Whether a test value repeats a top-level member.
fn served_repeats(text: &[u8]) -> bool {
    let text = String::from_utf8_lossy(text);
    text.matches("\"metadata\":").count() > 1 || text.matches("\"spec\":").count() > 1
}

/// Stored bytes written by hand: what the cache serves is what a full decode reads, and
/// bytes that are not JSON are refused, however far in the fault is.
#[test]
fn stored_bytes_are_checked_while_their_parts_are_found() {
    // Projected from the metadata member alone, as a kind without selectable fields is.
    let project = Projection::new(
        |object| Selectable::new(object, []),
        |metadata, _| {
            let metadata: Value = serde_json::from_slice(metadata).ok()?;
            Some(Selectable::new(&json!({ "metadata": metadata }), []))
        },
    );
    let decode =
        |text: &[u8]| CachedObject::decode("/k".into(), &Bytes::copy_from_slice(text), 7, &project);
    // A value of another shape than this process's encoding is read as any value is, even
    // when it is said to be its own.
    let own = |text: &[u8]| {
        CachedObject::decode_written(
            super::Writer::ThisProcess,
            "/k".into(),
            &Bytes::copy_from_slice(text),
            7,
            &project,
        )
    };
    for text in [
        &br#"{"kind":"Service","apiVersion":"v1" , "metadata" : {"name":"a"} ,"spec":{}}"#[..],
        br#"{"kind":"Service","apiVersion":"v1","metadata":{"name":"a","labels":{"x":"1"}},"metadata":{"name":"b"}}"#,
        br#"{"kind":"Service","apiVersion":"v1","metadata":{"name":"e"},"spec":{"a":1},"spec":{}}"#,
        br#"{"kind":"Service","apiVersion":"v1","meta\u0064ata":{"name":"c"},"spec":{"x":"\"}"}}"#,
        br#" {"kind":"Service","apiVersion":"v1","metadata":{"name":"d"}}"#,
        br#"{"kind":"Service","apiVersion":"v1","metadata":{"name":"f","resource\u0056ersion":"3"}}"#,
        // managedFields with space around it, first, last, alone and with its name escaped.
        br#"{"kind":"Service","apiVersion":"v1","metadata":{ "managedFields" : [ {"a":"],}"} ] , "name":"g" },"spec":{}}"#,
        br#"{"kind":"Service","apiVersion":"v1","metadata":{"name":"h" , "managedFields":[{}] }}"#,
        br#"{"kind":"Service","apiVersion":"v1","metadata":{ "managedFields":[] }}"#,
        br#"{"kind":"Service","apiVersion":"v1","metadata":{"name":"i","managed\u0046ields":[{}],"uid":"u"}}"#,
        // Repeated (the last one is the one read).
        br#"{"kind":"Service","apiVersion":"v1","metadata":{"name":"j","managedFields":[{"a":1}],"managed\u0046ields":[]}}"#,
    ] {
        let cached = decode(text).expect("valid JSON is cached");
        // (Repeated members aside: this process never writes those.)
        if !served_repeats(text) {
            let own = own(text).expect("valid JSON is cached");
            assert_eq!(own.object(), cached.object());
            assert_eq!(own.typed_json("Service", "v1"), cached.typed_json("Service", "v1"));
        }
        let mut expected: Value = serde_json::from_slice(text).expect("JSON");
        meta::strip_type_meta(&mut expected);
        meta::set_meta_str(&mut expected, "resourceVersion", "7");
        assert_eq!(
            cached.object(),
            expected,
            "{}",
            String::from_utf8_lossy(text)
        );
        assert_lean(&cached, &expected);
        let name = expected["metadata"]["name"].as_str().unwrap_or_default();
        assert_eq!(cached.selectable.name(), name);
        assert_eq!(cached.selectable.label("x"), None);
        assert_eq!(
            metadata_without_version(&cached),
            without_version(&expected["metadata"]),
            "{}",
            String::from_utf8_lossy(text)
        );
        // What is served is what was read, each member once.
        let served = String::from_utf8_lossy(&cached.typed_json("Service", "v1")).into_owned();
        for member in ["\"metadata\"", "\"spec\""] {
            assert!(served.matches(member).count() <= 1, "{served}");
        }
        let typed = meta::with_type_meta(&expected, "v1", "Service");
        assert_eq!(serde_json::from_str::<Value>(&served).ok(), Some(typed));
        assert_eq!(served.matches("ersion\":").count(), 2, "{served}");
    }
    for text in [
        &br#"{"kind":"Service","apiVersion":"v1","metadata":{"name":"a"},"spec":{"x":tru}}"#[..],
        br#"{"kind":"Service","apiVersion":"v1","metadata":{"name":"a"},"spec":[1,}}"#,
        br#"{"kind":"Service","apiVersion":"v1","metadata":{"name":"a"}}}"#,
        b"{\"kind\":\"Service\",\"apiVersion\":\"v1\",\"metadata\":{\"name\":\"\xff\"}}",
    ] {
        assert!(decode(text).is_none(), "{}", String::from_utf8_lossy(text));
    }
}

#[test]
fn selectable_answers_selectors_as_the_object_would() {
    let object = json!({
        "metadata": {"name": "web", "namespace": "prod", "labels": {"tier": "front", "app": "web", "odd": 1}},
        "spec": {"type": "NodePort"},
    });
    let s = Selectable::new(&object, [("spec.type", "NodePort".to_string())]);
    assert_eq!((s.name(), s.namespace()), ("web", "prod"));
    assert_eq!(s.label("app"), Some("web"));
    assert_eq!(s.label("tier"), Some("front"));
    assert_eq!(s.label("odd"), None, "labels are strings");
    assert_eq!(s.field("spec.type"), Some("NodePort"));
    assert_eq!(s.field("spec.clusterIP"), None);
    let selects = |labels: &str, fields: &str| {
        s.selected_by(
            &LabelSelector::parse(labels).expect("label selector"),
            &FieldSelector::parse(fields).expect("field selector"),
        )
    };
    assert!(selects(
        "app=web,tier in (front,back)",
        "metadata.name=web,spec.type=NodePort"
    ));
    assert!(selects("!missing", "metadata.namespace!=dev"));
    assert!(!selects("app=db", ""));
    assert!(!selects("", "spec.type=ClusterIP"));
    assert!(!selects("", "metadata.name=other"));
}

/// Any JSON value, with strings that need escapes and keys like the scanner's landmarks.
fn any_json() -> impl proptest::strategy::Strategy<Value = Value> {
    use proptest::prelude::*;
    let text = "[ -~\u{e9}\u{1F600}\\\\\"]{0,10}".prop_map(Value::from);
    // null, a boolean or a number, from one draw.
    let scalar = (any::<i64>(), 0..3u8).prop_map(|(n, pick)| match pick {
        0 => Value::Null,
        1 => Value::Bool(n % 2 == 0),
        _ => Value::from(n),
    });
    prop_oneof![text, scalar].prop_recursive(3, 24, 4, |inner| {
        let member = ("[a-zF\"\\\\{}:,]{0,8}", inner.clone());
        let object = proptest::collection::vec(member, 0..4)
            .prop_map(|members| Value::Object(members.into_iter().collect()));
        prop_oneof![
            proptest::collection::vec(inner, 0..4).prop_map(Value::from),
            object
        ]
    })
}

/// Members of a metadata object: managedFields, resourceVersion and name among others, with
/// any values.
fn metadata_members() -> impl proptest::strategy::Strategy<Value = Vec<(String, Value)>> {
    members_of(&["managedFields", "resourceVersion", "name"])
}

/// [`metadata_members`] with all those before `resourceVersion` in `ObjectMeta`'s order
/// (`name` to `uid`, which decide where it goes in).
fn metadata_members_placed() -> impl proptest::strategy::Strategy<Value = Vec<(String, Value)>> {
    members_of(&[
        "managedFields",
        "resourceVersion",
        "name",
        "generateName",
        "namespace",
        "selfLink",
        "uid",
        "labels",
    ])
}

fn members_of(
    known: &[&'static str],
) -> impl proptest::strategy::Strategy<Value = Vec<(String, Value)>> + use<> {
    use proptest::strategy::Strategy;
    let known = proptest::sample::select(known.to_vec()).prop_map(str::to_string);
    let key = proptest::prop_oneof![known, "[a-zA-Z\\\\\"]{1,8}"];
    proptest::collection::vec((key, any_json()), 0..6)
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(256))]

    /// Stored objects of any content, with managedFields anywhere in metadata or nowhere:
    /// what the cache serves and what partial readers decode agree with a full decode.
    #[test]
    fn any_stored_object_is_read_as_a_full_decode_reads_it(
        members in metadata_members(),
        spec in any_json(),
    ) {
        let metadata: serde_json::Map<String, Value> = members
            .into_iter()
            .filter(|(key, _)| key != "resourceVersion")
            .collect();
        same_as_reencoded(&json!({"kind": "Service", "apiVersion": "v1", "metadata": metadata, "spec": spec}));
    }
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(256))]

    /// Where the encoder says the stored JSON's parts are is where a scan of the bytes finds
    /// them, with managedFields anywhere in metadata or nowhere, and `resourceVersion` (which
    /// the stored form leaves out) anywhere: what a write's hint tells the cache is what
    /// reading the bytes would.
    #[test]
    fn the_encoders_layout_is_where_a_scan_finds_the_parts(
        members in metadata_members_placed(),
        spec in any_json(),
    ) {
        let metadata: serde_json::Map<String, Value> = members.into_iter().collect();
        let object = json!({"metadata": metadata, "spec": spec});
        let service = capstan_machinery::testdata::service();
        for schema in [None, service] {
            let (bytes, layout) =
                meta::typed_json_bytes_laid_out(&object, ("v1", "Service"), true, &|_| None, schema);
            let bytes = Bytes::from(bytes);
            let layout = layout.expect("a metadata object is laid out");
            let scanned = super::json::Stored::locate_own(bytes.clone()).expect("scans");
            let told = super::json::Stored::laid_out(bytes.clone(), &layout).expect("fits");
            proptest::prop_assert_eq!(told, scanned);
        }
    }
}

/// A write's hint gives the object the cache would have read from the bytes; a hint that
/// does not fit the bytes is not taken.
#[test]
fn a_hinted_write_is_cached_as_the_read_one_is() {
    let object = json!({"metadata": {"name": "a", "namespace": "n", "labels": {"k": "v"},
        "managedFields": [{"manager": "m"}]}, "spec": {"type": "ClusterIP"}});
    let (bytes, layout) =
        meta::typed_json_bytes_laid_out(&object, ("v1", "Service"), true, &|_| None, None);
    let bytes = Bytes::from(bytes);
    let layout = layout.expect("laid out");
    let written = |layout| {
        capstan_storage::Hint::new(super::Written {
            layout,
            selectable: Selectable::new(&object, []),
        })
    };
    let decode = |hint: Option<&capstan_storage::Hint>| {
        CachedObject::decode_hinted(
            super::Writer::ThisProcess,
            "/k".into(),
            &bytes,
            9,
            &projection(),
            hint,
        )
        .expect("decodes")
    };
    let (read, hinted) = (decode(None), decode(Some(&written(layout.clone()))));
    assert_eq!(hinted.selectable, read.selectable);
    assert_eq!(hinted.object(), read.object());
    assert!(hinted.holds_stored_bytes());
    // A layout of other bytes, or off by one, is refused (and the bytes read instead).
    let mut other = layout.clone();
    other.len += 1;
    assert!(super::json::Stored::laid_out(bytes.clone(), &other).is_none());
    let mut off = layout;
    off.metadata_start += 1;
    assert!(super::json::Stored::laid_out(bytes.clone(), &off).is_none());
    assert_eq!(decode(Some(&written(off))).object(), read.object());
    // A hint of another kind is no hint.
    assert_eq!(
        decode(Some(&capstan_storage::Hint::new(7u8))).object(),
        read.object()
    );
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(256))]

    /// A member found in the bytes is the one a full decode has at that path, for the JSON
    /// itself and for a cached object holding it (stored bytes or re-encoded); a member of
    /// `metadata` is not looked for in a cached object.
    #[test]
    fn a_member_found_in_the_bytes_is_the_decoded_one(
        members in metadata_members(),
        spec in any_json(),
        step in proptest::prop_oneof![
            proptest::strategy::Just("selector".to_string()),
            "[a-zF\"\\\\{}:,]{0,3}",
        ],
    ) {
        let metadata: serde_json::Map<String, Value> = members.into_iter().collect();
        let object = json!({"kind": "Service", "apiVersion": "v1", "metadata": metadata,
            "spec": spec, "status": {"spec": 1}});
        let bytes = Bytes::from(serde_json::to_vec(&object).expect("encodes"));
        let decoded = object["spec"].get(&step).map(Value::to_string);
        let found = |raw: Option<&[u8]>| {
            raw.map(|r| serde_json::from_slice::<Value>(r).expect("valid").to_string())
        };
        let path = ["spec", step.as_str()];
        proptest::prop_assert_eq!(found(super::member(&bytes, &path)), decoded.clone());
        let cached = CachedObject::decode("/k".into(), &bytes, 3, &projection()).expect("decodes");
        proptest::prop_assert_eq!(found(cached.member(&path)), decoded);
        proptest::prop_assert_eq!(cached.member(&["metadata"]).is_some(), !cached.holds_stored_bytes());
    }
}
