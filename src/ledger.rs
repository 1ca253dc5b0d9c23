//! Every live registration, by base address. An entry owns its registration *and* a reference
//! to the memory's owner (the tensor storage): dropping the entry unpins first, then lets the
//! memory go, so memory can never be freed while pinned. (Freeing memory before unregistering
//! it leaks the pinned pages, and the next registration at that address fails with 712.)

use std::any::Any;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use crate::backend::mapped::ViewHold;
use crate::backend::{BackendKind, Registration};
use crate::error::{Result, VikingError};

/// Something that keeps pinned memory alive (a Python storage object; a `Vec<u8>` in tests).
pub type Keepalive = Arc<dyn Any + Send + Sync>;

pub struct Entry {
    // Drop (below) releases the registration first, then the fields drop: the memory last.
    pub registration: Registration,
    pub keepalive: Vec<Keepalive>,
    pub owner: u64,
    pub priority: i32,
    /// Mapped views of this registration (backend/mapped.rs): while one lives, no `take_*`
    /// takes the entry; it stays pinned and counted.
    pub views: ViewHold,
}

impl Drop for Entry {
    fn drop(&mut self) {
        if self.registration.release().is_err() {
            // The range may still be pinned (a failed unpin, a lost device): freeing its memory
            // could leave the driver or the kernel pointing at freed pages. Keep it for good.
            for keepalive in self.keepalive.drain(..) {
                std::mem::forget(keepalive);
            }
        }
    }
}

impl Entry {
    pub fn addr(&self) -> u64 {
        self.registration.addr()
    }
    pub fn len(&self) -> u64 {
        self.registration.len()
    }
    pub fn end(&self) -> u64 {
        self.addr() + self.len()
    }
    /// Whether a mapped view holds this entry (the GPU may read it in place).
    pub fn viewed(&self) -> bool {
        self.views.viewed()
    }
}

#[derive(Default)]
pub struct Ledger {
    entries: BTreeMap<u64, Entry>,
}

impl Ledger {
    /// Adds an entry. An overlap with a live one would mean a byte held twice: refused (and the
    /// refused entry is dropped, which unpins it).
    pub fn insert(&mut self, entry: Entry) -> Result<()> {
        let (addr, end) = (entry.addr(), entry.end());
        let before = self.entries.range(..end).next_back().map(|(_, e)| e.end() > addr).unwrap_or(false);
        if before {
            return Err(VikingError::Internal(format!("registration {addr:#x}+{} overlaps a live one", entry.len())));
        }
        self.entries.insert(addr, entry);
        Ok(())
    }

    pub fn entries(&self) -> impl Iterator<Item = &Entry> {
        self.entries.values()
    }

    pub fn total_bytes(&self) -> u64 {
        self.entries.values().map(Entry::len).sum()
    }

    pub fn owner_bytes(&self, owner: u64) -> u64 {
        self.entries.values().filter(|e| e.owner == owner).map(Entry::len).sum()
    }

    /// Of `owner_bytes`: pins still being made off the caller's thread.
    /// Bytes of every pin still being made off the thread.
    pub fn pending_bytes(&self) -> u64 {
        self.entries.values().filter(|e| e.registration.pending()).map(Entry::len).sum()
    }

    pub fn owner_pending_bytes(&self, owner: u64) -> u64 {
        self.entries.values().filter(|e| e.owner == owner && e.registration.pending()).map(Entry::len).sum()
    }

    /// Bytes per (owner, backend).
    pub fn totals(&self) -> HashMap<(u64, BackendKind), (u64, usize)> {
        let mut totals = HashMap::new();
        for entry in self.entries.values() {
            let slot = totals.entry((entry.owner, entry.registration.backend())).or_insert((0, 0));
            slot.0 += entry.len();
            slot.1 += 1;
        }
        totals
    }

    /// Removes the entries `select` picks and returns them; the caller drops them (unpins).
    pub fn take_where(&mut self, mut select: impl FnMut(&Entry) -> bool) -> Vec<Entry> {
        let keys: Vec<u64> = self.entries.iter().filter(|(_, e)| !e.viewed() && select(e)).map(|(&k, _)| k).collect();
        keys.into_iter().filter_map(|k| self.entries.remove(&k)).collect()
    }

    pub fn take_owner(&mut self, owner: u64) -> Vec<Entry> {
        self.take_where(|e| e.owner == owner)
    }

    /// Every entry but those a mapped view holds.
    pub fn take_all(&mut self) -> Vec<Entry> {
        self.take_where(|_| true)
    }

    /// The entry whose range holds all of `[addr, addr+len)`.
    pub fn containing(&self, addr: u64, len: u64) -> Option<&Entry> {
        let end = addr.checked_add(len)?;
        self.entries.range(..=addr).next_back().map(|(_, e)| e).filter(|e| e.end() >= end)
    }

    /// Takes entries, lowest priority first (then the most recent address), until at least
    /// `bytes` are taken or only entries of `keep_from_priority` and above are left.
    /// Takes `owner`'s entries from the highest address down until it holds at most
    /// `keep_bytes` (a lowered per-model budget). Whole entries: it may end below `keep_bytes`;
    /// the next plan fills up to it again.
    pub fn take_owner_beyond(&mut self, owner: u64, keep_bytes: u64) -> Vec<Entry> {
        let mut held = self.owner_bytes(owner);
        let mut addrs: Vec<u64> = self.entries.values().filter(|e| e.owner == owner && !e.viewed()).map(Entry::addr).collect();
        addrs.sort_unstable_by(|a, b| b.cmp(a));
        let mut taken = Vec::new();
        for addr in addrs {
            if held <= keep_bytes {
                break;
            }
            if let Some(entry) = self.entries.remove(&addr) {
                held -= entry.len();
                taken.push(entry);
            }
        }
        taken
    }

    pub fn take_lowest(&mut self, bytes: u64, keep_from_priority: i32) -> Vec<Entry> {
        let mut candidates: Vec<(i32, u64, u64)> = self
            .entries
            .values()
            .filter(|e| e.priority < keep_from_priority && !e.viewed())
            .map(|e| (e.priority, u64::MAX - e.addr(), e.len()))
            .collect();
        candidates.sort();
        let mut taken = Vec::new();
        let mut freed = 0;
        for (_, inverted_addr, len) in candidates {
            if freed >= bytes {
                break;
            }
            if let Some(entry) = self.entries.remove(&(u64::MAX - inverted_addr)) {
                freed += len;
                taken.push(entry);
            }
        }
        taken
    }
}
