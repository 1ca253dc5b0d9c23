//! Raw OS calls: page locking (mlock on Unix, VirtualLock on Windows), the /proc files of Linux
//! and Windows' memory counters.

use crate::error::{Result, VikingError};

fn last_os_error(call: &'static str) -> VikingError {
    let error = std::io::Error::last_os_error();
    VikingError::Os { call, errno: error.raw_os_error().unwrap_or(0), message: error.to_string() }
}

pub fn page_size() -> u64 {
    #[cfg(unix)]
    {
        // SAFETY: sysconf takes a plain integer name and touches no memory of ours; an unknown
        // name returns -1, handled below.
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

/// Maps `len` bytes of the open file `fd` from `offset` (a multiple of the page size), shared
/// and read-only: the file's page-cache pages themselves, as every other mapping of the file
/// sees them. Returns the address.
///
/// # Safety
/// `fd` must be an open file descriptor; the caller unmaps the range exactly once (`unmap`).
#[cfg(unix)]
pub unsafe fn map_shared_read_only(fd: i32, offset: u64, len: u64) -> Result<u64> {
    let addr = libc::mmap(std::ptr::null_mut(), len as libc::size_t, libc::PROT_READ, libc::MAP_SHARED, fd, offset as libc::off_t);
    if addr == libc::MAP_FAILED {
        Err(last_os_error("mmap"))
    } else {
        Ok(addr as u64)
    }
}

/// # Safety
/// `[addr, addr+len)` must be a mapping made by `map_shared_read_only`, not used afterwards.
#[cfg(unix)]
pub unsafe fn unmap(addr: u64, len: u64) -> Result<()> {
    if libc::munmap(addr as *mut libc::c_void, len as libc::size_t) == 0 {
        Ok(())
    } else {
        Err(last_os_error("munmap"))
    }
}

/// The size of the open file `fd`.
#[cfg(unix)]
pub fn file_size(fd: i32) -> Result<u64> {
    // SAFETY: `libc::stat` is plain integers, for which all-zero bytes are a valid value.
    let mut stat: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `stat` is a live, writable struct of the type fstat fills; a bad `fd` makes the
    // call fail with EBADF, it cannot reach memory of ours.
    if unsafe { libc::fstat(fd, &mut stat) } == 0 {
        Ok(stat.st_size as u64)
    } else {
        Err(last_os_error("fstat"))
    }
}

/// Opens `path` read-only if it is still the file /proc/self/maps saw (the same device, as
/// "major:minor" in hex, and inode): a file replaced on disk since it was mapped is another one.
#[cfg(target_os = "linux")]
pub fn open_same_file(path: &str, device: &str, inode: u64) -> Option<std::fs::File> {
    use std::os::unix::fs::MetadataExt;
    let file = std::fs::File::open(path).ok()?;
    let meta = file.metadata().ok()?;
    let dev = meta.dev();
    let seen = format!("{:02x}:{:02x}", libc::major(dev), libc::minor(dev));
    (meta.is_file() && meta.ino() == inode && seen == device).then_some(file)
}

#[cfg(not(target_os = "linux"))]
pub fn open_same_file(_path: &str, _device: &str, _inode: u64) -> Option<std::fs::File> {
    None
}

/// Bytes of `[addr, addr+len)` whose pages are in RAM now, mapped into this process or not
/// (mincore: for a file mapping, the file's pages in the page cache). `None` if it cannot tell.
#[cfg(unix)]
pub fn resident_in_ram(addr: u64, len: u64) -> Option<u64> {
    let page = page_size();
    let start = addr / page * page;
    let pages = ((addr + len).div_ceil(page) * page - start) / page;
    let mut vector = vec![0u8; pages as usize];
    // SAFETY: mincore reads only the page tables of the range (an unmapped one fails with
    // ENOMEM) and writes one byte per page into `vector`, which holds exactly `pages` bytes for
    // the page-aligned range of `pages` pages passed.
    let done = unsafe { libc::mincore(start as *mut libc::c_void, (pages * page) as libc::size_t, vector.as_mut_ptr() as *mut _) };
    (done == 0).then(|| (vector.iter().filter(|&&b| b & 1 == 1).count() as u64 * page).min(len))
}

#[cfg(not(unix))]
pub fn resident_in_ram(_addr: u64, _len: u64) -> Option<u64> {
    None
}

#[cfg(windows)]
mod win {
    //! The few kernel32 functions Viking needs, declared by hand (no extra crate).
    #![allow(non_snake_case)]
    use std::ffi::c_void;

    pub type Handle = *mut c_void;
    pub const ERROR_WORKING_SET_QUOTA: i32 = 1453;

    #[repr(C)]
    #[derive(Default)]
    pub struct MemoryStatusEx {
        pub dwLength: u32,
        pub dwMemoryLoad: u32,
        pub ullTotalPhys: u64,
        pub ullAvailPhys: u64,
        pub ullTotalPageFile: u64,
        pub ullAvailPageFile: u64,
        pub ullTotalVirtual: u64,
        pub ullAvailVirtual: u64,
        pub ullAvailExtendedVirtual: u64,
    }

    #[repr(C)]
    #[derive(Default)]
    pub struct ProcessMemoryCounters {
        pub cb: u32,
        pub PageFaultCount: u32,
        pub PeakWorkingSetSize: usize,
        pub WorkingSetSize: usize,
        pub QuotaPeakPagedPoolUsage: usize,
        pub QuotaPagedPoolUsage: usize,
        pub QuotaPeakNonPagedPoolUsage: usize,
        pub QuotaNonPagedPoolUsage: usize,
        pub PagefileUsage: usize,
        pub PeakPagefileUsage: usize,
    }

    #[repr(C)]
    pub struct MemoryBasicInformation {
        pub BaseAddress: *mut c_void,
        pub AllocationBase: *mut c_void,
        pub AllocationProtect: u32,
        pub PartitionId: u16,
        pub RegionSize: usize,
        pub State: u32,
        pub Protect: u32,
        pub Type: u32,
    }

    pub const PAGE_READONLY: u32 = 0x02;
    pub const FILE_MAP_READ: u32 = 0x04;

    #[link(name = "kernel32")]
    extern "system" {
        pub fn VirtualQuery(address: *const c_void, buffer: *mut MemoryBasicInformation, length: usize) -> usize;
        pub fn CreateFileMappingW(file: Handle, attributes: *const c_void, protect: u32, size_high: u32, size_low: u32, name: *const u16) -> Handle;
        pub fn MapViewOfFile(mapping: Handle, access: u32, offset_high: u32, offset_low: u32, bytes: usize) -> *mut c_void;
        pub fn UnmapViewOfFile(address: *const c_void) -> i32;
        pub fn CloseHandle(handle: Handle) -> i32;
        pub fn GetFileSizeEx(file: Handle, size: *mut i64) -> i32;
        pub fn VirtualLock(address: *const c_void, size: usize) -> i32;
        pub fn VirtualUnlock(address: *const c_void, size: usize) -> i32;
        pub fn GetCurrentProcess() -> Handle;
        pub fn GetProcessWorkingSetSize(process: Handle, minimum: *mut usize, maximum: *mut usize) -> i32;
        pub fn SetProcessWorkingSetSize(process: Handle, minimum: usize, maximum: usize) -> i32;
        pub fn GlobalMemoryStatusEx(status: *mut MemoryStatusEx) -> i32;
        pub fn K32GetProcessMemoryInfo(process: Handle, counters: *mut ProcessMemoryCounters, size: u32) -> i32;
    }
}

/// # Safety
/// The range must be mapped.
#[cfg(windows)]
pub unsafe fn lock(addr: u64, len: u64) -> Result<()> {
    let address = addr as *const std::ffi::c_void;
    if win::VirtualLock(address, len as usize) != 0 {
        return Ok(());
    }
    let error = std::io::Error::last_os_error();
    if error.raw_os_error() != Some(win::ERROR_WORKING_SET_QUOTA) {
        return Err(last_os_error("VirtualLock"));
    }
    // Locked pages count against the process's minimum working set: raise it by the range
    // (and the maximum with it), then try once more.
    let process = win::GetCurrentProcess();
    let (mut minimum, mut maximum) = (0usize, 0usize);
    if win::GetProcessWorkingSetSize(process, &mut minimum, &mut maximum) == 0 {
        return Err(last_os_error("GetProcessWorkingSetSize"));
    }
    let grow = len as usize + (1 << 20);
    if win::SetProcessWorkingSetSize(process, minimum + grow, maximum.max(minimum + grow) + grow) == 0 {
        return Err(last_os_error("SetProcessWorkingSetSize"));
    }
    if win::VirtualLock(address, len as usize) != 0 {
        Ok(())
    } else {
        Err(last_os_error("VirtualLock"))
    }
}

/// # Safety
/// The range must be mapped.
#[cfg(windows)]
pub unsafe fn unlock(addr: u64, len: u64) -> Result<()> {
    if win::VirtualUnlock(addr as *const std::ffi::c_void, len as usize) != 0 {
        Ok(())
    } else {
        Err(last_os_error("VirtualUnlock"))
    }
}

/// The kind of memory `[addr, addr+len)` is, from VirtualQuery (Windows, where there is no
/// /proc/self/maps); `None` elsewhere.
#[cfg(windows)]
pub fn memory_kind(addr: u64, len: u64) -> Option<crate::memmap::MemoryKind> {
    use crate::memmap::{classify_windows, MemoryKind, WindowsRegion};
    let end = addr.checked_add(len)?;
    let mut regions = Vec::new();
    let mut cursor = addr;
    while cursor < end {
        // SAFETY: the struct is integers and raw pointers, for which all-zero bytes (0, null)
        // are valid values.
        let mut info: win::MemoryBasicInformation = unsafe { std::mem::zeroed() };
        let size = std::mem::size_of::<win::MemoryBasicInformation>();
        // SAFETY: VirtualQuery reads only the address space's bookkeeping for `cursor` (any
        // address, mapped or not) and writes at most `size` bytes into `info`, which is that big.
        if unsafe { win::VirtualQuery(cursor as *const std::ffi::c_void, &mut info, size) } == 0 {
            return Some(MemoryKind::Unmapped);
        }
        regions.push(WindowsRegion { state: info.State, protect: info.Protect, kind: info.Type });
        let next = info.BaseAddress as u64 + info.RegionSize as u64;
        if next <= cursor {
            break;
        }
        cursor = next;
    }
    Some(classify_windows(&regions))
}

#[cfg(not(windows))]
pub fn memory_kind(_addr: u64, _len: u64) -> Option<crate::memmap::MemoryKind> {
    None
}

/// Maps `len` bytes of the open file `handle` from `offset` (a multiple of the allocation
/// granularity, 64 KiB) read-only: a view of the file's cached pages, as every other view of
/// the file sees them. Returns (view address, mapping handle).
///
/// # Safety
/// `handle` must be an open file handle; the caller unmaps the view exactly once (`unmap_view`).
#[cfg(windows)]
pub unsafe fn map_view_read_only(handle: u64, offset: u64, len: u64) -> Result<(u64, u64)> {
    let mapping = win::CreateFileMappingW(handle as win::Handle, std::ptr::null(), win::PAGE_READONLY, 0, 0, std::ptr::null());
    if mapping.is_null() {
        return Err(last_os_error("CreateFileMappingW"));
    }
    let view = win::MapViewOfFile(mapping, win::FILE_MAP_READ, (offset >> 32) as u32, offset as u32, len as usize);
    if view.is_null() {
        let error = last_os_error("MapViewOfFile");
        win::CloseHandle(mapping);
        return Err(error);
    }
    Ok((view as u64, mapping as u64))
}

/// # Safety
/// `view` and `mapping` must come from `map_view_read_only`, not used afterwards.
#[cfg(windows)]
pub unsafe fn unmap_view(view: u64, mapping: u64) {
    win::UnmapViewOfFile(view as *const std::ffi::c_void);
    win::CloseHandle(mapping as win::Handle);
}

/// The size of the open file `handle` (Windows).
#[cfg(windows)]
pub fn file_size_of_handle(handle: u64) -> Result<u64> {
    let mut size = 0i64;
    // SAFETY: GetFileSizeEx writes one LARGE_INTEGER (an i64) into `size`; a handle that is not
    // an open file makes it fail (returns 0), it cannot reach memory of ours.
    if unsafe { win::GetFileSizeEx(handle as win::Handle, &mut size) } != 0 {
        Ok(size as u64)
    } else {
        Err(last_os_error("GetFileSizeEx"))
    }
}

/// The process's minimum working-set size, which bounds what VirtualLock can hold (Windows).
pub fn working_set_minimum() -> Option<u64> {
    #[cfg(windows)]
    // SAFETY: GetCurrentProcess returns a pseudo-handle that needs no closing, and
    // GetProcessWorkingSetSize writes one SIZE_T into each of the two locals it is given.
    unsafe {
        let (mut minimum, mut maximum) = (0usize, 0usize);
        if win::GetProcessWorkingSetSize(win::GetCurrentProcess(), &mut minimum, &mut maximum) != 0 {
            return Some(minimum as u64);
        }
    }
    None
}

/// (commit limit, commit available) in bytes: RAM plus pagefiles (Windows).
pub fn commit_charge() -> Option<(u64, u64)> {
    #[cfg(windows)]
    // SAFETY: GlobalMemoryStatusEx fills the MEMORYSTATUSEX it is given, whose dwLength is set
    // to its size as the call requires; `MemoryStatusEx` is `repr(C)` with the documented layout.
    unsafe {
        let mut status = win::MemoryStatusEx { dwLength: std::mem::size_of::<win::MemoryStatusEx>() as u32, ..Default::default() };
        if win::GlobalMemoryStatusEx(&mut status) != 0 {
            return Some((status.ullTotalPageFile, status.ullAvailPageFile));
        }
    }
    None
}

/// Page faults of this process so far: minor + major from /proc/self/stat on Linux, the
/// PageFaultCount (soft and hard) on Windows.
pub fn page_faults() -> Option<u64> {
    #[cfg(windows)]
    // SAFETY: K32GetProcessMemoryInfo writes at most `counters.cb` bytes, the size of the
    // `repr(C)` PROCESS_MEMORY_COUNTERS it is given, for the current process's pseudo-handle.
    unsafe {
        let mut counters = win::ProcessMemoryCounters { cb: std::mem::size_of::<win::ProcessMemoryCounters>() as u32, ..Default::default() };
        if win::K32GetProcessMemoryInfo(win::GetCurrentProcess(), &mut counters, counters.cb) != 0 {
            return Some(counters.PageFaultCount as u64);
        }
        None
    }
    #[cfg(not(windows))]
    {
        let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
        let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
        Some(fields.get(7)?.parse::<u64>().ok()? + fields.get(9)?.parse::<u64>().ok()?)
    }
}

/// The text of /proc/self/maps; `None` where there is no such file (not Linux). Only on Linux:
/// a Windows build run under Wine would otherwise read the Linux host's view of the process.
pub fn read_self_maps() -> Option<String> {
    if cfg!(target_os = "linux") {
        std::fs::read_to_string("/proc/self/maps").ok()
    } else {
        None
    }
}

/// Hands the /proc/self/pagemap entries of `[addr, addr+len)` to `visit` in chunks (first page
/// number, entries), so a status over a large model never holds its whole page table in one
/// buffer; `None` where it cannot be read (not Linux).
#[cfg(unix)]
pub fn pagemap_chunks(addr: u64, len: u64, visit: &mut dyn FnMut(u64, &[u64])) -> Option<()> {
    use std::os::unix::fs::FileExt;
    const CHUNK_PAGES: u64 = 1 << 15; // 256 KiB of entries, 128 MiB of memory with 4 KiB pages
    let page = page_size();
    let (first, last) = (addr / page, (addr + len).div_ceil(page));
    let file = std::fs::File::open("/proc/self/pagemap").ok()?;
    let mut bytes = vec![0u8; (CHUNK_PAGES.min(last - first) * 8) as usize];
    let mut entries = Vec::with_capacity(bytes.len() / 8);
    let mut start = first;
    while start < last {
        let count = CHUNK_PAGES.min(last - start);
        let chunk = &mut bytes[..(count * 8) as usize];
        file.read_exact_at(chunk, start * 8).ok()?;
        entries.clear();
        entries.extend(chunk.chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().unwrap())));
        visit(start, &entries);
        start += count;
    }
    Some(())
}

