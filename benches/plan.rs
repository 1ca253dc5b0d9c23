//! Planner speed: 10,000 tensor-sized ranges (a large checkpoint's worth), half adjacent so they
//! merge, with live registrations to subtract and a budget that cuts. Prints the median and
//! writes bench/results/plan.json. Run: cargo bench --no-default-features --bench plan

use std::time::Instant;

use viking_engine::MemoryKind;
use viking_engine::{plan, HostRange, Pinned, Rules};

fn main() {
    let count = 10_000u64;
    let mut ranges = Vec::with_capacity(count as usize);
    let mut addr = 0x7f00_0000_0000u64;
    // Deterministic pseudo-random sizes from 4 KiB to 64 MiB (xorshift).
    let mut seed = 0x9e3779b97f4a7c15u64;
    for i in 0..count {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        let len = 4096 << (seed % 15);
        ranges.push(HostRange { addr, len, owner: i % 4, priority: (i % 3) as i32, kind: MemoryKind::Anonymous });
        // Every other range is followed by a gap, so half of them merge with the next one.
        addr += len + if i % 2 == 0 { 0 } else { 4096 };
    }
    let pinned: Vec<Pinned> = ranges.iter().step_by(97).map(|r| Pinned { addr: r.addr, len: r.len / 2, owner: None }).collect();
    let total: u64 = ranges.iter().map(|r| r.len).sum();
    let rules = Rules::with_room(total / 2);

    let mut samples = Vec::new();
    let mut regions = 0;
    for _ in 0..25 {
        let started = Instant::now();
        let result = plan(&ranges, &pinned, &rules);
        samples.push(started.elapsed().as_secs_f64() * 1e3);
        regions = result.regions.len();
        std::hint::black_box(result);
    }
    samples.sort_by(|a, b| a.total_cmp(b));
    let median = samples[samples.len() / 2];
    println!("plan: {count} ranges ({:.1} GiB) -> {regions} regions, median {median:.2} ms, min {:.2} ms over {} runs", total as f64 / (1u64 << 30) as f64, samples[0], samples.len());
    // The commit measured, and whether the planner's source differed from it.
    let git = |args: &[&str]| std::process::Command::new("git").args(args).output().ok().map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string());
    let commit = git(&["rev-parse", "--short", "HEAD"]).unwrap_or_default();
    let dirty = git(&["status", "--porcelain", "--", "src", "benches"]).is_some_and(|s| !s.is_empty());
    let json = format!(
        "{{\n  \"bench\": \"plan\",\n  \"commit\": \"{commit}\",\n  \"dirty\": {dirty},\n  \"machine\": \"the development machine (2 cores, no GPU)\",\n  \"ranges\": {count},\n  \"total_bytes\": {total},\n  \"regions\": {regions},\n  \"median_ms\": {median:.3},\n  \"min_ms\": {:.3},\n  \"runs\": {},\n  \"target_ms\": 10.0\n}}\n",
        samples[0],
        samples.len()
    );
    let out = concat!(env!("CARGO_MANIFEST_DIR"), "/bench/results/plan.json");
    std::fs::create_dir_all(std::path::Path::new(out).parent().unwrap()).unwrap();
    std::fs::write(out, json).unwrap();
    println!("wrote {out}");
}
