//! /proc/self/maps parsing speed: every reconcile parses the whole maps text once. The input is
//! a ComfyUI-sized one (5,000 lines: torch's CUDA libraries, anonymous tensor memory, a mapped
//! safetensors file), built here so the figure does not depend on the machine. Prints the median
//! and writes bench/results/maps_parse.json. Run: cargo bench --no-default-features --bench maps

use std::fmt::Write;
use std::time::Instant;

use viking_engine::parse_maps;

fn maps_text(lines: u64) -> String {
    let libraries = ["libtorch_cuda.so", "libcublasLt.so.12", "libcudnn_engines_precompiled.so.9", "libc.so.6", "_C.cpython-312-x86_64-linux-gnu.so"];
    let mut text = String::new();
    let mut addr = 0x7f00_0000_0000u64;
    for i in 0..lines {
        let len = 0x1000u64 << (i % 9);
        let (perms, inode, path) = match i % 5 {
            0 | 1 => ("rw-p", 0, String::new()),
            2 => ("r--p", 4_000_000 + i % 40, format!("/opt/venv/lib/python3.12/site-packages/torch/lib/{}", libraries[(i % 5) as usize])),
            3 => ("r-xp", 4_000_000 + i % 40, format!("/opt/venv/lib/python3.12/site-packages/nvidia/lib/{}", libraries[(i / 5 % 5) as usize])),
            _ => ("rw-p", 77, "/models/checkpoints/flux1-dev-fp8.safetensors".to_string()),
        };
        let device = if inode == 0 { "00:00" } else { "fd:01" };
        writeln!(text, "{addr:x}-{:x} {perms} {:08x} {device} {inode:<26} {path}", addr + len, (i % 7) * 0x1000).unwrap();
        addr += len + if i % 3 == 0 { 0x1000 } else { 0 };
    }
    text
}

fn main() {
    let lines = 5_000u64;
    let text = maps_text(lines);
    let mut samples = Vec::new();
    let mut parsed = 0;
    for _ in 0..200 {
        let started = Instant::now();
        let mappings = parse_maps(&text);
        samples.push(started.elapsed().as_secs_f64() * 1e6);
        parsed = mappings.len();
        std::hint::black_box(mappings);
    }
    assert_eq!(parsed as u64, lines, "every line parses");
    samples.sort_by(|a, b| a.total_cmp(b));
    let median = samples[samples.len() / 2];
    println!("maps parse: {lines} lines ({} KiB) -> median {median:.1} us, min {:.1} us over {} runs", text.len() / 1024, samples[0], samples.len());
    let git = |args: &[&str]| std::process::Command::new("git").args(args).output().ok().map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string());
    let commit = git(&["rev-parse", "--short", "HEAD"]).unwrap_or_default();
    let dirty = git(&["status", "--porcelain", "--", "src/memmap.rs", "benches/maps.rs"]).is_some_and(|s| !s.is_empty());
    let json = format!(
        "{{\n  \"bench\": \"maps_parse\",\n  \"commit\": \"{commit}\",\n  \"dirty\": {dirty},\n  \"machine\": \"the development machine (2 cores, no GPU)\",\n  \"lines\": {lines},\n  \"text_bytes\": {},\n  \"median_us\": {median:.1},\n  \"min_us\": {:.1},\n  \"runs\": {}\n}}\n",
        text.len(),
        samples[0],
        samples.len()
    );
    let out = concat!(env!("CARGO_MANIFEST_DIR"), "/bench/results/maps_parse.json");
    std::fs::create_dir_all(std::path::Path::new(out).parent().unwrap()).unwrap();
    std::fs::write(out, json).unwrap();
    println!("wrote {out}");
}
