//! The status snapshot: the one JSON document the nodes, the HTTP route and the UI all read.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::backend::cuda::DeviceInfo;
use crate::backend;
use crate::budget::{self, Budget, MemorySnapshot, Policy};
use crate::engine::{Counters, Engine};
use crate::plan::{SkipReason, Skipped};
use crate::sys;

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SkipSummary {
    pub reason: String,
    pub description: String,
    pub bytes: u64,
    pub count: usize,
}

impl SkipSummary {
    pub fn new(reason: &str, description: &str, bytes: u64, count: usize) -> SkipSummary {
        SkipSummary { reason: reason.into(), description: description.into(), bytes, count }
    }
}

/// Groups skipped ranges by reason, in a fixed order.
pub fn summarize_skips(skipped: &[Skipped]) -> Vec<SkipSummary> {
    let mut by_reason: BTreeMap<SkipReason, (u64, usize)> = BTreeMap::new();
    for skip in skipped {
        let slot = by_reason.entry(skip.reason).or_default();
        slot.0 += skip.len;
        slot.1 += 1;
    }
    by_reason
        .into_iter()
        .map(|(reason, (bytes, count))| {
            let name = serde_json::to_value(reason).ok().and_then(|v| v.as_str().map(str::to_owned)).unwrap_or_default();
            SkipSummary::new(&name, reason.describe(), bytes, count)
        })
        .collect()
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct OwnerStatus {
    pub owner: u64,
    pub label: String,
    pub priority: i32,
    pub wanted_bytes: u64,
    pub pinned_bytes: u64,
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
    pub registrations: usize,
    pub owners: Vec<OwnerStatus>,
    pub cuda: CudaStatus,
    pub os_lock_available: bool,
    pub paging: Paging,
    pub counters: Counters,
    pub release_failures: u64,
    pub last_release_error: Option<String>,
    pub events: Vec<String>,
}

impl Engine {
    /// A fresh snapshot. `probe_cuda`: open the CUDA backend if it is not yet open (to report
    /// the device); otherwise CUDA is described only once something used it. `mark_run`: start
    /// a new "since the last run" period for the paging counters.
    pub fn status(&self, probe_cuda: bool, mark_run: bool) -> Status {
        let os_lock_available = self.oslock().is_some();
        let mut state = self.lock();
        let cuda = if probe_cuda || state.cuda_opened() {
            match state.cuda() {
                Ok(backend) => {
                    let memory = backend.memory_info().ok();
                    CudaStatus {
                        available: true,
                        reason: None,
                        device: Some(backend.info().clone()),
                        free_bytes: memory.map(|m| m.0),
                        total_bytes: memory.map(|m| m.1),
                    }
                }
                Err(error) => CudaStatus { available: false, reason: Some(error.to_string()), device: None, free_bytes: None, total_bytes: None },
            }
        } else {
            CudaStatus { available: false, reason: Some("not probed yet".into()), device: None, free_bytes: None, total_bytes: None }
        };

        let totals = state.ledger.totals();
        let mut owners: BTreeMap<u64, OwnerStatus> = BTreeMap::new();
        for (&owner, record) in &state.owners {
            owners.insert(
                owner,
                OwnerStatus {
                    owner,
                    label: record.label.clone(),
                    priority: record.priority,
                    wanted_bytes: record.wanted_bytes,
                    skipped: record.skipped.clone(),
                    ..OwnerStatus::default()
                },
            );
        }
        for (&(owner, backend_kind), &(bytes, count)) in &totals {
            let entry = owners.entry(owner).or_insert_with(|| OwnerStatus { owner, ..OwnerStatus::default() });
            entry.pinned_bytes += bytes;
            entry.regions += count;
            *entry.by_backend.entry(backend_kind.name()).or_default() += bytes;
        }

        for (owner, record) in &state.owners {
            let counts: Option<Vec<(u64, u64)>> = record.ranges.iter().map(|&(addr, len)| sys::os::residency(addr, len)).collect();
            if let (Some(counts), Some(entry)) = (counts, owners.get_mut(owner)) {
                entry.resident_bytes = Some(counts.iter().map(|c| c.0).sum());
                entry.swapped_bytes = Some(counts.iter().map(|c| c.1).sum());
            }
        }

        for entry in state.ledger.entries() {
            let swapped = sys::os::residency(entry.addr(), entry.len()).map(|(_, swapped)| swapped);
            if let Some(owner) = owners.get_mut(&entry.owner) {
                owner.pinned_swapped_bytes = match (owner.pinned_swapped_bytes, swapped) {
                    (_, None) => None,
                    (total, Some(bytes)) => Some(total.unwrap_or(0) + bytes),
                };
            }
        }

        let pinned_bytes = state.ledger.total_bytes();
        let memory = state.snapshot();
        let swaps_now = sys::os::swap_counters();
        let page = sys::os::page_size();
        let delta = |then: Option<(u64, u64)>, pick: fn((u64, u64)) -> u64| -> Option<u64> {
            Some(pick(swaps_now?).saturating_sub(pick(then?)) * page)
        };
        let paging = Paging {
            swap_total: memory.swap_total,
            swap_used: memory.swap_used,
            process_swapped_bytes: sys::os::self_status_bytes("VmSwap"),
            swapped_in_since_start: delta(state.swaps_at_start, |c| c.0),
            swapped_out_since_start: delta(state.swaps_at_start, |c| c.1),
            swapped_in_since_last_run: delta(state.swaps_at_last_run, |c| c.0),
            swapped_out_since_last_run: delta(state.swaps_at_last_run, |c| c.1),
            process_page_faults: sys::os::page_faults(),
            commit_limit: memory.commit_limit,
            commit_available: memory.commit_available,
            working_set_minimum: sys::os::working_set_minimum(),
        };
        if mark_run {
            state.swaps_at_last_run = swaps_now;
        }
        let (release_failures, last_release_error) = backend::release_failures();
        Status {
            version: env!("CARGO_PKG_VERSION"),
            budget: budget::compute(&memory, &state.policy),
            memory,
            policy: state.policy,
            pinned_bytes,
            registrations: state.ledger.entries().count(),
            owners: owners.into_values().collect(),
            cuda,
            os_lock_available,
            paging,
            counters: state.counters,
            release_failures,
            last_release_error,
            events: state.events.clone(),
        }
    }
}
