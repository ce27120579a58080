//! The write verbs: create, update, patch and server-side apply, and the optimistic loop
//! they share.

use super::*;
use crate::current::Current;
use crate::detached::Detached;
use crate::under_write::UnderWrite;

mod create;
pub use create::Created;
mod patch;
pub use patch::{FieldValidation, Patch};
mod typed;

/// What a write does when the object changed between its read and its transaction.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum OnConflict {
    /// Compute the write again on the new object (patch, apply, unconditional update).
    Retry,
    /// Answer 409 (an update pinned to the `resourceVersion` it read).
    Fail,
    /// Refuse the write when the object exists (an update without `resourceVersion` of a
    /// kind that needs one; a missing object may still be created).
    Refuse,
}

/// What a write reads of the stored object before it computes the new one.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Reads {
    /// Its members as stored, and its metadata ([`Current::read`]).
    Members,
    /// The whole object, which the write works on (a patch, an apply: [`Current::read_whole`]).
    Whole,
}

impl Registry {
    fn invalid(&self, name: &str, errors: &FieldErrors) -> ApiError {
        let info = self.strategy.info();
        ApiError::invalid(info.group, &info.group_kind(), name, errors)
    }

    fn validate_meta_create(&self, object: &Value, errors: &mut FieldErrors) {
        let info = self.strategy.info();
        let name = meta::name(object);
        let generate_name = meta::meta_str(object, "generateName");
        // Upstream's ValidateObjectMetaAccessor: generateName first, then name.
        if !generate_name.is_empty() {
            for message in self.strategy.validate_name(object, generate_name, true) {
                errors.push(FieldError::invalid(
                    "metadata.generateName",
                    &json!(generate_name),
                    message,
                ));
            }
        }
        if name.is_empty() {
            if generate_name.is_empty() {
                errors.push(FieldError::required(
                    "metadata.name",
                    "name or generateName is required",
                ));
            }
        } else {
            for message in self.strategy.validate_name(object, name, false) {
                errors.push(FieldError::invalid("metadata.name", &json!(name), message));
            }
        }
        let namespace = meta::namespace(object);
        if info.namespaced {
            if namespace.is_empty() {
                errors.push(FieldError::required("metadata.namespace", ""));
            } else {
                for message in validation::dns1123_label(namespace) {
                    errors.push(FieldError::invalid(
                        "metadata.namespace",
                        &json!(namespace),
                        message,
                    ));
                }
            }
        } else if !namespace.is_empty() {
            errors.push(FieldError::forbidden(
                "metadata.namespace",
                "not allowed on this type",
            ));
        }
        if let Some(meta) = meta::metadata(object) {
            errors.extend(validation::validate_object_meta(meta));
        }
        self.kube_finalizer_names(object, errors);
    }

    /// The core group's ValidateObjectMeta and ValidateObjectMetaUpdate add
    /// `validateKubeFinalizerName` for each finalizer, at its index.
    fn kube_finalizer_names(&self, object: &Value, errors: &mut FieldErrors) {
        if !self.strategy.info().group.is_empty() {
            return;
        }
        for (i, finalizer) in meta::finalizers(object).iter().enumerate() {
            for message in validation::kube_finalizer_name(finalizer) {
                errors.push(FieldError::invalid(
                    format!("metadata.finalizers[{i}]"),
                    &json!(finalizer),
                    message,
                ));
            }
        }
    }

