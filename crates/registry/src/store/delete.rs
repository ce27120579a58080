//! DELETE of one object (graceful where the kind says so, finalizers honoured) and of a
//! collection.

use super::*;

impl Registry {
    /// DELETE one object.
    pub async fn delete(
        &self,
        namespace: &str,
        name: &str,
        options: &DeleteOptions,
    ) -> Result<DeleteResult, ApiError> {
        let info = self.strategy.info();
        let key = info.key(namespace, name);
        if let Some(why) = self.strategy.undeletable(name) {
            let gr = info.group_resource();
            return Err(ApiError::new(
                403,
                capstan_machinery::Reason::Forbidden,
                format!("{gr} {} is forbidden: {why}", capstan_gostd::quote(name)),
            )
            .with_details(capstan_machinery::Details {
                name: name.to_string(),
                group: gr.group.to_string(),
                kind: gr.resource.to_string(),
                ..Default::default()
            }));
        }
        for _ in 0..WRITE_ATTEMPTS {
            let response = self.storage.get(&key, None).await.map_err(storage_error)?;
            let Some(kv) = response.kv else {
                return Err(self.not_found(name));
            };
            let old = self.decode(&kv)?;
            let kind_conflict = |why: String| {
                let mut err = ApiError::conflict(info.group_resource(), name, &why);
                err.message = format!(
                    "Operation cannot be fulfilled on {} {}: {why}",
                    info.kind,
                    capstan_gostd::quote(name)
                );
                if let Some(details) = err.details.as_mut() {
                    details.kind = info.kind.to_string();
                }
                err
            };
            if let Some(uid) = &options.uid {
                let stored = meta::meta_str(&old, "uid");
                if uid != stored {
                    return Err(kind_conflict(format!(
                        "the UID in the precondition ({uid}) does not match the UID in record ({stored}). The object might have been deleted and then recreated"
                    )));
                }
            }
            if let Some(rv) = &options.resource_version {
                let stored = kv.mod_revision.to_string();
                if *rv != stored {
                    return Err(kind_conflict(format!(
                        "the ResourceVersion in the precondition ({rv}) does not match the ResourceVersion in record ({stored}). The object might have been modified"
                    )));
                }
            }
            // The kind's own say first (a Namespace is only marked Terminating).
            let mut kept = old.clone();
            let deleting = self.strategy.deleting(&mut kept);
            if deleting == Deleting::Wait {
                return Ok(DeleteResult {
                    object: old,
                    removed: false,
                });
            }
            // The garbage collector's finalizers, as the options ask (upstream's
            // deletionFinalizersForGarbageCollection); a pending graceful deletion keeps them.
            let terminating = !meta::meta_str(&old, "deletionTimestamp").is_empty();
            let mut old = old;
            let mut finalizers_changed = false;
            if let Some(finalizers) = gc_finalizers(&meta::finalizers(&old), options) {
                let pending_graceful = terminating
                    && meta::metadata(&old)
                        .and_then(|m| m.get("deletionGracePeriodSeconds"))
                        .and_then(Value::as_i64)
                        .is_some_and(|g| g > 0);
                if !pending_graceful {
                    set_finalizers(&mut old, &finalizers);
                    set_finalizers(&mut kept, &finalizers);
                    finalizers_changed = true;
                }
            }
            // An object that stays is marked instead: graceful deletion (Pods) with a deadline
            // and grace period until deleted again with a shorter (zero) one; finalizers with
            // the time now and grace 0, once.
            let requested = options
                .grace_period_seconds
                .map(|g| if g < 0 { 1 } else { g });
            let mark = match self
                .strategy
                .grace_period(&old, requested)
                .filter(|g| *g > 0)
            {
                _ if deleting == Deleting::Mark => Marking::Mark(meta::now_rfc3339(), None),
                Some(grace) => {
                    let current = meta::metadata(&old)
                        .and_then(|m| m.get("deletionGracePeriodSeconds"))
                        .and_then(Value::as_i64);
                    // A shorter grace period moves the existing deadline closer by the
                    // difference, as upstream does; a first graceful delete counts from now.
                    match current.filter(|_| terminating) {
                        Some(current) if current <= grace => Marking::Keep,
                        Some(current) => Marking::Mark(
                            meta::shift_rfc3339(
                                meta::meta_str(&old, "deletionTimestamp"),
                                grace - current,
                            )
                            .unwrap_or_else(|| meta::rfc3339_in(grace)),
                            Some(grace),
                        ),
                        None => Marking::Mark(meta::rfc3339_in(grace), Some(grace)),
                    }
                }
                None if !meta::finalizers(&old).is_empty() => {
                    if terminating && !finalizers_changed {
                        Marking::Keep
                    } else if terminating {
                        // Finalizers changed on an object already being deleted: written with
                        // its deletion time kept.
                        Marking::Mark(meta::meta_str(&old, "deletionTimestamp").to_string(), None)
                    } else {
                        Marking::Mark(meta::now_rfc3339(), Some(0))
                    }
                }
                None => Marking::Remove,
            };
            if let Marking::Keep = mark {
                return Ok(DeleteResult {
                    object: old,
                    removed: false,
                });
            }
            if let Marking::Mark(deadline, grace) = mark {
                let mut marked = if deleting == Deleting::Mark {
                    kept
                } else {
                    old.clone()
                };
                // markAsDeleting: a generation moves once, when the deletion starts.
                if !terminating
                    && let Some(generation) = meta::metadata(&marked)
                        .and_then(|m| m.get("generation"))
                        .and_then(Value::as_i64)
                        .filter(|g| *g > 0)
                {
                    meta::metadata_mut(&mut marked)
                        .insert("generation".into(), json!(generation + 1));
                }
                meta::set_meta_str(&mut marked, "deletionTimestamp", &deadline);
                if let Some(grace) = grace {
                    meta::metadata_mut(&mut marked)
                        .insert("deletionGracePeriodSeconds".into(), json!(grace));
                }
                if options.dry_run {
                    return Ok(DeleteResult {
                        object: marked,
                        removed: false,
                    });
                }
                let txn = Txn::new()
                    .when(Compare::ModRevision(key.clone(), kv.mod_revision))
                    .then(Op::Put(
                        key.clone(),
                        self.encode_bounded(&mut marked, &Default::default(), true)?
                            .0,
                    ));
                match self.storage.txn(txn).await.map_err(storage_error)? {
                    TxnOutcome::Committed { revision, .. } => {
                        meta::set_meta_str(&mut marked, "resourceVersion", &revision.to_string());
                        return Ok(DeleteResult {
                            object: marked,
                            removed: false,
                        });
                    }
                    TxnOutcome::Failed { .. } => continue,
                }
            }
            if options.dry_run {
                return Ok(DeleteResult {
                    object: old,
                    removed: true,
                });
            }
            let WriteExtras { compares, ops } = self.strategy.release(&old);
            let mut txn = Txn::new().when(Compare::ModRevision(key.clone(), kv.mod_revision));
            txn.compares.extend(compares);
            txn = txn.then(Op::Delete(key.clone()));
            txn.ops.extend(ops);
            match self.storage.txn(txn).await.map_err(storage_error)? {
                TxnOutcome::Committed { revision, .. } => {
                    let mut object = old;
                    meta::set_meta_str(&mut object, "resourceVersion", &revision.to_string());
                    return Ok(DeleteResult {
                        object,
                        removed: true,
                    });
                }
                TxnOutcome::Failed { .. } => continue,
            }
        }
        Err(ApiError::modified(info.group_resource(), name))
    }

