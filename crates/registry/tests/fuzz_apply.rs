//! Property test: server-side apply takes any applied configuration over any live object
//! (and any stored managedFields) without panicking.

use capstan_registry::managed;
use proptest::prelude::*;
use serde_json::{Value, json};

fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        (0i64..70000).prop_map(Value::from),
        prop_oneof![
            Just("TCP".to_string()),
            Just("UDP".to_string()),
            "[a-z]{0,6}"
        ]
        .prop_map(Value::String),
    ];
    leaf.prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::btree_map(
                prop_oneof![
                    Just("spec".to_string()),
                    Just("ports".to_string()),
                    Just("port".to_string()),
                    Just("protocol".to_string()),
                    Just("targetPort".to_string()),
                    Just("selector".to_string()),
                    Just("externalIPs".to_string()),
                    Just("metadata".to_string()),
                    Just("labels".to_string()),
                    Just("fieldsV1".to_string()),
                    Just("manager".to_string()),
                    Just("operation".to_string()),
                    "[a-z]{1,6}",
                ],
                inner,
                0..5,
            )
            .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

static SERVICE: capstan_registry::ResourceInfo =
    capstan_registry::ResourceInfo::of::<k8s_openapi::api::core::v1::Service>(
        &capstan_machinery::testdata::SERVICE,
        "io.k8s.api.core.v1.Service",
    )
    .with_status();

fn tracking() -> managed::Tracking {
    let schema = capstan_machinery::testdata::service();
    managed::Tracking::new(&SERVICE, schema, capstan_registry::Subresource::Main)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn apply_never_panics(live in json_value(), config in json_value(), force in any::<bool>()) {
        let live = json!({"metadata": {"name": "x"}, "spec": live});
        let config = json!({"metadata": {"name": "x"}, "spec": config});
        let _ = managed::apply(Some(&live), &config, "fuzz", &tracking(), force);
        let _ = managed::apply(None, &config, "fuzz", &tracking(), force);
        let mut updated = config.clone();
        managed::record_update(&mut updated, Some(&live), "fuzz", &tracking());
    }

    #[test]
    fn arbitrary_managed_fields_never_panic(entries in json_value(), config in json_value()) {
        let live = json!({"metadata": {"name": "x", "managedFields": entries},
                          "spec": {"ports": [{"port": 80, "protocol": "TCP"}]}});
        let config = json!({"metadata": {"name": "x"}, "spec": config});
        let _ = managed::apply(Some(&live), &config, "fuzz", &tracking(), true);
        let mut updated = config.clone();
        managed::record_update(&mut updated, Some(&live), "fuzz", &tracking());
    }
}
