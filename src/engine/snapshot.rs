//! Fills in the status snapshot (`crate::status`) from the engine's state and the machine.

use std::collections::BTreeMap;

use super::Engine;
use crate::backend;
use crate::budget;
use crate::memmap;
use crate::status::{CudaStatus, OwnerStatus, Paging, Status};
use crate::sys;

impl Engine {
    /// A fresh snapshot. `probe_cuda`: open the CUDA backend if it is not yet open (to report
    /// the device); otherwise CUDA is described only once something used it. `mark_run`: start
    /// a new "since the last run" period for the paging counters.
    pub fn status(&self, probe_cuda: bool, mark_run: bool) -> Status {
        self.status_reading(probe_cuda, mark_run, true)
    }

    /// `status`, where `residency` says whether to read the page tables of every pinned range
    /// (~24 ms per GiB): without, each owner's residency figures stay None (ComfyUI's side
    /// serves them from a sample made off its execution thread).
    pub fn status_reading(&self, probe_cuda: bool, mark_run: bool, residency: bool) -> Status {
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
        // What the page-table reads below need, copied: they take ~24 ms per GiB, and the
        // engine's lock is not held for them (every pin, release and budget call waits on it).
        let wanted: BTreeMap<u64, Vec<(u64, u64)>> = state.owners.iter().map(|(&owner, record)| (owner, record.ranges.clone())).collect();
        for entry in state.ledger.entries().filter(|e| e.registration.through_file_view()) {
            if let Some(owner) = owners.get_mut(&entry.owner) {
                owner.file_page_bytes += entry.len();
            }
        }
        for entry in state.ledger.entries().filter(|e| e.viewed()) {
            if let Some(owner) = owners.get_mut(&entry.owner) {
                owner.mapped_view_bytes += entry.len();
            }
        }
        let pins: Vec<(u64, u64, u64, bool)> =
            state.ledger.entries().map(|e| (e.owner, e.addr(), e.len(), e.registration.pending())).collect();
        let pinned_bytes = state.ledger.total_bytes();
        let pinned_by_others = state.foreign_bytes;
        let (pressure_ceiling, pressure) = (state.pressure_ceiling(), state.pressure_status());
        let (policy, counters, events) = (state.policy, state.counters, state.events.clone());
        let (swaps_at_start, swaps_at_last_run) = (state.swaps_at_start, state.swaps_at_last_run);
        let swaps_now = sys::os::swap_counters();
        if mark_run {
            state.swaps_at_last_run = swaps_now;
        }
        drop(state);

        // Each owner's pages are read once: its pins lie inside its wanted ranges (all but the
        // file pages Viking maps itself, read on their own).
        let page = sys::os::page_size();
        let mut pins_of: BTreeMap<u64, Vec<(u64, u64)>> = BTreeMap::new();
        for &(owner, addr, len, pending) in &pins {
            pins_of.entry(owner).or_default().push((addr, len));
            if let (true, Some(entry)) = (pending, owners.get_mut(&owner)) {
                entry.pending_bytes += len;
            }
        }
        for (owner, entry) in owners.iter_mut().filter(|_| residency) {
            let ranges = wanted.get(owner).map_or(&[][..], Vec::as_slice);
            let mut owner_pins = pins_of.remove(owner).unwrap_or_default();
            owner_pins.sort_unstable();
            let mut read = |addr, len, visit: &mut dyn FnMut(u64, &[u64])| sys::os::pagemap_chunks(addr, len, visit);
            let Some((found, outside)) = memmap::residency_in_one_pass(page, ranges, &owner_pins, &mut read) else {
                continue;
            };
            entry.resident_bytes = Some(found.resident_bytes);
            entry.swapped_bytes = Some(found.swapped_bytes);
            if !owner_pins.is_empty() {
                let rest: Option<u64> = outside.iter().map(|&(addr, len)| sys::os::residency(addr, len).map(|(_, swapped)| swapped)).sum();
                entry.pinned_swapped_bytes = rest.map(|rest| found.pinned_swapped_bytes + rest);
            }
        }

        let memory = super::memory_snapshot(pinned_bytes, pinned_by_others);
        let delta = |then: Option<(u64, u64)>, pick: fn((u64, u64)) -> u64| -> Option<u64> {
            Some(pick(swaps_now?).saturating_sub(pick(then?)) * page)
        };
        let paging = Paging {
            swap_total: memory.swap_total,
            swap_used: memory.swap_used,
            process_swapped_bytes: sys::os::self_status_bytes("VmSwap"),
            swapped_in_since_start: delta(swaps_at_start, |c| c.0),
            swapped_out_since_start: delta(swaps_at_start, |c| c.1),
            swapped_in_since_last_run: delta(swaps_at_last_run, |c| c.0),
            swapped_out_since_last_run: delta(swaps_at_last_run, |c| c.1),
            process_page_faults: sys::os::page_faults(),
            commit_limit: memory.commit_limit,
            commit_available: memory.commit_available,
            working_set_minimum: sys::os::working_set_minimum(),
        };
        let (release_failures, last_release_error) = backend::release_failures();
        Status {
            version: env!("CARGO_PKG_VERSION"),
            budget: budget::compute(&memory, &policy, pressure_ceiling.as_ref()),
            memory,
            policy,
            pinned_bytes,
            pending_bytes: owners.values().map(|o| o.pending_bytes).sum(),
            registrations: pins.len(),
            owners: owners.into_values().collect(),
            cuda,
            os_lock_available,
            os_lock_limit_bytes: crate::sys::os::lock_limit(),
            monitor_releases: self.monitor_releases.load(std::sync::atomic::Ordering::Relaxed),
            pressure,
            paging,
            counters,
            release_failures,
            last_release_error,
            events,
        }
    }
}