    /// DELETE on a collection: deletes what the list selects; returns the objects as listed.
    pub async fn delete_collection(
        &self,
        namespace: &str,
        list: &ListOptions,
        options: &DeleteOptions,
    ) -> Result<ListResult, ApiError> {
        let mut listed = self.list(namespace, list).await?;
        for object in &listed.items {
            let ns = object.selectable.namespace().to_string();
            let name = object.selectable.name().to_string();
            match self.delete(&ns, &name, options).await {
                Ok(_) => {}
                Err(err) if err.is_not_found() => {}
                Err(err) => return Err(err),
            }
        }
        listed.continue_token = None;
        listed.remaining = None;
        Ok(listed)
    }
}

/// The GC finalizers a delete leaves on the object (upstream's
/// `deletionFinalizersForGarbageCollection`): the others kept in order, then `orphan` when
/// dependents are orphaned, `foregroundDeletion` when they go first. `None` when the set does
/// not change. No kind Capstan serves defaults to orphaning (ReplicationControllers and Jobs
/// do upstream).
fn gc_finalizers(existing: &[String], options: &DeleteOptions) -> Option<Vec<String>> {
    const ORPHAN: &str = "orphan";
    const FOREGROUND: &str = "foregroundDeletion";
    let from_finalizers = |orphan: bool| {
        existing.iter().find_map(|f| match f.as_str() {
            ORPHAN => Some(orphan),
            FOREGROUND => Some(!orphan),
            _ => None,
        })
    };
    let policy = options.propagation.as_deref();
    let orphan = match (options.orphan_dependents, policy) {
        (Some(orphan), _) => orphan,
        (None, Some(policy)) => policy == "Orphan",
        (None, None) => from_finalizers(true).unwrap_or(false),
    };
    let foreground = match (options.orphan_dependents, policy) {
        (Some(_), _) => false,
        (None, Some(policy)) => policy == "Foreground",
        (None, None) => from_finalizers(false).unwrap_or(false),
    };
    let mut out: Vec<String> = existing
        .iter()
        .filter(|f| *f != ORPHAN && *f != FOREGROUND)
        .cloned()
        .collect();
    if orphan {
        out.push(ORPHAN.to_string());
    }
    if foreground {
        out.push(FOREGROUND.to_string());
    }
    let same = {
        let a: std::collections::BTreeSet<&String> = existing.iter().collect();
        let b: std::collections::BTreeSet<&String> = out.iter().collect();
        a == b
    };
    (!same).then_some(out)
}