    /// Upstream's ValidateObjectMetaAccessorUpdate, in its order: no new finalizers on an
    /// object being deleted, the immutable fields, then labels, annotations and owners.
    fn validate_meta_update(
        &self,
        new: &Value,
        old: &Value,
        subresource: Subresource,
        errors: &mut FieldErrors,
    ) {
        if !meta::meta_str(old, "deletionTimestamp").is_empty() {
            let before = meta::finalizers(old);
            let mut added: Vec<String> = meta::finalizers(new)
                .into_iter()
                .filter(|f| !before.contains(f))
                .collect();
            added.sort();
            added.dedup();
            if !added.is_empty() {
                // Go's `%#v` of the sorted set.
                let quoted: Vec<String> = added.iter().map(|f| capstan_gostd::quote(f)).collect();
                errors.push(FieldError::forbidden(
                    "metadata.finalizers",
                    format!(
                        "no new finalizers can be added if the object is being deleted, found new finalizers []string{{{}}}",
                        quoted.join(", ")
                    ),
                ));
            }
        }
        let field = |object: &Value, name: &str| {
            meta::metadata(object)
                .and_then(|m| m.get(name))
                .cloned()
                .unwrap_or(Value::Null)
        };
        for name in [
            "name",
            "namespace",
            "uid",
            "creationTimestamp",
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
        ] {
            // Go's string fields are "" when absent; its pointers are nil.
            let (now, was) = match name {
                "name" | "namespace" | "uid" | "creationTimestamp" => (
                    json!(meta::meta_str(new, name)),
                    json!(meta::meta_str(old, name)),
                ),
                _ => (field(new, name), field(old, name)),
            };
            if now != was {
                errors.push(FieldError::invalid(
                    format!("metadata.{name}"),
                    &now,
                    "field is immutable",
                ));
            }
        }
        if let Some(meta) = meta::metadata(new) {
            errors.extend(validation::validate_object_meta_update(meta));
        }
        self.kube_finalizer_names(new, errors);
        if subresource == Subresource::Main && self.strategy.validates_metadata_on_update() {
            self.validate_meta_create(new, errors);
        }
    }

    /// UPDATE (PUT) of the main resource or of `/status`. Returns the
    /// stored object and whether it was created.
    pub async fn update(
        &self,
        namespace: &str,
        name: &str,
        new: Value,
        options: &WriteOptions,
        subresource: Subresource,
    ) -> Result<(Value, bool), ApiError> {
        let pinned = meta::resource_version(&new).to_string();
        self.update_with(namespace, name, &pinned, options, subresource, |_| {
            Ok(UnderWrite::normal(new.clone()))
        })
        .await
    }

    /// An update whose object `compute` gives (the same each time it is asked, `pinned` its
    /// `resourceVersion`, empty for none), in its type's form.
    pub(super) async fn update_with(
        &self,
        namespace: &str,
        name: &str,
        pinned: &str,
        options: &WriteOptions,
        subresource: Subresource,
        compute: impl Fn(Option<&Current<'_>>) -> Result<UnderWrite, ApiError>,
    ) -> Result<(Value, bool), ApiError> {
        let unpinned = pinned.is_empty();
        let allowed = self.strategy.info().allow_unconditional_update;
        self.write_loop(
            namespace,
            name,
            options,
            subresource,
            compute,
            (
                match (unpinned, allowed) {
                    (true, true) => OnConflict::Retry,
                    (true, false) => OnConflict::Refuse,
                    (false, _) => OnConflict::Fail,
                },
                Reads::Members,
                // An update's object is its own precondition (its uid, when it names one).
                true,
            ),
        )
        .await
    }

    /// PATCH: `apply` computes the new object, as any JSON (defaulting normalizes it), from the
    /// current one, lent as stored (without `kind` and `apiVersion`). A new object in its
    /// type's form goes through [`Registry::patch_object`] or [`Registry::patch_typed`].
    pub async fn patch(
        &self,
        object: (&str, &str),
        options: &WriteOptions,
        subresource: Subresource,
        apply: impl Fn(&Value) -> Result<Value, ApiError>,
    ) -> Result<Value, ApiError> {
        self.patch_with(object, options, subresource, Reads::Whole, |current| {
            Ok(UnderWrite::any(apply(current.whole()?)?))
        })
        .await
    }

    /// A patch whose new object `patch` computes from the current one (which must exist); the
    /// result is pinned to the current `resourceVersion` unless it names one.
    pub(super) async fn patch_with(
        &self,
        (namespace, name): (&str, &str),
        options: &WriteOptions,
        subresource: Subresource,
        reads: Reads,
        patch: impl Fn(&Current<'_>) -> Result<UnderWrite, ApiError>,
    ) -> Result<Value, ApiError> {
        let compute = |current: Option<&Current<'_>>| {
            let Some(current) = current else {
                return Err(self.not_found(name));
            };
            let mut patched = patch(current)?;
            if meta::resource_version(patched.json()).is_empty() {
                patched.set_resource_version(meta::resource_version(current.meta()));
            }
            Ok(patched)
        };
        let (object, _) = self
            .write_loop(
                namespace,
                name,
                options,
                subresource,
                compute,
                (OnConflict::Retry, reads, false),
            )
            .await?;
        Ok(object)
    }

    /// Server-side apply of `config` (kind and apiVersion already checked and removed) as
    /// `options.field_manager`: creates the object when absent (`true`), else merges it into
    /// the stored one; 409 on conflicts unless `force`.
    pub async fn apply(
        &self,
        namespace: &str,
        name: &str,
        config: Value,
        options: &WriteOptions,
        subresource: Subresource,
        force: bool,
    ) -> Result<(Value, bool), ApiError> {
        let info = self.strategy.info();
        let options = WriteOptions {
            applied: true,
            ..options.clone()
        };
        let tracking = crate::managed::Tracking::new(info, self.strategy.schema(), subresource);
        let conflicts = |conflicts: Vec<crate::managed::Conflict>| {
            let message = if let [one] = conflicts.as_slice() {
                format!(
                    "Apply failed with 1 conflict: conflict with {}: {}",
                    one.manager, one.field
                )
            } else {
                let mut groups: Vec<String> = Vec::new();
                let mut last: Option<&str> = None;
                for c in &conflicts {
                    if last != Some(c.manager.as_str()) {
                        groups.push(format!("conflicts with {}:", c.manager));
                        last = Some(c.manager.as_str());
                    }
                    if let Some(group) = groups.last_mut() {
                        group.push_str(&format!("\n- {}", c.field));
                    }
                }
                format!(
                    "Apply failed with {} conflicts: {}",
                    conflicts.len(),
                    groups.join("\n")
                )
            };
            // Upstream's NewApplyConflict: the causes alone, no name, group or kind.
            let causes = conflicts
                .iter()
                .map(|c| capstan_machinery::field::Cause {
                    reason: "FieldManagerConflict".into(),
                    message: format!("conflict with {}", c.manager),
                    field: c.field.clone(),
                })
                .collect();
            ApiError::new(409, capstan_machinery::Reason::Conflict, message).with_details(
                capstan_machinery::Details {
                    causes,
                    ..Default::default()
                },
            )
        };
        let merge = |live: Option<&Current<'_>>| {
            let live = live.map(Current::whole).transpose()?;
            let object =
                crate::managed::apply(live, &config, &options.field_manager, &tracking, force)
                    .map_err(conflicts)?;
            let mut object = UnderWrite::any(object);
            if live.is_some() && meta::resource_version(&config).is_empty() {
                // Apply never carries an optimistic lock unless the config names a version.
                object.set_resource_version("");
            }
            Ok(object)
        };
        self.write_loop(
            namespace,
            name,
            &options,
            subresource,
            merge,
            (OnConflict::Retry, Reads::Whole, false),
        )
        .await
    }

