//! `reconcile`: makes one owner's pins match what is in RAM now, in four named steps.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::{Engine, OwnerRecord, Report, Request, State};
use crate::backend::deferred::Locker;
use crate::backend::file_view::FileView;
use crate::backend::{Backend, BackendChoice, BackendKind, Registration};
use crate::budget::{self, Budget};
use crate::error::{Result, VikingError};
use crate::ledger::Entry;
use crate::memmap::{self, Mapping, MemoryKind};
use crate::plan::{self, HostRange, Pinned, Plan, Rules, SkipSummary};
use crate::spans;
use crate::sys;

/// The backend a request asked for and, in auto mode with CUDA, the OS lock for the memory
/// CUDA must not take (read-only mappings).
struct Backends {
    primary: Arc<dyn Backend>,
    fallback: Option<Arc<dyn Backend>>,
}

impl Backends {
    fn for_kind(&self, kind: MemoryKind) -> Arc<dyn Backend> {
        match &self.fallback {
            Some(fallback) if !self.primary.accepts(kind) => fallback.clone(),
            _ => self.primary.clone(),
        }
    }

    fn read_only_ok(&self) -> bool {
        self.primary.accepts(MemoryKind::ReadOnly) || self.fallback.is_some()
    }
}

/// The OS's limit on locked memory, as a plan sees it.
#[derive(Clone, Copy)]
struct Locks {
    /// What more may be locked now (u64::MAX: no limit).
    room_bytes: u64,
    /// The request's backend is the OS lock (else only read-only memory is locked).
    all_kinds: bool,
}

/// What step 4 registered.
#[derive(Default)]
struct Registered {
    bytes: u64,
    regions: usize,
    failures: Vec<String>,
    failed_bytes: u64,
}

impl Engine {
    /// Makes the owner's pins match `request.ranges`: releases what is no longer wanted, pins
    /// what is missing within the budget. Calling it twice with the same input changes nothing.
    pub fn reconcile(&self, request: Request) -> Result<Report> {
        validate_ranges(request.ranges.iter().map(|(a, l, _)| (*a, *l)))?;
        validate_ranges(request.foreign.iter().copied())?;
        let maps_text = sys::os::read_self_maps();
        let mappings: Option<Vec<Mapping>> = maps_text.as_deref().map(memmap::parse);

        let mut state = self.lock();
        let failed_late = state.take_failed_deferred(request.owner);
        let primary = self.backend_for(&mut state, request.backend)?;
        let fallback = match (request.backend, primary.kind()) {
            (BackendChoice::Auto, BackendKind::Cuda) => self.oslock.clone().map(|b| self.maybe_faulty(b)),
            _ => None,
        };
        let backends = Backends { primary, fallback };

        let mut released_bytes = state.release_unwanted(&request);
        let (budget, evicted, made_room) = state.make_room(&request);
        released_bytes += made_room;
        let locks = Locks { room_bytes: state.lock_room(), all_kinds: backends.primary.kind() == BackendKind::OsLock };
        let plan = state.plan_for(&request, mappings.as_deref(), &budget, backends.read_only_ok(), locks);
        let mut registered = state.register(&request, &plan, &backends, &self.locker, mappings.as_deref());
        for (text, bytes) in failed_late {
            registered.failures.push(text);
            registered.failed_bytes += bytes;
        }
        Ok(state.record(request, budget, plan, registered, released_bytes, evicted, backends.primary.kind()))
    }
}

impl State {
    /// Before step 1: the owner's pins made off the thread that failed since its last call
    /// leave the ledger (nothing is pinned there) as failures of this call, and are planned
    /// again like any missing range. Returns (text, bytes) per failure.
    fn take_failed_deferred(&mut self, owner: u64) -> Vec<(String, u64)> {
        let failed = self.ledger.take_where(|e| e.owner == owner && e.registration.failure().is_some());
        let label = self.label_of(owner);
        let mut out = Vec::new();
        for entry in failed {
            let text = format!("{:#x}+{}: {}", entry.addr(), entry.len(), entry.registration.failure().unwrap_or_default());
            // As a pin that fails on the caller's thread: a failure, not a registration.
            self.counters.registrations = self.counters.registrations.saturating_sub(1);
            self.counters.failures += 1;
            self.event(format!("pin failed for '{label}': {text}"));
            out.push((text, entry.len()));
        }
        out
    }

