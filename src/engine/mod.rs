//! The engine: one idempotent `reconcile(owner, wanted ranges)` that makes the owner's pins
//! match what the caller says is in RAM now, within the shared budget (`reconcile.rs`), and the
//! status snapshot (`snapshot.rs`). It is the only place that does I/O around the pure parts
//! (memory snapshot, /proc/self/maps) and it holds the ledger.

mod reconcile;
mod snapshot;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use serde::Serialize;

use crate::backend::cuda::{self, CudaBackend};
use crate::backend::deferred::Locker;
use crate::backend::faults::{FaultState, Faults, Faulty};
use crate::backend::mapped::{MappedView, ViewHold};
use crate::backend::oslock::OsLock;
use crate::backend::{Backend, BackendChoice, BackendKind};
use crate::budget::{self, Budget, MemorySnapshot, Os, Policy, PressureCeiling};
use crate::cgroup;
use crate::error::{Result, VikingError};
use crate::ledger::{Entry, Keepalive, Ledger};
use crate::plan::SkipSummary;
use crate::pressure::{self, Action, Governor, StallTotals};
use crate::status::{Counters, PressureEvent, PressureStatus};
use crate::sys;

/// What the caller wants pinned for one owner (one model).
pub struct Request {
    pub owner: u64,
    /// A name for people ("flux1-dev.safetensors (MODEL)").
    pub label: String,
    pub priority: i32,
    pub backend: BackendChoice,
    /// This model's own limit: at most this many bytes for this owner; `None`: only the shared
    /// budget applies.
    pub model_limit_bytes: Option<u64>,
    /// (addr, len) of each storage, with what keeps it alive.
    pub ranges: Vec<(u64, u64, Keepalive)>,
    /// Ranges the caller saw pinned (ComfyUI's registrations; CUDA also reports Viking's own
    /// pins as pinned): never touched. The bytes Viking holds itself are taken out here.
    pub foreign: Vec<(u64, u64)>,
    /// All bytes others hold pinned in this process (ComfyUI's total), for the budget.
    pub others_pinned_bytes: u64,
}

#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub owner: u64,
    pub backend: Option<BackendKind>,
    pub wanted_bytes: u64,
    pub pinned_bytes: u64,
    /// Of `pinned_bytes`: pins still being made off the caller's thread (backend/deferred.rs).
    pub pending_bytes: u64,
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
struct OwnerRecord {
    label: String,
    priority: i32,
    wanted_bytes: u64,
    /// The owner's ranges as last reconciled, merged (no references: only for residency).
    ranges: Vec<(u64, u64)>,
    skipped: Vec<SkipSummary>,
}

struct State {
    ledger: Ledger,
    policy: Policy,
    device: i32,
    owners: BTreeMap<u64, OwnerRecord>,
    counters: Counters,
    events: Vec<String>,
    /// Bytes pinned by others in this process, as of the last reconcile (ours never counted).
    foreign_bytes: u64,
    /// Whether the machine stalls for memory, and the ceiling on our pins that follows.
    governor: Governor,
    last_give_back: Option<PressureEvent>,
    last_take_back: Option<PressureEvent>,
    /// (pswpin, pswpout) when the engine started, and at the last marked status.
    swaps_at_start: Option<(u64, u64)>,
    swaps_at_last_run: Option<(u64, u64)>,
    /// CUDA registrations also map into the device (DEVICEMAP); see CudaBackend.
    cuda_devicemap: bool,
    cuda: Option<std::result::Result<Arc<CudaBackend>, VikingError>>,
}

const MAX_EVENTS: usize = 32;

impl State {
    fn event(&mut self, text: String) {
        if self.events.len() == MAX_EVENTS {
            self.events.remove(0);
        }
        self.events.push(text);
    }