    pub(super) async fn write_loop(
        &self,
        namespace: &str,
        name: &str,
        options: &WriteOptions,
        subresource: Subresource,
        compute: impl Fn(Option<&Current<'_>>) -> Result<UnderWrite, ApiError>,
        (on_conflict, reads, uid_precondition): (OnConflict, Reads, bool),
    ) -> Result<(Value, bool), ApiError> {
        let main = subresource == Subresource::Main;
        let info = self.strategy.info();
        let key = info.key(namespace, name);
        for _ in 0..WRITE_ATTEMPTS {
            let response = self.storage.get(&key, None).await.map_err(storage_error)?;
            let Some(kv) = response.kv else {
                let mut new = compute(None)?;
                if !main || !(info.allow_create_on_update || options.applied) {
                    return Err(self.not_found(name));
                }
                let uid = meta::meta_str(new.json(), "uid");
                if !uid.is_empty() {
                    return Err(ApiError::conflict(
                        info.group_resource(),
                        name,
                        &format!(
                            "uid mismatch: the provided object specified uid {uid}, and no existing object was found"
                        ),
                    ));
                }
                let created = self.create_under_write(namespace, new, options).await?;
                return Ok((created.object, true));
            };
            // The stored object, decoded as far as this write reads it.
            let old = match reads {
                Reads::Members => Current::read(&kv)?,
                Reads::Whole => Current::read_whole(&kv)?,
            };
            let mut new = compute(Some(&old))?;
            if !new.json().is_object() {
                return Err(ApiError::bad_request(
                    "the object provided is not a JSON object",
                ));
            }
            let sent_rv = meta::resource_version(new.json());
            if !sent_rv.is_empty() && sent_rv != kv.mod_revision.to_string() {
                return Err(ApiError::modified(info.group_resource(), name));
            }
            let sent_uid = meta::meta_str(new.json(), "uid").to_string();
            let old_uid = meta::meta_str(old.meta(), "uid").to_string();
            // Upstream's update takes the object's uid as a precondition; a patch's or an
            // apply's object has none, and a changed uid is refused as immutable.
            if uid_precondition && !sent_uid.is_empty() && sent_uid != old_uid {
                return Err(ApiError::conflict(
                    info.group_resource(),
                    name,
                    &format!(
                        "Precondition failed: UID in precondition: {sent_uid}, UID in object meta: {old_uid}"
                    ),
                ));
            }
            // After the UID precondition, as upstream's GuaranteedUpdate checks it first.
            if on_conflict == OnConflict::Refuse {
                return Err(self.version_required(name));
            }
            new.before_update(info.namespaced.then_some(namespace), old.meta());
            self.strategy.default_under_write(&mut new);
            if old.decoded().is_some() {
                // Compared as a whole (a patch decoded it): so is the new object.
                new.restore_detached();
            }
            if !options.applied {
                let tracking =
                    crate::managed::Tracking::new(info, self.strategy.schema(), subresource);
                new.edit_unseen(|json, detached| {
                    crate::managed::record_update_current(
                        (json, detached),
                        &old,
                        &options.field_manager,
                        &tracking,
                    )
                })?;
            }
            let admitted: Admitted = self
                .strategy
                .admit(
                    self.storage.as_ref(),
                    &mut new,
                    Some(&old),
                    subresource,
                    options.dry_run,
                )
                .await?;
            let (extras, warnings) = (admitted.extras, admitted.warnings);
            let mut errors = FieldErrors::new();
            self.validate_meta_update(new.json(), old.meta(), subresource, &mut errors);
            errors.extend(admitted.errors);
            if !errors.is_empty() {
                return Err(self.invalid(name, &errors));
            }
            new.set_resource_version(&kv.mod_revision.to_string());
            if crate::managed::same_ignoring_times_current(
                new.parts(),
                &old,
                self.strategy.schema(),
            ) {
                return Ok((old.into_whole()?, false));
            }
            let deleted = !meta::meta_str(old.meta(), "deletionTimestamp").is_empty();
            if deleted || options.dry_run {
                // What follows reads the whole object, or answers with it.
                new.restore_detached();
            }
            // Upstream's ShouldDeleteDuringUpdate: an update that leaves a deleted object
            // without finalizers deletes it, unless its grace period is still running or the
            // kind holds it otherwise (a Namespace until its spec.finalizers are gone).
            let finalized = deleted
                && meta::finalizers(new.json()).is_empty()
                && meta::metadata(old.meta())
                    .and_then(|m| m.get("deletionGracePeriodSeconds"))
                    .and_then(Value::as_i64)
                    .is_none_or(|grace| grace == 0)
                && matches!(
                    self.strategy.deleting(&mut new.json().clone()),
                    crate::Deleting::Proceed
                );
            // The last finalizer is gone: the update deletes the object instead, and answers
            // with it as it was last stored (upstream's deleteWithoutFinalizers answers with
            // what storage deleted, at the deletion's revision; a dry run, as it stands).
            let last = if finalized {
                Some(old.into_whole()?)
            } else {
                None
            };
            if options.dry_run {
                return Ok((last.unwrap_or_else(|| new.into_json()), false));
            }
            let unchanged = Compare::ModRevision(key.clone(), kv.mod_revision);
            let txn = match &last {
                Some(last) => {
                    let mut txn = Txn::new().when(unchanged).then(Op::Delete(key.clone()));
                    let released = self.strategy.release(last);
                    txn.compares
                        .extend(extras.compares.into_iter().chain(released.compares));
                    txn.ops.extend(released.ops);
                    txn
                }
                None => {
                    self.put(unchanged, &key, &mut new, options.applied, extras)?
                        .0
                }
            };
            let written = self.storage.txn(txn).await;
            match written.map_err(|error| storage_error(error).after_warnings(&warnings))? {
                TxnOutcome::Committed { revision, .. } => {
                    if let Some(mut last) = last {
                        meta::set_meta_str(&mut last, "resourceVersion", &revision.to_string());
                        return Ok((last, false));
                    }
                    return Ok((new.into_written(revision), false));
                }
                TxnOutcome::Failed { current, .. } => {
                    let object_moved = current.first().is_some_and(|c| {
                        c.as_ref().map(|kv| kv.mod_revision) != Some(kv.mod_revision)
                    });
                    if object_moved && on_conflict == OnConflict::Fail {
                        let modified = ApiError::modified(info.group_resource(), name);
                        return Err(modified.after_warnings(&warnings));
                    }
                    continue;
                }
            }
        }
        Err(ApiError::modified(info.group_resource(), name))
    }
}

impl Registry {
    /// The stored form of an object, with the members kept as encoded JSON (`detached`).
    fn encode_with(&self, object: &Value, detached: &Detached) -> Encoded {
        let (encoded, layout) = self.json_of(object, true, &|key| detached.get(key));
        (Bytes::from(encoded), layout)
    }

