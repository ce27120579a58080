//! Samples the RSS and CPU time of server processes from `/proc` while a scenario runs.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// What the server processes used.
#[derive(Debug, Clone, Copy)]
pub struct Usage {
    /// Peak of the summed resident set size, MiB.
    pub peak_rss_mib: f64,
    /// CPU seconds (user + system) consumed during the run.
    pub cpu_seconds: f64,
}

fn rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

fn cpu_ticks(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = stat.rsplit_once(')')?.1;
    let fields: Vec<&str> = after.split_whitespace().collect();
    // Fields 14 and 15 of /proc/PID/stat (utime, stime) are 11 and 12 after the comm.
    Some(fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?)
}

/// A background sampler.
pub struct Sampler {
    pids: Vec<u32>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<u64>>,
    start_ticks: u64,
}

const TICKS_PER_SECOND: f64 = 100.0;

impl Sampler {
    /// Starts sampling (does nothing without pids).
    pub fn start(pids: &[u32]) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let start_ticks = pids.iter().filter_map(|p| cpu_ticks(*p)).sum();
        let thread = (!pids.is_empty()).then(|| {
            let pids = pids.to_vec();
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut peak = 0;
                while !stop.load(Ordering::Relaxed) {
                    peak = peak.max(pids.iter().filter_map(|p| rss_kib(*p)).sum());
                    std::thread::sleep(Duration::from_millis(100));
                }
                peak
            })
        });
        Sampler {
            pids: pids.to_vec(),
            stop,
            thread,
            start_ticks,
        }
    }

    /// Stops and reports.
    pub fn finish(mut self) -> Option<Usage> {
        self.stop.store(true, Ordering::Relaxed);
        let peak = self.thread.take()?.join().ok()?;
        let end: u64 = self.pids.iter().filter_map(|p| cpu_ticks(*p)).sum();
        Some(Usage {
            peak_rss_mib: peak as f64 / 1024.0,
            cpu_seconds: end.saturating_sub(self.start_ticks) as f64 / TICKS_PER_SECOND,
        })
    }
}
