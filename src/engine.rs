//! The engine: one idempotent `reconcile(owner, wanted ranges)` that makes the owner's pins
//! match what the caller says is in RAM now, within the shared budget. It is the only place
//! that does I/O around the pure parts (memory snapshot, /proc/self/maps) and holds the ledger.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};

use serde::Serialize;

use crate::backend::cuda::{self, CudaBackend};
use crate::backend::faults::{FaultState, Faults, Faulty};
use crate::backend::oslock::OsLock;
use crate::backend::{Backend, BackendChoice, BackendKind, Registration};
use crate::budget::{self, Budget, MemorySnapshot, Os, Policy};
use crate::cgroup;
use crate::error::{Result, VikingError};
use crate::ledger::{Entry, Keepalive, Ledger};
use crate::memmap::{self, MemoryKind};
use crate::plan::{self, HostRange, Pinned, Rules};
use crate::status::{self, SkipSummary};
use crate::sys;

/// What the caller wants pinned for one owner (one model).
pub struct Request {
    pub owner: u64,
    /// A name for people ("flux1-dev.safetensors (MODEL)").
    pub label: String,
    pub priority: i32,
    pub backend: BackendChoice,
    /// At most this many bytes for this owner; `None`: only the shared budget applies.
    pub owner_cap_bytes: Option<u64>,
    /// (addr, len) of each storage, with what keeps it alive.
    pub ranges: Vec<(u64, u64, Keepalive)>,
    /// Pinned by others in this process (ComfyUI's own registrations): never touched.
    pub foreign: Vec<(u64, u64)>,
    /// All bytes others hold pinned in this process (ComfyUI's total), for the budget; at
    /// least the sum of `foreign`.
    pub others_pinned_bytes: u64,
}

#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub owner: u64,
    pub backend: Option<BackendKind>,
    pub wanted_bytes: u64,
    pub pinned_bytes: u64,
    pub newly_pinned_bytes: u64,
    pub released_bytes: u64,
    pub regions_registered: usize,
    pub failures: Vec<String>,
    pub skipped: Vec<SkipSummary>,
    /// Other owners' pins given up to make room: (owner, bytes).
    pub evicted: Vec<(u64, u64)>,
    pub budget: Budget,
}

/// What the status keeps about each owner between calls.
#[derive(Debug, Clone, Default)]
pub struct OwnerRecord {
    pub label: String,
    pub priority: i32,
    pub wanted_bytes: u64,
    /// The owner's ranges as last reconciled, merged (no references: only for residency).
    pub ranges: Vec<(u64, u64)>,
    pub skipped: Vec<SkipSummary>,
}

#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Counters {
    pub registrations: u64,
    pub releases: u64,
    pub failures: u64,
}

pub struct State {
    pub ledger: Ledger,
    pub policy: Policy,
    pub device: i32,
    pub owners: BTreeMap<u64, OwnerRecord>,
    pub counters: Counters,
    pub events: Vec<String>,
    pub foreign_bytes: u64,
    /// Pins released because of memory pressure since it began; 0 when there is none.
    pub given_back_under_pressure: u64,
    /// (pswpin, pswpout) when the engine started, and at the last marked status.
    pub swaps_at_start: Option<(u64, u64)>,
    pub swaps_at_last_run: Option<(u64, u64)>,
    /// CUDA registrations also map into the device (DEVICEMAP); see CudaBackend.
    pub cuda_devicemap: bool,
    cuda: Option<std::result::Result<Arc<CudaBackend>, VikingError>>,
}

const MAX_EVENTS: usize = 32;

impl State {
    pub fn event(&mut self, text: String) {
        if self.events.len() == MAX_EVENTS {
            self.events.remove(0);
        }
        self.events.push(text);
    }

    /// The CUDA backend for the configured device, opened once.
    pub fn cuda(&mut self) -> std::result::Result<Arc<CudaBackend>, VikingError> {
        let (device, devicemap) = (self.device, self.cuda_devicemap);
        self.cuda
            .get_or_insert_with(|| {
                CudaBackend::open(device).map(|cuda| {
                    cuda.set_devicemap(devicemap);
                    Arc::new(cuda)
                })
            })
            .clone()
    }

