//! coordination.k8s.io/v1 Lease: what client-go's leader election, node heartbeats and
//! Capstan's own controllers' election hold. Upstream's `pkg/registry/coordination/lease`
//! (strategy) and `pkg/apis/coordination/validation` (rules), with the
//! `CoordinatedLeaderElection` gate off, as 1.36 ships it.

use capstan_machinery::field::{FieldError, FieldErrors};
use capstan_machinery::table::{AGE_COLUMN, Column, NAME_COLUMN, age};
use capstan_machinery::validation;
use capstan_registry::{ResourceInfo, Strategy};
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use serde_json::{Value, json};

/// Lease's identity.
pub static LEASE_INFO: ResourceInfo =
    ResourceInfo::of::<Lease>(&super::V1, "io.k8s.api.coordination.v1.Lease")
        .storage_version_hash("gqkMMb/YqFM=")
        // leaseStrategy: AllowCreateOnUpdate, but not AllowUnconditionalUpdate.
        .create_on_update()
        // LeaseSpec is a struct without omitempty.
        .zero(r#"{"metadata":{"creationTimestamp":null},"spec":{}}"#)
        .priority(16500, 15)
        // pkg/api/legacyscheme: every built-in group decodes through the one scheme.
        .scheme(
            "pkg/api/legacyscheme/scheme.go:30",
            &[
                "coordination.k8s.io/v1",
                "coordination.k8s.io/v1beta1",
                "coordination.k8s.io/v1alpha2",
            ],
        );

/// The one strategy upstream knows (`OldestEmulationVersion`).
const STRATEGIES: &[&str] = &["OldestEmulationVersion"];

/// The holder column's description (`LeaseSpec.holderIdentity`).
const HOLDER: &str = "holderIdentity contains the identity of the holder of a current lease. If Coordinated Leader Election is used, the holder identity must be equal to the elected LeaseCandidate.metadata.name field.";

/// The Lease strategy.
pub struct LeaseStrategy;

/// `ValidateLeaseSpec`.
fn validate_spec(spec: &LeaseSpec) -> FieldErrors {
    let mut errors = FieldErrors::new();
    if let Some(duration) = spec.lease_duration_seconds.filter(|d| *d <= 0) {
        errors.push(FieldError::invalid(
            "spec.leaseDurationSeconds",
            &json!(duration),
            "must be greater than 0",
        ));
    }
    if let Some(transitions) = spec.lease_transitions.filter(|t| *t < 0) {
        errors.push(FieldError::invalid(
            "spec.leaseTransitions",
            &json!(transitions),
            "must be greater than or equal to 0",
        ));
    }
    if let Some(strategy) = &spec.strategy {
        // Upstream's ValidateCoordinatedLeaseStrategy is handed `spec.strategy` and names its
        // child `strategy` once more.
        let path = "spec.strategy.strategy";
        if strategy.split('/').count() == 1 {
            if !STRATEGIES.contains(&strategy.as_str()) {
                errors.push(FieldError::not_supported(
                    path,
                    &json!(strategy),
                    STRATEGIES,
                ));
            }
        } else {
            for message in validation::qualified_name(strategy) {
                errors.push(FieldError::invalid(path, &json!(strategy), message));
            }
        }
    }
    let preferred = spec
        .preferred_holder
        .as_deref()
        .is_some_and(|h| !h.is_empty());
    if preferred && spec.strategy.as_deref().is_none_or(str::is_empty) {
        errors.push(FieldError::forbidden(
            "spec.preferredHolder",
            "may only be specified if `strategy` is defined",
        ));
    }
    errors
}

impl Strategy for LeaseStrategy {
    type Object = Lease;

    fn info(&self) -> &ResourceInfo {
        &LEASE_INFO
    }

    /// `PrepareForCreate`: without the `CoordinatedLeaderElection` gate a Lease has no
    /// strategy or preferred holder.
    fn prepare_for_create(&self, lease: &mut Lease) {
        if let Some(spec) = lease.spec.as_mut() {
            spec.strategy = None;
            spec.preferred_holder = None;
        }
    }

    /// `PrepareForUpdate`: without the gate, neither field may be set unless it already was.
    fn prepare_for_update(&self, new: &mut Lease, old: &Lease) {
        let old = old.spec.as_ref();
        if let Some(spec) = new.spec.as_mut() {
            if old.is_none_or(|s| s.strategy.is_none()) {
                spec.strategy = None;
            }
            if old.is_none_or(|s| s.preferred_holder.is_none()) {
                spec.preferred_holder = None;
            }
        }
    }

    fn validate_create(&self, lease: &Lease) -> FieldErrors {
        validate_spec(&lease.spec.clone().unwrap_or_default())
    }

    fn validate_update(&self, new: &Lease, _old: &Lease) -> FieldErrors {
        validate_spec(&new.spec.clone().unwrap_or_default())
    }

    fn columns(&self) -> Vec<Column> {
        vec![NAME_COLUMN, Column::text("Holder", HOLDER, 0), AGE_COLUMN]
    }

    fn cells(&self, lease: &Lease) -> Vec<Value> {
        let holder = lease
            .spec
            .as_ref()
            .and_then(|s| s.holder_identity.as_deref());
        vec![
            json!(lease.metadata.name.as_deref().unwrap_or_default()),
            json!(holder.unwrap_or_default()),
            json!(age(&crate::created(&lease.metadata))),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::typed;

    fn causes(errors: &FieldErrors) -> Vec<(String, String)> {
        errors
            .0
            .iter()
            .map(|e| (e.field.clone(), e.body()))
            .collect()
    }

    #[test]
    fn durations_and_transitions_are_checked_as_upstream() {
        let lease: Lease =
            typed(json!({"spec": {"leaseDurationSeconds": -1, "leaseTransitions": -2}}));
        assert_eq!(
            causes(&LeaseStrategy.validate_create(&lease)),
            vec![
                (
                    "spec.leaseDurationSeconds".to_string(),
                    "Invalid value: -1: must be greater than 0".to_string()
                ),
                (
                    "spec.leaseTransitions".to_string(),
                    "Invalid value: -2: must be greater than or equal to 0".to_string()
                ),
            ]
        );
        let fine: Lease =
            typed(json!({"spec": {"holderIdentity": "a", "leaseDurationSeconds": 15}}));
        assert!(LeaseStrategy.validate_create(&fine).is_empty());
    }

    #[test]
    fn strategies_are_dropped_without_the_gate_unless_already_set() {
        let mut lease: Lease = typed(json!({"spec": {"strategy": "OldestEmulationVersion",
            "preferredHolder": "b"}}));
        LeaseStrategy.prepare_for_create(&mut lease);
        let spec = lease.spec.clone().unwrap_or_default();
        assert_eq!((spec.strategy, spec.preferred_holder), (None, None));
        let old: Lease = typed(json!({"spec": {"strategy": "OldestEmulationVersion"}}));
        let mut new: Lease = typed(json!({"spec": {"strategy": "x/y", "preferredHolder": "b"}}));
        LeaseStrategy.prepare_for_update(&mut new, &old);
        let spec = new.spec.clone().unwrap_or_default();
        assert_eq!(spec.strategy.as_deref(), Some("x/y"));
        assert_eq!(spec.preferred_holder, None);
    }

    #[test]
    fn an_unknown_strategy_and_a_lone_preferred_holder_are_refused() {
        let lease: Lease = typed(json!({"spec": {"strategy": "Newest"}}));
        let errors = causes(&LeaseStrategy.validate_update(&lease, &lease));
        assert_eq!(errors[0].0, "spec.strategy.strategy");
        assert!(errors[0].1.starts_with("Unsupported value: \"Newest\""));
        let lease: Lease = typed(json!({"spec": {"preferredHolder": "b"}}));
        let errors = causes(&LeaseStrategy.validate_update(&lease, &lease));
        assert_eq!(
            errors,
            vec![(
                "spec.preferredHolder".to_string(),
                "Forbidden: may only be specified if `strategy` is defined".to_string()
            )]
        );
    }

    #[test]
    fn the_holder_is_a_column() {
        let lease: Lease =
            typed(json!({"metadata": {"name": "l"}, "spec": {"holderIdentity": "a"}}));
        let cells = LeaseStrategy.cells(&lease);
        assert_eq!((&cells[0], &cells[1]), (&json!("l"), &json!("a")));
    }
}
