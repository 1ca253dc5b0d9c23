//! A shared, read-only view of part of a file (a checkpoint) that unmaps itself on drop.
//!
//! Why: ComfyUI 0.33's dynamic VRAM mode maps checkpoints private and read-only and reads them
//! with pread; registering such a private read-only mapping with CUDA hung for more than 90 s
//! on an H200. A view of our own, MAP_SHARED, maps the same page-cache pages: locking it keeps
//! the checkpoint's pages in RAM for every reader of the file, and a CUDA registration of it
//! with READ_ONLY took 0.04 s for 2 GiB (bench/results/gpu_probe_file_mapping.json).

use crate::error::{Result, VikingError};
use crate::sys::os;

#[derive(Debug)]
pub struct FileView {
    addr: u64,
    len: u64,
}

impl FileView {
    /// Maps `[offset, offset+len)` of the open file `fd`. `offset` must be a multiple of the page
    /// size and the range must lie inside the file as it is now.
    #[cfg(unix)]
    pub fn open(fd: i32, offset: u64, len: u64) -> Result<FileView> {
        let page = os::page_size();
        if !offset.is_multiple_of(page) {
            return Err(VikingError::invalid(format!("offset {offset} is not a multiple of the page size ({page})")));
        }
        if len == 0 {
            return Err(VikingError::invalid("a file view needs a length above 0"));
        }
        let size = os::file_size(fd)?;
        if offset.checked_add(len).is_none_or(|end| end > size) {
            return Err(VikingError::invalid(format!(
                "the file is {size} bytes, shorter than {offset} + {len}: was it replaced or truncated on disk?"
            )));
        }
        // SAFETY: fd is open (fstat just succeeded); the view unmaps exactly this range once.
        let addr = unsafe { os::map_shared_read_only(fd, offset, len)? };
        Ok(FileView { addr, len })
    }

    #[cfg(not(unix))]
    pub fn open(_fd: i32, _offset: u64, _len: u64) -> Result<FileView> {
        Err(VikingError::BackendUnavailable { backend: "file view", reason: "file views are implemented for Unix only".into() })
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

impl Drop for FileView {
    fn drop(&mut self) {
        #[cfg(unix)]
        // SAFETY: this view made the mapping and is its only owner; nothing uses it after drop
        // (the ledger keeps the view alive while any registration covers it).
        let _ = unsafe { os::unmap(self.addr, self.len) };
    }
}

#[cfg(all(test, unix))]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::unix::io::AsRawFd;

    #[test]
    fn a_view_maps_the_file_and_checks_its_size() {
        let path = std::env::temp_dir().join(format!("viking_view_{}", std::process::id()));
        let mut file = std::fs::File::create(&path).unwrap();
        file.write_all(&vec![7u8; 3 * 4096]).unwrap();
        drop(file);
        let file = std::fs::File::open(&path).unwrap();
        let view = FileView::open(file.as_raw_fd(), 4096, 2 * 4096).unwrap();
        // SAFETY: the view maps 8192 readable bytes.
        let first = unsafe { *(view.addr() as *const u8) };
        assert_eq!((first, view.len()), (7, 8192));
        assert_eq!(view.resident_bytes(), Some(8192)); // just written: in the page cache
        assert!(FileView::open(file.as_raw_fd(), 100, 4096).is_err(), "unaligned offset");
        let error = FileView::open(file.as_raw_fd(), 0, 4 * 4096).unwrap_err().to_string();
        assert!(error.contains("replaced or truncated"), "{error}");
        drop(view);
        std::fs::remove_file(path).unwrap();
    }
}
