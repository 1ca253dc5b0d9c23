//! Viking Engine: pins ComfyUI model weights where they lie in RAM, within a RAM budget.
//!
//! Layers, from the bottom:
//! - `sys`: thin unsafe calls (CUDA driver through cudarc, mlock, /proc);
//! - `backend`: safe backends behind one trait, and `Registration`, which unpins on drop;
//! - `budget`, `plan`, `memmap`, `cgroup`: pure logic, no I/O, unit- and property-tested;
//! - `ledger`, `engine`, `status`: the live registrations, `reconcile`, the status JSON;
//! - `python`: the pyo3 module (thin), with the one mapping of errors to Python exceptions.

pub mod backend;
pub mod budget;
pub mod cgroup;
pub mod engine;
pub mod error;
pub mod ledger;
pub mod memmap;
pub mod plan;
pub mod status;
pub mod sys;

#[cfg(feature = "python")]
mod python;

/// Property-test cases: 500 by default; the fuzz run in scripts/test.sh sets VIKING_FUZZ_CASES.
#[cfg(test)]
pub(crate) fn fuzz_cases() -> u32 {
    std::env::var("VIKING_FUZZ_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(500)
}
