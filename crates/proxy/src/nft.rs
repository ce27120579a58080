//! Talking to nftables through the `nft` command: one atomic transaction per sync (`nft -f -`),
//! and the names of what a table holds (`nft -j list table`).
//!
//! Upstream's kube-proxy does the same through `knftables`, which also execs `nft`: the CLI is
//! the stable interface (netlink's nftables messages are versioned with the kernel, and no
//! maintained Rust crate writes them for every expression the rules use: `numgen`, `vmap`
//! concatenations, dynamic sets with timeouts, `fib`).

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::Stdio;

use anyhow::{Context, bail};
use tokio::io::AsyncWriteExt;
use tokio::process::Command;

use crate::state::Family;

impl Family {
    /// The nftables family keyword of this address family's table.
    pub fn nft(self) -> &'static str {
        match self {
            Family::V4 => "ip",
            Family::V6 => "ip6",
        }
    }
}

/// The `nft` program.
#[derive(Clone, Debug)]
pub struct Nft {
    program: PathBuf,
}

/// The names of the chains and sets (maps included) a table holds.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Existing {
    /// Chain names.
    pub chains: BTreeSet<String>,
    /// Set and map names.
    pub sets: BTreeSet<String>,
}

impl Nft {
    /// `nft` from `$PATH` (or /usr/sbin/nft, where Debian puts it for root).
    pub fn new() -> Nft {
        let program = ["/usr/sbin/nft", "/sbin/nft", "/usr/bin/nft"]
            .iter()
            .map(PathBuf::from)
            .find(|p| p.exists())
            .unwrap_or_else(|| PathBuf::from("nft"));
        Nft { program }
    }

    /// Runs a transaction: every line takes effect, or none does.
    pub async fn apply(&self, script: &str) -> anyhow::Result<()> {
        self.run(script, false).await
    }

    /// Checks a transaction against the kernel without applying it (`nft -c`).
    pub async fn check(&self, script: &str) -> anyhow::Result<()> {
        self.run(script, true).await
    }

    async fn run(&self, script: &str, check_only: bool) -> anyhow::Result<()> {
        let mut child = Command::new(&self.program)
            .args(check_only.then_some("-c"))
            .arg("-f")
            .arg("-")
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("running {}", self.program.display()))?;
        if let Some(mut stdin) = child.stdin.take() {
            stdin
                .write_all(script.as_bytes())
                .await
                .context("writing to nft")?;
        }
        let out = child.wait_with_output().await.context("waiting for nft")?;
        if !out.status.success() {
            let err = String::from_utf8_lossy(&out.stderr);
            bail!("nft -f failed ({}): {}", out.status, first_lines(&err, 12));
        }
        Ok(())
    }

    /// The chains of `table` in `family`, and with `sets` its sets and maps; empty when the
    /// table does not exist. (Listing sets makes the kernel walk every anonymous set's
    /// elements: seconds for 10,000 Services, so it is done only when the rules are not
    /// this process's own.)
    pub async fn list(&self, family: Family, table: &str, sets: bool) -> anyhow::Result<Existing> {
        let mut existing = Existing::default();
        let kinds: &[&str] = if sets {
            &["chains", "sets", "maps"]
        } else {
            &["chains"]
        };
        for kind in kinds {
            let out = Command::new(&self.program)
                .args(["-j", "list", kind, family.nft()])
                .stdin(Stdio::null())
                .kill_on_drop(true)
                .output()
                .await
                .with_context(|| format!("running {}", self.program.display()))?;
            if !out.status.success() {
                let err = String::from_utf8_lossy(&out.stderr);
                bail!(
                    "nft list {kind} failed ({}): {}",
                    out.status,
                    first_lines(&err, 4)
                );
            }
            let listed = parse_listing(&out.stdout, table)?;
            existing.chains.extend(listed.chains);
            existing.sets.extend(listed.sets);
        }
        Ok(existing)
    }

    /// Deletes `table` in `family` if it exists (`capstan proxy --cleanup`).
    pub async fn delete_table(&self, family: Family, table: &str) -> anyhow::Result<()> {
        self.apply(&format!(
            "add table {f} {table}\ndelete table {f} {table}\n",
            f = family.nft()
        ))
        .await
    }
}

impl Default for Nft {
    fn default() -> Self {
        Nft::new()
    }
}

fn first_lines(s: &str, n: usize) -> String {
    s.lines().take(n).collect::<Vec<_>>().join(" | ")
}

/// Reads the names of `table`'s chains and sets out of `nft -j list …`'s JSON.
fn parse_listing(json: &[u8], table: &str) -> anyhow::Result<Existing> {
    let value: serde_json::Value = serde_json::from_slice(json).context("nft -j output")?;
    let mut existing = Existing::default();
    for item in value
        .get("nftables")
        .and_then(|v| v.as_array())
        .into_iter()
        .flatten()
    {
        let name = |kind: &str| {
            let object = item.get(kind)?;
            (object.get("table")?.as_str()? == table).then_some(())?;
            object.get("name")?.as_str().map(str::to_owned)
        };
        if let Some(chain) = name("chain") {
            existing.chains.insert(chain);
        } else if let Some(set) = name("set").or_else(|| name("map")) {
            existing.sets.insert(set);
        }
    }
    Ok(existing)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listing_names_chains_sets_and_maps() {
        let json = br#"{"nftables": [{"metainfo": {"version": "1.0.6", "json_schema_version": 1}},
          {"table": {"family": "ip", "name": "capstan-proxy", "handle": 3}},
          {"chain": {"family": "ip", "table": "capstan-proxy", "name": "services", "handle": 1}},
          {"chain": {"family": "ip", "table": "kube-proxy", "name": "services", "handle": 1}},
          {"chain": {"family": "ip", "table": "other", "name": "input", "handle": 1}},
          {"set": {"family": "ip", "name": "cluster-ips", "table": "capstan-proxy", "type": "ipv4_addr", "handle": 2}},
          {"map": {"family": "ip", "name": "service-ips", "table": "capstan-proxy", "handle": 4}},
          {"rule": {"family": "ip", "table": "capstan-proxy", "chain": "services", "handle": 5, "expr": []}}]}"#;
        let existing = parse_listing(json, "capstan-proxy").expect("parses");
        assert_eq!(existing.chains, BTreeSet::from(["services".to_owned()]));
        assert_eq!(
            existing.sets,
            BTreeSet::from(["cluster-ips".to_owned(), "service-ips".to_owned()])
        );
    }
}
