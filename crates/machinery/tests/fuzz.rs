//! Property tests: every decoder and patch engine a client can reach takes arbitrary input
//! without panicking (errors are fine; panics are bugs).

use capstan_machinery::{
    continue_token::ContinueToken, fields::FieldSelector, labels::LabelSelector, media, patch,
    protobuf, smp, yaml,
};
use proptest::prelude::*;
use serde_json::Value;

// The machinery's test data, as its unit tests have it (the `testdata` feature is for the
// crates above).
#[path = "../src/testdata.rs"]
#[allow(dead_code)]
mod testdata;
use capstan_machinery::GroupVersionData;
use testdata::SERVICE;

fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i32>().prop_map(Value::from),
        "[a-z$/]{0,12}".prop_map(Value::String),
    ];
    leaf.prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..5).prop_map(Value::Array),
            prop::collection::btree_map(
                prop_oneof![
                    Just("spec".to_string()),
                    Just("ports".to_string()),
                    Just("port".to_string()),
                    Just("metadata".to_string()),
                    Just("labels".to_string()),
                    Just("finalizers".to_string()),
                    Just("$patch".to_string()),
                    Just("$retainKeys".to_string()),
                    Just("$setElementOrder/ports".to_string()),
                    Just("$deleteFromPrimitiveList/finalizers".to_string()),
                    "[a-z]{1,6}",
                ],
                inner,
                0..5
            )
            .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn protobuf_bodies_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
        let mut body = b"k8s\x00".to_vec();
        body.extend_from_slice(&bytes);
        let _ = protobuf::decode(&body, SERVICE.messages());
        let _ = protobuf::decode(&bytes, SERVICE.messages());
    }

    #[test]
    fn duplicate_field_checks_never_panic(text in "[{}\\[\\],:\"a-c0-9 ]{0,200}") {
        let _ = capstan_machinery::strict::duplicate_fields(text.as_bytes());
    }

    /// The one-pass body decoder decodes what serde_json decodes, and fails where it fails
    /// with the same words.
    #[test]
    fn bodies_decode_as_serde_json_decodes_them(
        text in "[{}\\[\\],:\"a-c0-9.e\\\\ -]{0,120}",
        value in json_value(),
    ) {
        for text in [text.into_bytes(), serde_json::to_vec(&value).unwrap_or_default()] {
            let ours = capstan_machinery::strict::from_slice_with_duplicates(&text)
                .map(|(value, _)| value)
                .map_err(|e| e.to_string());
            let theirs = serde_json::from_slice::<Value>(&text).map_err(|e| e.to_string());
            prop_assert_eq!(ours, theirs);
        }
    }

    #[test]
    fn yaml_bodies_never_panic(text in "[ -~\n]{0,200}") {
        let _ = yaml::from_slice(text.as_bytes());
        let _ = yaml::duplicate_key(text.as_bytes());
    }

    #[test]
    fn selectors_and_tokens_never_panic(text in "[ -~]{0,60}") {
        let _ = LabelSelector::parse(&text);
        let _ = FieldSelector::parse(&text);
        let _ = ContinueToken::decode(&text);
        let _ = media::negotiate(&text, false);
        let _ = media::negotiate_plain(&text);
        let _ = media::body_format(Some(&text));
    }

    #[test]
    fn patch_engines_never_panic(original in json_value(), patch_doc in json_value()) {
        let schema = SERVICE.definition("io.k8s.api.core.v1.Service");
        let _ = smp::apply(original.clone(), &patch_doc, schema);
        let bytes = serde_json::to_vec(&patch_doc).unwrap_or_default();
        let _ = patch::merge_patch(original.clone(), &bytes);
        let _ = patch::json_patch(original.clone(), &bytes);
        if let Some(schema) = schema {
            let _ = capstan_machinery::go_json::type_error("Service", schema, &patch_doc);
            let _ = capstan_machinery::go_json::type_error("Service", schema, &serde_json::json!({"spec": patch_doc, "metadata": original}));
        }
    }
}
