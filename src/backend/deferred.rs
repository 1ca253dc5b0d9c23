//! Pins made off the caller's thread, for memory whose lock only keeps it resident.
//!
//! Why: locking a checkpoint's file pages (residency, ComfyUI 0.33's dynamic mode) faults each
//! page into Viking's view of the file. Measured on an H200, that took 655-824 ms for 8.0-8.9 GB
//! of two models, all of it inside ComfyUI's first prompt, because the lock ran on ComfyUI's
//! execution thread (bench/results/gpu_dynamic_rounds.json). Nothing reads through such a pin,
//! so it may come a moment later: a deferred registration is queued to one worker thread, counts
//! against the budget at once, and is released only after its pin is done (a queued one is
//! cancelled instead), so an unpin never runs before or during its pin.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Sender};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::Backend;
use crate::error::{Result, VikingError};

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PinState {
    Queued,
    Pinning,
    Pinned,
    Failed(String),
    Cancelled,
}

/// One deferred pin's state, shared by its registration and the worker.
pub struct Deferred {
    state: Mutex<PinState>,
    changed: Condvar,
}

impl Deferred {
    fn lock(&self) -> MutexGuard<'_, PinState> {
        // Every change is one assignment: a poisoned lock still holds a whole state.
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    pub fn state(&self) -> PinState {
        self.lock().clone()
    }

    /// The worker takes a queued pin; false when its registration was released meanwhile.
    fn start(&self) -> bool {
        let mut state = self.lock();
        if *state != PinState::Queued {
            return false;
        }
        *state = PinState::Pinning;
        true
    }

    fn finish(&self, result: Result<()>) {
        *self.lock() = match result {
            Ok(()) => PinState::Pinned,
            Err(error) => PinState::Failed(error.to_string()),
        };
        self.changed.notify_all();
    }

    /// For a release: waits out a pin in progress and cancels a queued one. Returns whether the
    /// range is pinned now (and so must be unpinned).
    pub fn settle_for_release(&self) -> bool {
        let mut state = self.lock();
        while *state == PinState::Pinning {
            state = self.changed.wait(state).unwrap_or_else(|poisoned| poisoned.into_inner());
        }
        match *state {
            PinState::Queued => {
                *state = PinState::Cancelled;
                false
            }
            PinState::Pinned => true,
            _ => false,
        }
    }
}

/// One queued pin less (done, cancelled or never sent); wakes `settle`.
fn done_one(outstanding: &(Mutex<usize>, Condvar)) {
    let (count, idle) = outstanding;
    *count.lock().unwrap_or_else(|p| p.into_inner()) -= 1;
    idle.notify_all();
}

struct Job {
    deferred: Arc<Deferred>,
    backend: Arc<dyn Backend>,
    addr: u64,
    len: u64,
}

/// The worker thread and what it has left to do. The thread starts with the first job and ends
/// when the locker is dropped.
#[derive(Default)]
pub struct Locker {
    sender: Mutex<Option<Sender<Job>>>,
    outstanding: Arc<(Mutex<usize>, Condvar)>,
    failures: Arc<AtomicU64>,
}

impl Locker {
    /// Queues `backend.pin(addr, len)`.
    ///
    /// # Safety
    /// `[addr, addr+len)` must stay mapped until the returned state has left `Queued` and
    /// `Pinning` (`Deferred::settle_for_release` waits for that).
    pub unsafe fn submit(&self, backend: Arc<dyn Backend>, addr: u64, len: u64) -> Result<Arc<Deferred>> {
        let deferred = Arc::new(Deferred { state: Mutex::new(PinState::Queued), changed: Condvar::new() });
        let mut sender = self.sender.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if sender.is_none() {
            *sender = Some(self.spawn()?);
        }
        *self.outstanding.0.lock().unwrap_or_else(|p| p.into_inner()) += 1;
        let job = Job { deferred: deferred.clone(), backend, addr, len };
        if sender.as_ref().is_some_and(|s| s.send(job).is_ok()) {
            return Ok(deferred);
        }
        *sender = None; // the worker is gone: the next submit starts another
        done_one(&self.outstanding);
        Err(VikingError::Internal("the deferred-pin worker stopped".into()))
    }

