//! End-to-end: the real `capstan` binary driven by the `kube` crate, and the error cases a
//! client can cause, checked as raw HTTP.

mod common;

use common::{Server, raw};
use futures_util::StreamExt;
use k8s_openapi::api::core::v1::Service;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::runtime::WatchStreamExt;
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

async fn wait_for(rx: &mut tokio::sync::mpsc::UnboundedReceiver<String>, name: &str) {
    let seen = tokio::time::timeout(std::time::Duration::from_secs(30), async {
        while let Some(seen) = rx.recv().await {
            if seen == name {
                return true;
            }
        }
        false
    })
    .await;
    assert_eq!(seen.ok(), Some(true), "the watcher never saw {name}");
}

#[tokio::test]
async fn kube_watcher_survives_a_restart() {
    let mut server = Server::start();
    let client = server.client().await;
    let api: Api<Service> = Api::namespaced(client, "default");
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let watcher = tokio::spawn(async move {
        let mut stream = kube::runtime::watcher(api, kube::runtime::watcher::Config::default())
            .default_backoff()
            .boxed();
        while let Some(event) = stream.next().await {
            if let Ok(
                kube::runtime::watcher::Event::Apply(s)
                | kube::runtime::watcher::Event::InitApply(s),
            ) = event
            {
                let _ = tx.send(s.metadata.name.unwrap_or_default());
            }
        }
    });
    server.ok(&["create", "service", "clusterip", "before", "--tcp=80:80"]);
    wait_for(&mut rx, "before").await;
    server.restart();
    server.ok(&["create", "service", "clusterip", "after", "--tcp=80:80"]);
    wait_for(&mut rx, "after").await;
    watcher.abort();
}

#[tokio::test]
async fn client_errors_get_upstreams_status_and_store_nothing() {
    let server = Server::start();
    let client = server.client().await;
    let services = "/api/v1/namespaces/default/services";

    let (code, body, _) = raw(
        &client,
        "POST",
        services,
        Some("application/json"),
        b"{bad".to_vec(),
    )
    .await;
    assert_eq!(
        (code, body["kind"].as_str(), body["reason"].as_str()),
        (400, Some("Status"), Some("BadRequest"))
    );

    let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}}).to_string();
    let (code, _, _) = raw(
        &client,
        "POST",
        services,
        Some("application/json"),
        pod.into_bytes(),
    )
    .await;
    assert_eq!(code, 400);

    let wrong_version =
        json!({"apiVersion": "v2", "kind": "Service", "metadata": {"name": "v"}}).to_string();
    let (code, body, _) = raw(
        &client,
        "POST",
        services,
        Some("application/json"),
        wrong_version.into_bytes(),
    )
    .await;
    assert_eq!(code, 400);
    assert_eq!(
        body["message"],
        "the API version in the data (v2) does not match the expected API version (v1)"
    );

    let elsewhere =
        json!({"metadata": {"name": "x", "namespace": "other"}, "spec": {"ports": [{"port": 80}]}})
            .to_string();
    let (code, body, _) = raw(
        &client,
        "POST",
        services,
        Some("application/json"),
        elsewhere.into_bytes(),
    )
    .await;
    assert_eq!(code, 400);
    assert_eq!(
        body["message"],
        "the namespace of the provided object does not match the namespace sent on the request"
    );

    let renamed =
        json!({"metadata": {"name": "other"}, "spec": {"ports": [{"port": 80}]}}).to_string();
    let (code, body, _) = raw(
        &client,
        "PUT",
        &format!("{services}/x"),
        Some("application/json"),
        renamed.into_bytes(),
    )
    .await;
    assert_eq!(code, 400);
    assert_eq!(
        body["message"],
        "the name of the object (other) does not match the name on the URL (x)"
    );

    let huge = vec![b' '; 3 * 1024 * 1024 + 10];
    let (code, body, _) = raw(&client, "POST", services, Some("application/json"), huge).await;
    assert_eq!(code, 413);
    assert_eq!(
        body["message"],
        "Request entity too large: limit is 3145728"
    );

    let invalid = json!({"metadata": {"name": "bad"}, "spec": {"ports": [{"port": 0, "protocol": "TCPX"}], "sessionAffinity": "Sometimes"}}).to_string();
    let (code, body, _) = raw(
        &client,
        "POST",
        services,
        Some("application/json"),
        invalid.into_bytes(),
    )
    .await;
    assert_eq!(code, 422);
    assert_eq!(body["details"]["kind"], "Service");
    assert!(body["message"].as_str().is_some_and(|m| m.starts_with("Service \"bad\" is invalid: [spec.ports[0].port: Invalid value: 0: must be between 1 and 65535, inclusive")), "{body}");

    let (code, body, _) = raw(
        &client,
        "POST",
        &format!("{services}/x"),
        Some("application/json"),
        b"{}".to_vec(),
    )
    .await;
    assert_eq!(
        (code, body["reason"].as_str()),
        (405, Some("MethodNotAllowed"))
    );

    let (code, body, _) = raw(
        &client,
        "PATCH",
        &format!("{services}/kubernetes"),
        Some("text/plain"),
        b"{}".to_vec(),
    )
    .await;
    assert_eq!(
        (code, body["reason"].as_str()),
        (415, Some("UnsupportedMediaType"))
    );

    let (code, body, _) = raw(&client, "GET", "/api/v1/foos", None, Vec::new()).await;
    assert_eq!(
        (code, body["message"].as_str()),
        (
            404,
            Some("the server could not find the requested resource")
        )
    );

    let (code, body, _) = raw(
        &client,
        "GET",
        &format!("{services}?resourceVersion=abc"),
        None,
        Vec::new(),
    )
    .await;
    assert_eq!(
        (code, body["message"].as_str()),
        (400, Some("invalid resource version: abc"))
    );

    // Nothing but the built-in Service was stored.
    let (_, list, _) = raw(&client, "GET", services, None, Vec::new()).await;
    let names: Vec<&str> = list["items"]
        .as_array()
        .expect("items")
        .iter()
        .filter_map(|i| i["metadata"]["name"].as_str())
        .collect();
    assert_eq!(names, ["kubernetes"]);
}

#[tokio::test]
async fn watch_from_a_too_old_revision_is_an_error_event() {
    let mut server = Server::start();
    server.ok(&["create", "service", "clusterip", "old", "--tcp=80:80"]);
    // After a restart the watch cache starts at the current revision: revision 1 is history.
    server.restart();
    let client = server.client().await;
    let current = server.ok(&[
        "get",
        "svc",
        "old",
        "-o",
        "jsonpath={.metadata.resourceVersion}",
    ]);
    let (code, body, _) = raw(
        &client,
        "GET",
        "/api/v1/namespaces/default/services?watch=1&resourceVersion=1&timeoutSeconds=5",
        None,
        Vec::new(),
    )
    .await;
    assert_eq!(code, 200, "watch errors arrive inside a 200 stream");
    assert_eq!(
        body,
        json!({"type": "ERROR", "object": {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": format!("too old resource version: 1 ({current})"), "reason": "Expired", "code": 410}})
    );
    // A list at an exact revision that storage still has works; a future one times out.
    let (code, _, _) = raw(&client, "GET", &format!("/api/v1/namespaces/default/services?resourceVersion={current}&resourceVersionMatch=Exact"), None, Vec::new()).await;
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
    let (code, body, _) = raw(&client, "GET", "/api/v1/services", None, Vec::new()).await;
    assert_eq!(code, 401);
    assert_eq!(
        body,
        json!({"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"Unauthorized","reason":"Unauthorized","code":401})
    );
}