    /// Step 1: releases this owner's pins that lie outside what is wanted now, and what is
    /// beyond a model limit lowered since the last call. Returns the bytes released.
    fn release_unwanted(&mut self, request: &Request) -> u64 {
        let owner = request.owner;
        let wanted = wanted_spans(request);
        let stale = self.ledger.take_where(|e| e.owner == owner && !spans::covers(&wanted, e.addr(), e.end()));
        let mut released = self.release(stale);
        if let Some(limit) = request.model_limit_bytes {
            let beyond = self.ledger.take_owner_beyond(owner, limit);
            released += self.release(beyond);
        }
        released
    }

    /// Step 2: the budget now, and room made for this owner: pins given back when over budget
    /// (the pressure governor's ceiling, a lowered limit), then lower-priority owners' pins if
    /// this owner needs them. While the ceiling holds, nothing above it is pinned again.
    /// Returns the budget (room as it stands after), the bytes evicted per owner and the bytes
    /// released.
    fn make_room(&mut self, request: &Request) -> (Budget, BTreeMap<u64, u64>, u64) {
        // CUDA reports Viking's own registrations as pinned too: only what lies outside the
        // ledger is someone else's (counting ours there would shrink the budget by what we hold).
        let ours = spans::from_lengths(self.ledger.entries().map(|e| (e.addr(), e.len())));
        let foreign = spans::subtract(&spans::from_lengths(request.foreign.iter().copied()), &ours);
        self.foreign_bytes = request.others_pinned_bytes.max(spans::union_bytes(&foreign));

        let (_, mut budget) = self.budget();
        let mut evicted: BTreeMap<u64, u64> = BTreeMap::new();
        let mut released = 0;
        if budget.excess_bytes > 0 {
            let taken = self.ledger.take_lowest(budget.excess_bytes, i32::MAX);
            count_by_owner(&taken, &mut evicted);
            released += self.release(taken);
        }
        let wanted_bytes = spans::union_bytes(&wanted_spans(request));
        let missing = wanted_bytes.saturating_sub(self.ledger.owner_bytes(request.owner));
        let room_now = budget.limit_bytes.saturating_sub(self.ledger.total_bytes());
        if missing > room_now {
            let taken = self.ledger.take_lowest(missing - room_now, request.priority);
            count_by_owner(&taken, &mut evicted);
            released += self.release(taken);
        }
        for (&other, &bytes) in &evicted {
            if other != request.owner {
                let label = self.label_of(other);
                self.event(format!("released {} of '{label}' (priority lower than {})", budget::gib(bytes), request.priority));
            }
        }
        budget.pinned_bytes = self.ledger.total_bytes();
        budget.room_bytes = budget.limit_bytes.saturating_sub(budget.pinned_bytes);
        (budget, evicted, released)
    }

    /// What more this process may lock (RLIMIT_MEMLOCK less what is locked now and our locks
    /// still being made off the thread); u64::MAX where nothing limits it.
    fn lock_room(&self) -> u64 {
        match sys::os::lock_limit() {
            None => u64::MAX,
            Some(limit) => limit
                .saturating_sub(sys::os::self_status_bytes("VmLck").unwrap_or(0))
                .saturating_sub(self.ledger.pending_bytes()),
        }
    }

    /// Step 3: the plan, against every live pin, ours and others'.
    fn plan_for(&self, request: &Request, mappings: Option<&[Mapping]>, budget: &Budget, read_only_ok: bool, locks: Locks) -> Plan {
        // Linux: /proc/self/maps; Windows: VirtualQuery; elsewhere every range is taken as heap.
        let kind_of = |addr, len| match mappings {
            Some(m) => memmap::classify(m, addr, len),
            None => sys::os::memory_kind(addr, len).unwrap_or(MemoryKind::Anonymous),
        };
        let ranges: Vec<HostRange> = request
            .ranges
            .iter()
            .map(|(addr, len, _)| HostRange { addr: *addr, len: *len, owner: request.owner, priority: request.priority, kind: kind_of(*addr, *len) })
            .collect();
        let mut pinned: Vec<Pinned> = self.ledger.entries().map(|e| Pinned { addr: e.addr(), len: e.len(), owner: Some(e.owner) }).collect();
        let ours = spans::from_lengths(pinned.iter().map(|p| (p.addr, p.len)));
        let foreign = spans::subtract(&spans::from_lengths(request.foreign.iter().copied()), &ours);
        pinned.extend(foreign.into_iter().map(|(start, stop)| Pinned { addr: start, len: stop - start, owner: None }));
        let model_room = request.model_limit_bytes.map_or(u64::MAX, |limit| limit.saturating_sub(self.ledger.owner_bytes(request.owner)));
        let rules = Rules {
            read_only_ok,
            lock_room_bytes: locks.room_bytes,
            lock_all_kinds: locks.all_kinds,
            ..Rules::with_room(budget.room_bytes.min(model_room))
        };
        plan::plan(&ranges, &pinned, &rules)
    }

