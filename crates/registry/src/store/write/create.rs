//! CREATE: a new object from a body (or a controller's typed object), its name generated
//! when asked, allocated, validated and written when absent.

use super::*;

/// A created object, and the compact JSON a create answers with ([`meta::typed_json_bytes`] of
/// it): its stored bytes with the `resourceVersion` put in, when it was stored (a dry run
/// encodes nothing).
pub struct Created {
    /// The object as written, with its `resourceVersion`.
    pub object: Value,
    /// Its compact JSON, `kind` and `apiVersion` first.
    pub json: Option<Vec<u8>>,
    /// Its kind's warnings about it (upstream's WarningsOnCreate).
    pub warnings: Vec<String>,
}

impl Registry {
    /// CREATE. `object` is the decoded body with the namespace already settled.
    pub async fn create(
        &self,
        namespace: &str,
        object: Value,
        options: &WriteOptions,
    ) -> Result<Value, ApiError> {
        Ok(self
            .create_answered(namespace, object, options)
            .await?
            .object)
    }

    /// [`Registry::create`], with the JSON to answer with: a handler answering in compact
    /// JSON sends the stored bytes, rather than encoding the object again.
    pub async fn create_answered(
        &self,
        namespace: &str,
        object: Value,
        options: &WriteOptions,
    ) -> Result<Created, ApiError> {
        // A body is in its type's form; an applied configuration is normalized by defaulting.
        let object = match options.applied {
            true => UnderWrite::any(object),
            false => UnderWrite::normal(object),
        };
        self.create_under_write(namespace, object, options).await
    }

    /// [`Registry::create_answered`] of an object under write (a typed create's, whose rules
    /// take the typed object rather than decode it from the JSON).
    pub(super) async fn create_under_write(
        &self,
        namespace: &str,
        mut object: UnderWrite,
        options: &WriteOptions,
    ) -> Result<Created, ApiError> {
        let info = self.strategy.info();
        let namespaced = info.namespaced.then_some(namespace);
        object.clear_for_create(namespaced);
        self.strategy.default_under_write(&mut object);
        if !options.applied {
            let tracking =
                crate::managed::Tracking::new(info, self.strategy.schema(), Subresource::Main);
            object.edit_unseen(|json, _| {
                crate::managed::record_update(json, None, &options.field_manager, &tracking);
            });
        }
        let uid = capstan_machinery::uid::new_v4_string();
        object.set_identity(&uid, meta::now_second());
        self.strategy.prepare_for_create(&mut object);
        if info.namespaced {
            self.check_namespace(namespace, &object.name(false)).await?;
        }
        let prefix = object.name(true);
        let generate = object.name(false).is_empty() && !prefix.is_empty();
        let attempts = if generate { GENERATE_NAME_ATTEMPTS } else { 1 };
        // A kind that allocates is tried again from the object as it came (its allocations
        // are made afresh); any other leaves the object as it was, a generated name aside, so
        // a failed attempt's object is tried again itself: the object is not copied first.
        // The copy an allocating kind's attempt starts from leaves out the managedFields just
        // recorded (most of the object, and no rule touches them): each attempt's object
        // takes them, and hands them on to the next should it fail.
        let (original, mut again, mut managed) = if self.strategy.allocates() {
            let managed = object.move_managed_fields(ManagedFields::take);
            (Some(object), None, managed)
        } else {
            (None, Some(object), None)
        };
        for attempt in 0..attempts.max(WRITE_ATTEMPTS) {
            let mut candidate = match (&original, again.take()) {
                (Some(object), _) => {
                    let mut candidate = object.clone();
                    if let Some(managed) = managed.take() {
                        candidate.move_managed_fields(|json| managed.put(json));
                    }
                    candidate
                }
                (None, Some(again)) => again,
                (None, None) => break,
            };
            if generate {
                candidate.set_name(&generate_name(&prefix));
            }
            let name = candidate.name(false);
            let key = info.key(namespace, &name);
            // Allocation first, as upstream's BeginCreate: its errors pre-empt validation's,
            // and validation sees the allocated values.
            let Admitted {
                extras,
                errors: invalid,
                warnings,
            } = self
                .strategy
                .admit(
                    self.storage.as_ref(),
                    &mut candidate,
                    None,
                    Subresource::Main,
                    options.dry_run,
                )
                .await?;
            #[cfg(debug_assertions)]
            if original.is_none() {
                // What lets a failed attempt's object be tried again: admitting it once more
                // (as a retry does, with a view of its own) changes nothing.
                let mut again = UnderWrite::normal(candidate.json().clone());
                let admitted = self
                    .strategy
                    .admit(
                        self.storage.as_ref(),
                        &mut again,
                        None,
                        Subresource::Main,
                        true,
                    )
                    .await;
                debug_assert!(admitted.is_ok(), "admitting the object again failed");
                debug_assert_eq!(
                    again.json(),
                    candidate.json(),
                    "admitting an object of a kind that does not allocate is not idempotent"
                );
            }
            let mut errors = FieldErrors::new();
            self.validate_meta_create(candidate.json(), &mut errors);
            errors.extend(invalid);
            if !errors.is_empty() {
                return Err(self.invalid(meta::name(candidate.json()), &errors));
            }
            if options.dry_run {
                let existing = self.storage.get(&key, None).await.map_err(storage_error)?;
                if existing.kv.is_some() {
                    return Err(ApiError::already_exists(info.group_resource(), &name)
                        .after_warnings(&warnings));
                }
                candidate.set_resource_version("");
                return Ok(Created {
                    object: candidate.into_json(),
                    json: None,
                    warnings,
                });
            }
            let absent = Compare::Absent(key.clone());
            let (txn, encoded) = self.put(absent, &key, &mut candidate, options.applied, extras)?;
            match self.storage.txn(txn).await.map_err(storage_error)? {
                TxnOutcome::Committed { revision, .. } => {
                    let object = candidate.into_written(revision);
                    let json = encoded.1.map(|layout| {
                        meta::with_resource_version(&encoded.0, layout.mark(), revision)
                    });
                    #[cfg(debug_assertions)]
                    if let Some(json) = &json {
                        // The bytes encoding the object itself gives.
                        let encoded = self.json_of(&object, false, &|_| None).0;
                        debug_assert_eq!(
                            String::from_utf8_lossy(json),
                            String::from_utf8_lossy(&encoded)
                        );
                    }
                    return Ok(Created {
                        object,
                        json,
                        warnings,
                    });
                }
                TxnOutcome::Failed { current, .. } => {
                    let taken = current.first().is_some_and(Option::is_some);
                    let retry = !taken || (generate && attempt + 1 < attempts);
                    if retry {
                        // An allocation raced another write (allocate again), or the
                        // generated name is taken (generate another).
                        if original.is_none() {
                            again = Some(candidate);
                        } else {
                            managed = candidate.move_managed_fields(ManagedFields::take);
                        }
                        continue;
                    }
                    if generate {
                        return Err(ApiError::generate_name_exhausted(
                            info.group_resource(),
                            &name,
                        )
                        .after_warnings(&warnings));
                    }
                    let existing = current
                        .first()
                        .and_then(|kv| kv.as_ref())
                        .and_then(|kv| self.decode(kv).ok());
                    let mut err = ApiError::already_exists(info.group_resource(), &name);
                    if existing.is_some_and(|e| !meta::meta_str(&e, "deletionTimestamp").is_empty())
                    {
                        err.message = format!("object is being deleted: {}", err.message);
                    }
                    // The kind's warnings were recorded before the write failed (upstream's
                    // BeforeCreate), and go out with the error.
                    return Err(err.after_warnings(&warnings));
                }
            }
        }
        Err(ApiError::new(
            500,
            capstan_machinery::Reason::ServerTimeout,
            format!(
                "The create operation against {} could not be completed at this time, please try again.",
                info.group_resource()
            ),
        ))
    }
}