    /// An object's JSON as its kind writes it ([`meta::typed_json_bytes_laid_out`]): `kind`
    /// and `apiVersion` first, each struct's members in its Go type's order.
    pub(super) fn json_of<'r>(
        &self,
        object: &Value,
        stored: bool,
        raw: &dyn Fn(&str) -> Option<&'r serde_json::value::RawValue>,
    ) -> (Vec<u8>, Option<meta::StoredLayout>) {
        let info = self.strategy.info();
        let type_meta = (info.api_version(), info.kind);
        let schema = self.strategy.schema();
        meta::typed_json_bytes_laid_out(object, (&type_meta.0, type_meta.1), stored, raw, schema)
    }

    /// Encodes an object for storage within the size bound. As upstream, an object too large
    /// with its managedFields is stored without them, unless they were just applied (server-side
    /// apply owns what it records); one too large even so is refused with etcd's error.
    pub(super) fn encode_bounded(
        &self,
        object: &mut Value,
        detached: &Detached,
        applied: bool,
    ) -> Result<Encoded, ApiError> {
        let encoded = self.encode_with(object, detached);
        if encoded.0.len() <= self.max_object_bytes {
            return Ok(encoded);
        }
        if !applied
            && meta::metadata_mut(object)
                .shift_remove("managedFields")
                .is_some()
        {
            let encoded = self.encode_with(object, detached);
            if encoded.0.len() <= self.max_object_bytes {
                return Ok(encoded);
            }
        }
        Err(ApiError::request_too_large_for_storage())
    }

