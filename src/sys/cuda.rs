//! Raw CUDA driver calls. The driver API, not the runtime: a failed call leaves no sticky
//! "last error" for PyTorch to trip over later (a failed cudaHostRegister through the runtime
//! API makes PyTorch raise that error from an unrelated later call).

use std::ffi::{c_void, CStr};

use cudarc::driver::sys::{self, CUcontext, CUdevice, CUdevice_attribute, CUresult};

use crate::error::{Result, VikingError};

pub const REGISTER_PORTABLE: u32 = sys::CU_MEMHOSTREGISTER_PORTABLE;
pub const REGISTER_DEVICEMAP: u32 = sys::CU_MEMHOSTREGISTER_DEVICEMAP;

/// The driver's name for a status code, e.g. CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED.
pub fn error_name(status: CUresult) -> String {
    let mut name: *const std::ffi::c_char = std::ptr::null();
    // SAFETY: cuGetErrorName writes one pointer into `name`, a live local; an unknown status
    // makes it fail and leave `name` as it was (null).
    let ok = unsafe { sys::cuGetErrorName(status, &mut name) } == CUresult::CUDA_SUCCESS;
    if ok && !name.is_null() {
        // SAFETY: on success `name` points at a NUL-terminated string in the driver's static
        // data, which lives as long as the library stays loaded (cudarc never unloads it).
        unsafe { CStr::from_ptr(name) }.to_string_lossy().into_owned()
    } else {
        format!("{status:?}")
    }
}

fn check(call: &'static str, status: CUresult) -> Result<()> {
    if status == CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(VikingError::Cuda { call, code: status as i32, name: error_name(status) })
    }
}

/// Whether libcuda can be loaded at all. cudarc panics on first use when it cannot.
pub fn driver_library_present() -> bool {
    // SAFETY: it only tries to dlopen libcuda and reports whether that worked; it calls no
    // driver function and takes no pointers of ours.
    unsafe { sys::is_culib_present() }
}

pub fn init() -> Result<()> {
    // SAFETY: cuInit takes only flags (0 is the one value allowed) and may be called any number
    // of times, from any thread.
    check("cuInit", unsafe { sys::cuInit(0) })
}

pub fn driver_version() -> Result<i32> {
    let mut version = 0;
    // SAFETY: writes one int into `version`, a live local.
    check("cuDriverGetVersion", unsafe { sys::cuDriverGetVersion(&mut version) })?;
    Ok(version)
}

pub fn device_count() -> Result<i32> {
    let mut count = 0;
    // SAFETY: writes one int into `count`, a live local.
    check("cuDeviceGetCount", unsafe { sys::cuDeviceGetCount(&mut count) })?;
    Ok(count)
}

pub fn device(ordinal: i32) -> Result<CUdevice> {
    let mut device = 0;
    // SAFETY: writes one CUdevice into `device`, a live local; a bad ordinal makes it fail.
    check("cuDeviceGet", unsafe { sys::cuDeviceGet(&mut device, ordinal) })?;
    Ok(device)
}

pub fn device_name(device: CUdevice) -> Result<String> {
    let mut buffer = [0 as std::ffi::c_char; 256];
    // SAFETY: the driver writes at most `buffer.len()` bytes, the length passed, into `buffer`.
    check("cuDeviceGetName", unsafe { sys::cuDeviceGetName(buffer.as_mut_ptr(), buffer.len() as i32, device) })?;
    // SAFETY: on success the driver wrote a NUL-terminated name into `buffer`, truncated to fit;
    // the buffer was zeroed, so a NUL lies within it in any case.
    Ok(unsafe { CStr::from_ptr(buffer.as_ptr()) }.to_string_lossy().into_owned())
}

pub fn device_attribute(device: CUdevice, attribute: CUdevice_attribute) -> Result<i32> {
    let mut value = 0;
    // SAFETY: writes one int into `value`, a live local; an unknown attribute or device makes
    // it fail.
    check("cuDeviceGetAttribute", unsafe { sys::cuDeviceGetAttribute(&mut value, attribute, device) })?;
    Ok(value)
}

