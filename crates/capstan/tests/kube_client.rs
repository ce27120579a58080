//! End-to-end: the real `capstan` binary driven by the `kube` crate, and the error cases a
//! client can cause, checked as raw HTTP.

mod common;

use common::{Server, assert_status, delete, get, patch, post_json, raw};
use futures_util::StreamExt;
use k8s_openapi::api::core::v1::Service;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use serde_json::json;

fn service(name: &str) -> Service {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name, "labels": {"app": name}},
        "spec": {"selector": {"app": name}, "ports": [{"port": 80}]},
    }))
    .expect("service")
}

#[tokio::test]
async fn kube_api_create_list_replace_delete() {
    let server = Server::start();
    let client = server.client().await;
    let api: Api<Service> = Api::namespaced(client, "default");
    let created = api
        .create(&PostParams::default(), &service("one"))
        .await
        .expect("create");
    let spec = created.spec.clone().expect("spec");
    assert!(spec.cluster_ip.is_some_and(|ip| ip.starts_with("10.")));
    assert_eq!(spec.type_.as_deref(), Some("ClusterIP"));

    let list = api
        .list(&ListParams::default().labels("app=one"))
        .await
        .expect("list");
    assert_eq!(list.items.len(), 1);

    let mut changed = created.clone();
    changed
        .metadata
        .labels
        .get_or_insert_default()
        .insert("changed".into(), "yes".into());
    let replaced = api
        .replace("one", &PostParams::default(), &changed)
        .await
        .expect("replace");
    assert_ne!(
        replaced.metadata.resource_version,
        created.metadata.resource_version
    );

    // Replacing with the old resourceVersion conflicts.
    let stale = api
        .replace("one", &PostParams::default(), &changed)
        .await
        .expect_err("stale");
    match stale {
        kube::Error::Api(status) => {
            assert_eq!(status.code, 409);
            assert_eq!(status.reason, "Conflict");
        }
        other => panic!("unexpected {other:?}"),
    }

    let deleted = api
        .delete("one", &DeleteParams::default())
        .await
        .expect("delete");
    assert!(
        deleted.left().is_some(),
        "Service delete returns the object"
    );
    let gone = api.get("one").await.expect_err("gone");
    assert!(matches!(gone, kube::Error::Api(s) if s.code == 404 && s.reason == "NotFound"));
}

