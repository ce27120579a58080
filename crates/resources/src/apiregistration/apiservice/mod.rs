//! apiregistration.k8s.io/v1 APIService: defaults, validation,
//! the status rules of the strategy, the Table, and the `Available` condition helpers the
//! availability controller and the aggregation proxy share.

mod validation;

use capstan_machinery::field::FieldErrors;
use capstan_machinery::table::{AGE_COLUMN, Column, NAME_COLUMN, age};
use capstan_registry::{ResourceInfo, Strategy};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::kube_aggregator::pkg::apis::apiregistration::v1::{
    APIService, APIServiceCondition, APIServiceSpec,
};
use serde::Deserialize;
use serde_json::{Value, json};

/// APIService's identity.
pub static APISERVICE_INFO: ResourceInfo = ResourceInfo::of::<APIService>(&super::V1, "io.k8s.kube-aggregator.pkg.apis.apiregistration.v1.APIService")
    .categories(&["api-extensions"])
    .with_status()
    .storage_version_hash("InPBPD7+PqM=")
    .storage_prefix("apiregistration.k8s.io/apiservices")
    .priority(20001, 15)
    // APIServiceSpec's priorities are not omitempty.
    .zero(r#"{"metadata":{"creationTimestamp":null},"spec":{"groupPriorityMinimum":0,"versionPriority":0},"status":{}}"#)
    // apiServerStatusStrategy.GetResetFields: a status write keeps spec and all metadata.
    .status_resets(&[&["spec"], &["metadata"]])
    // k8s.io/kube-aggregator/pkg/apiserver/scheme: runtime.NewScheme() on line 32.
    .scheme(
        "pkg/apiserver/scheme/scheme.go:32",
        &["apiregistration.k8s.io/v1", "apiregistration.k8s.io/v1beta1"],
    );

/// The label of APIServices the server registers for the groups it serves itself.
pub const AUTOMANAGED: &str = "kube-aggregator.kubernetes.io/automanaged";

/// The message of the `Local` condition.
pub const LOCAL_MESSAGE: &str = "Local APIServices are always available";

/// The APIService strategy.
pub struct ApiServiceStrategy;

/// Whether an APIService is served by the server itself (no `spec.service`).
pub fn is_local(apiservice: &APIService) -> bool {
    apiservice.spec.as_ref().is_none_or(|s| s.service.is_none())
}

/// The `Available` condition, if any.
pub fn available(apiservice: &APIService) -> Option<&APIServiceCondition> {
    apiservice
        .status
        .as_ref()?
        .conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == "Available")
}

/// Whether the `Available` condition is `True`.
pub fn is_available(apiservice: &APIService) -> bool {
    available(apiservice).is_some_and(|c| c.status == "True")
}

/// Sets the `Available` condition as upstream's helper does: reason and message replaced,
/// `lastTransitionTime` changed only when the status changes. Returns whether anything changed.
pub fn set_available(
    apiservice: &mut APIService,
    status: &str,
    reason: &str,
    message: &str,
) -> bool {
    let now = Time(k8s_openapi::jiff::Timestamp::now());
    let conditions = apiservice
        .status
        .get_or_insert_with(Default::default)
        .conditions
        .get_or_insert_with(Vec::new);
    match conditions.iter_mut().find(|c| c.type_ == "Available") {
        Some(condition) => {
            let same = condition.status == status
                && condition.reason.as_deref() == Some(reason)
                && condition.message.as_deref() == Some(message);
            if same {
                return false;
            }
            if condition.status != status {
                condition.last_transition_time = Some(now);
            }
            condition.status = status.to_string();
            condition.reason = Some(reason.to_string());
            condition.message = Some(message.to_string());
            true
        }
        None => {
            conditions.push(APIServiceCondition {
                type_: "Available".to_string(),
                status: status.to_string(),
                last_transition_time: Some(now),
                reason: Some(reason.to_string()),
                message: Some(message.to_string()),
            });
            true
        }
    }
}

impl Strategy for ApiServiceStrategy {
    type Object = APIService;

    fn info(&self) -> &ResourceInfo {
        &APISERVICE_INFO
    }

    fn name_rule(&self) -> fn(&str) -> Vec<String> {
        validation::path_segment_name
    }