    /// Upstream's answer to an update without `resourceVersion` where one is required (the
    /// missing version printed as 1.36 prints values in field errors: `0`).
    fn version_required(&self, name: &str) -> ApiError {
        let info = self.strategy.info();
        let errors = FieldErrors(vec![FieldError {
            kind: capstan_machinery::field::ErrorType::Invalid,
            field: "metadata.resourceVersion".into(),
            value: "0".into(),
            detail: "must be specified for an update".into(),
        }]);
        let resource = info.group_resource().to_string();
        ApiError::invalid(info.group, &resource, name, &errors)
    }

    /// The transaction that writes `object` under `key` when `guard` holds, with the
    /// strategy's allocation work (`extras`) in the same transaction.
    fn put(
        &self,
        guard: Compare,
        key: &str,
        object: &mut UnderWrite,
        applied: bool,
        extras: WriteExtras,
    ) -> Result<(Txn, Encoded), ApiError> {
        let encoded =
            object.edit_unseen(|json, detached| self.encode_bounded(json, detached, applied))?;
        let mut txn = Txn::new()
            .when(guard)
            .then(Op::Put(key.to_string(), encoded.0.clone()));
        // The watch cache takes what is known here with the write's event, rather than
        // scanning and decoding the bytes again (when the store delivers it, and what
        // selectors read is in the object here: a typed update's detached lists are only in
        // the bytes).
        if let Some(layout) = &encoded.1
            && (object.detached().is_empty() || self.strategy.selectable_fields().is_empty())
            && self.storage.delivers_hints()
        {
            txn = txn.hint(capstan_storage::Hint::new(crate::cache::Written {
                layout: layout.clone(),
                selectable: self.strategy.selectable(object.json()),
            }));
        }
        txn.compares.extend(extras.compares);
        txn.ops.extend(extras.ops);
        Ok((txn, encoded))
    }
}

/// An object's stored JSON, and where its parts are ([`meta::typed_json_bytes_laid_out`]).
pub(super) type Encoded = (Bytes, Option<meta::StoredLayout>);