async fn wait_for(seen: &std::sync::Mutex<std::collections::HashSet<String>>, name: &str) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while !seen.lock().expect("lock").contains(name) {
        assert!(
            std::time::Instant::now() < deadline,
            "the watcher never saw {name}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn kube_watcher_survives_a_restart() {
    let mut server = Server::start();
    let client = server.client().await;
    let api: Api<Service> = Api::namespaced(client, "default");
    let (seen, watcher) = common::watch_service_names(api);
    server.ok(&["create", "service", "clusterip", "before", "--tcp=80:80"]);
    wait_for(&seen, "before").await;
    server.restart();
    server.ok(&["create", "service", "clusterip", "after", "--tcp=80:80"]);
    wait_for(&seen, "after").await;
    watcher.abort();
}

#[tokio::test]
async fn watch_from_a_too_old_revision_is_an_error_event() {
    let mut server = Server::start();
    // Selector-less, so no controller writes follow the create.
    let manifest = server.apply_file(
        "old.yaml",
        "apiVersion: v1\nkind: Service\nmetadata: {name: old}\nspec:\n  ports: [{port: 80}]\n",
    );
    server.ok(&["create", "-f", common::path_str(&manifest)]);
    // After a restart the watch cache starts at the current revision: revision 1 is history.
    server.restart();
    let client = server.client().await;
    let current = server.jsonpath(&["svc", "old"], "{.metadata.resourceVersion}");
    let (code, body, _) = get(
        &client,
        "/api/v1/namespaces/default/services?watch=1&resourceVersion=1&timeoutSeconds=5",
    )
    .await;
    assert_eq!(code, 200, "watch errors arrive inside a 200 stream");
    // The oldest revision the cache holds: at least the Service's (the controllers' Lease may
    // have been renewed since).
    let message = body["object"]["message"].as_str().unwrap_or_default();
    let oldest: i64 = message
        .strip_prefix("too old resource version: 1 (")
        .and_then(|m| m.strip_suffix(')'))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{message}"));
    assert!(
        oldest >= current.parse::<i64>().expect("a revision"),
        "{message}"
    );
    assert_eq!(
        body,
        json!({"type": "ERROR", "object": {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": message, "reason": "Expired", "code": 410}})
    );
    // A list at an exact revision that storage still has works; a future one times out.
    let (code, _, _) = get(&client, &format!("/api/v1/namespaces/default/services?resourceVersion={current}&resourceVersionMatch=Exact")).await;
    assert_eq!(code, 200);
}

#[tokio::test]
async fn unauthenticated_requests_get_401() {
    let server = Server::start();
    let client = server.client().await;
    drop(client);
    let kubeconfig = std::fs::read_to_string(server.kubeconfig()).expect("kubeconfig");
    let broken = kubeconfig.replace(&server.token(), "wrong-token");
    let path = server.apply_file("broken-kubeconfig", &broken);
    let config = kube::Config::from_custom_kubeconfig(
        kube::config::Kubeconfig::read_from(&path).expect("kubeconfig"),
        &Default::default(),
    )
    .await
    .expect("config");
    let client = kube::Client::try_from(config).expect("client");
    let (code, body, _) = get(&client, "/api/v1/services").await;
    assert_eq!(code, 401);
    assert_eq!(
        body,
        json!({"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"Unauthorized","reason":"Unauthorized","code":401})
    );
}

#[tokio::test]
async fn status_subresource_finalizers_patches_and_collections() {
    let server = Server::start();
    let client = server.client().await;
    let base = "/api/v1/namespaces/default/services";
    let body = |v: serde_json::Value| v.to_string().into_bytes();

    // generateName
    let (code, created, _) = post_json(&client, base, &json!({
        "metadata": {"generateName": "gen-", "labels": {"group": "a"}, "finalizers": ["example.com/hold"]},
        "spec": {"type": "LoadBalancer", "ports": [{"port": 80}]},
    })).await;
    assert_eq!(code, 201, "{created}");
    let name = created["metadata"]["name"]
        .as_str()
        .expect("name")
        .to_string();
    assert!(name.starts_with("gen-") && name.len() == 9, "{name}");

    // /status: status changes are kept, spec changes ignored.
    let mut status_put = created.clone();
    status_put["status"] = json!({"loadBalancer": {"ingress": [{"ip": "192.0.2.1"}]}});
    status_put["spec"]["sessionAffinity"] = json!("ClientIP");
    let (code, updated, _) = raw(
        &client,
        "PUT",
        &format!("{base}/{name}/status"),
        Some("application/json"),
        body(status_put),
    )
    .await;
    assert_eq!(code, 200, "{updated}");
    assert_eq!(
        updated["status"]["loadBalancer"]["ingress"][0],
        json!({"ip": "192.0.2.1", "ipMode": "VIP"})
    );
    assert_eq!(updated["spec"]["sessionAffinity"], "None");
    let (code, got, _) = get(&client, &format!("{base}/{name}/status")).await;
    assert_eq!((code, got["kind"].as_str()), (200, Some("Service")));

    // JSON patch.
    let item = format!("{base}/{name}");
    let json_patch = "application/json-patch+json";
    let add = json!([{"op": "add", "path": "/metadata/labels/patched", "value": "yes"}]);
    let (code, patched, _) = patch(&client, &item, json_patch, &add).await;
    assert_eq!(code, 200, "{patched}");
    assert_eq!(patched["metadata"]["labels"]["patched"], "yes");
    let test = json!([{"op": "test", "path": "/metadata/labels/patched", "value": "no"}]);
    let (code, failed, _) = patch(&client, &item, json_patch, &test).await;
    assert_eq!((code, failed["reason"].as_str()), (422, Some("Invalid")));

    // A finalizer keeps the object, marked for deletion; removing it completes the delete.
    let (code, marked, _) = delete(&client, &item).await;
    assert_eq!(code, 200);
    assert!(
        marked["metadata"]["deletionTimestamp"].is_string(),
        "{marked}"
    );
    let (code, still, _) = get(&client, &item).await;
    assert_eq!(code, 200, "{still}");
    let released = json!({"metadata": {"finalizers": null}});
    let (code, _, _) = patch(&client, &item, "application/merge-patch+json", &released).await;
    assert_eq!(code, 200);
    let (code, _, _) = get(&client, &item).await;
    assert_eq!(code, 404, "the last finalizer's removal deleted it");

    // Preconditions.
    let pre = json!({"metadata": {"name": "pre"}, "spec": {"ports": [{"port": 80}]}});
    let (_, s, _) = post_json(&client, base, &pre).await;
    let (code, conflict, _) = raw(
        &client,
        "DELETE",
        &format!("{base}/pre"),
        Some("application/json"),
        body(
            json!({"kind": "DeleteOptions", "apiVersion": "v1", "preconditions": {"uid": "nope"}}),
        ),
    )
    .await;
    assert_eq!(code, 409);
    assert_eq!(conflict["details"]["kind"], "Service");
    assert_eq!(
        conflict["message"],
        format!(
            "Operation cannot be fulfilled on Service \"pre\": the UID in the precondition (nope) does not match the UID in record ({}). The object might have been deleted and then recreated",
            s["metadata"]["uid"].as_str().unwrap_or_default()
        )
    );

    // deletecollection with a label selector.
    for n in ["c1", "c2"] {
        post_json(&client, base, &json!({"metadata": {"name": n, "labels": {"group": "c"}}, "spec": {"ports": [{"port": 80}]}})).await;
    }
    let (code, deleted, _) = delete(&client, &format!("{base}?labelSelector=group%3Dc")).await;
    assert_eq!(code, 200);
    assert_eq!(deleted["kind"], "ServiceList");
    assert_eq!(deleted["items"].as_array().map(Vec::len), Some(2));
    let (_, left, _) = get(&client, &format!("{base}?labelSelector=group%3Dc")).await;
    assert_eq!(left["items"], json!([]));
}

#[tokio::test]
async fn yaml_in_and_out() {
    let server = Server::start();
    let client = server.client().await;
    let yaml =
        "apiVersion: v1\nkind: Service\nmetadata:\n  name: yml\nspec:\n  ports:\n  - port: 80\n";
    let (code, created, _) = raw(
        &client,
        "POST",
        "/api/v1/namespaces/default/services",
        Some("application/yaml"),
        yaml.as_bytes().to_vec(),
    )
    .await;
    assert_eq!(code, 201, "{created}");
    let (_, headers, body) = common::send(
        &client,
        "GET",
        "/api/v1/namespaces/default/services/yml",
        &[("accept", "application/yaml")],
        Vec::new(),
    )
    .await;
    assert_eq!(headers["content-type"], "application/yaml");
    let text = String::from_utf8(body).expect("utf-8");
    assert!(
        text.starts_with("apiVersion: v1\nkind: Service\nmetadata:\n"),
        "{text}"
    );
}

#[tokio::test]
async fn lists_at_a_compacted_revision_are_410() {
    let server = Server::start_with(&["--etcd-compaction-interval", "200ms"]);
    let client = server.client().await;
    for n in ["a", "b", "c"] {
        server.ok(&["create", "service", "clusterip", n, "--tcp=80:80"]);
    }
    tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
    server.ok(&["label", "svc", "a", "x=y"]);
    tokio::time::sleep(std::time::Duration::from_millis(1000)).await;
    let at_two = "/api/v1/namespaces/default/services?resourceVersion=2&resourceVersionMatch=Exact";
    let (code, body, _) = get(&client, at_two).await;
    let expired = (
        410,
        "Expired",
        "The resourceVersion for the provided list is too old.",
    );
    assert_status(at_two, code, &body, expired);
}

/// The Service `web` of the reference transcripts, as their client sent it.
fn web_service() -> serde_json::Value {
    json!({"apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "web", "labels": {"app": "web"}},
        "spec": {"selector": {"app": "web"}, "ports": [{"name": "http", "port": 80, "targetPort": 8080}]}})
}

#[tokio::test]
async fn created_objects_carry_upstreams_managed_fields() {
    let server = Server::start();
    let client = server.client().await;
    // The request and the fieldsV1 kube-apiserver 1.36 answered (reference transcript).
    let body = web_service();
    let (code, created, _) = post_json(
        &client,
        "/api/v1/namespaces/default/services?fieldManager=curl",
        &body,
    )
    .await;
    assert_eq!(code, 201, "{created}");
    let entry = &created["metadata"]["managedFields"][0];
    assert_eq!(
        (
            entry["manager"].as_str(),
            entry["operation"].as_str(),
            entry["apiVersion"].as_str()
        ),
        (Some("curl"), Some("Update"), Some("v1"))
    );
    assert_eq!(entry["fieldsType"], "FieldsV1");
    assert_eq!(
        entry["fieldsV1"],
        json!({
        "f:metadata": {"f:labels": {".": {}, "f:app": {}}},
        "f:spec": {"f:internalTrafficPolicy": {},
                   "f:ports": {".": {}, "k:{\"port\":80,\"protocol\":\"TCP\"}": {".": {}, "f:name": {}, "f:port": {}, "f:protocol": {}, "f:targetPort": {}}},
                   "f:selector": {}, "f:sessionAffinity": {}, "f:type": {}}})
    );
}

/// The APIService API's requests and Status errors are conformance cases
/// (`tests/conformance/apiservices.json`); this is what needs a client: discovery order and
/// kubectl's view of an unavailable group.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unavailable_apiservice_is_listed_and_answers_503() {
    let server = Server::start();
    let client = server.client().await;
    let base = "/apis/apiregistration.k8s.io/v1/apiservices";
    let remote = json!({
        "apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService",
        "metadata": {"name": "v1beta1.foo.example.com"},
        "spec": {"group": "foo.example.com", "version": "v1beta1", "groupPriorityMinimum": 100,
                 "versionPriority": 15, "insecureSkipTLSVerify": true,
                 "service": {"namespace": "ext", "name": "api"}}});
    let (code, created, _) = post_json(&client, base, &remote).await;
    assert_eq!(code, 201, "{created}");
    // Legacy /apis lists it (available or not) after the aggregator's own group and, by
    // groupPriorityMinimum, after coordination.k8s.io and discovery.k8s.io (16500 and 16200
    // against its 100).
    let (_, groups, _) = get(&client, "/apis").await;
    assert_eq!(groups["groups"][0]["name"], "apiregistration.k8s.io");
    assert_eq!(groups["groups"][1]["name"], "coordination.k8s.io");
    assert_eq!(groups["groups"][2]["name"], "discovery.k8s.io");
    assert_eq!(groups["groups"][3]["name"], "foo.example.com");
    // Its group is unavailable: 503 plain text (checked with kubectl: the kube client retries
    // 503s with back-off), which client-go turns into upstream's message.
    let err = server.fails(&["get", "--raw", "/apis/foo.example.com/v1beta1/things"]);
    assert!(
        err.contains("Error from server (ServiceUnavailable): the server is currently unable to handle the request"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scheduled_pods_are_deleted_gracefully() {
    let server = Server::start();
    let client = server.client().await;
    let pods = "/api/v1/namespaces/default/pods";
    let create = |name: &str, node: &str| {
        json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name},
            "spec": {"nodeName": node, "terminationGracePeriodSeconds": 45,
                     "containers": [{"name": "c", "image": "nginx"}]}})
    };
    // Never scheduled: gone at once.
    let (code, _, _) = post_json(&client, pods, &create("loose", "")).await;
    assert_eq!(code, 201);
    let (code, _, _) = delete(&client, &format!("{pods}/loose")).await;
    assert_eq!(code, 200);
    let (code, _, _) = get(&client, &format!("{pods}/loose")).await;
    assert_eq!(code, 404);
    // Scheduled: marked with the pod's own grace period and kept.
    let (code, _, _) = post_json(&client, pods, &create("held", "n1")).await;
    assert_eq!(code, 201);
    let item = format!("{pods}/held");
    let (code, marked, _) = delete(&client, &item).await;
    assert_eq!(code, 200, "{marked}");
    assert_eq!(marked["metadata"]["deletionGracePeriodSeconds"], 45);
    let deadline = marked["metadata"]["deletionTimestamp"].clone();
    // A longer grace period changes nothing; a shorter one moves the deadline closer.
    let (_, same, _) = delete(&client, &format!("{item}?gracePeriodSeconds=100")).await;
    assert_eq!(same["metadata"]["deletionTimestamp"], deadline);
    assert_eq!(
        same["metadata"]["resourceVersion"],
        marked["metadata"]["resourceVersion"]
    );
    let (_, shorter, _) = delete(&client, &format!("{item}?gracePeriodSeconds=5")).await;
    assert_eq!(shorter["metadata"]["deletionGracePeriodSeconds"], 5);
    assert!(shorter["metadata"]["deletionTimestamp"].as_str() < deadline.as_str());
    // Grace 0 removes it.
    let (code, _, _) = delete(&client, &format!("{item}?gracePeriodSeconds=0")).await;
    assert_eq!(code, 200);
    let (code, _, _) = get(&client, &item).await;
    assert_eq!(code, 404);
}

/// Lists and watches are served from the stored bytes with the object's own resourceVersion
/// spliced in: a listed item and a watch event carry the same resourceVersion as a GET, and
/// objects keep their top-level members in order (metadata, spec, status).
#[tokio::test]
async fn listed_and_watched_objects_carry_their_resource_version_in_written_order() {
    use kube::api::WatchParams;
    let server = Server::start();
    let client = server.client().await;
    let base = "/api/v1/namespaces/default/services";
    let body = json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "order"},
        "spec": {"selector": {"app": "v1"}, "ports": [{"port": 80}]}});
    let (code, created, _) = post_json(&client, base, &body).await;
    assert_eq!(code, 201, "{created}");
    let keys = |v: &serde_json::Value| -> Vec<String> {
        v.as_object()
            .map(|m| m.keys().cloned().collect())
            .unwrap_or_default()
    };
    let api: Api<Service> = Api::namespaced(client.clone(), "default");
    let created_rv = created["metadata"]["resourceVersion"]
        .as_str()
        .expect("resourceVersion")
        .to_string();
    let mut events = api
        .watch(
            &WatchParams::default().fields("metadata.name=order"),
            &created_rv,
        )
        .await
        .expect("watch")
        .boxed();
    let order = format!("{base}/order");
    let selector = json!({"spec": {"selector": {"app": "v2"}}});
    let (code, patched, _) = patch(
        &client,
        &order,
        "application/strategic-merge-patch+json",
        &selector,
    )
    .await;
    assert_eq!(code, 200, "{patched}");
    let (_, got, _) = get(&client, &order).await;
    assert_eq!(
        keys(&got),
        ["kind", "apiVersion", "metadata", "spec", "status"]
    );
    let (_, list, _) = get(&client, base).await;
    let item = list["items"]
        .as_array()
        .and_then(|items| items.iter().find(|i| i["metadata"]["name"] == "order"))
        .expect("listed")
        .clone();
    assert_eq!(keys(&item), ["metadata", "spec", "status"]);
    assert_eq!(
        item["metadata"]["resourceVersion"],
        got["metadata"]["resourceVersion"]
    );
    assert_eq!(item["spec"]["selector"]["app"], "v2");
    let event = tokio::time::timeout(std::time::Duration::from_secs(10), events.next())
        .await
        .expect("an event in time")
        .expect("an event")
        .expect("not an error");
    let kube::api::WatchEvent::Modified(watched) = event else {
        panic!("expected MODIFIED, got {event:?}");
    };
    assert_eq!(
        watched.metadata.resource_version.as_deref(),
        got["metadata"]["resourceVersion"].as_str()
    );
}

/// A GET of `uri`, gzip accepted or not: the status, `Content-Encoding`, and the body as
/// sent (still compressed).
async fn get_encoded(
    client: &kube::Client,
    uri: &str,
    gzip: bool,
) -> (u16, Option<String>, Vec<u8>) {
    let accept: &[(&str, &str)] = if gzip {
        &[("accept-encoding", "gzip")]
    } else {
        &[]
    };
    let (status, headers, body) = common::send(client, "GET", uri, accept, Vec::new()).await;
    let encoding = headers
        .get("content-encoding")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    (status, encoding, body)
}

/// Creates `count` Services in `default` (250 list to well over 128 KiB of JSON).
async fn create_services(client: &kube::Client, count: usize) {
    let api: Api<Service> = Api::namespaced(client.clone(), "default");
    for i in 0..count {
        api.create(&PostParams::default(), &service(&format!("s{i:03}")))
            .await
            .expect("create");
    }
}

#[tokio::test]
async fn large_responses_are_gzipped_for_clients_that_accept_it() {
    use std::io::Read;
    let server = Server::start();
    let client = server.client().await;
    create_services(&client, 250).await;
    let list = "/api/v1/namespaces/default/services";
    let (status, encoding, plain) = get_encoded(&client, list, false).await;
    assert_eq!((status, encoding), (200, None));
    assert!(plain.len() > 128 * 1024, "{} bytes", plain.len());
    let (status, encoding, gzipped) = get_encoded(&client, list, true).await;
    assert_eq!((status, encoding.as_deref()), (200, Some("gzip")));
    assert!(gzipped.len() < plain.len() / 4, "{} bytes", gzipped.len());
    let mut unzipped = Vec::new();
    flate2::read::GzDecoder::new(&gzipped[..])
        .read_to_end(&mut unzipped)
        .expect("gunzips");
    let items = |bytes: &[u8]| {
        let list: serde_json::Value = serde_json::from_slice(bytes).expect("a list");
        list["items"].as_array().map(Vec::len)
    };
    assert_eq!(items(&unzipped), items(&plain));
    assert_eq!(items(&unzipped), Some(251));
    // Small responses are sent as they are.
    let (_, encoding, _) = get_encoded(&client, &format!("{list}/s000"), true).await;
    assert_eq!(encoding, None);
    // kubectl (Go's transport asks for gzip and decodes it) reads the compressed list.
    let names = server.ok(&["get", "services", "-o", "name"]);
    assert_eq!(names.lines().count(), 251);
}

#[tokio::test]
async fn response_compression_can_be_turned_off() {
    let server = Server::start_with(&["--feature-gates", "APIResponseCompression=false"]);
    let client = server.client().await;
    create_services(&client, 250).await;
    let (status, encoding, plain) =
        get_encoded(&client, "/api/v1/namespaces/default/services", true).await;
    assert_eq!((status, encoding), (200, None));
    assert!(plain.len() > 128 * 1024);
}

/// A GET of `uri` with this `Accept`, as JSON.
async fn get_accepting(client: &kube::Client, uri: &str, accept: &str) -> serde_json::Value {
    let (status, _, body) =
        common::send(client, "GET", uri, &[("accept", accept)], Vec::new()).await;
    assert_eq!(status, 200, "{uri}");
    serde_json::from_slice(&body).expect("JSON")
}

#[tokio::test]
async fn a_list_tables_rows_are_the_single_objects_rows() {
    const TABLE: &str = "application/json;as=Table;v=v1;g=meta.k8s.io";
    let server = Server::start();
    let client = server.client().await;
    create_services(&client, 3).await;
    let list = "/api/v1/namespaces/default/services";
    for include in ["Metadata", "Object", "None"] {
        let table = get_accepting(&client, &format!("{list}?includeObject={include}"), TABLE).await;
        let age = table["columnDefinitions"]
            .as_array()
            .and_then(|c| c.iter().position(|c| c["name"] == "Age"))
            .expect("an Age column");
        let rows = table["rows"].as_array().expect("rows");
        assert_eq!(rows.len(), 4, "kubernetes and s000..s002");
        for row in rows {
            let name = row["cells"][0].as_str().expect("a name cell");
            let single = get_accepting(
                &client,
                &format!("{list}/{name}?includeObject={include}"),
                TABLE,
            )
            .await;
            let (mut listed, mut alone) = (row.clone(), single["rows"][0].clone());
            // The age is computed when the row is written.
            for row in [&mut listed, &mut alone] {
                row["cells"][age] = serde_json::Value::Null;
            }
            assert_eq!(listed, alone, "{include}: {name}");
            match include {
                "Metadata" => {
                    assert_eq!(listed["object"]["kind"], "PartialObjectMetadata");
                    assert!(listed["object"]["metadata"]["managedFields"].is_array());
                    assert!(listed["object"]["metadata"]["resourceVersion"].is_string());
                }
                "Object" => assert_eq!(listed["object"]["spec"]["type"], "ClusterIP"),
                _ => assert!(listed["object"].is_null()),
            }
        }
    }
}

/// What a client reading the bytes sees: each object's members in the order kube-apiserver's
/// Go types write them (the 1.36 transcripts' order), whichever way it is read.
#[tokio::test]
async fn objects_come_in_kube_apiservers_member_order() {
    let server = Server::start();
    let client = server.client().await;
    let service = web_service();
    let path = "/api/v1/namespaces/default/services";
    let (code, created, _) = post_json(&client, path, &service).await;
    assert_eq!(code, 201, "{created}");
    let (_, got, _) = get(&client, &format!("{path}/web")).await;
    let (_, list, _) = get(&client, path).await;
    let keys = |value: &serde_json::Value| -> Vec<String> {
        value
            .as_object()
            .map(|m| m.keys().cloned().collect())
            .unwrap_or_default()
    };
    let listed = list["items"]
        .as_array()
        .and_then(|items| items.iter().find(|item| item["metadata"]["name"] == "web"))
        .expect("web listed");
    for object in [&created, &got, listed] {
        assert_eq!(
            keys(&object["metadata"]),
            [
                "name",
                "namespace",
                "uid",
                "resourceVersion",
                "creationTimestamp",
                "labels",
                "managedFields"
            ],
            "{object}"
        );
        assert_eq!(
            keys(&object["spec"]),
            [
                "ports",
                "selector",
                "clusterIP",
                "clusterIPs",
                "type",
                "sessionAffinity",
                "ipFamilies",
                "ipFamilyPolicy",
                "internalTrafficPolicy"
            ],
            "{object}"
        );
        assert_eq!(
            keys(&object["spec"]["ports"][0]),
            ["name", "protocol", "port", "targetPort"]
        );
        assert_eq!(
            keys(&object["metadata"]["managedFields"][0]),
            [
                "manager",
                "operation",
                "apiVersion",
                "time",
                "fieldsType",
                "fieldsV1"
            ]
        );
    }
    assert_eq!(keys(&created)[..2], ["kind", "apiVersion"]);
}

/// The body of a GET as text, with these request headers.
async fn text_of(client: &kube::Client, uri: &str, headers: &[(&str, &str)]) -> (u16, String) {
    let (code, _, body) = common::send(client, "GET", uri, headers, Vec::new()).await;
    (code, String::from_utf8(body).expect("UTF-8"))
}

#[tokio::test]
async fn strings_are_escaped_as_gos_encoder_escapes_them() {
    let server = Server::start();
    let client = server.client().await;
    let path = "/api/v1/namespaces/default/services";
    let service: Service = serde_json::from_value(json!({
        "metadata": {"name": "esc", "annotations": {"note": "a<b>&c\u{2028}d"}},
        "spec": {"ports": [{"port": 80}]}}))
    .expect("a Service");
    let api: Api<Service> = Api::namespaced(client.clone(), "default");
    let created = api
        .create(&PostParams::default(), &service)
        .await
        .expect("create");
    let created = serde_json::to_value(created).expect("JSON");
    // What the client sent reads back the same; Go's encoder wrote `<`, `>`, `&` and U+2028
    // as escapes.
    assert_eq!(
        created["metadata"]["annotations"]["note"],
        "a<b>&c\u{2028}d"
    );
    let escaped = r#""note":"a\u003cb\u003e\u0026c\u2028d""#;
    for uri in [
        format!("{path}/esc"),
        path.to_string(),
        format!("{path}/esc?pretty=true"),
    ] {
        let (_, text) = text_of(&client, &uri, &[]).await;
        assert!(
            text.replace("\": ", "\":").contains(escaped),
            "{uri}: {text}"
        );
    }
    // A Table's `<none>` (no selector) and `<pending>`-style cells too.
    let table = [("accept", "application/json;as=Table;v=v1;g=meta.k8s.io")];
    let (_, text) = text_of(&client, &format!("{path}/esc"), &table).await;
    assert!(text.contains(r#""\u003cnone\u003e""#), "{text}");
    assert!(!text.contains("<none>"), "{text}");
}

#[tokio::test]
async fn raw_json_pretty_for_curl_and_the_api_groups_type_first() {
    let server = Server::start();
    let client = server.client().await;
    // `/version` is always indented, with no newline after it (upstream's WriteRawJSON).
    let (code, version) = text_of(&client, "/version", &[]).await;
    assert_eq!(code, 200);
    assert!(version.starts_with("{\n  \"major\": \"1\",\n"), "{version}");
    assert!(version.ends_with('}'), "{version:?}");
    // Discovery, as every negotiated answer, is indented for curl, Wget and browsers.
    let (_, compact) = text_of(&client, "/api", &[]).await;
    assert!(
        compact.starts_with(r#"{"kind":"APIVersions","#),
        "{compact}"
    );
    let (_, indented) = text_of(&client, "/api", &[("user-agent", "curl/8.5.0")]).await;
    assert!(
        indented.starts_with("{\n  \"kind\": \"APIVersions\",\n"),
        "{indented}"
    );
    let (code, not_found) =
        text_of(&client, "/api/v1/nothing", &[("user-agent", "Wget/1.21")]).await;
    assert_eq!(code, 404);
    assert!(
        not_found.starts_with("{\n  \"kind\": \"Status\""),
        "{not_found}"
    );
    // Errors answered outside a resource's handler are negotiated too (upstream's
    // ErrorNegotiated); one that accepts nothing served is written raw, with its own code.
    for (accept, begins) in [
        ("application/yaml", "apiVersion: v1\n"),
        ("application/unknown", "{\n  \"kind\": \"Status\""),
    ] {
        let (code, text) = text_of(&client, "/api/v1/nothing", &[("accept", accept)]).await;
        assert_eq!(code, 404);
        assert!(text.starts_with(begins), "{accept}: {text}");
    }
    let (_, quiet) = text_of(&client, "/api?pretty=false", &[("user-agent", "curl/8")]).await;
    assert!(quiet.starts_with(r#"{"kind":"#), "{quiet}");
    // An APIGroup's TypeMeta comes first, as Go writes it.
    let (_, group) = text_of(&client, "/apis/discovery.k8s.io", &[]).await;
    assert!(
        group.starts_with(r#"{"kind":"APIGroup","apiVersion":"v1","name":"discovery.k8s.io","#),
        "{group}"
    );
    // A Status that could not be negotiated is written raw: indented, whatever was asked.
    let (code, refused) = text_of(
        &client,
        "/api/v1/namespaces/default/services",
        &[("accept", "application/unknown")],
    )
    .await;
    assert_eq!(code, 406, "{refused}");
    assert!(
        refused.starts_with("{\n  \"kind\": \"Status\",\n"),
        "{refused}"
    );
    assert!(refused.ends_with('}'), "{refused:?}");
}

#[tokio::test]
async fn bookmarks_carry_the_kinds_zero_value_and_come_before_the_deadline() {
    // No writes but the test's: no controllers, no Lease renewals.
    let server = Server::start_with(&["--leader-elect=false", "--disable-endpoints-controller"]);
    let client = server.client().await;
    let path = "/api/v1/namespaces/default/services";
    let api: Api<Service> = Api::namespaced(client.clone(), "default");
    api.create(&PostParams::default(), &service("marked"))
        .await
        .expect("create");
    let (_, list, _) = get(&client, path).await;
    let start = list["metadata"]["resourceVersion"]
        .as_str()
        .expect("a list revision")
        .to_string();
    // Two watches from the list's revision that time out after 4 s: upstream's cacher sends
    // a bookmark 2 s before the deadline, if the watch has seen a revision past its start.
    let watch = |uri: String| {
        let client = client.clone();
        tokio::spawn(async move { text_of(&client, &uri, &[]).await })
    };
    let changed = watch(format!(
        "{path}?watch=true&resourceVersion={start}&allowWatchBookmarks=true&timeoutSeconds=4"
    ));
    let quiet = watch(format!(
        "/api/v1/namespaces/kube-system/services?watch=true&resourceVersion={start}&allowWatchBookmarks=true&timeoutSeconds=4"
    ));
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    let patched = api
        .patch(
            "marked",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(json!({"metadata": {"labels": {"x": "1"}}})),
        )
        .await
        .expect("patch");
    let revision = patched.metadata.resource_version.expect("a revision");
    let (code, lines) = changed.await.expect("watch");
    assert_eq!(code, 200);
    let lines: Vec<&str> = lines.lines().collect();
    assert_eq!(lines.len(), 2, "{lines:?}");
    assert!(lines[0].starts_with(r#"{"type":"MODIFIED","#), "{lines:?}");
    assert_eq!(
        lines[1],
        format!(
            r#"{{"type":"BOOKMARK","object":{{"kind":"Service","apiVersion":"v1","metadata":{{"resourceVersion":"{revision}"}},"spec":{{}},"status":{{"loadBalancer":{{}}}}}}}}"#
        )
    );
    // The other namespace's watch saw the same revision go by: its bookmark says so.
    let (_, quiet) = quiet.await.expect("watch");
    assert_eq!(quiet.lines().count(), 1, "{quiet}");
    assert!(
        quiet.contains(&format!(r#""resourceVersion":"{revision}""#)),
        "{quiet}"
    );
    // A watch at the latest revision that sees nothing newer gets no bookmark.
    let (_, idle) = text_of(
        &client,
        &format!(
            "{path}?watch=true&resourceVersion={revision}&allowWatchBookmarks=true&timeoutSeconds=3"
        ),
        &[],
    )
    .await;
    assert_eq!(idle, "", "{idle}");
}