#[cfg(not(unix))]
pub fn pagemap_chunks(_addr: u64, _len: u64, _visit: &mut dyn FnMut(u64, &[u64])) -> Option<()> {
    None
}

/// (resident bytes, swapped bytes) of `[addr, addr+len)` of this process, from
/// /proc/self/pagemap; `None` where it cannot be read (not Linux).
pub fn residency(addr: u64, len: u64) -> Option<(u64, u64)> {
    let (mut present, mut swapped) = (0, 0);
    pagemap_chunks(addr, len, &mut |_, entries| {
        let counted = crate::memmap::count_pagemap(entries);
        present += counted.0;
        swapped += counted.1;
    })?;
    let page = page_size();
    Some(((present * page).min(len), (swapped * page).min(len)))
}

/// Pages swapped in and out since boot (pswpin, pswpout of /proc/vmstat).
pub fn swap_counters() -> Option<(u64, u64)> {
    let text = std::fs::read_to_string("/proc/vmstat").ok()?;
    let field = |name: &str| text.lines().find_map(|l| l.strip_prefix(name)?.trim().parse::<u64>().ok());
    Some((field("pswpin ")?, field("pswpout ")?))
}

/// The bytes this process may lock with mlock, or `None` when nothing limits it: the process
/// has CAP_IPC_LOCK (root, or a container given it), or RLIMIT_MEMLOCK is unlimited. A normal
/// user's or a default Docker container's limit is 8 MiB (64 KiB on older systems). On Windows
/// `None`: VirtualLock's bound is the working set, which the OS-lock backend raises itself.
/// (CUDA registrations are not counted against this limit.)
#[cfg(unix)]
pub fn lock_limit() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    if has_cap_ipc_lock(&status) {
        return None;
    }
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit writes one `rlimit` into `limit`, a live local of that type; the
    // resource is a valid constant.
    if unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut limit) } != 0 {
        return None;
    }
    (limit.rlim_cur != libc::RLIM_INFINITY).then_some(limit.rlim_cur as u64)
}

