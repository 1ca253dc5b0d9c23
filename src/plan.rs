//! Which byte ranges to register. Pure and deterministic: host ranges (one per tensor storage),
//! what is already pinned and the room in the budget in; regions to register and everything
//! left out (with reasons) out.
//!
//! Rules, each from a measured fact:
//! - a storage is registered whole, inside one region, or not at all: on an H200 a copy to the
//!   GPU from a storage whose first bytes are registered but not all of it fails with "invalid
//!   argument", and so does one spanning two adjacent registrations
//!   (bench/results/gpu_probe_partial_registration.json); a storage whose start is not
//!   registered copies as pageable memory. So the budget cuts at storage boundaries, large
//!   regions split at storage boundaries, and a storage pinned in part by someone else is left;
//! - never overlap a live registration, ours or another's: the CUDA driver answers 712
//!   (CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED);
//! - merge ranges of one owner that touch or overlap (each registration call costs ~0.2 ms:
//!   4096 registrations of 1 MiB ran at 5.2 GB/s against 25 GB/s for one large one);
//! - split regions above `max_region_bytes` (one registration of 512 GiB or more fails on
//!   driver r580); a single storage above `MAX_ONE_REGISTRATION` is left out;
//! - read-only memory (a checkpoint's file pages, which only the OS lock takes: a lock call
//!   costs microseconds, not CUDA's ~0.2 ms) goes in regions of at most
//!   `max_read_only_region_bytes` with no minimum: a change to one weight's range releases and
//!   locks again one small region, not the whole file (one 2 GiB region cost 26-40 ms at each
//!   such change on this dev machine, `bench/probes/event_cost.py`), and no small range is left
//!   out for its size (the model would never look completely pinned);
//! - highest priority first.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::memmap::MemoryKind;
use crate::spans;

/// The largest single storage Viking registers (well below the 512 GiB that fails on r580).
pub const MAX_ONE_REGISTRATION: u64 = 256 << 30;

/// One piece of host memory a caller wants pinned (one tensor storage, typically).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostRange {
    pub addr: u64,
    pub len: u64,
    pub owner: u64,
    pub priority: i32,
    pub kind: MemoryKind,
}

impl HostRange {
    fn end(&self) -> u64 {
        self.addr + self.len
    }
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
    /// Regions above this are split (at storage boundaries).
    pub max_region_bytes: u64,
    /// Merged regions smaller than this are not worth a registration call.
    pub min_region_bytes: u64,
    /// Whether the backend may take read-only memory (the OS lock may; CUDA must not).
    pub read_only_ok: bool,
    /// Regions of read-only memory above this are split (at storage boundaries).
    pub max_read_only_region_bytes: u64,
    /// What more the OS lets this process lock (RLIMIT_MEMLOCK less what is locked now);
    /// u64::MAX where nothing limits it (CAP_IPC_LOCK, an unlimited ulimit, Windows).
    pub lock_room_bytes: u64,
    /// Every region goes to the OS lock (its backend is the OS lock); otherwise only read-only
    /// memory does (CUDA takes the rest, which the lock limit does not count).
    pub lock_all_kinds: bool,
}

impl Rules {
    pub fn with_room(room_bytes: u64) -> Rules {
        Rules {
            room_bytes,
            max_region_bytes: 32 << 30,
            min_region_bytes: 64 << 10,
            read_only_ok: true,
            max_read_only_region_bytes: 64 << 20,
            lock_room_bytes: u64::MAX,
            lock_all_kinds: true,
        }
    }

    /// Whether regions of this kind are OS-locked (and count against the lock limit).
    fn locked(&self, kind: MemoryKind) -> bool {
        self.lock_all_kinds || kind == MemoryKind::ReadOnly
    }

