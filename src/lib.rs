//! Viking Engine: pins ComfyUI model weights where they lie in RAM, within a RAM budget.
//!
//! Layers, from the bottom:
//! - `sys`: thin unsafe calls (CUDA driver through cudarc, mlock, /proc);
//! - `backend`: safe backends behind one trait, and `Registration`, which unpins on drop;
//! - `budget`, `pressure`, `plan`, `spans`, `memmap`, `cgroup`: pure logic, no I/O, unit- and property-tested;
//! - `ledger`, `engine`, `status`: the live registrations, `reconcile`, the status snapshot;
//! - `python`: the pyo3 module (thin), with the one mapping of errors to Python exceptions.
//!
//! Only the pyo3 module uses the engine from outside; the planner is re-exported for the
//! benchmark in benches/plan.rs.

// Without the pyo3 bindings only the tests and the planner bench use the engine.
#![cfg_attr(not(feature = "python"), allow(dead_code))]

pub(crate) mod backend;
pub(crate) mod budget;
pub(crate) mod cgroup;
pub(crate) mod engine;
pub(crate) mod error;
pub(crate) mod ledger;
pub(crate) mod memmap;
pub(crate) mod plan;
pub(crate) mod pressure;
pub(crate) mod spans;
pub(crate) mod status;
pub(crate) mod sys;

#[cfg(feature = "python")]
mod python;

/// What benches/plan.rs measures: the pure planner.
pub use memmap::MemoryKind;
/// What benches/maps.rs measures: the /proc/self/maps parser.
pub use memmap::parse as parse_maps;
pub use plan::{plan, HostRange, Pinned, Rules};

/// Property-test cases: 500 by default; the fuzz run in scripts/test.sh sets VIKING_FUZZ_CASES.
#[cfg(test)]
pub(crate) fn fuzz_cases() -> u32 {
    std::env::var("VIKING_FUZZ_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(500)
}
