//! The child process of the storage crash test (`tests/crash.rs`): writes to an embedded store
//! as fast as it can from many tasks and prints `key revision` for every write the store
//! acknowledged, until it is killed.
//!
//! Usage: `capstan-crash-writer DATA_DIR TAG`

use std::io::Write;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use capstan_storage::{Compare, EmbeddedOptions, EmbeddedStore, Op, Storage, Txn, TxnOutcome};

const WRITERS: usize = 16;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let (Some(dir), Some(tag)) = (args.next(), args.next()) else {
        return Err("usage: capstan-crash-writer DATA_DIR TAG".into());
    };
    let store =
        Arc::new(EmbeddedStore::open(EmbeddedOptions::new(dir)).map_err(|e| e.to_string())?);
    let out = Arc::new(Mutex::new(std::io::stdout()));
    let mut tasks = Vec::new();
    for writer in 0..WRITERS {
        let (store, out, tag) = (store.clone(), out.clone(), tag.clone());
        tasks.push(tokio::spawn(async move {
            for n in 0u64.. {
                let key = format!("crash/{tag}/{writer}/{n}");
                let txn = Txn::new()
                    .when(Compare::Absent(key.clone()))
                    .then(Op::Put(key.clone(), Bytes::from(key.clone())));
                match store.txn(txn).await {
                    Ok(TxnOutcome::Committed { revision, .. }) => {
                        let mut out = out.lock().unwrap_or_else(|e| e.into_inner());
                        // One write per line, flushed: the parent only trusts whole lines.
                        if writeln!(out, "{key} {revision}")
                            .and_then(|()| out.flush())
                            .is_err()
                        {
                            return;
                        }
                    }
                    other => panic!("write of {key} was not committed: {other:?}"),
                }
            }
        }));
    }
    for task in tasks {
        task.await?;
    }
    Ok(())
}
