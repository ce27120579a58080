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

/// CPU ticks (user + system) these processes have used so far.
fn total_ticks(pids: &[u32]) -> u64 {
    pids.iter().filter_map(|p| cpu_ticks(*p)).sum()
}

/// CPU seconds (user + system) these processes have used so far; `None` without pids.
pub fn cpu_seconds(pids: &[u32]) -> Option<f64> {
    (!pids.is_empty()).then(|| total_ticks(pids) as f64 / TICKS_PER_SECOND)
}

/// Waits until these processes go idle (two quarter-second windows in a row with at most one
/// CPU tick each, or 30 s) and returns the CPU seconds they used before that: work a scenario
/// left queued when its last request was answered, such as a controller catching up.
pub fn settle(pids: &[u32]) -> Option<f64> {
    if pids.is_empty() {
        return None;
    }
    let start = total_ticks(pids);
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let (mut last, mut busy_until, mut quiet) = (start, start, 0);
    while quiet < 2 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(250));
        let now = total_ticks(pids);
        if now.saturating_sub(last) <= 1 {
            quiet += 1;
        } else {
            quiet = 0;
            busy_until = now;
        }
        last = now;
    }
    Some(busy_until.saturating_sub(start) as f64 / TICKS_PER_SECOND)
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
        let start_ticks = total_ticks(pids);
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
        let end = total_ticks(&self.pids);
        Some(Usage {
            peak_rss_mib: peak as f64 / 1024.0,
            cpu_seconds: end.saturating_sub(self.start_ticks) as f64 / TICKS_PER_SECOND,
        })
    }
}

/// CPU ticks (user + system) of every thread of these processes, summed by thread name
/// (`/proc/PID/task/TID/stat`), so a run can say which part of a server used the CPU.
pub fn thread_ticks(pids: &[u32]) -> std::collections::BTreeMap<String, u64> {
    let mut by_name = std::collections::BTreeMap::new();
    for pid in pids {
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
            continue;
        };
        for task in tasks.flatten() {
            let Ok(stat) = std::fs::read_to_string(task.path().join("stat")) else {
                continue;
            };
            let Some((head, tail)) = stat.rsplit_once(')') else {
                continue;
            };
            let name = head.split_once('(').map_or("", |(_, n)| n);
            let fields: Vec<&str> = tail.split_whitespace().collect();
            let ticks = fields
                .get(11)
                .and_then(|u| u.parse::<u64>().ok())
                .zip(fields.get(12).and_then(|s| s.parse::<u64>().ok()))
                .map_or(0, |(u, s)| u + s);
            *by_name.entry(format!("{pid}/{name}")).or_insert(0) += ticks;
        }
    }
    by_name
}

/// CPU seconds per thread name between two [`thread_ticks`] samples, largest first.
pub fn thread_seconds(
    before: &std::collections::BTreeMap<String, u64>,
    after: &std::collections::BTreeMap<String, u64>,
) -> Vec<(String, f64)> {
    let mut used: Vec<(String, f64)> = after
        .iter()
        .map(|(name, ticks)| {
            let was = before.get(name).copied().unwrap_or(0);
            (
                name.clone(),
                ticks.saturating_sub(was) as f64 / TICKS_PER_SECOND,
            )
        })
        .collect();
    used.sort_by(|a, b| b.1.total_cmp(&a.1));
    used
}
