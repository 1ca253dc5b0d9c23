//! A read-only view of part of a file (a checkpoint) that unmaps itself on drop.
//!
//! Why: ComfyUI 0.33's dynamic VRAM mode maps checkpoints private and read-only and reads them
//! with pread; registering such a private read-only mapping with CUDA hung for more than 90 s
//! on an H200. A view of our own maps the same page-cache pages (MAP_SHARED on Unix, a
//! read-only file-mapping view on Windows): locking it keeps the checkpoint's pages in RAM for
//! every reader of the file, and a CUDA registration of it with READ_ONLY took 0.04 s for
//! 2 GiB (bench/results/gpu_probe_file_mapping.json). On Windows, which drops a file's cached
//! pages after reads (comfy-aimdo issue 70), VirtualLock on the view keeps them.

use crate::error::{Result, VikingError};
use crate::sys::os;

#[derive(Debug)]
pub struct FileView {
    addr: u64,
    len: u64,
    /// Where the OS mapped it (Windows maps from a 64 KiB boundary below `addr`) and the
    /// mapping object to close (Windows; 0 on Unix).
    base: u64,
    mapping: u64,
}

impl FileView {
    /// Maps `[offset, offset+len)` of the open file `file` (a file descriptor on Unix, a file
    /// HANDLE on Windows). `offset` must be a multiple of the page size and the range must lie
    /// inside the file as it is now.
    pub fn open(file: i64, offset: u64, len: u64) -> Result<FileView> {
        let page = os::page_size();
        if !offset.is_multiple_of(page) {
            return Err(VikingError::invalid(format!("offset {offset} is not a multiple of the page size ({page})")));
        }
        if len == 0 {
            return Err(VikingError::invalid("a file view needs a length above 0"));
        }
        let size = file_size(file)?;
        if offset.checked_add(len).is_none_or(|end| end > size) {
            return Err(VikingError::invalid(format!(
                "the file is {size} bytes, shorter than {offset} + {len}: was it replaced or truncated on disk?"
            )));
        }
        // SAFETY: `file` is open (its size was just read through it), the range is non-empty,
        // page-aligned and inside the file; the mapping's only owner is the returned view, which
        // unmaps it exactly once, on drop.
        unsafe { map(file, offset, len) }
    }

    /// A view of the file pages behind `[addr, addr+len)` of a private writable file mapping
    /// (`slice`, from /proc/self/maps), from the page that holds its first byte, for the OS lock
    /// to hold in place of the range itself. Why: mlock of a private *writable* mapping faults
    /// every page in for writing, so the kernel copies each one (copy-on-write) and the model
    /// ends up read in and copied into anonymous memory; locking the shared pages reads them
    /// once and copies nothing, and the private mapping keeps showing those very pages.
    /// `None` where it cannot stand in: the path now names another file, a page of the range
    /// was already copied (written to, which the view would not hold), not Linux.
    pub fn of_private_range(slice: &crate::memmap::FileSlice, addr: u64, len: u64) -> Option<FileView> {
        if !cfg!(target_os = "linux") {
            return None;
        }
        let page = os::page_size();
        let mut copied = false;
        os::pagemap_chunks(addr, len, &mut |_, entries| copied |= !crate::memmap::no_page_copied(entries))?;
        // A private mapping starts on a page of its file: its bytes sit where the file's do.
        if copied || slice.offset % page != addr % page {
            return None;
        }
        let file = os::open_same_file(&slice.path, &slice.device, slice.inode)?;
        let start = slice.offset / page * page;
        FileView::open(raw_file(&file), start, slice.offset - start + len).ok()
    }

    pub fn addr(&self) -> u64 {
        self.addr
    }

    pub fn len(&self) -> u64 {
        self.len
    }

    /// Bytes of the view whose file pages are in RAM now.
    pub fn resident_bytes(&self) -> Option<u64> {
        os::resident_in_ram(self.addr, self.len)
    }
}

#[cfg(unix)]
fn raw_file(file: &std::fs::File) -> i64 {
    use std::os::unix::io::AsRawFd;
    file.as_raw_fd() as i64
}

#[cfg(windows)]
fn raw_file(file: &std::fs::File) -> i64 {
    use std::os::windows::io::AsRawHandle;
    file.as_raw_handle() as i64
}

#[cfg(not(any(unix, windows)))]
fn raw_file(_file: &std::fs::File) -> i64 {
    -1
}

#[cfg(unix)]
fn file_size(fd: i64) -> Result<u64> {
    os::file_size(i32::try_from(fd).map_err(|_| VikingError::invalid(format!("{fd} is not a file descriptor")))?)
}

