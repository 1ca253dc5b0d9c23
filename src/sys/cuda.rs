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
    // SAFETY: cuGetErrorName writes a pointer to a static string or leaves it null.
    let ok = unsafe { sys::cuGetErrorName(status, &mut name) } == CUresult::CUDA_SUCCESS;
    if ok && !name.is_null() {
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
    // SAFETY: only tries to dlopen the library.
    unsafe { sys::is_culib_present() }
}

pub fn init() -> Result<()> {
    check("cuInit", unsafe { sys::cuInit(0) })
}

pub fn driver_version() -> Result<i32> {
    let mut version = 0;
    check("cuDriverGetVersion", unsafe { sys::cuDriverGetVersion(&mut version) })?;
    Ok(version)
}

pub fn device_count() -> Result<i32> {
    let mut count = 0;
    check("cuDeviceGetCount", unsafe { sys::cuDeviceGetCount(&mut count) })?;
    Ok(count)
}

pub fn device(ordinal: i32) -> Result<CUdevice> {
    let mut device = 0;
    check("cuDeviceGet", unsafe { sys::cuDeviceGet(&mut device, ordinal) })?;
    Ok(device)
}

pub fn device_name(device: CUdevice) -> Result<String> {
    let mut buffer = [0 as std::ffi::c_char; 256];
    check("cuDeviceGetName", unsafe { sys::cuDeviceGetName(buffer.as_mut_ptr(), buffer.len() as i32, device) })?;
    Ok(unsafe { CStr::from_ptr(buffer.as_ptr()) }.to_string_lossy().into_owned())
}

pub fn device_attribute(device: CUdevice, attribute: CUdevice_attribute) -> Result<i32> {
    let mut value = 0;
    check("cuDeviceGetAttribute", unsafe { sys::cuDeviceGetAttribute(&mut value, attribute, device) })?;
    Ok(value)
}

/// Retains the device's primary context: the one PyTorch uses, so pins are visible to it.
pub fn primary_context_retain(device: CUdevice) -> Result<CUcontext> {
    let mut context = std::ptr::null_mut();
    check("cuDevicePrimaryCtxRetain", unsafe { sys::cuDevicePrimaryCtxRetain(&mut context, device) })?;
    Ok(context)
}

/// Whether the device's primary context is active: someone (PyTorch, a node pack) retained it.
pub fn primary_context_active(device: CUdevice) -> Result<bool> {
    let (mut flags, mut active) = (0, 0);
    check("cuDevicePrimaryCtxGetState", unsafe { sys::cuDevicePrimaryCtxGetState(device, &mut flags, &mut active) })?;
    Ok(active != 0)
}

pub fn primary_context_release(device: CUdevice) -> Result<()> {
    check("cuDevicePrimaryCtxRelease", unsafe { sys::cuDevicePrimaryCtxRelease_v2(device) })
}

pub fn current_context() -> Result<CUcontext> {
    let mut context = std::ptr::null_mut();
    check("cuCtxGetCurrent", unsafe { sys::cuCtxGetCurrent(&mut context) })?;
    Ok(context)
}

pub fn set_current_context(context: CUcontext) -> Result<()> {
    check("cuCtxSetCurrent", unsafe { sys::cuCtxSetCurrent(context) })
}

/// (free, total) bytes of device memory of the current context's device.
pub fn memory_info() -> Result<(usize, usize)> {
    let (mut free, mut total) = (0, 0);
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
    check("cuMemHostGetDevicePointer", unsafe { sys::cuMemHostGetDevicePointer_v2(&mut device_pointer, addr as *mut c_void, 0) })?;
    Ok(device_pointer)
}

/// Waits for all work of the current context (every stream, PyTorch's too).
pub fn synchronize() -> Result<()> {
    check("cuCtxSynchronize", unsafe { sys::cuCtxSynchronize() })
}
