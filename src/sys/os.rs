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

/// (resident bytes, swapped bytes) of `[addr, addr+len)` of this process, from
/// /proc/self/pagemap; `None` where it cannot be read (not Linux).
#[cfg(not(unix))]
pub fn residency(_addr: u64, _len: u64) -> Option<(u64, u64)> {
    None
}

/// (resident bytes, swapped bytes) of `[addr, addr+len)` of this process, from
/// /proc/self/pagemap; `None` where it cannot be read (not Linux).
#[cfg(unix)]
pub fn residency(addr: u64, len: u64) -> Option<(u64, u64)> {
    use std::os::unix::fs::FileExt;
    let page = page_size();
    let (first, last) = (addr / page, (addr + len).div_ceil(page));
    let file = std::fs::File::open("/proc/self/pagemap").ok()?;
    let mut buffer = vec![0u8; ((last - first) * 8) as usize];
    file.read_exact_at(&mut buffer, first * 8).ok()?;
    let entries: Vec<u64> = buffer.chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().unwrap())).collect();
    let (present, swapped) = crate::memmap::count_pagemap(&entries);
    Some(((present * page).min(len), (swapped * page).min(len)))
}

/// Pages swapped in and out since boot (pswpin, pswpout of /proc/vmstat).
pub fn swap_counters() -> Option<(u64, u64)> {
    let text = std::fs::read_to_string("/proc/vmstat").ok()?;
    let field = |name: &str| text.lines().find_map(|l| l.strip_prefix(name)?.trim().parse::<u64>().ok());
    Some((field("pswpin ")?, field("pswpout ")?))
}

/// A `kB` field of /proc/self/status (e.g. VmSwap, VmLck), in bytes.
pub fn self_status_bytes(field: &str) -> Option<u64> {
    let text = std::fs::read_to_string("/proc/self/status").ok()?;
    text.lines().find_map(|l| l.strip_prefix(field)?.strip_prefix(':')?.trim().trim_end_matches("kB").trim().parse::<u64>().ok()).map(|kib| kib * 1024)
}