    /// The CUDA backend for the configured device, opened once.
    fn cuda(&mut self) -> std::result::Result<Arc<CudaBackend>, VikingError> {
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

    fn cuda_opened(&self) -> bool {
        self.cuda.is_some()
    }

    /// The machine now, with what this engine holds.
    fn snapshot(&self) -> MemorySnapshot {
        memory_snapshot(self.ledger.total_bytes(), self.foreign_bytes)
    }

    /// The machine and the budget now.
    fn budget(&mut self) -> (MemorySnapshot, Budget) {
        let snapshot = self.snapshot();
        let budget = budget::compute(&snapshot, &self.policy, self.pressure_ceiling().as_ref());
        (snapshot, budget)
    }

    /// The governor's ceiling, with the give-back that set it for the budget's reason:
    /// "gave back 3.1 GiB at 12:04:31 UTC, the machine stalled 23% of the last 1.5 s".
    fn pressure_ceiling(&self) -> Option<PressureCeiling> {
        let bytes = self.governor.ceiling()?;
        let why = self.governor.why().map(|why| why.describe()).unwrap_or_default();
        let taken_back_at = self.last_take_back.as_ref().map_or(f64::MIN, |t| t.unix_time);
        let reason = match &self.last_give_back {
            Some(given) if given.unix_time >= taken_back_at => format!("gave back {} at {}, {why}", budget::gib(given.bytes), clock_time(given.unix_time)),
            // The ceiling came down while we held nothing: nothing more is pinned meanwhile.
            _ => why,
        };
        Some(PressureCeiling { bytes, reason })
    }

    /// The governor's part of the status.
    fn pressure_status(&self) -> PressureStatus {
        let reading = self.governor.reading();
        let source = sys::pressure::source().name().unwrap_or(if Os::current() == Os::Windows { "windows-available-ram" } else { "available-ram" });
        PressureStatus {
            source,
            some_stalled: reading.map(|r| r.some),
            full_stalled: reading.map(|r| r.full),
            window_seconds: reading.map(|r| r.window_ms as f64 / 1000.0),
            state: self.governor.state(),
            ceiling_bytes: self.governor.ceiling(),
            hold_seconds: self.governor.hold_ms() as f64 / 1000.0,
            last_give_back: self.last_give_back.clone(),
            last_take_back: self.last_take_back.clone(),
        }
    }

    /// Feeds one sample to the governor; notes what it did in the events and the status.
    fn observe_pressure(&mut self, at_ms: u64, stall: Option<StallTotals>, machine: &MemorySnapshot) {
        let sample = pressure::Sample {
            at_ms,
            stall,
            available_ram: machine.available_ram,
            free_swap: machine.swap_total.saturating_sub(machine.swap_used),
            usable_ram: machine.usable_ram(),
            held_bytes: self.ledger.total_bytes(),
            os: machine.os,
        };
        match self.governor.observe(&sample) {
            Some(Action::GaveBack { bytes, why, .. }) => {
                let reason = why.describe();
                self.event(format!("memory pressure: giving back {}: {reason}", budget::gib(bytes)));
                self.last_give_back = Some(PressureEvent { unix_time: unix_now(), bytes, reason });
            }
            Some(Action::TookBack { calm_ms }) => {
                let reason = format!("calm for {:.0} s", calm_ms as f64 / 1000.0);
                self.event(format!("memory pressure over ({reason}): pins may be made again"));
                self.last_take_back = Some(PressureEvent { unix_time: unix_now(), bytes: 0, reason });
            }
            None => {}
        }
    }

    /// Drops entries (unpins them, then frees their memory references) and counts them. A copy
    /// to the GPU queued earlier may still read CUDA-registered pages: the device finishes its
    /// work first (the caller may be any thread: a finalizer, an HTTP route, the exit).
    fn release(&mut self, entries: Vec<Entry>) -> u64 {
        if let Some(cuda) = entries.iter().find(|e| e.registration.backend() == BackendKind::Cuda) {
            cuda.registration.quiesce();
        }
        let bytes = entries.iter().map(Entry::len).sum();
        self.counters.releases += entries.len() as u64;
        drop(entries);
        bytes
    }

    /// Releases the pins of forgotten owners (`release_owner`) that mapped views held, once
    /// no view of them is left. Returns the bytes.
    fn sweep_unviewed(&mut self) -> u64 {
        let owners = &self.owners;
        let orphans = self.ledger.take_where(|e| !owners.contains_key(&e.owner));
        self.release(orphans)
    }

    /// The hold of the entry that can serve a mapped view of `[addr, addr+len)`: a settled pin
    /// of Viking's holding the whole range (a view never spans two registrations).
    fn view_hold(&self, addr: u64, len: u64, need_cuda: bool) -> Result<ViewHold> {
        if len == 0 {
            return Err(VikingError::invalid("a mapped view needs at least one byte"));
        }
        let Some(entry) = self.ledger.containing(addr, len) else {
            return Err(VikingError::invalid(format!("no pin of Viking's holds the whole of {addr:#x}+{len}: pin the model first")));
        };
        if need_cuda && entry.registration.backend() != BackendKind::Cuda {
            return Err(VikingError::BackendUnavailable {
                backend: "cuda",
                reason: format!("{addr:#x}+{len} is held by the {} backend: only a CUDA registration maps into the device", entry.registration.backend().name()),
            });
        }
        if entry.registration.pending() || entry.registration.failure().is_some() {
            return Err(VikingError::invalid(format!("the pin holding {addr:#x}+{len} is not made yet (or failed): no view of it")));
        }
        Ok(entry.views.clone())
    }

    fn label_of(&self, owner: u64) -> String {
        self.owners.get(&owner).map(|r| r.label.clone()).unwrap_or_default()
    }
}

pub struct Engine {
    // Before `locker`: the ledger's entries go first, and the worker finishes what they wait for.
    state: Mutex<State>,
    /// Makes the pins that only keep memory resident (read-only file pages) off the caller's thread.
    locker: Locker,
    oslock: Option<Arc<OsLock>>,
    faults: Arc<FaultState>,
    /// Whether the pressure monitor releases pins itself (the default), or leaves that to the
    /// caller's `relieve_pressure()` at a moment no copy can read them (ComfyUI's side does).
    monitor_releases: AtomicBool,
    /// The governor's clock (monotonic: a wall clock set back must not stop a hold).
    started: std::time::Instant,
}

/// Seconds since the Unix epoch, for the status's times.
fn unix_now() -> f64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64())
}

