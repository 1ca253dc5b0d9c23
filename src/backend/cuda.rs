//! CUDA registration through the driver API: cuMemHostRegister with PORTABLE|DEVICEMAP on the
//! device's primary context (PyTorch's), unregister with the exact base.

use std::panic::{catch_unwind, AssertUnwindSafe};

use cudarc::driver::sys::{CUcontext, CUdevice, CUdevice_attribute};
use serde::Serialize;

use super::{Backend, BackendKind};
use crate::error::{Result, VikingError};
use crate::memmap::MemoryKind;
use crate::sys::cuda;

#[derive(Debug, Clone, Serialize)]
pub struct DeviceInfo {
    pub ordinal: i32,
    pub name: String,
    pub driver_version: i32,
    pub host_register_supported: bool,
    pub read_only_host_register_supported: bool,
    pub can_use_host_pointer_for_registered_mem: bool,
    pub unified_addressing: bool,
}

pub struct CudaBackend {
    device: CUdevice,
    context: CUcontext,
    info: DeviceInfo,
    /// Register with DEVICEMAP as well as PORTABLE (the default). Off: PORTABLE only, as
    /// ComfyUI's own pinning does; for the measurement of what the device mapping costs.
    devicemap: std::sync::atomic::AtomicBool,
}

// SAFETY: the only field that is not Send is the CUcontext handle (a raw pointer). The driver
// API is thread safe and a primary context may be made current on any thread; this type makes
// it current only around single calls (`with_current`), and puts back what that thread had.
unsafe impl Send for CudaBackend {}
// SAFETY: as for Send; shared use only reads the handles and the `devicemap` atomic, and every
// driver call made through `&self` is one the driver allows from several threads at once.
unsafe impl Sync for CudaBackend {}

fn unavailable(reason: impl Into<String>) -> VikingError {
    VikingError::BackendUnavailable { backend: "cuda", reason: reason.into() }
}

/// How many CUDA devices this machine has: 0 when there is no driver or no GPU.
pub fn device_count() -> i32 {
    if !cuda::driver_library_present() {
        return 0;
    }
    catch_unwind(|| cuda::init().and_then(|_| cuda::device_count()).unwrap_or(0)).unwrap_or(0)
}

impl CudaBackend {
    /// Opens the primary context of device `ordinal`. Never panics: cudarc panics when libcuda
    /// or one of its symbols is missing, so the library is probed first and unwinds are caught.
    pub fn open(ordinal: i32) -> Result<CudaBackend> {
        if !cuda::driver_library_present() {
            return Err(unavailable("no CUDA driver library (libcuda.so / nvcuda.dll) on this machine"));
        }
        catch_unwind(AssertUnwindSafe(|| Self::open_inner(ordinal)))
            .unwrap_or_else(|_| Err(unavailable("the CUDA driver library lacks a needed function (driver too old?)")))
    }

    fn open_inner(ordinal: i32) -> Result<CudaBackend> {
        cuda::init().map_err(|e| unavailable(format!("cuInit: {e} (no GPU, or the driver is not loaded)")))?;
        let count = cuda::device_count()?;
        if ordinal < 0 || ordinal >= count {
            return Err(VikingError::invalid(format!(
                "CUDA device {ordinal} does not exist: this machine has {count} device(s); use 0..{}",
                count.max(1) - 1
            )));
        }
        let device = cuda::device(ordinal)?;
        let attribute = |a| cuda::device_attribute(device, a).map(|v| v != 0);
        use CUdevice_attribute::*;
        let info = DeviceInfo {
            ordinal,
            name: cuda::device_name(device)?,
            driver_version: cuda::driver_version()?,
            host_register_supported: attribute(CU_DEVICE_ATTRIBUTE_HOST_REGISTER_SUPPORTED)?,
            read_only_host_register_supported: attribute(CU_DEVICE_ATTRIBUTE_READ_ONLY_HOST_REGISTER_SUPPORTED)?,
            can_use_host_pointer_for_registered_mem: attribute(CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM)?,
            unified_addressing: attribute(CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING)?,
        };
        if !info.host_register_supported {
            return Err(unavailable(format!("{} does not support cuMemHostRegister", info.name)));
        }
        let context = cuda::primary_context_retain(device)?;
        Ok(CudaBackend { device, context, info, devicemap: std::sync::atomic::AtomicBool::new(true) })
    }

