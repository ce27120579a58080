//! A controller's typed writes (`update_typed`, `patch_typed`) on the embedded store: the
//! rules are handed the typed objects instead of decoding them from JSON, and must see what
//! the JSON says (the metadata the registry gives the object, the stored object it replaces).

use capstan_registry::{ReadAt, Registry, Subresource, WriteOptions};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use serde_json::json;

mod support;

/// The EndpointSlice registry of a fresh embedded store (kept alive by the returned dir).
async fn slices() -> (tempfile::TempDir, Registry) {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let registry = support::registries(dir.path()).await;
    let slices = registry("EndpointSlice");
    (dir, slices)
}

/// Patches the slice `s` as a controller does, with `change`.
async fn patch(
    slices: &Registry,
    change: impl Fn(&mut EndpointSlice),
) -> Result<serde_json::Value, capstan_machinery::ApiError> {
    let options = controller();
    slices
        .patch_typed("ns", "s", &options, Subresource::Main, |stored| {
            let mut slice = EndpointSlice::clone(stored);
            change(&mut slice);
            Ok(slice)
        })
        .await
}

/// Creates the slice `s` (at 10.0.0.1) as the controller does; the object created.
async fn create(slices: &Registry) -> serde_json::Value {
    slices
        .create("ns", slice("10.0.0.1"), &controller())
        .await
        .expect("created")
}

fn controller() -> WriteOptions {
    WriteOptions {
        dry_run: false,
        field_manager: "kube-controller-manager".into(),
        applied: false,
    }
}

fn slice(address: &str) -> serde_json::Value {
    json!({"metadata": {"name": "s", "labels": {"kubernetes.io/service-name": "web"}},
           "addressType": "IPv4",
           "endpoints": [{"addresses": [address], "conditions": {"ready": true}}],
           "ports": [{"name": "http", "port": 80, "protocol": "TCP"}]})
}

/// [`slice`] as a controller holds it.
fn typed_slice(address: &str) -> EndpointSlice {
    serde_json::from_value(slice(address)).expect("a typed slice")
}

fn set_address(slice: &mut EndpointSlice, address: &str) {
    if let Some(endpoint) = slice.endpoints.iter_mut().flatten().next() {
        endpoint.addresses = vec![address.to_string()];
    }
}

#[tokio::test]
async fn a_typed_update_without_system_metadata_keeps_the_stored_and_bumps_the_generation() {
    let (_dir, slices) = slices().await;
    let created = create(&slices).await;
    // As a controller builds it: no uid, no creation time, a stale generation; a new label
    // and a new address.
    let mut typed = typed_slice("10.0.0.2");
    typed.metadata.generation = Some(7);
    typed.metadata.resource_version = created["metadata"]["resourceVersion"]
        .as_str()
        .map(str::to_string);
    typed
        .metadata
        .labels
        .get_or_insert_with(Default::default)
        .insert("extra".into(), "1".into());
    let (updated, _) = slices
        .update_typed("ns", "s", &typed, &controller(), Subresource::Main)
        .await
        .expect("updated");
    assert_eq!(updated["metadata"]["uid"], created["metadata"]["uid"]);
    assert_eq!(
        updated["metadata"]["creationTimestamp"],
        created["metadata"]["creationTimestamp"]
    );
    assert_eq!(updated["metadata"]["generation"], 2, "{updated}");
    assert_eq!(updated["metadata"]["labels"]["extra"], "1");
    assert_eq!(updated["endpoints"][0]["addresses"][0], "10.0.0.2");
}

#[tokio::test]
async fn a_typed_patch_is_validated_against_the_stored_object() {
    let (_dir, slices) = slices().await;
    create(&slices).await;
    let refused = patch(&slices, |slice| {
        slice.address_type = "IPv6".into();
        set_address(slice, "2001:db8::1");
    })
    .await
    .expect_err("addressType is immutable");
    assert_eq!(refused.code, 422);
    assert!(
        refused
            .message
            .contains("addressType: Invalid value: \"IPv6\": field is immutable"),
        "{}",
        refused.message
    );
    let patched = patch(&slices, |slice| set_address(slice, "10.0.0.3"))
        .await
        .expect("patched");
    assert_eq!(patched["metadata"]["generation"], 2);
    // A typed patch returns the object without its atomic lists (its caller has them).
    assert_eq!(patched.get("endpoints"), None);
    let stored = slices
        .get("ns", "s", capstan_registry::ReadAt::Latest)
        .await
        .expect("stored");
    assert_eq!(stored["endpoints"][0]["addresses"][0], "10.0.0.3");
}