#[cfg(not(unix))]
pub fn lock_limit() -> Option<u64> {
    None
}

/// Whether /proc/PID/status text grants CAP_IPC_LOCK (bit 14 of CapEff) in effect.
#[cfg_attr(not(unix), allow(dead_code))]
pub fn has_cap_ipc_lock(status: &str) -> bool {
    const CAP_IPC_LOCK: u32 = 14;
    status
        .lines()
        .find_map(|line| line.strip_prefix("CapEff:"))
        .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
        .is_some_and(|caps| caps >> CAP_IPC_LOCK & 1 == 1)
}

/// A `kB` field of /proc/self/status (e.g. VmSwap, VmLck), in bytes.
pub fn self_status_bytes(field: &str) -> Option<u64> {
    let text = std::fs::read_to_string("/proc/self/status").ok()?;
    text.lines().find_map(|l| l.strip_prefix(field)?.strip_prefix(':')?.trim().trim_end_matches("kB").trim().parse::<u64>().ok()).map(|kib| kib * 1024)
}

/// Where our memory cgroup's levels lie: their directories, from our own cgroup up to the root
/// of the mount, and the version. Found once: a process does not change cgroups under us, and
/// the pressure monitor asks twice a second.
fn cgroup_location() -> Option<&'static (crate::cgroup::CgroupVersion, Vec<std::path::PathBuf>)> {
    use crate::cgroup;
    static LOCATION: std::sync::OnceLock<Option<(cgroup::CgroupVersion, Vec<std::path::PathBuf>)>> = std::sync::OnceLock::new();
    LOCATION
        .get_or_init(|| {
            if !cfg!(target_os = "linux") {
                return None;
            }
            let (version, path) = cgroup::memory_cgroup_path(&std::fs::read_to_string("/proc/self/cgroup").ok()?)?;
            let (mount, mount_root) = cgroup::mount_of(&std::fs::read_to_string("/proc/self/mountinfo").ok()?, version)?;
            let dirs = cgroup::ancestors(&path, &mount_root).iter().map(|relative| std::path::Path::new(&mount).join(relative)).collect();
            Some((version, dirs))
        })
        .as_ref()
}

