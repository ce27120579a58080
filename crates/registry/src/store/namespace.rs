//! The namespace lifecycle admission plugin, as the registry's creates apply it.

use super::*;

/// At most this many namespaces' lifecycle verdicts are kept per registry
/// ([`Registry::check_namespace`]: every create reads its namespace, which seldom changes).
pub(super) const KEPT_LIFECYCLES: usize = 1024;

impl Registry {
    /// The namespace lifecycle admission plugin: content is created only in a namespace that
    /// exists and is not being terminated (`name`: the new object's).
    pub(super) async fn check_namespace(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<(), ApiError> {
        let Some(prefix) = &self.namespace_prefix else {
            return Ok(());
        };
        let key = format!("{prefix}{namespace}");
        let response = self.storage.get(&key, None).await.map_err(storage_error)?;
        let Some(kv) = response.kv else {
            return Err(ApiError::not_found(
                capstan_machinery::status::GroupResource {
                    group: "",
                    resource: "namespaces",
                },
                namespace,
            ));
        };
        let terminating = match self.lifecycles.get(&key, kv.mod_revision) {
            Some(terminating) => terminating,
            None => {
                let terminating = terminating(&kv)?;
                self.lifecycles.put(key, kv.mod_revision, terminating);
                terminating
            }
        };
        if terminating {
            let gr = self.strategy.info().group_resource();
            return Err(ApiError::new(
                403,
                capstan_machinery::Reason::Forbidden,
                format!(
                    "{gr} {} is forbidden: unable to create new content in namespace {namespace} because it is being terminated",
                    capstan_gostd::quote(name),
                ),
            )
            .with_details(capstan_machinery::Details {
                name: name.to_string(),
                group: gr.group.to_string(),
                kind: gr.resource.to_string(),
                causes: vec![capstan_machinery::field::Cause {
                    reason: capstan_machinery::status::NAMESPACE_TERMINATING.into(),
                    message: format!("namespace {namespace} is being terminated"),
                    field: "metadata.namespace".into(),
                }],
                ..Default::default()
            }));
        }
        Ok(())
    }
}

/// Whether a stored namespace is being terminated (deleted, or in phase `Terminating`).
fn terminating(kv: &capstan_storage::KeyValue) -> Result<bool, ApiError> {
    // Only the two fields read here are decoded (as values: a null or a value of another
    // type is read as absent, as before); the rest is skipped unparsed.
    #[derive(serde::Deserialize)]
    struct Lifecycle {
        metadata: Option<LifecycleMeta>,
        status: Option<LifecycleStatus>,
    }
    #[derive(serde::Deserialize)]
    struct LifecycleMeta {
        #[serde(rename = "deletionTimestamp")]
        deletion_timestamp: Option<Value>,
    }
    #[derive(serde::Deserialize)]
    struct LifecycleStatus {
        phase: Option<Value>,
    }
    let ns: Lifecycle = serde_json::from_slice(&kv.value)
        .map_err(|_| ApiError::internal(format!("undecodable object at {}", kv.key)))?;
    let deleting = ns
        .metadata
        .and_then(|m| m.deletion_timestamp)
        .is_some_and(|t| t.as_str().is_some_and(|t| !t.is_empty()));
    let terminating = ns
        .status
        .and_then(|s| s.phase)
        .is_some_and(|p| p.as_str() == Some("Terminating"));
    Ok(deleting || terminating)
}