/// An object's `metadata.managedFields`, taken out of it, and where in its metadata they were.
struct ManagedFields(usize, Value);

impl ManagedFields {
    fn take(object: &mut Value) -> Option<Self> {
        let metadata = object.get_mut("metadata")?.as_object_mut()?;
        let at = metadata.keys().position(|k| k == "managedFields")?;
        Some(Self(at, metadata.shift_remove("managedFields")?))
    }

    /// Puts them back where they were.
    fn put(self, object: &mut Value) {
        if let Some(metadata) = object.get_mut("metadata").and_then(Value::as_object_mut) {
            let at = self.0.min(metadata.len());
            metadata.shift_insert(at, "managedFields".to_string(), self.1);
        }
    }
}

/// `prefix` (cut to leave room) and five random characters of upstream's alphabet.
fn generate_name(prefix: &str) -> String {
    let mut cut = prefix.len().min(58);
    while !prefix.is_char_boundary(cut) {
        cut -= 1;
    }
    let mut name = prefix[..cut].to_string();
    for _ in 0..5 {
        name.push(NAME_ALPHABET[fastrand::usize(..NAME_ALPHABET.len())] as char);
    }
    name
}

#[cfg(test)]
mod tests {
    use super::{ManagedFields, NAME_ALPHABET, generate_name};
    use serde_json::json;

    #[test]
    fn generated_names_use_upstreams_alphabet() {
        let name = generate_name("gen-");
        assert_eq!(name.len(), 9);
        assert!(name[4..].bytes().all(|c| NAME_ALPHABET.contains(&c)));
        assert_eq!(generate_name(&"a".repeat(70)).len(), 63);
    }

    #[test]
    fn managed_fields_set_aside_go_back_where_they_were() {
        let entries = json!([{"manager": "m", "fieldsV1": {"f:spec": {}}}]);
        for at in 0..3 {
            let mut metadata = serde_json::Map::new();
            for (i, name) in ["name", "namespace"].into_iter().enumerate() {
                if i == at {
                    metadata.insert("managedFields".into(), entries.clone());
                }
                metadata.insert(name.into(), json!(name));
            }
            if at == 2 {
                metadata.insert("managedFields".into(), entries.clone());
            }
            let object = json!({"metadata": metadata, "spec": {"type": "ClusterIP"}});
            let mut taken = object.clone();
            let managed = ManagedFields::take(&mut taken).expect("has managedFields");
            assert_eq!(taken["metadata"].get("managedFields"), None);
            let mut copy = taken.clone();
            managed.put(&mut copy);
            assert_eq!(copy.to_string(), object.to_string(), "at {at}");
        }
        // None to take: nothing changes.
        let mut bare = json!({"metadata": {"name": "a"}});
        assert!(ManagedFields::take(&mut bare).is_none());
        assert_eq!(bare, json!({"metadata": {"name": "a"}}));
    }
}
