//! The OS page lock: mlock/munlock on Unix, VirtualLock/VirtualUnlock on Windows (which raises
//! the process's working-set minimum as it goes). It needs no GPU, takes any mapped memory
//! (read-only file mappings too) and keeps pages out of swap / the pagefile.
//!
//! Both lock whole pages and neither is reference counted: two regions that share a page
//! (one tensor ends where the next begins) would unlock each other's page on release. So this
//! backend remembers its live regions and leaves a shared boundary page locked until the last
//! region on it goes.

use std::collections::BTreeMap;
use std::sync::Mutex;

use super::{Backend, BackendKind};
use crate::error::{Result, VikingError};
use crate::memmap::MemoryKind;
use crate::sys::os;

pub struct OsLock {
    page: u64,
    live: Mutex<BTreeMap<u64, u64>>, // addr -> len
}

impl OsLock {
    pub fn new() -> Result<OsLock> {
        if cfg!(any(unix, windows)) {
            Ok(OsLock { page: os::page_size(), live: Mutex::new(BTreeMap::new()) })
        } else {
            Err(VikingError::BackendUnavailable { backend: "os-lock", reason: "no page lock on this OS".into() })
        }
    }

    /// The page span of `[addr, addr+len)` less its first/last page where a neighbour uses it.
    fn pages_to_unlock(&self, live: &BTreeMap<u64, u64>, addr: u64, len: u64) -> Option<(u64, u64)> {
        let mut start = addr / self.page * self.page;
        let mut end = (addr + len).div_ceil(self.page) * self.page;
        if let Some((&prev, &prev_len)) = live.range(..addr).next_back() {
            if prev + prev_len > start {
                start += self.page;
            }
        }
        if let Some((&next, _)) = live.range(addr + len..).next() {
            if next < end {
                end -= self.page;
            }
        }
        (start < end).then_some((start, end - start))
    }
}

impl Backend for OsLock {
    fn kind(&self) -> BackendKind {
        BackendKind::OsLock
    }

    fn accepts(&self, kind: MemoryKind) -> bool {
        kind.is_host_memory()
    }

    unsafe fn pin(&self, addr: u64, len: u64) -> Result<()> {
        #[cfg(any(unix, windows))]
        {
            let mut live = self.live.lock().map_err(|_| VikingError::Internal("os-lock table poisoned".into()))?;
            if let Err(error) = os::lock(addr, len) {
                // mlock may have locked part of the range before failing: undo that part, but
                // leave pages shared with live neighbours locked.
                if let Some((start, span)) = self.pages_to_unlock(&live, addr, len) {
                    let _ = os::unlock(start, span);
                }
                return Err(error);
            }
            live.insert(addr, len);
            Ok(())
        }
        #[cfg(not(any(unix, windows)))]
        {
            let _ = (addr, len);
            Err(VikingError::BackendUnavailable { backend: "os-lock", reason: "no page lock on this OS".into() })
        }
    }

    unsafe fn unpin(&self, addr: u64, len: u64) -> Result<()> {
        #[cfg(any(unix, windows))]
        {
            let mut live = self.live.lock().map_err(|_| VikingError::Internal("os-lock table poisoned".into()))?;
            live.remove(&addr);
            match self.pages_to_unlock(&live, addr, len) {
                Some((start, span)) => os::unlock(start, span),
                None => Ok(()),
            }
        }
        #[cfg(not(any(unix, windows)))]
        {
            let _ = (addr, len);
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs on Linux and, cross-compiled, under Wine: lock and unlock a real buffer, with two
    /// regions sharing a page.
    #[test]
    fn lock_and_unlock_a_real_buffer() {
        let lock = OsLock::new().unwrap();
        let mut buffer = vec![7u8; 3 << 20];
        let base = buffer.as_mut_ptr() as u64;
        // SAFETY: both ranges lie inside `buffer`, which outlives the block, and each unpin
        // matches a pin of the same range.
        unsafe {
            lock.pin(base, 1 << 20).unwrap();
            lock.pin(base + (1 << 20), 1 << 20).unwrap(); // shares a page with the first when unaligned
            lock.unpin(base, 1 << 20).unwrap();
            lock.unpin(base + (1 << 20), 1 << 20).unwrap();
        }
        assert!(lock.live.lock().unwrap().is_empty());
        assert_eq!(buffer[5], 7);
    }
}
