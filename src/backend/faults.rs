//! Fault injection for the reliability tests: a backend wrapper that fails the Nth pin or unpin
//! from now on, or behaves as if the device were lost. Off unless a test switches it on.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use serde::Serialize;

use super::{Backend, BackendKind};
use crate::error::{Result, VikingError};
use crate::memmap::MemoryKind;

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Faults {
    /// Fail the Nth pin call from now (1 = the next one); 0: never.
    pub fail_pin_nth: u64,
    /// Fail the Nth unpin call from now; 0: never. The failed range stays pinned for real.
    pub fail_unpin_nth: u64,
    /// Every call fails as if the GPU had fallen off the bus.
    pub device_lost: bool,
}

impl Faults {
    pub fn any(&self) -> bool {
        self.fail_pin_nth > 0 || self.fail_unpin_nth > 0 || self.device_lost
    }
}

#[derive(Default)]
pub struct FaultState {
    faults: Mutex<Faults>,
    pins: AtomicU64,
    unpins: AtomicU64,
}

impl FaultState {
    pub fn set(&self, faults: Faults) {
        *self.faults.lock().unwrap_or_else(|p| p.into_inner()) = faults;
        self.pins.store(0, Ordering::SeqCst);
        self.unpins.store(0, Ordering::SeqCst);
    }
    pub fn get(&self) -> Faults {
        *self.faults.lock().unwrap_or_else(|p| p.into_inner())
    }
}

pub struct Faulty {
    pub inner: Arc<dyn Backend>,
    pub state: Arc<FaultState>,
}

fn injected(what: &str, kind: BackendKind) -> VikingError {
    VikingError::Os { call: "fault injection", errno: 0, message: format!("injected {what} failure ({})", kind.name()) }
}

fn lost() -> VikingError {
    // CUDA_ERROR_DEVICE_UNAVAILABLE: what the driver answers once the device is gone.
    VikingError::Cuda { call: "fault injection", code: 46, name: "CUDA_ERROR_DEVICE_UNAVAILABLE (injected)".into() }
}

impl Faulty {
    /// Counts this call and fails it if the faults say so.
    fn check(&self, calls: &AtomicU64, nth: fn(&Faults) -> u64, what: &str) -> Result<()> {
        let faults = self.state.get();
        let call = calls.fetch_add(1, Ordering::SeqCst) + 1;
        if faults.device_lost {
            return Err(lost());
        }
        if nth(&faults) == call {
            return Err(injected(what, self.kind()));
        }
        Ok(())
    }
}

impl Backend for Faulty {
    fn kind(&self) -> BackendKind {
        self.inner.kind()
    }
    fn accepts(&self, kind: MemoryKind) -> bool {
        self.inner.accepts(kind)
    }
    unsafe fn pin(&self, addr: u64, len: u64) -> Result<()> {
        self.check(&self.state.pins, |f| f.fail_pin_nth, "pin")?;
        self.inner.pin(addr, len)
    }
    unsafe fn unpin(&self, addr: u64, len: u64) -> Result<()> {
        self.check(&self.state.unpins, |f| f.fail_unpin_nth, "unpin")?;
        self.inner.unpin(addr, len)
    }
    fn quiesce(&self) {
        self.inner.quiesce()
    }
}
