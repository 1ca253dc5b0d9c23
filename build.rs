//! Records what the native module is built from, so that a shipped wheel can never silently
//! drift from the source next to it.
//!
//! The hash covers the native source: every file under src/ (hidden files and editor backups
//! ending in `~` left out), Cargo.toml, Cargo.lock and this file. Per file, in the order of the
//! relative paths ('/'-separated, compared byte-wise): the path, a 0 byte, the length of the
//! content as 8 little-endian bytes, the content; CRLF counts as LF, so a Windows checkout
//! hashes like a Linux one. The hash is 64-bit FNV-1a, written `fnv1a64:<16 hex digits>`.
//! comfy_node/native.py computes the same (`source_hash`); the module exposes it as
//! `viking_native.__source_hash__`, and the literal in the binary is what the shipped-wheel
//! test reads without running the module.

use std::fs;
use std::path::Path;

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

fn fnv1a(mut hash: u64, bytes: &[u8]) -> u64 {
    for &b in bytes {
        hash ^= u64::from(b);
        hash = hash.wrapping_mul(FNV_PRIME);
    }
    hash
}

/// CRLF -> LF.
fn normalized(data: Vec<u8>) -> Vec<u8> {
    let mut out = Vec::with_capacity(data.len());
    for (i, &b) in data.iter().enumerate() {
        if b == b'\r' && data.get(i + 1) == Some(&b'\n') {
            continue;
        }
        out.push(b);
    }
    out
}

fn skipped(name: &str) -> bool {
    name.starts_with('.') || name.ends_with('~')
}

/// Regular files under `dir` (symlinks are not followed), as paths relative to the root.
fn walk(root: &Path, rel: &str, out: &mut Vec<String>) {
    let entries = fs::read_dir(root.join(rel)).unwrap_or_else(|e| panic!("read_dir {rel}: {e}"));
    for entry in entries {
        let entry = entry.expect("read_dir entry");
        let name = entry.file_name().into_string().expect("non-UTF-8 file name under src/");
        if skipped(&name) {
            continue;
        }
        let path = format!("{rel}/{name}");
        let kind = entry.file_type().expect("file type");
        if kind.is_dir() {
            walk(root, &path, out);
        } else if kind.is_file() {
            out.push(path);
        }
    }
}

fn main() {
    let root_dir = std::env::var_os("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR");
    let root = Path::new(&root_dir);
    let mut files: Vec<String> =
        ["Cargo.toml", "Cargo.lock", "build.rs"].iter().filter(|f| root.join(f).is_file()).map(|f| f.to_string()).collect();
    walk(root, "src", &mut files);
    files.sort();
    let mut hash = FNV_OFFSET;
    for rel in &files {
        let data = normalized(fs::read(root.join(rel)).unwrap_or_else(|e| panic!("read {rel}: {e}")));
        hash = fnv1a(hash, rel.as_bytes());
        hash = fnv1a(hash, &[0]);
        hash = fnv1a(hash, &(data.len() as u64).to_le_bytes());
        hash = fnv1a(hash, &data);
    }
    println!("cargo:rustc-env=VIKING_SOURCE_HASH=fnv1a64:{hash:016x}");
    // A directory makes cargo look at every file below it (new ones included).
    for watched in ["src", "Cargo.toml", "Cargo.lock", "build.rs"] {
        println!("cargo:rerun-if-changed={watched}");
    }
}
