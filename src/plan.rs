//! Which byte ranges to register. Pure and deterministic: host ranges, what is already pinned
//! and the room in the budget in; regions to register and everything left out (with reasons) out.
//!
//! Rules, each from a measured fact (FACTS sections 1 and 4):
//! - never overlap a live registration, ours or another's: the driver answers 712;
//! - merge ranges of one owner that touch or overlap (one call per region: ~0.2 ms a call);
//! - split regions above `max_region_bytes` (one registration of >= 512 GiB fails on r580);
//! - highest priority first; a region that does not fit is cut to the room left (at a page).

use std::collections::BTreeMap;

use serde::Serialize;

use crate::memmap::MemoryKind;

pub const PAGE: u64 = 4096;

/// One piece of host memory a caller wants pinned (one tensor storage, typically).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostRange {
    pub addr: u64,
    pub len: u64,
    pub owner: u64,
    pub priority: i32,
    pub kind: MemoryKind,
}

/// A byte range already pinned: by us (`owner` is Some) or by someone else (None).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pinned {
    pub addr: u64,
    pub len: u64,
    pub owner: Option<u64>,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rules {
    pub room_bytes: u64,
    pub max_region_bytes: u64,
    /// Merged regions smaller than this are not worth a registration call.
    pub min_region_bytes: u64,
    /// Whether the backend may take read-only memory (the OS lock may; CUDA must not).
    pub read_only_ok: bool,
}

