//! `capstan`: a Kubernetes-compatible control plane for service networking.
//!
//! Today the binary wires up the storage layer (`capstan serve` opens the store, recovers it,
//! and keeps it compacted); the API server is wired in by the next layers.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use capstan_storage::{Compactor, EmbeddedOptions, EmbeddedStore, Storage};
use clap::{Parser, Subcommand, ValueEnum};

#[derive(Parser)]
#[command(name = "capstan", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Start Capstan.
    Serve(ServeArgs),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum StorageKind {
    /// The crash-safe embedded store in --data-dir (the default; one machine).
    Embedded,
    /// etcd v3 at --etcd-servers (several replicas sharing one cluster state).
    Etcd,
}

#[derive(clap::Args)]
struct ServeArgs {
    /// Where the embedded store (and, later, certificates and kubeconfig) live.
    #[arg(long, default_value = "./capstan-data")]
    data_dir: PathBuf,
    /// Which storage engine to use.
    #[arg(long, value_enum, default_value_t = StorageKind::Embedded)]
    storage: StorageKind,
    /// etcd client URLs, comma separated (with --storage etcd).
    #[arg(long, value_delimiter = ',', default_value = "http://127.0.0.1:2379")]
    etcd_servers: Vec<String>,
    /// Key prefix in etcd, so one etcd can host several Capstan clusters.
    #[arg(long, default_value = "/registry/")]
    etcd_prefix: String,
    /// How often storage history is compacted (kube-apiserver's default: 5m). 0 disables it.
    #[arg(long, alias = "compaction-interval", default_value = "5m", value_parser = parse_duration)]
    etcd_compaction_interval: Duration,
}

/// Parses Go-style durations as kube-apiserver flags take them: `300ms`, `90s`, `5m`, `1h`, `0`.
fn parse_duration(text: &str) -> Result<Duration, String> {
    if text == "0" {
        return Ok(Duration::ZERO);
    }
    let split = text
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .ok_or_else(|| format!("missing unit in duration {text:?} (use ms, s, m or h)"))?;
    let (number, unit) = text.split_at(split);
    let number: f64 = number
        .parse()
        .map_err(|_| format!("invalid duration {text:?}"))?;
    let seconds = match unit {
        "ms" => number / 1000.0,
        "s" => number,
        "m" => number * 60.0,
        "h" => number * 3600.0,
        _ => return Err(format!("unknown unit {unit:?} in duration {text:?}")),
    };
    Duration::try_from_secs_f64(seconds).map_err(|e| format!("invalid duration {text:?}: {e}"))
}

async fn open_storage(args: &ServeArgs) -> anyhow::Result<Arc<dyn Storage>> {
    match args.storage {
        StorageKind::Embedded => {
            let store = EmbeddedStore::open(EmbeddedOptions::new(&args.data_dir))
                .with_context(|| format!("opening the store in {}", args.data_dir.display()))?;
            Ok(Arc::new(store))
        }
        #[cfg(feature = "etcd")]
        StorageKind::Etcd => {
            let mut options = capstan_storage::EtcdOptions::new(args.etcd_servers.clone());
            options.prefix = args.etcd_prefix.clone();
            let store = capstan_storage::EtcdStore::connect(options)
                .await
                .with_context(|| format!("connecting to etcd at {:?}", args.etcd_servers))?;
            Ok(Arc::new(store))
        }
        #[cfg(not(feature = "etcd"))]
        StorageKind::Etcd => anyhow::bail!(
            "this capstan was built without the etcd engine; rebuild with `--features etcd`"
        ),
    }
}

async fn serve(args: ServeArgs) -> anyhow::Result<()> {
    let store = open_storage(&args).await?;
    let revision = store.current_revision().await?;
    tracing::info!(storage = ?args.storage, revision, "storage ready");
    let _compactor = (!args.etcd_compaction_interval.is_zero())
        .then(|| Compactor::start(store.clone(), args.etcd_compaction_interval));
    shutdown_signal().await;
    tracing::info!("shutting down");
    Ok(())
}

async fn shutdown_signal() {
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = terminate => {}
    }
}

fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let runtime = tokio::runtime::Runtime::new().context("starting the async runtime")?;
    match cli.command {
        Command::Serve(args) => runtime.block_on(serve(args)),
    }
}

#[cfg(test)]
mod tests {
    use super::parse_duration;
    use std::time::Duration;

    #[test]
    fn durations_parse_like_kube_apiserver_flags() {
        assert_eq!(parse_duration("5m"), Ok(Duration::from_secs(300)));
        assert_eq!(parse_duration("90s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("1.5h"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_duration("0"), Ok(Duration::ZERO));
        assert!(parse_duration("5").is_err());
        assert!(parse_duration("5d").is_err());
        assert!(parse_duration("m").is_err());
    }
}