/// Retains the device's primary context: the one PyTorch uses, so pins are visible to it.
pub fn primary_context_retain(device: CUdevice) -> Result<CUcontext> {
    let mut context = std::ptr::null_mut();
    // SAFETY: writes one context handle into `context`, a live local; the retain is balanced by
    // `primary_context_release`, which the caller owes.
    check("cuDevicePrimaryCtxRetain", unsafe { sys::cuDevicePrimaryCtxRetain(&mut context, device) })?;
    Ok(context)
}

/// Whether the device's primary context is active: someone (PyTorch, a node pack) retained it.
pub fn primary_context_active(device: CUdevice) -> Result<bool> {
    let (mut flags, mut active) = (0, 0);
    // SAFETY: writes one flags word and one int into the two locals; it retains nothing.
    check("cuDevicePrimaryCtxGetState", unsafe { sys::cuDevicePrimaryCtxGetState(device, &mut flags, &mut active) })?;
    Ok(active != 0)
}

pub fn primary_context_release(device: CUdevice) -> Result<()> {
    // SAFETY: takes a device handle by value and no pointers; callers release exactly the
    // retains they made (`CudaBackend`'s drop, `synchronize_other_devices`), so PyTorch's own
    // retain of the context is never released under it.
    check("cuDevicePrimaryCtxRelease", unsafe { sys::cuDevicePrimaryCtxRelease_v2(device) })
}

pub fn current_context() -> Result<CUcontext> {
    let mut context = std::ptr::null_mut();
    // SAFETY: writes one context handle (null if none is current) into `context`, a live local.
    check("cuCtxGetCurrent", unsafe { sys::cuCtxGetCurrent(&mut context) })?;
    Ok(context)
}

pub fn set_current_context(context: CUcontext) -> Result<()> {
    // SAFETY: binds `context` to this thread only; the driver checks the handle (null unbinds)
    // and fails for a destroyed one. Callers pass a retained primary context or the one they
    // found current.
    check("cuCtxSetCurrent", unsafe { sys::cuCtxSetCurrent(context) })
}

/// (free, total) bytes of device memory of the current context's device.
pub fn memory_info() -> Result<(usize, usize)> {
    let (mut free, mut total) = (0, 0);
    // SAFETY: writes one size_t into each of the two locals; without a current context it fails.
    check("cuMemGetInfo", unsafe { sys::cuMemGetInfo_v2(&mut free, &mut total) })?;
    Ok((free, total))
}

/// # Safety
/// `[addr, addr+len)` must be mapped host memory that stays mapped until `host_unregister`.
pub unsafe fn host_register(addr: usize, len: usize, flags: u32) -> Result<()> {
    check("cuMemHostRegister", sys::cuMemHostRegister_v2(addr as *mut c_void, len, flags))
}

/// # Safety
/// `addr` must be the exact base of a live registration.
pub unsafe fn host_unregister(addr: usize) -> Result<()> {
    check("cuMemHostUnregister", sys::cuMemHostUnregister(addr as *mut c_void))
}

pub fn host_device_pointer(addr: usize) -> Result<u64> {
    let mut device_pointer = 0;
    // SAFETY: writes one device pointer into `device_pointer`, a live local, and only looks
    // `addr` up in the driver's table of registrations (an address it does not know fails); the
    // flags must be 0.
    check("cuMemHostGetDevicePointer", unsafe { sys::cuMemHostGetDevicePointer_v2(&mut device_pointer, addr as *mut c_void, 0) })?;
    Ok(device_pointer)
}

/// Waits for all work of the current context (every stream, PyTorch's too).
pub fn synchronize() -> Result<()> {
    // SAFETY: waits for the current context's work; takes no pointers, and fails without a
    // current context.
    check("cuCtxSynchronize", unsafe { sys::cuCtxSynchronize() })
}