impl Rules {
    pub fn with_room(room_bytes: u64) -> Rules {
        Rules { room_bytes, max_region_bytes: 32 << 30, min_region_bytes: 64 << 10, read_only_ok: true }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Region {
    pub addr: u64,
    pub len: u64,
    pub owner: u64,
    pub priority: i32,
    pub kind: MemoryKind,
    /// Indices of the input ranges this region lies in (whose memory it must keep alive).
    pub sources: Vec<usize>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SkipReason {
    OverBudget,
    NotHostMemory,
    ReadOnlyFileMapping,
    PinnedByOther,
    PinnedForAnotherModel,
    TooSmall,
}

impl SkipReason {
    pub fn describe(self) -> &'static str {
        match self {
            SkipReason::OverBudget => "over budget",
            SkipReason::NotHostMemory => "not host memory (unmapped or a device mapping)",
            SkipReason::ReadOnlyFileMapping => "read-only file mapping (CUDA must not register it)",
            SkipReason::PinnedByOther => "already pinned by someone else (ComfyUI)",
            SkipReason::PinnedForAnotherModel => "already pinned by Viking for another model",
            SkipReason::TooSmall => "too small to be worth a registration",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Skipped {
    pub addr: u64,
    pub len: u64,
    pub owner: u64,
    pub reason: SkipReason,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Plan {
    pub regions: Vec<Region>,
    pub skipped: Vec<Skipped>,
    /// Bytes of the input already pinned by us for the same owner: nothing to do.
    pub already_pinned_bytes: u64,
    pub planned_bytes: u64,
}

/// A piece of an input range after subtraction, before merging.
#[derive(Debug, Clone, Copy)]
struct Piece {
    addr: u64,
    end: u64,
    source: usize,
}

/// `[addr, end)` minus the sorted, non-overlapping `pinned` intervals. Calls `covered` for each
/// removed part and returns the parts left.
fn subtract(addr: u64, end: u64, pinned: &[Pinned], mut covered: impl FnMut(u64, u64, &Pinned)) -> Vec<(u64, u64)> {
    let mut left = Vec::new();
    let mut cursor = addr;
    let first = pinned.partition_point(|p| p.addr + p.len <= addr);
    for p in &pinned[first..] {
        if p.addr >= end {
            break;
        }
        let (p_start, p_end) = (p.addr.max(cursor), (p.addr + p.len).min(end));
        if p_start > cursor {
            left.push((cursor, p_start));
        }
        if p_end > p_start {
            covered(p_start, p_end, p);
        }
        cursor = cursor.max(p_end);
    }
    if cursor < end {
        left.push((cursor, end));
    }
    left
}

/// Plans the registrations. `ranges` must be valid (len > 0, no wrap; `python.rs` checks).
/// `pinned` may come in any order; its intervals must not overlap each other.
pub fn plan(ranges: &[HostRange], pinned: &[Pinned], rules: &Rules) -> Plan {
    let mut out = Plan::default();
    let mut pinned = pinned.to_vec();
    pinned.sort_by_key(|p| p.addr);

    // 1. Drop what cannot be pinned; subtract what already is.
    let mut pieces: Vec<Piece> = Vec::with_capacity(ranges.len());
    for (source, range) in ranges.iter().enumerate() {
        let skip = |reason| Skipped { addr: range.addr, len: range.len, owner: range.owner, reason };
        if !range.kind.is_host_memory() {
            out.skipped.push(skip(SkipReason::NotHostMemory));
            continue;
        }
        if range.kind == MemoryKind::ReadOnly && !rules.read_only_ok {
            out.skipped.push(skip(SkipReason::ReadOnlyFileMapping));
            continue;
        }
        let end = range.addr + range.len;
        let mut covered_parts = Vec::new();
        let left = subtract(range.addr, end, &pinned, |start, stop, p| covered_parts.push((start, stop, p.owner)));
        for (start, stop, pinned_owner) in covered_parts {
            match pinned_owner {
                Some(owner) if owner == range.owner => out.already_pinned_bytes += stop - start,
                Some(_) => out.skipped.push(Skipped { addr: start, len: stop - start, owner: range.owner, reason: SkipReason::PinnedForAnotherModel }),
                None => out.skipped.push(Skipped { addr: start, len: stop - start, owner: range.owner, reason: SkipReason::PinnedByOther }),
            }
        }
        pieces.extend(left.into_iter().map(|(addr, end)| Piece { addr, end, source }));
    }

    // 2. Merge pieces of one owner, priority and kind that touch or overlap.
    let key = |p: &Piece| {
        let r = &ranges[p.source];
        (r.owner, std::cmp::Reverse(r.priority), r.kind)
    };
    pieces.sort_by_key(|p| (key(p), p.addr, p.end, p.source));
    let mut merged: Vec<Region> = Vec::new();
    for piece in &pieces {
        let range = &ranges[piece.source];
        if let Some(last) = merged.last_mut() {
            let same_group = (last.owner, std::cmp::Reverse(last.priority), last.kind) == key(piece);
            if same_group && piece.addr <= last.addr + last.len {
                last.len = last.len.max(piece.end - last.addr);
                if last.sources.last() != Some(&piece.source) {
                    last.sources.push(piece.source);
                }
                continue;
            }
        }
        merged.push(Region { addr: piece.addr, len: piece.end - piece.addr, owner: range.owner, priority: range.priority, kind: range.kind, sources: vec![piece.source] });
    }
    // Pieces of different owners may still overlap (two models sharing a tensor): the first
    // owner in order keeps the bytes, the later one is told.
    merged.sort_by_key(|r| (std::cmp::Reverse(r.priority), r.addr, r.owner));
    let mut claimed: BTreeMap<u64, u64> = BTreeMap::new(); // start -> end, disjoint
    let mut deduped = Vec::with_capacity(merged.len());
    for region in merged {
        let end = region.addr + region.len;
        let mut cursor = region.addr;
        let mut left = Vec::new();
        let first = claimed.range(..=region.addr).next_back().map_or(region.addr, |(&start, _)| start);
        for (&start, &stop) in claimed.range(first..end) {
            if stop <= cursor {
                continue;
            }
            if start > cursor {
                left.push((cursor, start));
            }
            let taken_end = stop.min(end);
            let taken_start = start.max(cursor);
            out.skipped.push(Skipped { addr: taken_start, len: taken_end - taken_start, owner: region.owner, reason: SkipReason::PinnedForAnotherModel });
            cursor = taken_end;
        }
        if cursor < end {
            left.push((cursor, end));
        }
        for (start, stop) in left {
            claimed.insert(start, stop);
            let sources = region.sources.iter().copied().filter(|&s| ranges[s].addr < stop && start < ranges[s].addr + ranges[s].len).collect();
            deduped.push(Region { addr: start, len: stop - start, sources, ..region.clone() });
        }
    }

    // 3. Fill the budget, highest priority first; split what is too large for one call.
    let mut room = rules.room_bytes;
    for region in deduped {
        if region.len < rules.min_region_bytes {
            out.skipped.push(Skipped { addr: region.addr, len: region.len, owner: region.owner, reason: SkipReason::TooSmall });
            continue;
        }
        let mut take = region.len.min(room);
        if take < region.len {
            // Cut at a page boundary so the remainder is a clean region for later.
            let cut_end = (region.addr + take) / PAGE * PAGE;
            take = cut_end.saturating_sub(region.addr);
            if take < rules.min_region_bytes {
                take = 0;
            }
            let rest = region.len - take;
            out.skipped.push(Skipped { addr: region.addr + take, len: rest, owner: region.owner, reason: SkipReason::OverBudget });
        }
        room -= take;
        let mut offset = 0;
        while offset < take {
            let len = (take - offset).min(rules.max_region_bytes);
            let (addr, end) = (region.addr + offset, region.addr + offset + len);
            let sources = region.sources.iter().copied().filter(|&s| ranges[s].addr < end && addr < ranges[s].addr + ranges[s].len).collect();
            out.regions.push(Region { addr, len, sources, ..region.clone() });
            out.planned_bytes += len;
            offset += len;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const MIB: u64 = 1 << 20;

    fn range(addr: u64, len: u64, owner: u64, priority: i32) -> HostRange {
        HostRange { addr, len, owner, priority, kind: MemoryKind::Anonymous }
    }

    fn rules(room: u64) -> Rules {
        Rules { room_bytes: room, max_region_bytes: 64 * MIB, min_region_bytes: 64 << 10, read_only_ok: false }
    }

    #[test]
    fn adjacent_and_overlapping_ranges_of_one_owner_merge() {
        let base = 0x7f00_0000_0000;
        let input = [range(base, MIB, 1, 0), range(base + MIB, MIB, 1, 0), range(base + MIB / 2, MIB, 1, 0)];
        let plan = plan(&input, &[], &rules(u64::MAX));
        assert_eq!(plan.regions.len(), 1);
        assert_eq!((plan.regions[0].addr, plan.regions[0].len), (base, 2 * MIB));
        assert_eq!(plan.regions[0].sources, vec![0, 2, 1]);
        assert!(plan.skipped.is_empty());
    }

    #[test]
    fn different_owners_do_not_merge_and_shared_bytes_go_to_one() {
        let base = 0x1000_0000;
        let input = [range(base, 2 * MIB, 1, 0), range(base + MIB, 2 * MIB, 2, 0)];
        let plan = plan(&input, &[], &rules(u64::MAX));
        assert_eq!(plan.regions.len(), 2);
        assert_eq!(plan.planned_bytes, 3 * MIB);
        assert_eq!(plan.skipped, vec![Skipped { addr: base + MIB, len: MIB, owner: 2, reason: SkipReason::PinnedForAnotherModel }]);
    }

    #[test]
    fn live_registrations_are_subtracted() {
        let base = 0x1000_0000;
        let pinned = [
            Pinned { addr: base, len: MIB, owner: Some(1) },
            Pinned { addr: base + 2 * MIB, len: MIB, owner: None },
            Pinned { addr: base + 4 * MIB, len: MIB, owner: Some(9) },
        ];
        let plan = plan(&[range(base, 6 * MIB, 1, 0)], &pinned, &rules(u64::MAX));
        assert_eq!(plan.already_pinned_bytes, MIB);
        let regions: Vec<_> = plan.regions.iter().map(|r| (r.addr - base, r.len)).collect();
        assert_eq!(regions, vec![(MIB, MIB), (3 * MIB, MIB), (5 * MIB, MIB)]);
        let reasons: Vec<_> = plan.skipped.iter().map(|s| s.reason).collect();
        assert_eq!(reasons, vec![SkipReason::PinnedByOther, SkipReason::PinnedForAnotherModel]);
    }

    #[test]
    fn priority_decides_who_fits() {
        let input = [range(0x1000_0000, 8 * MIB, 1, 0), range(0x2000_0000, 8 * MIB, 2, 5)];
        let plan = plan(&input, &[], &rules(10 * MIB));
        assert_eq!(plan.regions[0].owner, 2);
        assert_eq!(plan.regions[0].len, 8 * MIB);
        assert_eq!(plan.regions[1].len, 2 * MIB); // cut to the room left
        assert_eq!(plan.planned_bytes, 10 * MIB);
        assert_eq!(plan.skipped, vec![Skipped { addr: 0x1000_0000 + 2 * MIB, len: 6 * MIB, owner: 1, reason: SkipReason::OverBudget }]);
    }

    #[test]
    fn large_regions_split_and_small_ones_skip() {
        let input = [range(0x1000_0000, 150 * MIB, 1, 0), range(0x9000_0000, 4096, 1, 0)];
        let plan = plan(&input, &[], &rules(u64::MAX));
        let lens: Vec<_> = plan.regions.iter().map(|r| r.len / MIB).collect();
        assert_eq!(lens, vec![64, 64, 22]);
        assert_eq!(plan.skipped[0].reason, SkipReason::TooSmall);
    }

    #[test]
    fn read_only_and_unmapped_are_refused() {
        let mut ro = range(0x1000_0000, MIB, 1, 0);
        ro.kind = MemoryKind::ReadOnly;
        let mut dev = range(0x2000_0000, MIB, 1, 0);
        dev.kind = MemoryKind::Special;
        let plan_cuda = plan(&[ro, dev], &[], &rules(u64::MAX));
        assert!(plan_cuda.regions.is_empty());
        let reasons: Vec<_> = plan_cuda.skipped.iter().map(|s| s.reason).collect();
        assert_eq!(reasons, vec![SkipReason::ReadOnlyFileMapping, SkipReason::NotHostMemory]);
        let plan_lock = plan(&[ro], &[], &Rules { read_only_ok: true, ..rules(u64::MAX) });
        assert_eq!(plan_lock.planned_bytes, MIB);
    }

    fn arb_input() -> impl Strategy<Value = (Vec<HostRange>, Vec<Pinned>, u64)> {
        let ranges = proptest::collection::vec((0u64..4096, 1u64..512, 0u64..4, -2i32..3), 0..40).prop_map(|v| {
            v.into_iter().map(|(page, pages, owner, priority)| range(0x1000_0000 + page * 4096 + owner * 64, pages * 4096 - owner * 8, owner, priority)).collect::<Vec<_>>()
        });
        // Non-overlapping live registrations: disjoint slots of 1 MiB.
        let pinned = proptest::collection::btree_map(0u64..20, (1u64..256, proptest::option::of(0u64..4)), 0..6).prop_map(|m| {
            m.into_iter().map(|(slot, (pages, owner))| Pinned { addr: 0x1000_0000 + slot * (1 << 20), len: pages * 4096, owner }).collect::<Vec<_>>()
        });
        (ranges, pinned, 0u64..(64 << 20))
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(crate::fuzz_cases()))]
        #[test]
        fn plan_invariants((ranges, pinned, room) in arb_input()) {
            let rules = Rules { room_bytes: room, max_region_bytes: 1 << 20, min_region_bytes: 8192, read_only_ok: false };
            let plan = plan(&ranges, &pinned, &rules);
            // Total within budget, and adds up.
            prop_assert!(plan.planned_bytes <= room);
            prop_assert_eq!(plan.planned_bytes, plan.regions.iter().map(|r| r.len).sum::<u64>());
            let mut sorted: Vec<_> = plan.regions.iter().collect();
            sorted.sort_by_key(|r| r.addr);
            for pair in sorted.windows(2) {
                // No two regions overlap.
                prop_assert!(pair[0].addr + pair[0].len <= pair[1].addr);
            }
            for region in &plan.regions {
                prop_assert!(region.len > 0 && region.len <= rules.max_region_bytes);
                // Its sources are the owner's ranges that it touches.
                prop_assert!(!region.sources.is_empty());
                for &s in &region.sources {
                    prop_assert_eq!(ranges[s].owner, region.owner);
                    let r = &ranges[s];
                    prop_assert!(r.addr < region.addr + region.len && region.addr < r.addr + r.len);
                }
                // Every byte of it lies in some input range of the owner.
                let mut cursor = region.addr;
                let mut owned: Vec<_> = ranges.iter().filter(|r| r.owner == region.owner).collect();
                owned.sort_by_key(|r| r.addr);
                for r in owned { if r.addr <= cursor && cursor < r.addr + r.len { cursor = r.addr + r.len; } }
                prop_assert!(cursor >= region.addr + region.len);
                // Never over a live registration.
                for p in &pinned { prop_assert!(p.addr + p.len <= region.addr || region.addr + region.len <= p.addr); }
            }
            // Deterministic.
            prop_assert_eq!(&plan, &super::plan(&ranges, &pinned, &rules));
        }
    }
}