    pub fn info(&self) -> &DeviceInfo {
        &self.info
    }

    /// Whether later registrations also map the memory into the device (DEVICEMAP).
    pub fn set_devicemap(&self, on: bool) {
        self.devicemap.store(on, std::sync::atomic::Ordering::Relaxed);
    }

    /// Runs `call` with our primary context current, then puts back whatever was current, so
    /// the calling thread's CUDA state (PyTorch's) is as it was.
    fn with_context<T>(&self, call: impl FnOnce() -> Result<T>) -> Result<T> {
        with_current(self.context, call)
    }

    /// (free, total) device memory.
    pub fn memory_info(&self) -> Result<(u64, u64)> {
        self.with_context(cuda::memory_info).map(|(free, total)| (free as u64, total as u64))
    }

    /// The device address of registered host memory (equals `addr` under UVA).
    pub fn device_pointer(&self, addr: u64) -> Result<u64> {
        self.with_context(|| cuda::host_device_pointer(addr as usize))
    }
}

/// Runs `call` with `context` current, then puts back whatever was current.
fn with_current<T>(context: CUcontext, call: impl FnOnce() -> Result<T>) -> Result<T> {
    let previous = cuda::current_context()?;
    if previous != context {
        cuda::set_current_context(context)?;
    }
    let result = call();
    if previous != context {
        cuda::set_current_context(previous)?;
    }
    result
}

/// Waits for the work of every other device whose primary context is active. Registrations are
/// PORTABLE: a node pack that runs a model on a second GPU copies from the same pinned pages in
/// that device's context, which synchronising our own context does not wait for.
fn synchronize_other_devices(ours: CUdevice) {
    for ordinal in 0..cuda::device_count().unwrap_or(0) {
        let Ok(device) = cuda::device(ordinal) else { continue };
        if device == ours || !cuda::primary_context_active(device).unwrap_or(false) {
            continue; // an inactive context has no work queued (retaining it would create one)
        }
        if let Ok(context) = cuda::primary_context_retain(device) {
            let _ = with_current(context, cuda::synchronize);
            let _ = cuda::primary_context_release(device);
        }
    }
}

impl Drop for CudaBackend {
    fn drop(&mut self) {
        let _ = cuda::primary_context_release(self.device);
    }
}

impl Backend for CudaBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Cuda
    }

    /// Never read-only memory: registering a private read-only file mapping hung for more than
    /// 90 s on an H200 with PORTABLE|READ_ONLY, and failed at once with "invalid argument" with
    /// PORTABLE alone (driver 580).
    fn accepts(&self, kind: MemoryKind) -> bool {
        matches!(kind, MemoryKind::Anonymous | MemoryKind::PrivateFile | MemoryKind::SharedWritable)
    }

    unsafe fn pin(&self, addr: u64, len: u64) -> Result<()> {
        let devicemap = self.devicemap.load(std::sync::atomic::Ordering::Relaxed);
        let flags = cuda::REGISTER_PORTABLE | if devicemap { cuda::REGISTER_DEVICEMAP } else { 0 };
        self.with_context(|| cuda::host_register(addr as usize, len as usize, flags))
    }

    unsafe fn unpin(&self, addr: u64, _len: u64) -> Result<()> {
        self.with_context(|| cuda::host_unregister(addr as usize))
    }

    fn quiesce(&self) {
        let _ = self.with_context(cuda::synchronize);
        synchronize_other_devices(self.device);
    }
}