    fn spawn(&self) -> Result<Sender<Job>> {
        let (sender, receiver) = mpsc::channel::<Job>();
        let (outstanding, failures) = (self.outstanding.clone(), self.failures.clone());
        std::thread::Builder::new()
            .name("viking-locker".into())
            .spawn(move || {
                for job in receiver {
                    if job.deferred.start() {
                        // SAFETY: submit's contract: the range stays mapped while the pin is
                        // queued or in progress.
                        let result = catch_unwind(AssertUnwindSafe(|| unsafe { job.backend.pin(job.addr, job.len) }))
                            .unwrap_or_else(|_| Err(VikingError::Internal("a deferred pin panicked".into())));
                        if result.is_err() {
                            failures.fetch_add(1, Ordering::Relaxed);
                        }
                        job.deferred.finish(result);
                    }
                    done_one(&outstanding);
                }
            })
            .map_err(|error| VikingError::Internal(format!("cannot start the deferred-pin worker: {error}")))?;
        Ok(sender)
    }

    /// Waits until every queued pin is done, at most `timeout`. Returns whether none is left.
    pub fn settle(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let (count, idle) = &*self.outstanding;
        let mut count = count.lock().unwrap_or_else(|p| p.into_inner());
        while *count > 0 {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            count = idle.wait_timeout(count, left).unwrap_or_else(|p| p.into_inner()).0;
        }
        true
    }

    /// Deferred pins that failed since the locker started (the caller learns which at its next
    /// reconcile; this count lets it know that one is due).
    pub fn failures(&self) -> u64 {
        self.failures.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::{BackendKind, Registration};
    use crate::memmap::MemoryKind;

    /// Records pins (as they start) and unpins in order; a pin takes `pin_ms`, and the one at
    /// `fail_addr` fails.
    #[derive(Default)]
    struct Recorder {
        calls: Mutex<Vec<(&'static str, u64)>>,
        pin_ms: u64,
        fail_addr: u64,
    }

    impl Backend for Recorder {
        fn kind(&self) -> BackendKind {
            BackendKind::OsLock
        }
        fn accepts(&self, _kind: MemoryKind) -> bool {
            true
        }
        unsafe fn pin(&self, addr: u64, _len: u64) -> Result<()> {
            self.calls.lock().unwrap().push(("pin", addr));
            std::thread::sleep(Duration::from_millis(self.pin_ms));
            if addr == self.fail_addr {
                return Err(VikingError::invalid("refused on purpose"));
            }
            Ok(())
        }
        unsafe fn unpin(&self, addr: u64, _len: u64) -> Result<()> {
            self.calls.lock().unwrap().push(("unpin", addr));
            Ok(())
        }
    }

    #[test]
    fn a_release_waits_for_its_pin_cancels_a_queued_one_and_unpins_only_what_was_pinned() {
        let recorder = Arc::new(Recorder { pin_ms: 50, fail_addr: 0x3000, ..Recorder::default() });
        let locker = Locker::default();
        // SAFETY: the recorder touches no memory.
        let [first, second, failing] = [0x1000, 0x2000, 0x3000].map(|addr| unsafe { Registration::deferred(recorder.clone(), addr, 4096, &locker).unwrap() });
        assert!(first.pending() && second.pending());
        // While the first pin is under way (50 ms), the second is still queued: released then,
        // it is cancelled, never pinned, never unpinned. The first's release waits for its pin,
        // then unpins.
        while recorder.calls.lock().unwrap().is_empty() {
            std::thread::sleep(Duration::from_millis(1));
        }
        drop(second);
        drop(first);
        assert!(locker.settle(Duration::from_secs(5)));
        assert_eq!(failing.failure().as_deref(), Some("refused on purpose"));
        assert_eq!(locker.failures(), 1);
        drop(failing); // failed: nothing to unpin
        let calls = recorder.calls.lock().unwrap().clone();
        let of = |addr: u64| calls.iter().filter(|c| c.1 == addr).map(|c| c.0).collect::<Vec<_>>();
        assert_eq!((of(0x1000), of(0x2000), of(0x3000)), (vec!["pin", "unpin"], vec![], vec!["pin"]), "{calls:?}");
    }

    #[test]
    fn settle_returns_when_the_queue_is_empty_or_at_its_timeout() {
        let recorder = Arc::new(Recorder { pin_ms: 200, ..Recorder::default() });
        let locker = Locker::default();
        assert!(locker.settle(Duration::ZERO), "nothing queued");
        // SAFETY: the recorder touches no memory.
        let registration = unsafe { Registration::deferred(recorder.clone(), 0x1000, 4096, &locker).unwrap() };
        assert!(!locker.settle(Duration::from_millis(20)));
        assert!(locker.settle(Duration::from_secs(5)));
        assert!(!registration.pending() && registration.failure().is_none());
    }
}
