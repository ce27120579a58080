//! The local APIServices of the groups Capstan serves itself, registered at start (upstream's
//! autoregister controller in kube-aggregator).

use std::sync::Arc;

use capstan_registry::{Registry, Subresource, WriteOptions};
use capstan_resources::apiregistration::apiservice::AUTOMANAGED;

/// A local APIService that could not be registered.
#[derive(Debug, thiserror::Error)]
#[error("{doing} APIService {name}: {message}")]
pub struct RegisterError {
    doing: &'static str,
    name: String,
    message: String,
}

impl RegisterError {
    fn new(doing: &'static str, name: &str, message: impl Into<String>) -> Self {
        RegisterError {
            doing,
            name: name.to_string(),
            message: message.into(),
        }
    }
}

/// The local APIServices of the groups Capstan serves itself (`v1.`, `v1.discovery.k8s.io`,
/// …; the aggregator's own group is not registered, as upstream), with the priorities
/// discovery gives them. Created when missing; the spec reset at start while it carries the
/// `onstart` label; left alone without it.
pub async fn register_local_apiservices(
    registries: &[Arc<Registry>],
    options: &WriteOptions,
) -> Result<(), RegisterError> {
    let mut groups: Vec<(&str, &str, (i64, i64))> = Vec::new();
    for registry in registries {
        let info = registry.strategy().info();
        let priority = if info.group.is_empty() {
            (18000, 1)
        } else {
            info.priority
        };
        let entry = (info.group, info.version, priority);
        if info.group != "apiregistration.k8s.io" && !groups.contains(&entry) {
            groups.push(entry);
        }
    }
    let Some(apiservices) = crate::registry(registries, "apiregistration.k8s.io", "apiservices")
    else {
        return Ok(());
    };
    for (group, version, (group_priority, version_priority)) in groups {
        let mut spec = serde_json::json!({"version": version,
            "groupPriorityMinimum": group_priority, "versionPriority": version_priority});
        if !group.is_empty() {
            spec["group"] = group.into();
        }
        register_local_apiservice(&apiservices, &format!("{version}.{group}"), spec, options)
            .await?;
    }
    Ok(())
}

async fn register_local_apiservice(
    apiservices: &Registry,
    name: &str,
    spec: serde_json::Value,
    options: &WriteOptions,
) -> Result<(), RegisterError> {
    match apiservices
        .get("", name, capstan_registry::ReadAt::Latest)
        .await
    {
        Ok(mut existing) => {
            let managed = existing
                .pointer("/metadata/labels")
                .and_then(|l| l.get(AUTOMANAGED))
                .and_then(serde_json::Value::as_str)
                == Some("onstart");
            if managed && existing.is_object() && existing.get("spec") != Some(&spec) {
                existing["spec"] = spec;
                // In its type's form (field order included), as an update's object must be.
                let existing = apiservices
                    .strategy()
                    .decode(existing)
                    .map_err(|e| RegisterError::new("resetting", name, e))?;
                apiservices
                    .update("", name, existing, options, Subresource::Main)
                    .await
                    .map_err(|e| RegisterError::new("resetting", name, e.message))?;
            }
        }
        Err(e) if e.is_not_found() => {
            let object = serde_json::json!({
                "metadata": {"name": name, "labels": {AUTOMANAGED: "onstart"}},
                "spec": spec,
            });
            match apiservices.create("", object, options).await {
                Ok(_) => {}
                Err(e) if e.is_conflict() => {}
                Err(e) => return Err(RegisterError::new("registering", name, e.message)),
            }
        }
        Err(e) => return Err(RegisterError::new("reading", name, e.message)),
    }
    Ok(())
}
