//! What the in-process benchmarks share.

use std::time::Instant;

/// The server's allocator, so allocation costs what it costs in `capstan serve`.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// The iterations per figure: env `CAPSTAN_BENCH_ITERATIONS`, default 20,000.
pub fn iterations() -> u32 {
    std::env::var("CAPSTAN_BENCH_ITERATIONS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20_000)
}

/// Prints the mean time of `run` over `iterations` runs (after a tenth as many to warm up),
/// per `unit`.
pub fn time(label: &str, unit: &str, iterations: u32, mut run: impl FnMut()) {
    for _ in 0..iterations / 10 {
        run();
    }
    let started = Instant::now();
    for _ in 0..iterations {
        run();
    }
    let per = started.elapsed() / iterations.max(1);
    println!("{label:<48} {:>8.2} µs per {unit}", per.as_secs_f64() * 1e6);
}