/// Sets `metadata.finalizers` (removed when empty).
fn set_finalizers(object: &mut Value, finalizers: &[String]) {
    let metadata = meta::metadata_mut(object);
    if finalizers.is_empty() {
        metadata.shift_remove("finalizers");
    } else {
        metadata.insert("finalizers".into(), json!(finalizers));
    }
}

#[cfg(test)]
mod gc_tests {
    use super::*;

    fn options(propagation: Option<&str>, orphan: Option<bool>) -> DeleteOptions {
        DeleteOptions {
            propagation: propagation.map(str::to_string),
            orphan_dependents: orphan,
            ..DeleteOptions::default()
        }
    }

    #[test]
    fn finalizers_follow_the_propagation_policy() {
        let none: Vec<String> = Vec::new();
        assert_eq!(gc_finalizers(&none, &options(None, None)), None);
        assert_eq!(
            gc_finalizers(&none, &options(Some("Background"), None)),
            None
        );
        assert_eq!(
            gc_finalizers(&none, &options(Some("Orphan"), None)),
            Some(vec!["orphan".to_string()])
        );
        assert_eq!(
            gc_finalizers(&["x".to_string()], &options(Some("Foreground"), None)),
            Some(vec!["x".to_string(), "foregroundDeletion".to_string()])
        );
        assert_eq!(
            gc_finalizers(&none, &options(None, Some(true))),
            Some(vec!["orphan".to_string()])
        );
        // Background takes the GC finalizers away again; no options keep them.
        let orphaning = vec!["orphan".to_string()];
        assert_eq!(
            gc_finalizers(&orphaning, &options(Some("Background"), None)),
            Some(vec![])
        );
        assert_eq!(gc_finalizers(&orphaning, &options(None, None)), None);
    }
}
