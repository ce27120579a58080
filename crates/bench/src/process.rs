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
    /// The part of [`Usage::cpu_seconds`] spent in the kernel (system time).
    pub system_seconds: f64,
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

/// CPU time a process (or several) has used, in clock ticks: in user space and in the kernel.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Ticks {
    pub user: u64,
    pub system: u64,
}

impl Ticks {
    /// User and system together.
    pub fn total(self) -> u64 {
        self.user + self.system
    }

    /// What was used since `earlier`.
    pub fn since(self, earlier: Ticks) -> Ticks {
        Ticks {
            user: self.user.saturating_sub(earlier.user),
            system: self.system.saturating_sub(earlier.system),
        }
    }

    /// Ticks as seconds.
    pub fn seconds(ticks: u64) -> f64 {
        ticks as f64 / TICKS_PER_SECOND
    }
}

fn cpu_ticks(pid: u32) -> Option<Ticks> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat_split(stat.rsplit_once(')')?.1)
}

/// User and system ticks from what follows the `(comm)` of a `/proc/.../stat` line.
fn stat_split(after_comm: &str) -> Option<Ticks> {
    let fields: Vec<&str> = after_comm.split_whitespace().collect();
    // Fields 14 and 15 of /proc/PID/stat (utime, stime) are 11 and 12 after the comm.
    Some(Ticks {
        user: fields.get(11)?.parse().ok()?,
        system: fields.get(12)?.parse().ok()?,
    })
}

/// User + system ticks from what follows the `(comm)` of a `/proc/.../stat` line.
fn stat_ticks(after_comm: &str) -> Option<u64> {
    stat_split(after_comm).map(Ticks::total)
}

/// CPU ticks these processes have used so far.
pub fn split_ticks(pids: &[u32]) -> Ticks {
    pids.iter()
        .filter_map(|p| cpu_ticks(*p))
        .fold(Ticks::default(), |sum, t| Ticks {
            user: sum.user + t.user,
            system: sum.system + t.system,
        })
}

/// CPU ticks (user + system) these processes have used so far.
fn total_ticks(pids: &[u32]) -> u64 {
    split_ticks(pids).total()
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
    start_ticks: Ticks,
}

const TICKS_PER_SECOND: f64 = 100.0;

impl Sampler {
    /// Starts sampling (does nothing without pids).
    pub fn start(pids: &[u32]) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let start_ticks = split_ticks(pids);
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
        let used = split_ticks(&self.pids).since(self.start_ticks);
        Some(Usage {
            peak_rss_mib: peak as f64 / 1024.0,
            cpu_seconds: Ticks::seconds(used.total()),
            system_seconds: Ticks::seconds(used.system),
        })
    }
}

/// What one thread (or the threads of one name) of a process has had so far: CPU ticks (user
/// and system), and the time it was runnable but waited for a CPU (the scheduler's run-queue
/// wait, from `/proc/PID/task/TID/schedstat`; 0 where the kernel does not keep it).
#[derive(Debug, Clone, Copy, Default)]
pub struct ThreadTime {
    pub ticks: u64,
    pub waited_ns: u64,
}

/// [`ThreadTime`] of every thread of these processes, summed by `pid/thread-name`
/// (`/proc/PID/task/TID/stat`), so a run can say which part of a server used the CPU.
pub fn thread_ticks(pids: &[u32]) -> std::collections::BTreeMap<String, ThreadTime> {
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
            let ticks = stat_ticks(tail).unwrap_or(0);
            // schedstat: time on a CPU, time waiting on a run queue (ns), timeslices.
            let waited_ns = std::fs::read_to_string(task.path().join("schedstat"))
                .ok()
                .and_then(|s| s.split_whitespace().nth(1)?.parse::<u64>().ok())
                .unwrap_or(0);
            let entry: &mut ThreadTime = by_name.entry(format!("{pid}/{name}")).or_default();
            entry.ticks += ticks;
            entry.waited_ns += waited_ns;
        }
    }
    by_name
}

/// What the threads of one name used between two [`thread_ticks`] samples.
#[derive(Debug, Clone)]
pub struct ThreadUse {
    /// `pid/thread-name`.
    pub thread: String,
    /// CPU seconds (user and system).
    pub cpu_seconds: f64,
    /// Seconds spent runnable, waiting for a CPU.
    pub waited_seconds: f64,
}

/// [`ThreadUse`] per thread name between two [`thread_ticks`] samples, largest CPU first.
pub fn thread_seconds(
    before: &std::collections::BTreeMap<String, ThreadTime>,
    after: &std::collections::BTreeMap<String, ThreadTime>,
) -> Vec<ThreadUse> {
    let mut used: Vec<ThreadUse> = after
        .iter()
        .map(|(name, now)| {
            let was = before.get(name).copied().unwrap_or_default();
            ThreadUse {
                thread: name.clone(),
                cpu_seconds: now.ticks.saturating_sub(was.ticks) as f64 / TICKS_PER_SECOND,
                waited_seconds: now.waited_ns.saturating_sub(was.waited_ns) as f64 / 1e9,
            }
        })
        .collect();
    used.sort_by(|a, b| b.cpu_seconds.total_cmp(&a.cpu_seconds));
    used
}

/// The machine's CPU time so far, in ticks of all CPUs: (idle, all), from `/proc/stat`.
pub fn machine_ticks() -> Option<(u64, u64)> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let line = stat.lines().find(|l| l.starts_with("cpu "))?;
    let ticks: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|t| t.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq steal (guest time is inside user already).
    let all = ticks.iter().take(8).sum();
    Some((ticks.get(3).copied()?, all))
}

/// The share of the machine's CPU time that was idle between two [`machine_ticks`] samples.
pub fn idle_share(before: (u64, u64), after: (u64, u64)) -> f64 {
    let all = after.1.saturating_sub(before.1);
    after.0.saturating_sub(before.0) as f64 / all.max(1) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn threads_and_the_machine_are_read_from_proc() {
        let pid = std::process::id();
        let threads = thread_ticks(&[pid]);
        assert!(
            threads
                .keys()
                .any(|name| name.starts_with(&format!("{pid}/"))),
            "this process's threads: {threads:?}"
        );
        let (idle, all) = machine_ticks().expect("/proc/stat has a cpu line");
        assert!(0 < all && idle <= all);
        assert_eq!(idle_share((10, 100), (40, 200)), 0.3);
        assert_eq!(idle_share((10, 100), (10, 100)), 0.0, "no time passed");
    }

    #[test]
    fn user_and_system_time_are_read_apart() {
        // What follows `(comm)` in /proc/PID/stat: state, then fields 4–13, then utime 7 and
        // stime 3.
        let line = " S 1 1 1 0 -1 4194560 100 0 0 0 7 3 0 0 20 0 1 0 5 0 0";
        let ticks = stat_split(line).expect("a stat line");
        assert_eq!(ticks, Ticks { user: 7, system: 3 });
        assert_eq!(stat_ticks(line), Some(10));
        assert_eq!(stat_split(" S 1 1"), None, "too short");
        let later = Ticks { user: 9, system: 8 };
        assert_eq!(later.since(ticks), Ticks { user: 2, system: 5 });
        assert_eq!(ticks.since(later), Ticks::default(), "never negative");
        // A real stat line parses (this process's).
        assert!(
            cpu_ticks(std::process::id()).is_some(),
            "this process's stat"
        );
    }
}