    fn name_against_object(&self, object: &Value, name: &str) -> Option<String> {
        let spec = object
            .get("spec")
            .and_then(|spec| APIServiceSpec::deserialize(spec).ok())
            .unwrap_or_default();
        validation::required_name(&spec, name)
    }

    fn default(&self, apiservice: &mut APIService) {
        if let Some(service) = apiservice.spec.as_mut().and_then(|s| s.service.as_mut()) {
            service.port.get_or_insert(443);
        }
    }

    /// Upstream's PrepareForCreate resets status to the empty struct (which Go always writes:
    /// `status: {}`); a local APIService is Available at once.
    fn prepare_for_create(&self, apiservice: &mut APIService) {
        apiservice.status.get_or_insert_default();
        if is_local(apiservice) {
            set_available(apiservice, "True", "Local", LOCAL_MESSAGE);
        }
    }

    /// A `/status` write changes none of the labels, annotations, finalizers or owners.
    fn prepare_for_status_update(&self, new: &mut APIService, old: &APIService) {
        new.metadata.labels.clone_from(&old.metadata.labels);
        new.metadata
            .annotations
            .clone_from(&old.metadata.annotations);
        new.metadata.finalizers.clone_from(&old.metadata.finalizers);
        new.metadata
            .owner_references
            .clone_from(&old.metadata.owner_references);
    }

    fn validate_create(&self, apiservice: &APIService) -> FieldErrors {
        validation::validate(apiservice)
    }

    fn validates_metadata_on_update(&self) -> bool {
        true
    }

    fn validate_update(&self, new: &APIService, _old: &APIService) -> FieldErrors {
        validation::validate(new)
    }

    fn validate_status_update(&self, new: &APIService, _old: &APIService) -> FieldErrors {
        validation::validate_status(new)
    }

    fn columns(&self) -> Vec<Column> {
        vec![
            NAME_COLUMN,
            Column {
                name: "Service",
                kind: "string",
                format: "",
                description: "The reference to the service that hosts this API endpoint.",
                priority: 0,
            },
            Column {
                name: "Available",
                kind: "string",
                format: "",
                description: "Whether this service is available.",
                priority: 0,
            },
            AGE_COLUMN,
        ]
    }

    fn cells(&self, apiservice: &APIService) -> Vec<Value> {
        let service = match apiservice.spec.as_ref().and_then(|s| s.service.as_ref()) {
            None => "Local".to_string(),
            Some(s) => format!(
                "{}/{}",
                s.namespace.as_deref().unwrap_or_default(),
                s.name.as_deref().unwrap_or_default()
            ),
        };
        let available = match available(apiservice) {
            None => "Unknown".to_string(),
            Some(c) => match c.reason.as_deref().unwrap_or_default() {
                reason if c.status != "True" && !reason.is_empty() => {
                    format!("{} ({reason})", c.status)
                }
                _ => c.status.clone(),
            },
        };
        vec![
            json!(apiservice.metadata.name.as_deref().unwrap_or_default()),
            json!(service),
            json!(available),
            json!(age(&crate::created(&apiservice.metadata))),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cells_show_local_and_reasons() {
        let strategy = ApiServiceStrategy;
        let mut local: APIService = crate::typed(
            json!({"metadata": {"name": "v1."}, "spec": {"version": "v1",
            "groupPriorityMinimum": 1, "versionPriority": 1}}),
        );
        strategy.prepare_for_create(&mut local);
        assert_eq!(
            strategy.cells(&local)[1..3],
            [json!("Local"), json!("True")]
        );
        let mut remote: APIService =
            crate::typed(json!({"metadata": {"name": "v1alpha1.example.com"},
            "spec": {"groupPriorityMinimum": 1, "versionPriority": 1,
                     "service": {"namespace": "ext", "name": "api"}}}));
        strategy.prepare_for_create(&mut remote);
        assert_eq!(
            strategy.cells(&remote)[1..3],
            [json!("ext/api"), json!("Unknown")]
        );
        assert!(set_available(&mut remote, "False", "MissingEndpoints", "m"));
        assert!(!set_available(
            &mut remote,
            "False",
            "MissingEndpoints",
            "m"
        ));
        assert_eq!(
            strategy.cells(&remote)[2],
            json!("False (MissingEndpoints)")
        );
        strategy.default(&mut remote);
        assert_eq!(
            remote.spec.and_then(|s| s.service).and_then(|s| s.port),
            Some(443)
        );
    }
}