/// "12:04:31 UTC" of a Unix time (the status carries the time itself; the panel shows it local).
fn clock_time(unix_time: f64) -> String {
    let seconds = unix_time.max(0.0) as u64 % 86_400;
    format!("{:02}:{:02}:{:02} UTC", seconds / 3600, seconds / 60 % 60, seconds % 60)
}

/// The memory figures of this machine now, with our own and others' pinned bytes.
fn memory_snapshot(pinned_by_us: u64, pinned_by_others: u64) -> MemorySnapshot {
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
                governor: Governor::default(),
                last_give_back: None,
                last_take_back: None,
                swaps_at_start: sys::os::swap_counters(),
                swaps_at_last_run: sys::os::swap_counters(),
                cuda_devicemap: true,
                cuda: None,
            }),
            locker: Locker::default(),
            oslock: OsLock::new().ok().map(Arc::new),
            faults: Arc::new(FaultState::default()),
            monitor_releases: AtomicBool::new(true),
            started: std::time::Instant::now(),
        }
    }

    /// Waits until the pins made off the caller's thread are done, at most `timeout`. Returns
    /// whether they all are.
    pub fn settle(&self, timeout: std::time::Duration) -> bool {
        self.locker.settle(timeout)
    }

    /// How many pins made off the caller's thread have failed so far; the next reconcile of
    /// their owner reports them (and tries again).
    pub fn deferred_failures(&self) -> u64 {
        self.locker.failures()
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock cannot leave the ledger half-written (every change is
        // one insert or remove), so a poisoned lock is still safe to use.
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
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

    /// Whether the pressure monitor thread releases pins itself (`true`, the default) or only
    /// the caller's `relieve_pressure` does.
    pub fn set_monitor_releases(&self, on: bool) {
        self.monitor_releases.store(on, Ordering::Relaxed);
    }

    /// One round of the pressure monitor: feeds the governor a sample, then gives back what
    /// lies above its ceiling unless the caller took that over.
    pub fn monitor_round(&self) -> u64 {
        self.observe_pressure();
        if self.monitor_releases.load(Ordering::Relaxed) {
            self.relieve_pressure()
        } else {
            0
        }
    }

    /// One sample of the machine for the pressure governor. The files are read before the
    /// engine's lock is taken: a pin or a status must not wait on them.
    pub fn observe_pressure(&self) {
        let stall = sys::pressure::stall_totals();
        let machine = memory_snapshot(0, 0);
        let at_ms = self.started.elapsed().as_millis() as u64;
        self.lock().observe_pressure(at_ms, stall, &machine);
    }

    /// Gives back the pins above the budget (the pressure governor's ceiling, or a lowered
    /// limit), lowest priority first. Returns the bytes released.
    pub fn relieve_pressure(&self) -> u64 {
        let mut state = self.lock();
        state.sweep_unviewed(); // the pins of forgotten owners whose last mapped view is gone
        if state.ledger.total_bytes() == 0 {
            return 0;
        }
        let (_, budget) = state.budget();
        if budget.excess_bytes == 0 {
            return 0;
        }
        let taken = state.ledger.take_lowest(budget.excess_bytes, i32::MAX);
        let mut by_owner: BTreeMap<u64, u64> = BTreeMap::new();
        for entry in &taken {
            *by_owner.entry(entry.owner).or_default() += entry.len();
        }
        let released = state.release(taken);
        for (owner, bytes) in by_owner {
            let label = state.label_of(owner);
            let text = match budget.reason.strip_prefix("limited by memory pressure: ") {
                Some(why) if budget.bound_by == budget::Term::Pressure => format!("memory pressure: released {} of '{label}' ({why})", budget::gib(bytes)),
                _ => format!("released {} of '{label}' ({})", budget::gib(bytes), budget.reason),
            };
            state.event(text);
        }
        released
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

    /// Changes only the shared headroom (None: auto), leaving the limit and the device as they
    /// are: the headroom comes from ComfyUI's settings dialog or a node, the rest from elsewhere.
    pub fn set_headroom(&self, headroom_bytes: Option<u64>) {
        self.lock().policy.headroom_bytes = headroom_bytes;
    }

    fn oslock(&self) -> Option<Arc<OsLock>> {
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
            // Auto never fails for CUDA's sake: no driver, no GPU, or a CUDA error at context
            // creation (exclusive-process mode, no memory) all mean the OS lock; the status's
            // `cuda.reason` says why.
            BackendChoice::Auto => match state.cuda() {
                Ok(cuda) => Ok(cuda as Arc<dyn Backend>),
                Err(_) => oslock(),
            },
        }?;
        Ok(self.maybe_faulty(backend))
    }

    /// What others in this process hold pinned now (ComfyUI's own total), for the budget between
    /// reconciles (ComfyUI's dynamic VRAM mode pins and unpins during every step).
    pub fn note_foreign_pins(&self, bytes: u64) {
        self.lock().foreign_bytes = bytes;
    }

    /// The machine and the budget now, without the per-model figures of the status.
    pub fn budget_now(&self) -> (MemorySnapshot, Budget) {
        self.lock().budget()
    }

    /// The device address of CUDA-pinned host memory at `addr`.
    pub fn device_pointer(&self, addr: u64) -> Result<u64> {
        let backend = self.lock().cuda()?;
        backend.device_pointer(addr)
    }

    /// A view of `[addr, addr+len)`, inside one CUDA registration of Viking's, at its device
    /// address (registrations carry DEVICEMAP): the GPU reads those bytes in place. The
    /// registration cannot end while the view lives (backend/mapped.rs).
    pub fn mapped_view(&self, addr: u64, len: u64) -> Result<MappedView> {
        let mut state = self.lock();
        let hold = state.view_hold(addr, len, true)?;
        let device_addr = state.cuda()?.device_pointer(addr)?;
        Ok(MappedView::new(&hold, addr, len, device_addr))
    }

    /// `mapped_view` without the device: the host address stands for the device's, so the
    /// lifetime rules can be tested on any backend.
    #[cfg(test)]
    pub(crate) fn host_view(&self, addr: u64, len: u64) -> Result<MappedView> {
        let hold = self.lock().view_hold(addr, len, false)?;
        Ok(MappedView::new(&hold, addr, len, addr))
    }

    /// Releases every pin of `owner` and forgets it. Returns the bytes released. Pins a mapped
    /// view holds stay (counted) until the view is gone; a later call releases them.
    pub fn release_owner(&self, owner: u64) -> u64 {
        let mut state = self.lock();
        let taken = state.ledger.take_owner(owner);
        state.owners.remove(&owner);
        state.release(taken) + state.sweep_unviewed()
    }

    /// Releases every pin (the interpreter's exit calls this) but those mapped views hold.
    pub fn release_all(&self) -> u64 {
        let mut state = self.lock();
        let taken = state.ledger.take_all();
        state.owners.clear();
        state.release(taken)
    }
}

#[cfg(test)]
mod tests;
