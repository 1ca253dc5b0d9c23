//! Mapped views: the GPU reads a pinned registration in place, through its device address (the
//! registrations carry DEVICEMAP), with no copy into VRAM. Worth it only for weights read
//! sparsely: a text encoder's token-embedding table, of which a prompt reads a few hundred rows.
//!
//! A view holds its registration: while one lives, the ledger entry behind it is never taken
//! (no release, no pressure relief, no eviction for a lower budget); it stays counted in the
//! budget and the status as any pin. Once the last view of it is gone, the entry is released
//! the usual way (its owner's next reconcile, or the next sweep when the owner was forgotten).

use std::sync::Arc;

/// Shared by a ledger entry and every view of it: the entry is held while views exist.
#[derive(Clone, Default)]
pub struct ViewHold(Arc<()>);

impl ViewHold {
    /// How many views of the entry are alive now.
    pub fn live_views(&self) -> usize {
        Arc::strong_count(&self.0) - 1
    }

    /// Whether a view holds the entry.
    pub fn viewed(&self) -> bool {
        self.live_views() > 0
    }
}

/// A range of a pinned registration as the device sees it. Holds its registration until dropped.
pub struct MappedView {
    /// The device's address of `host_addr` (equal to it under unified addressing).
    pub device_addr: u64,
    pub host_addr: u64,
    pub len: u64,
    _hold: ViewHold,
}

impl MappedView {
    /// A view of `[host_addr, host_addr+len)`, holding the entry `hold` belongs to.
    pub fn new(hold: &ViewHold, host_addr: u64, len: u64, device_addr: u64) -> MappedView {
        MappedView { device_addr, host_addr, len, _hold: hold.clone() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hold_counts_its_live_views() {
        let hold = ViewHold::default();
        assert!(!hold.viewed());
        let first = MappedView::new(&hold, 0x1000, 64, 0x1000);
        let second = MappedView::new(&hold, 0x1040, 64, 0x1040);
        assert_eq!(hold.live_views(), 2);
        drop(first);
        assert!(hold.viewed());
        drop(second);
        assert_eq!(hold.live_views(), 0);
    }
}