    /// (smallest, largest) region of memory of this kind.
    fn region_bounds(&self, kind: MemoryKind) -> (u64, u64) {
        match kind {
            MemoryKind::ReadOnly => (0, self.max_region_bytes.min(self.max_read_only_region_bytes)),
            _ => (self.min_region_bytes, self.max_region_bytes),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Region {
    pub addr: u64,
    pub len: u64,
    pub owner: u64,
    pub priority: i32,
    pub kind: MemoryKind,
    /// Indices of the input ranges this region holds (whose memory it must keep alive). Each
    /// lies wholly inside the region.
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
    PartlyPinnedElsewhere,
    TooSmall,
    TooLarge,
    LockLimit,
}

impl SkipReason {
    pub fn name(self) -> &'static str {
        match self {
            SkipReason::OverBudget => "over_budget",
            SkipReason::NotHostMemory => "not_host_memory",
            SkipReason::ReadOnlyFileMapping => "read_only_file_mapping",
            SkipReason::PinnedByOther => "pinned_by_other",
            SkipReason::PinnedForAnotherModel => "pinned_for_another_model",
            SkipReason::PartlyPinnedElsewhere => "partly_pinned_elsewhere",
            SkipReason::TooSmall => "too_small",
            SkipReason::TooLarge => "too_large",
            SkipReason::LockLimit => "lock_limit",
        }
    }

    pub fn describe(self) -> &'static str {
        match self {
            SkipReason::OverBudget => "over budget",
            SkipReason::NotHostMemory => "not host memory (unmapped or a device mapping)",
            SkipReason::ReadOnlyFileMapping => "read-only file mapping (CUDA must not register it)",
            SkipReason::PinnedByOther => "already pinned by someone else (ComfyUI)",
            SkipReason::PinnedForAnotherModel => "already pinned by Viking for another model",
            SkipReason::PartlyPinnedElsewhere => {
                "the rest of a storage pinned in part elsewhere (a copy from a storage registered in part fails)"
            }
            SkipReason::TooSmall => "too small to be worth a registration",
            SkipReason::TooLarge => "a single storage too large for one registration",
            SkipReason::LockLimit => {
                "over the locked-memory limit (ulimit -l): raise it (docker run --ulimit memlock=-1, systemd \
                 LimitMEMLOCK=infinity) or give the container CAP_IPC_LOCK"
            }
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

/// Skipped bytes of one reason, for the report and the status.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SkipSummary {
    pub reason: String,
    pub description: String,
    pub bytes: u64,
    pub count: usize,
}

impl SkipSummary {
    pub fn new(reason: &str, description: &str, bytes: u64, count: usize) -> SkipSummary {
        SkipSummary { reason: reason.into(), description: description.into(), bytes, count }
    }
}

/// Groups skipped ranges by reason, in a fixed order.
pub fn summarize_skips(skipped: &[Skipped]) -> Vec<SkipSummary> {
    let mut by_reason: BTreeMap<SkipReason, (u64, usize)> = BTreeMap::new();
    for skip in skipped {
        let slot = by_reason.entry(skip.reason).or_default();
        slot.0 += skip.len;
        slot.1 += 1;
    }
    by_reason.into_iter().map(|(reason, (bytes, count))| SkipSummary::new(reason.name(), reason.describe(), bytes, count)).collect()
}

/// Ranges of one owner, priority and kind that touch or overlap, merged: a candidate region.
/// `cuts` are the addresses inside it that no source straddles (where it may be cut).
struct Run {
    addr: u64,
    end: u64,
    owner: u64,
    priority: i32,
    kind: MemoryKind,
    sources: Vec<usize>,
    cuts: Vec<u64>,
}

impl Run {
    /// The furthest place this run may end at, at most `limit` bytes from `from` (a cut or the
    /// end), or None. `cuts` are sorted: a binary search.
    fn boundary_within(&self, from: u64, limit: u64) -> Option<u64> {
        let reach = from.saturating_add(limit);
        if self.end <= reach {
            return (self.end > from).then_some(self.end);
        }
        let below = self.cuts.partition_point(|&c| c <= reach);
        below.checked_sub(1).map(|i| self.cuts[i]).filter(|&c| c > from)
    }

    /// Where the registration that starts at `start` ends, when what is taken of this run ends
    /// at `take_end`: the furthest cut at most `max_region` on, else the nearest one beyond.
    /// No piece may be shorter than `min_region`, neither this one nor what it leaves; a tail
    /// that would be joins this registration. `take_end - start` is at least `min_region`.
    fn split_point(&self, start: u64, take_end: u64, min_region: u64, max_region: u64) -> u64 {
        if take_end - start <= max_region {
            return take_end;
        }
        // Cuts that leave this piece and the rest each at least min_region long.
        let (lowest, highest) = (start.saturating_add(min_region.max(1)), take_end.saturating_sub(min_region));
        let first = self.cuts.partition_point(|&c| c < lowest);
        let last = self.cuts.partition_point(|&c| c <= highest);
        let usable = self.cuts.get(first..last).unwrap_or(&[]);
        let reach = start.saturating_add(max_region);
        match usable.partition_point(|&c| c <= reach) {
            0 => usable.first().copied().unwrap_or(take_end),
            within => usable[within - 1],
        }
    }
}

/// Plans the registrations. `ranges` must be valid (len > 0, no wrap; the engine checks).
/// `pinned` may come in any order; its intervals must not overlap each other.
pub fn plan(ranges: &[HostRange], pinned: &[Pinned], rules: &Rules) -> Plan {
    let mut out = Plan::default();
    let accepted = pinnable(ranges, pinned, rules, &mut out);
    let runs = merge_runs(ranges, &accepted);
    fill(ranges, runs, rules, &mut out);
    out
}

/// Step 1: the indices of the ranges that may be pinned: host memory the backend takes, not
/// pinned at all yet, and not claimed by an owner planned before. Everything else goes to
/// `out` (already pinned for this owner, or skipped with its reason). Ranges of one group that
/// overlap are decided together: no registration can end inside an overlap.
fn pinnable(ranges: &[HostRange], pinned: &[Pinned], rules: &Rules, out: &mut Plan) -> Vec<usize> {
    let mut pinned = pinned.to_vec();
    pinned.sort_by_key(|p| p.addr);
    let mut candidates = Vec::new();
    for (index, range) in ranges.iter().enumerate() {
        let reason = if !range.kind.is_host_memory() {
            Some(SkipReason::NotHostMemory)
        } else if range.kind == MemoryKind::ReadOnly && !rules.read_only_ok {
            Some(SkipReason::ReadOnlyFileMapping)
        } else if range.len > MAX_ONE_REGISTRATION {
            Some(SkipReason::TooLarge)
        } else {
            None
        };
        match reason {
            Some(reason) => out.skipped.push(Skipped { addr: range.addr, len: range.len, owner: range.owner, reason }),
            None => candidates.push(index),
        }
    }
    // Memory wanted by two groups (two owners; or one owner's ranges of two priorities or
    // kinds, which cannot merge): the first cluster in order keeps it (the higher priority),
    // the later one is told. Claimed spans by start: (end, group).
    let mut claimed: BTreeMap<u64, (u64, Group)> = BTreeMap::new();
    let mut accepted = Vec::new();
    for cluster in clusters(ranges, candidates) {
        let first = pinned.partition_point(|p| p.addr + p.len <= cluster.addr);
        let over: Vec<&Pinned> = pinned[first..].iter().take_while(|p| p.addr < cluster.end).collect();
        // Claimed spans are disjoint (an overlapping one is never claimed): walk back from the
        // last one that starts before the cluster's end while they still reach into it.
        let others: Vec<(u64, u64, u64)> = claimed
            .range(..cluster.end)
            .rev()
            .take_while(|(_, &(end, _))| end > cluster.addr)
            .filter(|(_, &(_, group))| group != cluster.group)
            .map(|(&start, &(end, group))| (start, end, group.0))
            .collect();
        if over.is_empty() && others.is_empty() {
            claimed.insert(cluster.addr, (cluster.end, cluster.group));
            accepted.extend(cluster.members);
            continue;
        }
        // Pinned in part: what the pins hold is accounted for, the rest is left out (a storage
        // registered in part cannot be copied from).
        let owner = cluster.group.0;
        let mut skip = |addr: u64, end: u64, reason| out.skipped.push(Skipped { addr, len: end - addr, owner, reason });
        let mut held: Vec<(u64, u64)> = Vec::new();
        for p in &over {
            let (start, end) = (p.addr.max(cluster.addr), (p.addr + p.len).min(cluster.end));
            held.push((start, end));
            match p.owner {
                Some(other) if other == owner => {} // already pinned: counted below
                Some(_) => skip(start, end, SkipReason::PinnedForAnotherModel),
                None => skip(start, end, SkipReason::PinnedByOther),
            }
        }
        for (start, end, other) in others {
            if other != owner {
                let (start, end) = (start.max(cluster.addr), end.min(cluster.end));
                held.push((start, end));
                skip(start, end, SkipReason::PinnedForAnotherModel);
            }
        }
        for (start, end) in spans::subtract(&[(cluster.addr, cluster.end)], &held) {
            skip(start, end, SkipReason::PartlyPinnedElsewhere);
        }
        out.already_pinned_bytes += over
            .iter()
            .filter(|p| p.owner == Some(owner))
            .map(|p| (p.addr + p.len).min(cluster.end) - p.addr.max(cluster.addr))
            .sum::<u64>();
    }
    accepted
}

/// Owner, priority and kind: ranges that may share one registration.
type Group = (u64, i32, MemoryKind);

/// Ranges of one group whose bytes overlap (not merely touch), decided together.
struct Cluster {
    addr: u64,
    end: u64,
    group: Group,
    members: Vec<usize>,
}

/// The clusters of `candidates`, highest priority first, then by address.
fn clusters(ranges: &[HostRange], mut candidates: Vec<usize>) -> Vec<Cluster> {
    let group = |i: usize| (ranges[i].owner, ranges[i].priority, ranges[i].kind);
    candidates.sort_by_key(|&i| (group(i), ranges[i].addr, i));
    let mut out: Vec<Cluster> = Vec::new();
    for index in candidates {
        let range = &ranges[index];
        match out.last_mut() {
            Some(cluster) if cluster.group == group(index) && range.addr < cluster.end => {
                cluster.end = cluster.end.max(range.end());
                cluster.members.push(index);
            }
            _ => out.push(Cluster { addr: range.addr, end: range.end(), group: group(index), members: vec![index] }),
        }
    }
    out.sort_by_key(|c| (std::cmp::Reverse(c.group.1), c.addr, c.group.0));
    out
}

/// Step 2: accepted ranges of one owner, priority and kind that touch or overlap become one
/// run, highest priority first.
fn merge_runs(ranges: &[HostRange], accepted: &[usize]) -> Vec<Run> {
    let key = |i: usize| (ranges[i].owner, std::cmp::Reverse(ranges[i].priority), ranges[i].kind);
    let mut sorted = accepted.to_vec();
    sorted.sort_by_key(|&i| (key(i), ranges[i].addr, ranges[i].end(), i));
    let mut runs: Vec<Run> = Vec::new();
    for index in sorted {
        let range = &ranges[index];
        if let Some(run) = runs.last_mut() {
            if (run.owner, std::cmp::Reverse(run.priority), run.kind) == key(index) && range.addr <= run.end {
                // Sorted by start, so no later range can straddle a cut made here.
                if range.addr == run.end {
                    run.cuts.push(run.end);
                }
                run.end = run.end.max(range.end());
                run.sources.push(index);
                continue;
            }
        }
        runs.push(Run { addr: range.addr, end: range.end(), owner: range.owner, priority: range.priority, kind: range.kind, sources: vec![index], cuts: Vec::new() });
    }
    runs.sort_by_key(|r| (std::cmp::Reverse(r.priority), r.addr, r.owner));
    runs
}

/// Step 3: fills the budget run by run, cutting only where no storage straddles, and splits
/// what is taken into registrations of at most the largest region of its kind (a single larger
/// storage gets a registration of its own).
fn fill(ranges: &[HostRange], runs: Vec<Run>, rules: &Rules, out: &mut Plan) {
    let mut room = rules.room_bytes;
    let mut lock_room = rules.lock_room_bytes;
    for run in runs {
        let skip = |out: &mut Plan, addr: u64, end: u64, reason| out.skipped.push(Skipped { addr, len: end - addr, owner: run.owner, reason });
        let (min_region, max_region) = rules.region_bounds(run.kind);
        if run.end - run.addr < min_region {
            skip(out, run.addr, run.end, SkipReason::TooSmall);
            continue;
        }
        // An OS-locked run is bounded by the lock limit too; the smaller bound names the skip.
        let locked = rules.locked(run.kind);
        let lock_reach = lock_room.saturating_sub(LOCK_SLACK_BYTES);
        let (reach, bound) = if locked && lock_reach < room { (lock_reach, SkipReason::LockLimit) } else { (room, SkipReason::OverBudget) };
        let take_end = run.boundary_within(run.addr, reach).filter(|&end| end - run.addr >= min_region.max(1));
        let Some(take_end) = take_end else {
            skip(out, run.addr, run.end, bound);
            continue;
        };
        if take_end < run.end {
            skip(out, take_end, run.end, bound);
        }
        room -= take_end - run.addr;
        let regions_before = out.regions.len();
        // Sources are in address order: each region takes the next ones that end inside it.
        let mut next_source = 0;
        let mut start = run.addr;
        while start < take_end {
            let stop = run.split_point(start, take_end, min_region, max_region);
            let mut sources = Vec::new();
            while next_source < run.sources.len() && ranges[run.sources[next_source]].end() <= stop {
                sources.push(run.sources[next_source]);
                next_source += 1;
            }
            out.regions.push(Region { addr: start, len: stop - start, owner: run.owner, priority: run.priority, kind: run.kind, sources });
            out.planned_bytes += stop - start;
            start = stop;
        }
        if locked {
            let regions = (out.regions.len() - regions_before) as u64;
            lock_room = lock_room.saturating_sub(take_end - run.addr + regions * LOCK_SLACK_BYTES);
        }
    }
}

/// What one locked region may cost beyond its bytes: the OS locks whole pages, and a region's
/// first and last page may hold memory outside it (two pages of the largest common size).
const LOCK_SLACK_BYTES: u64 = 2 * 4096;

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const MIB: u64 = 1 << 20;

    fn range(addr: u64, len: u64, owner: u64, priority: i32) -> HostRange {
        HostRange { addr, len, owner, priority, kind: MemoryKind::Anonymous }
    }

    fn rules(room: u64) -> Rules {
        Rules { room_bytes: room, max_region_bytes: 64 * MIB, min_region_bytes: 64 << 10, read_only_ok: false, max_read_only_region_bytes: 4 * MIB, lock_room_bytes: u64::MAX, lock_all_kinds: true }
    }

    /// Found by the fuzz run: splitting a run at its largest region left a 4 KiB tail, one
    /// registration smaller than the smallest allowed. A short tail joins the piece before it.
    #[test]
    fn a_short_tail_joins_the_region_before_it() {
        let rules = Rules { room_bytes: 1_404_928, max_region_bytes: 1 << 20, min_region_bytes: 8192, read_only_ok: false, max_read_only_region_bytes: 1 << 18, lock_room_bytes: u64::MAX, lock_all_kinds: true };
        let ranges = [range(0x1000_0000, 1_400_832, 0, 0), range(0x1000_0000 + 1_400_832, 4096, 0, 0)];
        let plan = plan(&ranges, &[], &rules);
        assert_eq!(plan.regions.len(), 1);
        assert_eq!((plan.regions[0].addr, plan.regions[0].len, plan.regions[0].sources.clone()), (0x1000_0000, 1_404_928, vec![0, 1]));
    }

    /// ... and a short storage before a large one is not cut off into a registration of its own.
    #[test]
    fn a_short_head_joins_the_region_after_it() {
        let rules = Rules { room_bytes: 64 * MIB, max_region_bytes: 1 << 20, min_region_bytes: 8192, read_only_ok: false, max_read_only_region_bytes: 1 << 18, lock_room_bytes: u64::MAX, lock_all_kinds: true };
        let ranges = [range(0x1000_0000, 4096, 0, 0), range(0x1000_1000, 2 << 20, 0, 0), range(0x1020_1000, 1 << 20, 0, 0)];
        let plan = plan(&ranges, &[], &rules);
        let pieces: Vec<(u64, u64)> = plan.regions.iter().map(|r| (r.addr, r.len)).collect();
        assert_eq!(pieces, vec![(0x1000_0000, 4096 + (2 << 20)), (0x1020_1000, 1 << 20)]);
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
    fn different_owners_do_not_merge_and_shared_memory_goes_to_one() {
        let base = 0x1000_0000;
        let input = [range(base, 2 * MIB, 1, 0), range(base + MIB, 2 * MIB, 2, 0)];
        let plan = plan(&input, &[], &rules(u64::MAX));
        // Owner 2's storage overlaps owner 1's: pinning the rest of it alone would leave a
        // storage registered in part, so none of it is pinned.
        assert_eq!(plan.regions.iter().map(|r| (r.owner, r.len)).collect::<Vec<_>>(), vec![(1, 2 * MIB)]);
        assert_eq!(
            plan.skipped,
            vec![
                Skipped { addr: base + MIB, len: MIB, owner: 2, reason: SkipReason::PinnedForAnotherModel },
                Skipped { addr: base + 2 * MIB, len: MIB, owner: 2, reason: SkipReason::PartlyPinnedElsewhere },
            ]
        );
    }

    #[test]
    fn live_registrations_are_subtracted_and_a_storage_pinned_in_part_is_left() {
        let base = 0x1000_0000;
        let pinned = [
            Pinned { addr: base, len: MIB, owner: Some(1) },
            Pinned { addr: base + 2 * MIB, len: MIB, owner: None },
            Pinned { addr: base + 4 * MIB + MIB / 2, len: MIB / 2, owner: None },
        ];
        let input = [range(base, MIB, 1, 0), range(base + MIB, MIB, 1, 0), range(base + 2 * MIB, MIB, 1, 0), range(base + 4 * MIB, MIB, 1, 0)];
        let plan = plan(&input, &pinned, &rules(u64::MAX));
        assert_eq!(plan.already_pinned_bytes, MIB);
        assert_eq!(plan.regions.iter().map(|r| (r.addr - base, r.len)).collect::<Vec<_>>(), vec![(MIB, MIB)]);
        let reasons: Vec<_> = plan.skipped.iter().map(|s| (s.addr - base, s.reason)).collect();
        assert_eq!(
            reasons,
            vec![(2 * MIB, SkipReason::PinnedByOther), (4 * MIB + MIB / 2, SkipReason::PinnedByOther), (4 * MIB, SkipReason::PartlyPinnedElsewhere)]
        );
    }

    #[test]
    fn the_budget_cuts_between_storages_never_inside_one() {
        // Three adjacent 3 MiB storages (one run) and 7 MiB of room: two fit, the third is left
        // whole (a cut inside it would leave a storage registered in part).
        let base = 0x1000_0000;
        let input = [range(base, 3 * MIB, 1, 0), range(base + 3 * MIB, 3 * MIB, 1, 0), range(base + 6 * MIB, 3 * MIB, 1, 0)];
        let plan = plan(&input, &[], &rules(7 * MIB));
        assert_eq!(plan.regions.iter().map(|r| (r.addr - base, r.len)).collect::<Vec<_>>(), vec![(0, 6 * MIB)]);
        assert_eq!(plan.skipped, vec![Skipped { addr: base + 6 * MIB, len: 3 * MIB, owner: 1, reason: SkipReason::OverBudget }]);
        // A smaller storage further on still fits in the room left.
        let with_small = [input[0], input[1], input[2], range(0x2000_0000, MIB, 1, 0)];
        assert_eq!(super::plan(&with_small, &[], &rules(7 * MIB)).planned_bytes, 7 * MIB);
    }

    #[test]
    fn priority_decides_who_fits() {
        let input = [range(0x1000_0000, 8 * MIB, 1, 0), range(0x2000_0000, 8 * MIB, 2, 5), range(0x3000_0000, 2 * MIB, 1, 0)];
        let plan = plan(&input, &[], &rules(10 * MIB));
        assert_eq!(plan.regions.iter().map(|r| (r.owner, r.len)).collect::<Vec<_>>(), vec![(2, 8 * MIB), (1, 2 * MIB)]);
        assert_eq!(plan.skipped, vec![Skipped { addr: 0x1000_0000, len: 8 * MIB, owner: 1, reason: SkipReason::OverBudget }]);
    }

    #[test]
    fn large_regions_split_between_storages_and_small_ones_skip() {
        // 150 MiB of 10 MiB storages split at 64 MiB boundaries that fall between storages.
        let mut input: Vec<HostRange> = (0..15).map(|i| range(0x1000_0000 + i * 10 * MIB, 10 * MIB, 1, 0)).collect();
        input.push(range(0x9000_0000, 4096, 1, 0));
        // One storage larger than a region: a registration of its own.
        input.push(range(0xA000_0000, 100 * MIB, 1, 0));
        let plan = plan(&input, &[], &rules(u64::MAX));
        let lens: Vec<_> = plan.regions.iter().map(|r| r.len / MIB).collect();
        assert_eq!(lens, vec![60, 60, 30, 100]);
        assert_eq!(plan.skipped[0].reason, SkipReason::TooSmall);
        for region in &plan.regions {
            for &s in &region.sources {
                assert!(input[s].addr >= region.addr && input[s].end() <= region.addr + region.len);
            }
        }
    }

    #[test]
    fn read_only_unmapped_and_too_large_are_refused() {
        let mut ro = range(0x1000_0000, MIB, 1, 0);
        ro.kind = MemoryKind::ReadOnly;
        let mut dev = range(0x2000_0000, MIB, 1, 0);
        dev.kind = MemoryKind::Special;
        let huge = range(0x1_0000_0000_0000, MAX_ONE_REGISTRATION + 4096, 1, 0);
        let plan_cuda = plan(&[ro, dev, huge], &[], &rules(u64::MAX));
        assert!(plan_cuda.regions.is_empty());
        let reasons: Vec<_> = plan_cuda.skipped.iter().map(|s| s.reason).collect();
        assert_eq!(reasons, vec![SkipReason::ReadOnlyFileMapping, SkipReason::NotHostMemory, SkipReason::TooLarge]);
        let plan_lock = plan(&[ro], &[], &Rules { read_only_ok: true, ..rules(u64::MAX) });
        assert_eq!(plan_lock.planned_bytes, MIB);
    }

    #[test]
    fn read_only_regions_are_small_and_have_no_minimum() {
        // A checkpoint's weights, adjacent in the file: 12 of 1 MiB become regions of at most
        // 4 MiB (these rules), not one of 12; a lone 4 KiB range is still locked.
        let mut input: Vec<HostRange> = (0..12).map(|i| range(0x1000_0000 + i * MIB, MIB, 1, 0)).collect();
        input.push(range(0x2000_0000, 4096, 1, 0));
        for r in &mut input {
            r.kind = MemoryKind::ReadOnly;
        }
        let rules = Rules { read_only_ok: true, ..rules(u64::MAX) };
        let plan = plan(&input, &[], &rules);
        assert_eq!(plan.regions.iter().map(|r| r.len).collect::<Vec<_>>(), vec![4 * MIB, 4 * MIB, 4 * MIB, 4096]);
        assert!(plan.skipped.is_empty());
        // One weight taken out (ComfyUI stages it): only the region that held it changes.
        let without_one: Vec<HostRange> = input.iter().enumerate().filter(|&(i, _)| i != 5).map(|(_, r)| *r).collect();
        let kept: Vec<Pinned> = [0, 2].iter().map(|&i| Pinned { addr: plan.regions[i].addr, len: plan.regions[i].len, owner: Some(1) }).collect();
        let replanned = super::plan(&without_one, &kept, &rules);
        assert_eq!(replanned.regions.iter().map(|r| (r.addr - 0x1000_0000, r.len)).collect::<Vec<_>>(),
                   vec![(4 * MIB, MIB), (6 * MIB, 2 * MIB), (0x1000_0000, 4096)]);
    }

    #[test]
    fn skip_summaries_group_by_reason() {
        let skipped = [
            Skipped { addr: 0, len: 10, owner: 1, reason: SkipReason::TooSmall },
            Skipped { addr: 20, len: 5, owner: 1, reason: SkipReason::OverBudget },
            Skipped { addr: 40, len: 7, owner: 1, reason: SkipReason::TooSmall },
        ];
        let summary = summarize_skips(&skipped);
        assert_eq!(summary, vec![SkipSummary::new("over_budget", "over budget", 5, 1), SkipSummary::new("too_small", "too small to be worth a registration", 17, 2)]);
    }

    fn arb_input() -> impl Strategy<Value = (Vec<HostRange>, Vec<Pinned>, u64)> {
        // Owner 3's ranges are read-only (a checkpoint's file pages in Viking's views).
        let ranges = proptest::collection::vec((0u64..4096, 1u64..512, 0u64..4, -2i32..3), 0..40).prop_map(|v| {
            v.into_iter()
                .map(|(page, pages, owner, priority)| {
                    let mut r = range(0x1000_0000 + page * 4096 + owner * 64, pages * 4096 - owner * 8, owner, priority);
                    if owner == 3 {
                        r.kind = MemoryKind::ReadOnly;
                    }
                    r
                })
                .collect::<Vec<_>>()
        });
        // Non-overlapping live registrations: disjoint slots of 1 MiB.
        let pinned = proptest::collection::btree_map(0u64..20, (1u64..256, proptest::option::of(0u64..4)), 0..6).prop_map(|m| {
            m.into_iter().map(|(slot, (pages, owner))| Pinned { addr: 0x1000_0000 + slot * (1 << 20), len: pages * 4096, owner }).collect::<Vec<_>>()
        });
        (ranges, pinned, 0u64..(64 << 20))
    }

    /// Disjoint, page-aligned storages of one owner and priority (as one model's weights are).
    fn arb_model() -> impl Strategy<Value = Vec<HostRange>> {
        proptest::collection::vec((0u64..3, 16u64..300), 1..30).prop_map(|v| {
            let mut addr = 0x4000_0000u64;
            v.into_iter()
                .map(|(gap_pages, pages)| {
                    addr += gap_pages * 4096;
                    let r = range(addr, pages * 4096, 7, 0);
                    addr += pages * 4096;
                    r
                })
                .collect()
        })
    }

    #[test]
    fn the_lock_limit_bounds_locked_memory_and_is_named() {
        // Three 1 MiB storages of anonymous memory and two of read-only file pages; 1.5 MiB of
        // lock room: one storage fits, the next would cross the limit.
        let mut input: Vec<HostRange> = (0..3).map(|i| range(i * MIB, MIB, 1, 0)).collect();
        for i in 0..2 {
            let mut ro = range(64 * MIB + i * MIB, MIB, 1, 0);
            ro.kind = MemoryKind::ReadOnly;
            input.push(ro);
        }
        let with_lock = |lock_all_kinds| Rules { read_only_ok: true, lock_room_bytes: 3 * MIB / 2, lock_all_kinds, ..rules(u64::MAX) };
        // The OS lock takes everything: 1 MiB planned, the rest skipped for the lock limit.
        let all = plan(&input, &[], &with_lock(true));
        assert_eq!(all.planned_bytes, MIB);
        assert!(all.skipped.iter().all(|s| s.reason == SkipReason::LockLimit), "{:?}", all.skipped);
        // CUDA takes the anonymous memory (not counted), the lock only the read-only pages.
        let cuda = plan(&input, &[], &with_lock(false));
        let locked: u64 = cuda.regions.iter().filter(|r| r.kind == MemoryKind::ReadOnly).map(|r| r.len).sum();
        assert_eq!((cuda.planned_bytes - locked, locked), (3 * MIB, MIB));
        // A budget smaller than the lock room names the budget.
        let budget = plan(&input, &[], &Rules { room_bytes: MIB / 2, ..with_lock(true) });
        assert!(budget.skipped.iter().all(|s| s.reason == SkipReason::OverBudget), "{:?}", budget.skipped);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(crate::fuzz_cases()))]
        #[test]
        fn plan_keeps_locked_bytes_within_the_lock_limit((ranges, pinned, room) in arb_input(), lock_room in 0u64..(1 << 22), lock_all_kinds in any::<bool>()) {
            let rules = Rules { lock_room_bytes: lock_room, lock_all_kinds, ..Rules::with_room(room) };
            let plan = plan(&ranges, &pinned, &rules);
            let locked: u64 = plan.regions.iter().filter(|r| rules.locked(r.kind)).map(|r| r.len).sum();
            prop_assert!(locked <= lock_room && plan.planned_bytes <= room);
        }

        #[test]
        fn plan_invariants((ranges, pinned, room) in arb_input(), read_only_ok in any::<bool>()) {
            let rules = Rules { room_bytes: room, max_region_bytes: 1 << 20, min_region_bytes: 8192, read_only_ok, max_read_only_region_bytes: 1 << 18, lock_room_bytes: u64::MAX, lock_all_kinds: true };
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
                prop_assert!(region.len > 0);
                prop_assert!(!region.sources.is_empty());
                // Every byte of it lies in its sources, which are the owner's and lie wholly inside.
                let source_spans: Vec<(u64, u64)> = region.sources.iter().map(|&s| (ranges[s].addr, ranges[s].end())).collect();
                prop_assert!(spans::covers(&source_spans, region.addr, region.addr + region.len));
                for &s in &region.sources {
                    prop_assert_eq!(ranges[s].owner, region.owner);
                    prop_assert!(ranges[s].addr >= region.addr && ranges[s].end() <= region.addr + region.len);
                }
                // Larger than a region only when no storage boundary within the first
                // max_region_bytes could end it (storages overlap there, or one is that large,
                // or a cut there leaves a piece shorter than min_region_bytes).
                let (min_region, max_region) = rules.region_bounds(region.kind);
                prop_assert!(region.len >= min_region, "region {:?} shorter than {}", region, min_region);
                if region.len > max_region {
                    let (limit, end) = (region.addr + max_region, region.addr + region.len);
                    for &s in &region.sources {
                        let cut = ranges[s].end();
                        let straddled = region.sources.iter().any(|&o| ranges[o].addr < cut && cut < ranges[o].end());
                        let leaves_a_short_piece = cut - region.addr < min_region || end - cut < min_region;
                        prop_assert!(cut > limit || straddled || cut == end || leaves_a_short_piece, "region {:?} could have been cut at {}", region, cut);
                    }
                }
                // Never over a live registration.
                for p in &pinned { prop_assert!(p.addr + p.len <= region.addr || region.addr + region.len <= p.addr); }
            }
            // Whole storages: a range whose first byte is registered lies wholly inside that
            // registration (a storage whose start is not registered copies as pageable memory).
            // Storages of two owners (or of two priorities) that overlap cannot both be whole
            // (never so in practice: one storage is one model's): not checked.
            let pinned_spans = spans::from_lengths(pinned.iter().map(|p| (p.addr, p.len)));
            let skipped_spans = spans::from_lengths(plan.skipped.iter().map(|s| (s.addr, s.len)));
            let straddles = |r: &HostRange| ranges.iter().any(|o| (o.owner, o.priority) != (r.owner, r.priority) && o.addr < r.end() && r.addr < o.end());
            for r in &ranges {
                if let Some(g) = plan.regions.iter().find(|g| g.addr <= r.addr && r.addr < g.addr + g.len) {
                    prop_assert!(r.end() <= g.addr + g.len || straddles(r), "range {:?} registered in part", r);
                }
                // ... and what is not planned is accounted for: already pinned or skipped.
                let planned = plan.regions.iter().any(|g| g.sources.iter().any(|&s| ranges[s] == *r));
                if !planned {
                    let accounted: Vec<(u64, u64)> = pinned_spans.iter().chain(&skipped_spans).copied()
                        .chain(plan.regions.iter().map(|g| (g.addr, g.addr + g.len))).collect();
                    prop_assert!(spans::covers(&accounted, r.addr, r.end()), "range {:?} neither planned nor skipped", r);
                }
            }
            // Deterministic.
            prop_assert_eq!(&plan, &super::plan(&ranges, &pinned, &rules));
        }

        #[test]
        fn a_model_fills_the_room_up_to_one_storage(model in arb_model(), room_pages in 0u64..3000) {
            let rules = Rules { room_bytes: room_pages * 4096, max_region_bytes: 1 << 20, min_region_bytes: 4096, read_only_ok: false, max_read_only_region_bytes: 1 << 18, lock_room_bytes: u64::MAX, lock_all_kinds: true };
            let plan = plan(&model, &[], &rules);
            let total: u64 = model.iter().map(|r| r.len).sum();
            if rules.room_bytes >= total {
                // Room for everything: everything is planned, nothing skipped.
                prop_assert_eq!(plan.planned_bytes, total);
                prop_assert!(plan.skipped.is_empty());
            } else {
                // Greedy in address order within one run: what is left out could not have fit
                // (the first storage left out is larger than the room left).
                let first_left = model.iter().find(|r| !plan.regions.iter().any(|g| r.addr >= g.addr && r.end() <= g.addr + g.len));
                if let Some(first_left) = first_left {
                    prop_assert!(first_left.len > rules.room_bytes - plan.planned_bytes);
                }
            }
        }
    }
}