    /// Step 4: registers region by region. A failed region is reported; the rest goes on.
    /// Read-only memory (a checkpoint's file pages) is pinned off this thread: that pin only
    /// keeps the pages resident, and faulting them all in is what takes the time. So is the OS
    /// lock's hold on a private file mapping (a safetensors file torch maps copy-on-write),
    /// made through a shared view of the same file pages, which copies nothing (file_view.rs).
    fn register(&mut self, request: &Request, plan: &Plan, backends: &Backends, locker: &Locker, mappings: Option<&[Mapping]>) -> Registered {
        let mut done = Registered::default();
        for region in &plan.regions {
            let keepalive = region.sources.iter().map(|&s| request.ranges[s].2.clone()).collect();
            let backend = backends.for_kind(region.kind);
            let view = match (region.kind, backend.kind(), mappings) {
                (MemoryKind::PrivateFile, BackendKind::OsLock, Some(mappings)) => memmap::private_file_slice(mappings, region.addr, region.len)
                    .and_then(|slice| FileView::of_private_range(&slice, region.addr, region.len)),
                _ => None,
            };
            // SAFETY: the entry holds `keepalive`, which keeps the region's memory mapped for
            // as long as the registration lives (a deferred one's release waits for its pin);
            // a view shows the region's own file pages.
            let registration = unsafe {
                if region.kind == MemoryKind::ReadOnly {
                    Registration::deferred(backend, region.addr, region.len, locker)
                } else if let Some(view) = view {
                    Registration::through_view(backend, region.addr, region.len, view, locker)
                } else {
                    Registration::new(backend, region.addr, region.len)
                }
            };
            match registration {
                Ok(registration) => {
                    let entry = Entry { registration, keepalive, owner: request.owner, priority: request.priority, views: Default::default() };
                    if let Err(error) = self.ledger.insert(entry) {
                        done.failures.push(error.to_string());
                        continue;
                    }
                    self.counters.registrations += 1;
                    done.regions += 1;
                    done.bytes += region.len;
                }
                Err(error) => {
                    self.counters.failures += 1;
                    done.failed_bytes += region.len;
                    let text = format!("{:#x}+{}: {error}", region.addr, region.len);
                    self.event(format!("pin failed for '{}': {text}", request.label));
                    done.failures.push(text);
                }
            }
        }
        done
    }

    /// Remembers the owner for the status and writes the report.
    #[allow(clippy::too_many_arguments)]
    fn record(&mut self, request: Request, mut budget: Budget, plan: Plan, registered: Registered, released_bytes: u64, evicted: BTreeMap<u64, u64>, backend: BackendKind) -> Report {
        let owner = request.owner;
        let wanted = wanted_spans(&request);
        let mut skipped = plan::summarize_skips(&plan.skipped);
        if !registered.failures.is_empty() {
            skipped.push(SkipSummary::new("failed", "the backend refused it (see failures)", registered.failed_bytes, registered.failures.len()));
        }
        let wanted_bytes = spans::union_bytes(&wanted);
        let ranges = spans::merge(&wanted).into_iter().map(|(start, stop)| (start, stop - start)).collect();
        self.owners.insert(owner, OwnerRecord { label: request.label, priority: request.priority, wanted_bytes, ranges, skipped: skipped.clone() });
        budget.pinned_bytes = self.ledger.total_bytes();
        budget.room_bytes = budget.limit_bytes.saturating_sub(budget.pinned_bytes);
        Report {
            owner,
            backend: Some(backend),
            wanted_bytes,
            pinned_bytes: self.ledger.owner_bytes(owner),
            pending_bytes: self.ledger.owner_pending_bytes(owner),
            newly_pinned_bytes: registered.bytes,
            released_bytes,
            regions_registered: registered.regions,
            failures: registered.failures,
            skipped,
            evicted: evicted.into_iter().collect(),
            budget,
        }
    }
}

fn wanted_spans(request: &Request) -> Vec<(u64, u64)> {
    spans::from_lengths(request.ranges.iter().map(|(addr, len, _)| (*addr, *len)))
}

fn count_by_owner(entries: &[Entry], into: &mut BTreeMap<u64, u64>) {
    for entry in entries {
        *into.entry(entry.owner).or_default() += entry.len();
    }
}

/// Checks ranges from the caller: no null pointer, no zero length, no wrap past the end of the
/// address space. The first bad one is named, so the caller knows what to fix.
pub(crate) fn validate_ranges(ranges: impl Iterator<Item = (u64, u64)>) -> Result<()> {
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