/// Every level of our memory cgroup that has a usage file, from our own cgroup up to the root
/// of the mount (see `cgroup.rs`); empty where there are no cgroups (not Linux).
pub fn cgroup_levels() -> Vec<crate::cgroup::Level> {
    use crate::cgroup::{self, Level};
    let Some((version, dirs)) = cgroup_location() else {
        return Vec::new();
    };
    let (limit_files, usage_file, stat_file) = version.files();
    let read = |dir: &std::path::Path, file: &str| std::fs::read_to_string(dir.join(file)).ok();
    dirs.iter()
        .filter_map(|dir| {
            let usage = read(dir, usage_file)?.trim().parse().ok()?;
            Some(Level {
                limit: limit_files.iter().filter_map(|f| read(dir, f).as_deref().and_then(cgroup::parse_limit)).min(),
                usage,
                reclaimable_file: read(dir, stat_file).as_deref().map(cgroup::reclaimable_file).unwrap_or(0),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cap_ipc_lock_is_bit_14_of_the_effective_set() {
        assert!(has_cap_ipc_lock("Name:\tpython\nCapEff:\t000001ffffffffff\n")); // root
        assert!(!has_cap_ipc_lock("CapEff:\t0000000000000000\n")); // a normal user
        assert!(!has_cap_ipc_lock("CapEff:\t00000000a80425fb\n")); // Docker's default set: no IPC_LOCK
        assert!(has_cap_ipc_lock("CapEff:\t00000000a80465fb\n")); // the same with --cap-add IPC_LOCK
        assert!(!has_cap_ipc_lock("no such line"));
    }
}
