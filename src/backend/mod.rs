//! The safe layer: backends that pin and unpin host memory, behind one trait, and the RAII
//! `Registration` that unpins on drop.

pub mod cuda;
pub mod deferred;
pub mod faults;
pub mod file_view;
pub mod mapped;
pub mod oslock;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};

use self::deferred::{Deferred, Locker, PinState};
use crate::error::Result;
use crate::memmap::MemoryKind;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BackendKind {
    Cuda,
    #[serde(rename = "os-lock")]
    OsLock,
}

impl BackendKind {
    pub fn name(self) -> &'static str {
        match self {
            BackendKind::Cuda => "cuda",
            BackendKind::OsLock => "os-lock",
        }
    }
}

/// What a caller asks for. `Auto`: CUDA when it is available, else the OS lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum BackendChoice {
    Auto,
    Cuda,
    OsLock,
}

impl BackendChoice {
    pub fn parse(text: &str) -> Result<BackendChoice> {
        match text.trim().to_ascii_lowercase().replace('_', "-").as_str() {
            "auto" | "" => Ok(BackendChoice::Auto),
            "cuda" => Ok(BackendChoice::Cuda),
            "os-lock" | "oslock" | "mlock" => Ok(BackendChoice::OsLock),
            other => Err(crate::error::VikingError::invalid(format!(
                "backend '{other}' is not known; use 'auto', 'cuda' or 'os-lock'"
            ))),
        }
    }
}

pub trait Backend: Send + Sync {
    fn kind(&self) -> BackendKind;
    /// Whether this backend may take memory of this kind.
    fn accepts(&self, kind: MemoryKind) -> bool;
    /// # Safety
    /// `[addr, addr+len)` must be mapped and stay mapped until `unpin` of the same range.
    unsafe fn pin(&self, addr: u64, len: u64) -> Result<()>;
    /// # Safety
    /// `[addr, addr+len)` must be exactly a range this backend pinned and has not unpinned.
    unsafe fn unpin(&self, addr: u64, len: u64) -> Result<()>;
    /// Blocks until no device copy can still read memory this backend pinned (CUDA: every
    /// device with an active primary context is synchronised). Called before releasing.
    fn quiesce(&self) {}
}

/// Failures to unpin, which can only be logged (they happen in `Drop`).
static RELEASE_FAILURES: AtomicU64 = AtomicU64::new(0);
static LAST_RELEASE_ERROR: Mutex<Option<String>> = Mutex::new(None);

pub fn release_failures() -> (u64, Option<String>) {
    let last = LAST_RELEASE_ERROR.lock().map(|g| g.clone()).unwrap_or(None);
    (RELEASE_FAILURES.load(Ordering::Relaxed), last)
}

/// A live pin. Dropping it unpins the exact range it pinned.
pub struct Registration {
    backend: Arc<dyn Backend>,
    addr: u64,
    len: u64,
    released: bool,
    /// Set when the pin is made off this thread (deferred.rs): its state there.
    deferred: Option<Arc<Deferred>>,
    /// Set when the pin holds the file pages behind the range through a view of its own
    /// (`through_view`): what is locked; unmapped after the unlock, when this value drops.
    view: Option<file_view::FileView>,
}

impl Registration {
    /// # Safety
    /// The memory must stay mapped for as long as the returned value lives; the ledger makes
    /// sure by holding a reference to its owner next to it.
    pub unsafe fn new(backend: Arc<dyn Backend>, addr: u64, len: u64) -> Result<Registration> {
        backend.pin(addr, len)?;
        Ok(Registration { backend, addr, len, released: false, deferred: None, view: None })
    }

    /// A pin of `[addr, addr+len)` of a private file mapping made by locking `view`, the same
    /// file pages mapped shared and read-only (file_view.rs: `of_private_range` says why), off
    /// this thread as `deferred`: the lock only keeps the pages resident, and reading them in
    /// is what takes the time. The registration still stands for `[addr, addr+len)` in the
    /// ledger and the budget.
    ///
    /// # Safety
    /// As `new`; `view` must show the file pages behind the range.
    pub unsafe fn through_view(backend: Arc<dyn Backend>, addr: u64, len: u64, view: file_view::FileView, locker: &Locker) -> Result<Registration> {
        let deferred = locker.submit(backend.clone(), view.addr(), view.len())?;
        Ok(Registration { backend, addr, len, released: false, deferred: Some(deferred), view: Some(view) })
    }

    /// Whether the pin holds the range's file pages through a view of its own.
    pub fn through_file_view(&self) -> bool {
        self.view.is_some()
    }

    /// The same, with the pin queued to `locker`'s thread: it holds the range at once (for the
    /// budget), and its release waits for the pin.
    ///
    /// # Safety
    /// As `new`.
    pub unsafe fn deferred(backend: Arc<dyn Backend>, addr: u64, len: u64, locker: &Locker) -> Result<Registration> {
        let deferred = locker.submit(backend.clone(), addr, len)?;
        Ok(Registration { backend, addr, len, released: false, deferred: Some(deferred), view: None })
    }

    /// Whether the pin is still queued or being made (a deferred one).
    pub fn pending(&self) -> bool {
        self.deferred.as_ref().is_some_and(|d| matches!(d.state(), PinState::Queued | PinState::Pinning))
    }

    /// Why a deferred pin failed, once it has.
    pub fn failure(&self) -> Option<String> {
        match self.deferred.as_ref()?.state() {
            PinState::Failed(error) => Some(error),
            _ => None,
        }
    }
    pub fn addr(&self) -> u64 {
        self.addr
    }
    pub fn len(&self) -> u64 {
        self.len
    }
    pub fn backend(&self) -> BackendKind {
        self.backend.kind()
    }

    /// Unpins now (once). On failure the range may still be pinned: the caller must then keep
    /// the memory alive for good (the ledger leaks its reference rather than free pinned memory).
    pub fn release(&mut self) -> Result<()> {
        if self.released {
            return Ok(());
        }
        self.released = true;
        if self.deferred.as_ref().is_some_and(|d| !d.settle_for_release()) {
            return Ok(()); // cancelled before it ran, or it failed: nothing is pinned
        }
        let (addr, len) = self.view.as_ref().map_or((self.addr, self.len), |v| (v.addr(), v.len()));
        // SAFETY: this value pinned exactly this range and is the only one to unpin it.
        let result = unsafe { self.backend.unpin(addr, len) };
        if let Err(error) = &result {
            RELEASE_FAILURES.fetch_add(1, Ordering::Relaxed);
            if let Ok(mut last) = LAST_RELEASE_ERROR.lock() {
                *last = Some(format!("{:#x}+{}: {error}", self.addr, self.len));
            }
        }
        result
    }

    /// Waits until the device has finished any copy that may read pinned memory.
    pub fn quiesce(&self) {
        self.backend.quiesce();
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        let _ = self.release();
    }
}