    pub fn cuda_opened(&self) -> bool {
        self.cuda.is_some()
    }

    /// The machine now, with what this engine holds and has given back.
    pub fn snapshot(&self) -> MemorySnapshot {
        memory_snapshot(self.ledger.total_bytes(), self.foreign_bytes, self.given_back_under_pressure)
    }

    /// The machine and the budget now; forgets what was given back once the pressure is over.
    fn budget(&mut self) -> (MemorySnapshot, Budget) {
        let snapshot = self.snapshot();
        let budget = budget::compute(&snapshot, &self.policy);
        if !budget.under_pressure() {
            self.given_back_under_pressure = 0;
        }
        (snapshot, budget)
    }

    /// Releases entries taken to bring the pins under `budget`; under pressure they count as
    /// given back (see budget.rs). Returns the bytes.
    fn give_back(&mut self, entries: Vec<Entry>, budget: &Budget) -> u64 {
        let bytes = self.release(entries);
        if budget.under_pressure() {
            self.given_back_under_pressure += bytes;
        }
        bytes
    }

    /// Drops entries (unpins them, then frees their memory references) and counts them.
    fn release(&mut self, entries: Vec<Entry>) -> u64 {
        let bytes = entries.iter().map(Entry::len).sum();
        self.counters.releases += entries.len() as u64;
        drop(entries);
        bytes
    }
}

pub struct Engine {
    state: Mutex<State>,
    oslock: Option<Arc<OsLock>>,
    faults: Arc<FaultState>,
}

/// The memory figures of this machine now, with our own and others' pinned bytes.
fn memory_snapshot(pinned_by_us: u64, pinned_by_others: u64, given_back_under_pressure: u64) -> MemorySnapshot {
    let mut system = sysinfo::System::new();
    system.refresh_memory();
    let total_ram = system.total_memory();
    // MemAvailable counts clean page cache as available; the container figure does too.
    let container = cgroup::container(&sys::os::cgroup_levels(), total_ram);
    let commit = sys::os::commit_charge();
    MemorySnapshot {
        total_ram,
        available_ram: container.map_or(u64::MAX, |c| c.available).min(system.available_memory()),
        swap_total: system.total_swap(),
        swap_used: system.used_swap(),
        container_limit: container.map(|c| c.limit),
        pinned_by_us,
        given_back_under_pressure,
        pinned_by_others,
        commit_limit: commit.map(|c| c.0),
        commit_available: commit.map(|c| c.1),
        os: Os::current(),
    }
}

impl Default for Engine {
    fn default() -> Self {
        Self::new()
    }
}

impl Engine {
    pub fn new() -> Engine {
        Engine {
            state: Mutex::new(State {
                ledger: Ledger::default(),
                policy: Policy::default(),
                device: 0,
                owners: BTreeMap::new(),
                counters: Counters::default(),
                events: Vec::new(),
                foreign_bytes: 0,
                given_back_under_pressure: 0,
                swaps_at_start: sys::os::swap_counters(),
                swaps_at_last_run: sys::os::swap_counters(),
                cuda_devicemap: true,
                cuda: None,
            }),
            oslock: OsLock::new().ok().map(Arc::new),
            faults: Arc::new(FaultState::default()),
        }
    }

    /// Test-only: makes later pins and unpins fail on purpose (see backend/faults.rs).
    pub fn set_faults(&self, faults: Faults) {
        self.faults.set(faults);
    }

    /// Wraps a backend in the fault injector while faults are switched on.
    fn maybe_faulty(&self, backend: Arc<dyn Backend>) -> Arc<dyn Backend> {
        if self.faults.get().any() {
            Arc::new(Faulty { inner: backend, state: self.faults.clone() })
        } else {
            backend
        }
    }

