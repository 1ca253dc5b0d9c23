//! Raw OS calls: page locking and the /proc files of Linux.

use crate::error::{Result, VikingError};

fn last_os_error(call: &'static str) -> VikingError {
    let error = std::io::Error::last_os_error();
    VikingError::Os { call, errno: error.raw_os_error().unwrap_or(0), message: error.to_string() }
}

pub fn page_size() -> u64 {
    #[cfg(unix)]
    {
        // SAFETY: sysconf has no preconditions.
        let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        if size > 0 {
            return size as u64;
        }
    }
    4096
}

/// # Safety
/// The range must be mapped.
#[cfg(unix)]
pub unsafe fn lock(addr: u64, len: u64) -> Result<()> {
    if libc::mlock(addr as *const libc::c_void, len as libc::size_t) == 0 {
        Ok(())
    } else {
        Err(last_os_error("mlock"))
    }
}

/// # Safety
/// The range must be mapped.
#[cfg(unix)]
pub unsafe fn unlock(addr: u64, len: u64) -> Result<()> {
    if libc::munlock(addr as *const libc::c_void, len as libc::size_t) == 0 {
        Ok(())
    } else {
        Err(last_os_error("munlock"))
    }
}

/// The text of /proc/self/maps; `None` where there is no such file (not Linux).
pub fn read_self_maps() -> Option<String> {
    std::fs::read_to_string("/proc/self/maps").ok()
}
