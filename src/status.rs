//! The status snapshot: the one JSON document the nodes, the HTTP route and the UI all read.
//! Plain data only; `engine/snapshot.rs` fills it in. `viking_native.pyi` and
//! `comfy_node/records.py` describe the same fields for Python: a renamed field fails a test.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::backend::cuda::DeviceInfo;
use crate::budget::{Budget, MemorySnapshot, Policy};
use crate::plan::SkipSummary;

/// Registration calls made, released and failed since the start.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Counters {
    pub registrations: u64,
    pub releases: u64,
    pub failures: u64,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct OwnerStatus {
    pub owner: u64,
    pub label: String,
    pub priority: i32,
    pub wanted_bytes: u64,
    pub pinned_bytes: u64,
    /// Of `pinned_bytes`: pins still being made off the caller's thread (backend/deferred.rs).
    pub pending_bytes: u64,
    /// Of `pinned_bytes`: a private file mapping's bytes held as the file's own pages, through
    /// a shared view (the OS lock, backend/file_view.rs), so nothing was copied.
    pub file_page_bytes: u64,
    /// Of `pinned_bytes`: registrations that mapped views hold (the GPU reads them in place,
    /// backend/mapped.rs); they stay pinned and counted until the last view is gone.
    pub mapped_view_bytes: u64,
    pub regions: usize,
    pub by_backend: BTreeMap<&'static str, u64>,
    pub skipped: Vec<SkipSummary>,
    /// Of the owner's bytes (pinned or not): in RAM now, and swapped out (Linux pagemap).
    pub resident_bytes: Option<u64>,
    pub swapped_bytes: Option<u64>,
    /// Of the bytes Viking pinned: swapped out (should always be 0: that is the point).
    pub pinned_swapped_bytes: Option<u64>,
}

/// Paging seen by the OS: what the swap guard is about.
#[derive(Debug, Clone, Serialize)]
pub struct Paging {
    pub swap_total: u64,
    pub swap_used: u64,
    /// This process's memory in swap now (VmSwap).
    pub process_swapped_bytes: Option<u64>,
    /// Bytes swapped in / out by the whole machine since Viking started, and since the last
    /// marked status (the status node marks one per run; the panel's polls do not).
    pub swapped_in_since_start: Option<u64>,
    pub swapped_out_since_start: Option<u64>,
    pub swapped_in_since_last_run: Option<u64>,
    pub swapped_out_since_last_run: Option<u64>,
    /// This process's page faults so far (Linux: minor + major; Windows: soft + hard).
    pub process_page_faults: Option<u64>,
    /// Windows: the commit limit (RAM + pagefiles) and what is left of it; the working-set
    /// minimum, which bounds what VirtualLock can hold (Viking raises it as it pins).
    pub commit_limit: Option<u64>,
    pub commit_available: Option<u64>,
    pub working_set_minimum: Option<u64>,
}

/// One move of the pressure governor: when (Unix seconds), how many bytes, and why.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PressureEvent {
    pub unix_time: f64,
    /// Given back (0 for a take-back).
    pub bytes: u64,
    /// "the machine stalled 23% of the last 1.5 s"; for a take-back "calm for 31 s".
    pub reason: String,
}

/// The pressure governor (pressure.rs): what it watches, what it sees, what it did.
#[derive(Debug, Clone, Serialize)]
pub struct PressureStatus {
    /// Where the stall figures come from: "psi:/proc/pressure/memory" (the machine's),
    /// "psi:cgroup" (our cgroup v2's memory.pressure); without PSI, "available-ram" (RAM
    /// available plus free swap) or "windows-available-ram" (that, and the OS's low-memory level).
    pub source: &'static str,
    /// Shares of the last window in which some task, and every task, stalled for memory.
    pub some_stalled: Option<f64>,
    pub full_stalled: Option<f64>,
    pub window_seconds: Option<f64>,
    pub state: crate::pressure::State,
    /// The ceiling on our pinned bytes; None: the pressure sets none.
    pub ceiling_bytes: Option<u64>,
    /// How long the pressure must stay low before the ceiling lifts.
    pub hold_seconds: f64,
    pub last_give_back: Option<PressureEvent>,
    pub last_take_back: Option<PressureEvent>,
}

#[derive(Debug, Clone, Serialize)]
pub struct CudaStatus {
    pub available: bool,
    /// Why not, when not available (or not opened yet).
    pub reason: Option<String>,
    pub device: Option<DeviceInfo>,
    pub free_bytes: Option<u64>,
    pub total_bytes: Option<u64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Status {
    pub version: &'static str,
    pub memory: MemorySnapshot,
    pub policy: Policy,
    pub budget: Budget,
    pub pinned_bytes: u64,
    /// Of `pinned_bytes`: pins still being made off the caller's thread.
    pub pending_bytes: u64,
    pub registrations: usize,
    pub owners: Vec<OwnerStatus>,
    pub cuda: CudaStatus,
    pub os_lock_available: bool,
    /// What this process may lock with the OS lock (RLIMIT_MEMLOCK without CAP_IPC_LOCK);
    /// None: no limit. CUDA registrations do not count against it.
    pub os_lock_limit_bytes: Option<u64>,
    /// Whether the native pressure monitor releases pins from its own thread (false: the
    /// caller took relief over, ComfyUI's side does it where no copy can read the pages).
    pub monitor_releases: bool,
    pub pressure: PressureStatus,
    pub paging: Paging,
    pub counters: Counters,
    pub release_failures: u64,
    pub last_release_error: Option<String>,
    pub events: Vec<String>,
}