    /// Gives RAM back when available memory has fallen below the headroom while pins are held
    /// (another process grew): releases the lowest-priority pins until the shortfall is covered.
    /// Called by the pressure monitor; returns the bytes released.
    pub fn relieve_pressure(&self) -> u64 {
        let mut state = self.lock();
        if state.ledger.total_bytes() == 0 {
            state.given_back_under_pressure = 0;
            return 0;
        }
        let (snapshot, budget) = state.budget();
        if budget.excess_bytes == 0 {
            return 0;
        }
        let taken = state.ledger.take_lowest(budget.excess_bytes, i32::MAX);
        // A copy to the GPU may still read these pages: let it finish before unpinning.
        for entry in &taken {
            if entry.registration.backend() == BackendKind::Cuda {
                entry.registration.quiesce();
                break;
            }
        }
        let mut by_owner: BTreeMap<u64, u64> = BTreeMap::new();
        for entry in &taken {
            *by_owner.entry(entry.owner).or_default() += entry.len();
        }
        let released = state.give_back(taken, &budget);
        for (owner, bytes) in by_owner {
            let label = state.owners.get(&owner).map(|r| r.label.clone()).unwrap_or_default();
            state.event(format!(
                "memory pressure: released {} of '{label}' ({} available, below the {} headroom)",
                budget::gib(bytes),
                budget::gib(snapshot.available_ram),
                budget::gib(budget.headroom_bytes)
            ));
        }
        released
    }