/// A typed update keeps the slice's endpoints and ports as the JSON they encode to: what is
/// stored is what the same update stores when they are made JSON trees, byte for byte.
#[tokio::test]
async fn a_typed_update_stores_its_lists_as_a_json_update_would() {
    let (_dir, slices) = slices().await;
    let mut stored = Vec::new();
    for typed_write in [false, true] {
        let created = create(&slices).await;
        let mut new = typed_slice("10.0.0.2");
        new.endpoints.get_or_insert_with(Vec::new).push(
            serde_json::from_value(json!({"addresses": ["10.0.0.9"],
                "conditions": {"ready": false, "serving": true}, "nodeName": "n1",
                "targetRef": {"kind": "Pod", "name": "p\"q", "namespace": "ns"}}))
            .expect("an endpoint"),
        );
        let written = if typed_write {
            slices
                .update_typed_over("ns", "s", (&new, None), &controller(), Subresource::Main)
                .await
        } else {
            let mut json = serde_json::to_value(&new).expect("encodes");
            json["metadata"]["resourceVersion"] = created["metadata"]["resourceVersion"].clone();
            slices
                .update("ns", "s", json, &controller(), Subresource::Main)
                .await
        };
        written.expect("updated");
        let mut object = slices
            .get("ns", "s", capstan_registry::ReadAt::Latest)
            .await
            .expect("stored");
        for volatile in [
            "resourceVersion",
            "uid",
            "creationTimestamp",
            "managedFields",
        ] {
            object["metadata"]
                .as_object_mut()
                .map(|m| m.remove(volatile));
        }
        stored.push(serde_json::to_string(&object).expect("encodes"));
        slices
            .delete("ns", "s", &Default::default())
            .await
            .expect("deleted");
    }
    assert_eq!(stored[0], stored[1]);
    assert!(stored[1].contains(r#""name":"p\"q""#), "{}", stored[1]);
}

/// A controller's update made from the slice it read: the rules take that slice as the stored
/// one while its revision is still stored, and decode the stored JSON once it is not. (The
/// read given here differs from the stored slice on purpose, to show which one they took: a
/// controller gives the slice exactly as read.)
#[tokio::test]
async fn a_typed_update_takes_the_slice_as_read_only_at_the_stored_revision() {
    let (_dir, slices) = slices().await;
    let created = create(&slices).await;
    let version = created["metadata"]["resourceVersion"]
        .as_str()
        .map(str::to_string);
    let read_at = |version: Option<String>| {
        let mut read: EndpointSlice =
            serde_json::from_value(created.clone()).expect("a typed slice");
        read.metadata.managed_fields = None;
        read.metadata.generation = Some(40);
        read.metadata.resource_version = version;
        read
    };
    let new = typed_slice("10.0.0.2");
    let (updated, _) = slices
        .update_typed_over(
            "ns",
            "s",
            (&new, Some(read_at(version.clone()))),
            &controller(),
            Subresource::Main,
        )
        .await
        .expect("updated");
    // The generation moves from the read slice's.
    assert_eq!(updated["metadata"]["generation"], 41, "{updated}");
    // Read at a revision no longer stored: the stored slice (generation 41) is the old one.
    let new = typed_slice("10.0.0.3");
    let (updated, _) = slices
        .update_typed_over(
            "ns",
            "s",
            (&new, Some(read_at(version))),
            &controller(),
            Subresource::Main,
        )
        .await
        .expect("updated");
    assert_eq!(updated["metadata"]["generation"], 42, "{updated}");
}

/// A generated name that is taken is generated again, and the object is written under the new
/// one as it would have been under the first: the failed attempt's object is tried again
/// (slices allocate nothing), not a copy made beforehand.
#[tokio::test]
async fn a_taken_generated_name_is_generated_again() {
    let (_dir, slices) = slices().await;
    let generated = |address: &str| {
        let mut slice = slice(address);
        slice["metadata"] = json!({"generateName": "web-",
            "labels": {"kubernetes.io/service-name": "web"}});
        slice
    };
    // The same seed: the second create's first name is the first create's.
    fastrand::seed(7);
    let first = slices
        .create("ns", generated("10.0.0.1"), &controller())
        .await
        .expect("created");
    fastrand::seed(7);
    let second = slices
        .create("ns", generated("10.0.0.2"), &controller())
        .await
        .expect("created under another name");
    let name = |object: &serde_json::Value| object["metadata"]["name"].as_str().map(String::from);
    let (first_name, second_name) = (name(&first).expect("named"), name(&second).expect("named"));
    assert_ne!(first_name, second_name);
    assert!(second_name.starts_with("web-"), "{second_name}");
    assert_ne!(first["metadata"]["uid"], second["metadata"]["uid"]);
    assert_eq!(second["metadata"]["generation"], 1);
    assert_eq!(second["metadata"]["generateName"], "web-");
    assert_eq!(second["endpoints"][0]["addresses"][0], "10.0.0.2");
    let managed = second["metadata"]["managedFields"]
        .as_array()
        .expect("managedFields");
    assert_eq!(managed.len(), 1);
    assert_eq!(managed[0]["manager"], "kube-controller-manager");
    // What is stored is what the create answered.
    let stored = slices
        .get("ns", &second_name, ReadAt::Latest)
        .await
        .expect("stored");
    assert_eq!(stored, second);
    // The first is untouched.
    let kept = slices
        .get("ns", &first_name, ReadAt::Latest)
        .await
        .expect("stored");
    assert_eq!(kept, first);
}