#[cfg(unix)]
unsafe fn map(fd: i64, offset: u64, len: u64) -> Result<FileView> {
    let addr = os::map_shared_read_only(fd as i32, offset, len)?;
    Ok(FileView { addr, len, base: addr, mapping: 0 })
}

#[cfg(windows)]
fn file_size(handle: i64) -> Result<u64> {
    os::file_size_of_handle(handle as u64)
}

#[cfg(windows)]
unsafe fn map(handle: i64, offset: u64, len: u64) -> Result<FileView> {
    const GRANULARITY: u64 = 64 << 10; // a view starts on an allocation-granularity boundary
    let start = offset / GRANULARITY * GRANULARITY;
    let (base, mapping) = os::map_view_read_only(handle as u64, start, len + (offset - start))?;
    Ok(FileView { addr: base + (offset - start), len, base, mapping })
}

#[cfg(not(any(unix, windows)))]
fn file_size(_file: i64) -> Result<u64> {
    Err(VikingError::BackendUnavailable { backend: "file view", reason: "file views are implemented for Unix and Windows".into() })
}

#[cfg(not(any(unix, windows)))]
unsafe fn map(_file: i64, _offset: u64, _len: u64) -> Result<FileView> {
    unreachable!("file_size refuses first")
}

impl Drop for FileView {
    fn drop(&mut self) {
        // SAFETY: `base`/`len` are the mapping this view made and owns alone (it is neither
        // Clone nor Copy); nothing reads it after drop, as the ledger keeps the view alive while
        // any registration covers it.
        #[cfg(unix)]
        let _ = unsafe { os::unmap(self.base, self.len) };
        // SAFETY: `base` and `mapping` are the view and mapping handle this value made and owns
        // alone; as on Unix, nothing uses them after drop.
        #[cfg(windows)]
        unsafe {
            os::unmap_view(self.base, self.mapping)
        };
        let _ = self.mapping;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn test_file(pages: usize) -> (std::path::PathBuf, std::fs::File) {
        let path = std::env::temp_dir().join(format!("viking_view_{}_{pages}", std::process::id()));
        let mut file = std::fs::File::create(&path).unwrap();
        file.write_all(&vec![7u8; pages * 4096]).unwrap();
        drop(file);
        let file = std::fs::File::open(&path).unwrap();
        (path, file)
    }

    #[test]
    fn a_view_maps_the_file_and_checks_its_size() {
        let (path, file) = test_file(20);
        // 17 pages in: past Windows' 64 KiB granularity, so the view starts below the offset there.
        let view = FileView::open(raw_file(&file), 17 * 4096, 2 * 4096).unwrap();
        // SAFETY: the view maps 8192 readable bytes.
        let first = unsafe { *(view.addr() as *const u8) };
        assert_eq!((first, view.len()), (7, 8192));
        if cfg!(unix) {
            assert_eq!(view.resident_bytes(), Some(8192)); // just written: in the page cache
        }
        assert!(FileView::open(raw_file(&file), 100, 4096).is_err(), "unaligned offset");
        let error = FileView::open(raw_file(&file), 0, 21 * 4096).unwrap_err().to_string();
        assert!(error.contains("replaced or truncated"), "{error}");
        drop(view);
        drop(file);
        std::fs::remove_file(path).unwrap();
    }

    /// The view is read-only file memory (the kind CUDA never takes), the OS lock holds it, and
    /// ordinary heap memory is told apart from it (Windows: VirtualQuery; Linux: /proc/self/maps).
    #[test]
    fn a_view_is_read_only_memory_that_the_os_lock_holds() {
        use crate::memmap::{self, MemoryKind};
        let (path, file) = test_file(4);
        let view = FileView::open(raw_file(&file), 0, 4 * 4096).unwrap();
        let heap = vec![1u8; 1 << 20];
        let kind = |addr: u64, len: u64| match os::read_self_maps() {
            Some(text) => memmap::classify(&memmap::parse(&text), addr, len),
            None => os::memory_kind(addr, len).expect("a way to tell memory kinds apart"),
        };
        assert_eq!(kind(view.addr(), view.len()), MemoryKind::ReadOnly);
        assert_eq!(kind(heap.as_ptr() as u64, heap.len() as u64), MemoryKind::Anonymous);
        // SAFETY: the view is mapped until it drops, after the unlock.
        unsafe {
            os::lock(view.addr(), view.len()).unwrap();
            os::unlock(view.addr(), view.len()).unwrap();
        }
        drop(view);
        drop(file);
        std::fs::remove_file(path).unwrap();
    }
}