    pub fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock cannot leave the ledger half-written (every change is
        // one insert or remove), so a poisoned lock is still safe to use.
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Sets the shared budget policy and the CUDA device. Pins already held stay; the next
    /// reconcile honours the new budget.
    pub fn configure(&self, policy: Policy, device: i32, cuda_devicemap: Option<bool>) -> Result<()> {
        if device < 0 {
            return Err(VikingError::invalid(format!("device is {device}; CUDA device numbers start at 0")));
        }
        let count = cuda::device_count();
        if device > 0 && device >= count {
            return Err(VikingError::invalid(format!(
                "CUDA device {device} does not exist: this machine has {count} CUDA device(s); use device 0{}",
                if count > 1 { format!("..{}", count - 1) } else { String::new() }
            )));
        }
        let mut state = self.lock();
        if state.device != device {
            if state.ledger.entries().any(|e| e.registration.backend() == BackendKind::Cuda) {
                return Err(VikingError::invalid("release the CUDA pins (unpin all) before changing the device"));
            }
            state.cuda = None;
            state.device = device;
        }
        state.policy = policy;
        if let Some(devicemap) = cuda_devicemap {
            state.cuda_devicemap = devicemap;
            if let Some(Ok(cuda)) = &state.cuda {
                cuda.set_devicemap(devicemap);
            }
        }
        Ok(())
    }

    pub fn oslock(&self) -> Option<Arc<OsLock>> {
        self.oslock.clone()
    }

    fn backend_for(&self, state: &mut State, choice: BackendChoice) -> Result<Arc<dyn Backend>> {
        let oslock = || -> Result<Arc<dyn Backend>> {
            self.oslock.clone().map(|b| b as Arc<dyn Backend>).ok_or_else(|| VikingError::BackendUnavailable {
                backend: "os-lock",
                reason: "page locking is not implemented for this OS yet".into(),
            })
        };
        let backend = match choice {
            BackendChoice::OsLock => oslock(),
            BackendChoice::Cuda => state.cuda().map(|b| b as Arc<dyn Backend>),
            BackendChoice::Auto => match state.cuda() {
                Ok(cuda) => Ok(cuda as Arc<dyn Backend>),
                Err(VikingError::BackendUnavailable { .. }) => oslock(),
                Err(other) => Err(other),
            },
        }?;
        Ok(self.maybe_faulty(backend))
    }

    /// Makes the owner's pins match `request.ranges`: releases what is no longer wanted, pins
    /// what is missing within the budget. Calling it twice with the same input changes nothing.
    pub fn reconcile(&self, request: Request) -> Result<Report> {
        validate_ranges(request.ranges.iter().map(|(a, l, _)| (*a, *l)))?;
        validate_ranges(request.foreign.iter().copied())?;
        let mappings = sys::os::read_self_maps().map(|text| memmap::parse(&text));
        let kind_of = |addr, len| mappings.as_deref().map_or(MemoryKind::Anonymous, |m| memmap::classify(m, addr, len));

        let mut state = self.lock();
        let primary = self.backend_for(&mut state, request.backend)?;
        // Memory CUDA must not take (read-only mappings) goes to the OS lock in auto mode.
        let fallback = match (request.backend, primary.kind()) {
            (BackendChoice::Auto, BackendKind::Cuda) => self.oslock.clone().map(|b| self.maybe_faulty(b)),
            _ => None,
        };
        let owner = request.owner;

        // 1. Release this owner's pins that lie outside what is wanted now.
        let mut wanted: Vec<(u64, u64)> = request.ranges.iter().map(|(a, l, _)| (*a, a + l)).collect();
        wanted.sort();
        let stale = state.ledger.take_where(|e| e.owner == owner && !covered_by(&wanted, e.addr(), e.end()));
        let mut released_bytes = state.release(stale);
        // A per-model budget lowered since the last call: give back what is now beyond it.
        if let Some(cap) = request.owner_cap_bytes {
            let beyond = state.ledger.take_owner_beyond(owner, cap);
            released_bytes += state.release(beyond);
        }

        // 2. The budget, and room made by pressure or by lower-priority owners.
        let foreign_bytes = request.others_pinned_bytes.max(request.foreign.iter().map(|(_, l)| l).sum());
        state.foreign_bytes = foreign_bytes;
        let (_, mut budget) = state.budget();
        let mut evicted: BTreeMap<u64, u64> = BTreeMap::new();
        if budget.excess_bytes > 0 {
            // Over budget already (pressure, or a lowered limit): give back the lowest first.
            let taken = state.ledger.take_lowest(budget.excess_bytes, i32::MAX);
            for entry in &taken {
                *evicted.entry(entry.owner).or_default() += entry.len();
            }
            released_bytes += state.give_back(taken, &budget);
        }
        let wanted_bytes = union_bytes(&wanted);
        let owner_pinned = state.ledger.owner_bytes(owner);
        let missing = wanted_bytes.saturating_sub(owner_pinned);
        let room_now = budget.limit_bytes.saturating_sub(state.ledger.total_bytes());
        if missing > room_now {
            let taken = state.ledger.take_lowest(missing - room_now, request.priority);
            for entry in &taken {
                *evicted.entry(entry.owner).or_default() += entry.len();
            }
            released_bytes += state.release(taken);
        }
        budget.pinned_bytes = state.ledger.total_bytes();
        budget.room_bytes = budget.limit_bytes.saturating_sub(budget.pinned_bytes);
        let owner_room = request.owner_cap_bytes.map_or(u64::MAX, |cap| cap.saturating_sub(owner_pinned));
        for (&other, &bytes) in &evicted {
            if other != owner {
                let label = state.owners.get(&other).map(|r| r.label.clone()).unwrap_or_default();
                state.event(format!("released {} of '{label}' (priority lower than {})", budget::gib(bytes), request.priority));
            }
        }

        // 3. Plan against every live pin, ours and others'.
        let ranges: Vec<HostRange> = request
            .ranges
            .iter()
            .map(|(addr, len, _)| HostRange { addr: *addr, len: *len, owner, priority: request.priority, kind: kind_of(*addr, *len) })
            .collect();
        let mut pinned: Vec<Pinned> = state.ledger.entries().map(|e| Pinned { addr: e.addr(), len: e.len(), owner: Some(e.owner) }).collect();
        pinned.extend(disjoint_foreign(&request.foreign, &pinned));
        let read_only_ok = primary.accepts(MemoryKind::ReadOnly) || fallback.is_some();
        let rules = Rules { read_only_ok, ..Rules::with_room(budget.room_bytes.min(owner_room)) };
        let plan = plan::plan(&ranges, &pinned, &rules);

        // 4. Register, region by region. A failed region is reported; the rest goes on.
        let mut failures = Vec::new();
        let mut newly_pinned_bytes = 0;
        let mut regions_registered = 0;
        let mut failed_bytes: Vec<(u64, u64)> = Vec::new();
        for region in &plan.regions {
            let backend = match &fallback {
                Some(fallback) if !primary.accepts(region.kind) => fallback.clone(),
                _ => primary.clone(),
            };
            let keepalive = region.sources.iter().map(|&s| request.ranges[s].2.clone()).collect();
            // SAFETY: the entry holds `keepalive`, which keeps the region's memory mapped for
            // as long as the registration lives.
            match unsafe { Registration::new(backend, region.addr, region.len) } {
                Ok(registration) => {
                    let entry = Entry { registration, keepalive, owner, priority: request.priority, kind: region.kind };
                    state.ledger.insert(entry)?;
                    state.counters.registrations += 1;
                    regions_registered += 1;
                    newly_pinned_bytes += region.len;
                }
                Err(error) => {
                    state.counters.failures += 1;
                    failed_bytes.push((region.len, 1));
                    let text = format!("{:#x}+{}: {error}", region.addr, region.len);
                    state.event(format!("pin failed for '{}': {text}", request.label));
                    failures.push(text);
                }
            }
        }

        let mut skipped = status::summarize_skips(&plan.skipped);
        if !failed_bytes.is_empty() {
            skipped.push(SkipSummary::new("failed", "the backend refused it (see failures)", failed_bytes.iter().map(|f| f.0).sum(), failed_bytes.len()));
        }
        let pinned_bytes = state.ledger.owner_bytes(owner);
        let ranges = merge_spans(&wanted).into_iter().map(|(start, stop)| (start, stop - start)).collect();
        state.owners.insert(owner, OwnerRecord { label: request.label, priority: request.priority, wanted_bytes, ranges, skipped: skipped.clone() });
        budget.pinned_bytes = state.ledger.total_bytes();
        budget.room_bytes = budget.limit_bytes.saturating_sub(budget.pinned_bytes);
        Ok(Report {
            owner,
            backend: Some(primary.kind()),
            wanted_bytes,
            pinned_bytes,
            newly_pinned_bytes,
            released_bytes,
            regions_registered,
            failures,
            skipped,
            evicted: evicted.into_iter().collect(),
            budget,
        })
    }

    /// Releases every pin of `owner` and forgets it. Returns the bytes released.
    pub fn release_owner(&self, owner: u64) -> u64 {
        let mut state = self.lock();
        let taken = state.ledger.take_owner(owner);
        state.owners.remove(&owner);
        state.release(taken)
    }

    /// Releases every pin (the interpreter's exit calls this).
    pub fn release_all(&self) -> u64 {
        let mut state = self.lock();
        let taken = state.ledger.take_all();
        state.owners.clear();
        state.release(taken)
    }
}

/// Checks ranges from the caller: no null pointer, no zero length, no wrap past the end of the
/// address space. The first bad one is named, so the caller knows what to fix.
pub fn validate_ranges(ranges: impl Iterator<Item = (u64, u64)>) -> Result<()> {
    for (index, (addr, len)) in ranges.enumerate() {
        if addr == 0 {
            return Err(VikingError::invalid(format!("range {index}: address is 0 (null); pass the data_ptr() of a CPU tensor's storage")));
        }
        if len == 0 {
            return Err(VikingError::invalid(format!("range {index} at {addr:#x}: length is 0; leave empty tensors out")));
        }
        if addr.checked_add(len).is_none_or(|end| end > 1 << 57) {
            return Err(VikingError::invalid(format!("range {index}: {addr:#x} + {len} runs past the end of the address space; check the pointer and size")));
        }
    }
    Ok(())
}

/// Whether `[addr, end)` lies inside the union of the sorted `ranges`.
fn covered_by(ranges: &[(u64, u64)], addr: u64, end: u64) -> bool {
    let mut cursor = addr;
    for &(start, stop) in ranges {
        if start > cursor {
            break;
        }
        if stop > cursor {
            cursor = stop;
        }
        if cursor >= end {
            return true;
        }
    }
    cursor >= end
}

/// Bytes in the union of the sorted `ranges`.
fn union_bytes(ranges: &[(u64, u64)]) -> u64 {
    let (mut total, mut cursor) = (0, 0);
    for &(start, stop) in ranges {
        let start = start.max(cursor);
        if stop > start {
            total += stop - start;
            cursor = stop;
        }
    }
    total
}

/// The union of `[start, stop)` spans, sorted and merged.
fn merge_spans(spans: &[(u64, u64)]) -> Vec<(u64, u64)> {
    let mut spans = spans.to_vec();
    spans.sort();
    let mut merged: Vec<(u64, u64)> = Vec::new();
    for (start, stop) in spans {
        match merged.last_mut() {
            Some(last) if start <= last.1 => last.1 = last.1.max(stop),
            _ => merged.push((start, stop)),
        }
    }
    merged
}

/// Foreign pins as planner input: merged, and without the bytes already in `ours`.
fn disjoint_foreign(foreign: &[(u64, u64)], ours: &[Pinned]) -> Vec<Pinned> {
    let spans: Vec<(u64, u64)> = foreign.iter().map(|&(a, l)| (a, a + l)).collect();
    let merged = merge_spans(&spans);
    let mut ours_sorted: Vec<(u64, u64)> = ours.iter().map(|p| (p.addr, p.addr + p.len)).collect();
    ours_sorted.sort();
    let mut out = Vec::new();
    for (start, stop) in merged {
        let mut cursor = start;
        for &(o_start, o_stop) in &ours_sorted {
            if o_stop <= cursor || o_start >= stop {
                continue;
            }
            if o_start > cursor {
                out.push(Pinned { addr: cursor, len: o_start - cursor, owner: None });
            }
            cursor = cursor.max(o_stop);
        }
        if cursor < stop {
            out.push(Pinned { addr: cursor, len: stop - cursor, owner: None });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: usize = 1 << 20;
    /// The engine tests read the process's VmLck: run them one at a time.
    static SERIAL: Mutex<()> = Mutex::new(());

    /// A page-aligned heap buffer; the test keeps it alive through the keepalive.
    fn buffer(bytes: usize) -> (u64, Keepalive) {
        let mut memory = vec![1u8; bytes + 4096];
        let addr = (memory.as_mut_ptr() as u64).div_ceil(4096) * 4096;
        (addr, Arc::new(memory))
    }

    fn request(owner: u64, priority: i32, ranges: Vec<(u64, u64, Keepalive)>) -> Request {
        Request { owner, label: format!("model {owner}"), priority, backend: BackendChoice::OsLock, owner_cap_bytes: None, ranges, foreign: vec![], others_pinned_bytes: 0 }
    }

    #[cfg(target_os = "linux")]
    fn locked_kib() -> u64 {
        let status = std::fs::read_to_string("/proc/self/status").unwrap();
        let line = status.lines().find(|l| l.starts_with("VmLck:")).unwrap();
        line.split_whitespace().nth(1).unwrap().parse().unwrap()
    }

    // One test, so the VmLck figures are not disturbed by others running in parallel.
    #[test]
    #[cfg(target_os = "linux")]
    fn reconcile_pins_releases_and_is_idempotent() {
        let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
        let engine = Engine::new();
        engine.configure(Policy::from_user(0.0, 0.0, 0.0).unwrap(), 0, None).unwrap();
        let (a, keep_a) = buffer(8 * MIB);
        let (b, keep_b) = buffer(8 * MIB);
        let before = locked_kib();
        let ranges = vec![(a, 8 * MIB as u64, keep_a.clone()), (b, 8 * MIB as u64, keep_b.clone())];
        let report = engine.reconcile(request(1, 0, ranges.clone())).unwrap();
        assert_eq!(report.newly_pinned_bytes, 16 * MIB as u64, "{report:?}");
        assert!(locked_kib() >= before + 16 * 1024);
        // Twice: nothing new.
        let again = engine.reconcile(request(1, 0, ranges)).unwrap();
        assert_eq!((again.newly_pinned_bytes, again.released_bytes, again.pinned_bytes), (0, 0, 16 * MIB as u64));
        // b no longer wanted: released.
        let shrink = engine.reconcile(request(1, 0, vec![(a, 8 * MIB as u64, keep_a.clone())])).unwrap();
        assert_eq!(shrink.released_bytes, 8 * MIB as u64);
        // A second owner over the same bytes gets nothing: a byte is never held twice.
        let other = engine.reconcile(request(2, 0, vec![(a, 8 * MIB as u64, keep_a.clone())])).unwrap();
        assert_eq!(other.newly_pinned_bytes, 0);
        assert_eq!(other.skipped[0].reason, "pinned_for_another_model");
        // The status sees the pinned pages in RAM, none in swap.
        let status = engine.status(false, false);
        let owner = status.owners.iter().find(|o| o.owner == 1).unwrap();
        assert_eq!((owner.resident_bytes, owner.swapped_bytes, owner.pinned_swapped_bytes), (Some(8 * MIB as u64), Some(0), Some(0)));
        assert!(status.paging.swapped_in_since_start.is_some());
        assert_eq!(engine.release_owner(1), 8 * MIB as u64);
        assert!(locked_kib() <= before + 8); // back where it was (a page of slack)
        assert_eq!(engine.release_all(), 0);
    }

    #[test]
    fn a_lowered_model_budget_gives_back_what_is_beyond_it() {
        let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
        let engine = Engine::new();
        engine.configure(Policy::from_user(0.0, 0.0, 0.0).unwrap(), 0, None).unwrap();
        let buffers: Vec<(u64, Keepalive)> = (0..4).map(|_| buffer(4 * MIB)).collect();
        let ranges: Vec<(u64, u64, Keepalive)> = buffers.iter().map(|(a, k)| (*a, 4 * MIB as u64, k.clone())).collect();
        let all = engine.reconcile(request(1, 0, ranges.clone())).unwrap();
        assert_eq!(all.pinned_bytes, 16 * MIB as u64);
        // The same model, now with 6 MiB of its own budget: never more than 6 MiB pinned.
        let capped = engine.reconcile(Request { owner_cap_bytes: Some(6 * MIB as u64), ..request(1, 0, ranges.clone()) }).unwrap();
        assert_eq!(capped.pinned_bytes, 6 * MIB as u64, "{capped:?}");
        assert_eq!(capped.skipped.iter().find(|s| s.reason == "over_budget").map(|s| s.bytes), Some(10 * MIB as u64));
        // Again: stable, nothing churns.
        let again = engine.reconcile(Request { owner_cap_bytes: Some(6 * MIB as u64), ..request(1, 0, ranges.clone()) }).unwrap();
        assert_eq!((again.pinned_bytes, again.newly_pinned_bytes, again.released_bytes), (6 * MIB as u64, 0, 0));
        engine.release_all();
    }

    #[test]
    fn higher_priority_evicts_lower_within_a_user_budget() {
        let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
        let engine = Engine::new();
        engine.configure(Policy::from_user(12.0 / 1024.0, 0.0, 0.0).unwrap(), 0, None).unwrap(); // 12 MiB
        let (a, keep_a) = buffer(8 * MIB);
        let (b, keep_b) = buffer(8 * MIB);
        let low = engine.reconcile(request(10, 0, vec![(a, 8 * MIB as u64, keep_a)])).unwrap();
        assert_eq!(low.pinned_bytes, 8 * MIB as u64);
        let high = engine.reconcile(request(11, 5, vec![(b, 8 * MIB as u64, keep_b)])).unwrap();
        assert_eq!(high.pinned_bytes, 8 * MIB as u64);
        assert_eq!(high.evicted, vec![(10, 8 * MIB as u64)]);
        assert!(engine.lock().events.iter().any(|e| e.contains("model 10")));
        engine.release_all();
    }

    #[test]
    #[cfg(target_os = "linux")]
    fn injected_faults_leave_a_consistent_ledger() {
        let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
        let engine = Engine::new();
        engine.configure(Policy::from_user(0.0, 0.0, 0.0).unwrap(), 0, None).unwrap();
        let buffers: Vec<(u64, Keepalive)> = (0..3).map(|_| buffer(4 * MIB)).collect();
        let ranges = || buffers.iter().map(|(a, k)| (*a, 4 * MIB as u64, k.clone())).collect::<Vec<_>>();
        let before = locked_kib();

        // The 2nd pin fails: the others are pinned, the failure is reported, nothing half-done.
        engine.set_faults(Faults { fail_pin_nth: 2, ..Faults::default() });
        let report = engine.reconcile(request(1, 0, ranges())).unwrap();
        assert_eq!((report.regions_registered, report.failures.len()), (2, 1), "{report:?}");
        assert_eq!(report.pinned_bytes, 8 * MIB as u64);
        assert!(locked_kib() - before >= 8 * 1024 && locked_kib() - before < 12 * 1024);
        assert_eq!(engine.lock().counters.failures, 1);

        // The next unpin fails: that memory stays pinned, so its keepalive is kept for good.
        let (failures_before, _) = crate::backend::release_failures();
        engine.set_faults(Faults { fail_unpin_nth: 1, ..Faults::default() });
        let first = engine.lock().ledger.entries().map(|e| e.addr()).min().unwrap();
        let handle = buffers.iter().find(|(a, _)| *a == first).unwrap().1.clone();
        assert_eq!(engine.release_owner(1), 8 * MIB as u64);
        assert_eq!(crate::backend::release_failures().0, failures_before + 1);
        assert!(Arc::strong_count(&handle) >= 3, "the failed region's memory must not be freed");
        assert_eq!(engine.lock().ledger.total_bytes(), 0);

        // A lost device: nothing pins, every failure is reported, no panic.
        engine.set_faults(Faults { device_lost: true, ..Faults::default() });
        let lost = engine.reconcile(request(2, 0, ranges())).unwrap();
        assert_eq!((lost.pinned_bytes, lost.failures.len()), (0, 3));
        assert!(lost.failures[0].contains("CUDA_ERROR_DEVICE_UNAVAILABLE"));
        engine.set_faults(Faults::default());
        // Clean up the range the injected unpin failure left locked (a test-only leak).
        unsafe { crate::sys::os::unlock(first, 4 * MIB as u64).unwrap() };
    }

    #[test]
    fn bad_ranges_are_rejected_before_anything_is_pinned() {
        let engine = Engine::new();
        let keep: Keepalive = Arc::new(());
        for (addr, len) in [(0, 10), (4096, 0), (u64::MAX - 10, 100)] {
            let error = engine.reconcile(request(1, 0, vec![(addr, len, keep.clone())])).err().unwrap();
            assert!(matches!(error, VikingError::InvalidInput(_)), "{error}");
        }
        assert!(engine.configure(Policy::default(), -1, None).is_err());
        assert!(engine.configure(Policy::default(), 64, None).is_err());
        assert_eq!(engine.lock().ledger.total_bytes(), 0);
    }

    #[test]
    fn helpers() {
        assert!(covered_by(&[(0, 10), (10, 20)], 5, 15));
        assert!(!covered_by(&[(0, 10), (11, 20)], 5, 15));
        assert_eq!(union_bytes(&[(0, 10), (5, 15), (20, 30)]), 25);
        let ours = [Pinned { addr: 10, len: 10, owner: Some(1) }];
        let foreign = disjoint_foreign(&[(0, 15), (12, 13), (30, 5)], &ours);
        assert_eq!(foreign.iter().map(|p| (p.addr, p.len)).collect::<Vec<_>>(), vec![(0, 10), (20, 5), (30, 5)]);
    }
}
