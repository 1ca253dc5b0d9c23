//! The pressure governor: whether the machine stalls for memory, and the ceiling on our pinned
//! bytes that follows from it. Pure logic: samples in (the engine's monitor thread takes one
//! twice a second), a ceiling and, when it moves, an action out. No I/O and no clock here.
//!
//! Why stalls and not "available RAM below a headroom": on a machine short of RAM with swap on,
//! available RAM below any useful headroom is the normal state, and pinning weights that are
//! already resident takes no new memory. What hurts the user is the machine stalling: tasks
//! waiting for pages to be reclaimed or read back. The kernel measures exactly that (pressure
//! stall information, PSI): `some` is the share of time at least one task waited for memory,
//! `full` the share in which every runnable task did (the machine did no work at all).
//!
//! The policy:
//! - Stalling: over the last window (at least `MIN_WINDOW_MS`), `full` >= `STALL_FULL` or
//!   `some` >= `STALL_SOME`. Without PSI: RAM available plus free swap below a critical floor
//!   (and on Windows, RAM available below the level where the OS raises its low-memory
//!   notification). Then the ceiling drops below what we hold by a step, once per
//!   `COOLDOWN_MS`, so the effect of one give-back shows before the next.
//! - Near OOM (RAM available plus free swap below the emergency floor) the ceiling drops at
//!   every sample, whatever PSI says: the OOM killer does not wait for a window.
//! - Take-back (no ceiling) only after the pressure stayed below the LOWER thresholds
//!   (`CALM_FULL`, `CALM_SOME`) for the hold time, `BASE_HOLD_MS` at first; a give-back within
//!   `FLAP_WINDOW_MS` of a take-back doubles the hold (up to `MAX_HOLD_MS`), so a neighbour that
//!   bursts every 20-30 s never makes Viking pin and unpin with it.
//! - Windows' commit charge is not a signal: locking a page neither raises it nor, unlocked,
//!   lowers it, so giving pins back for it would cost speed and help nothing (see budget.rs).

use std::collections::VecDeque;

use serde::Serialize;

use crate::budget::{gib, Os};

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

/// The shortest span a stall share is computed over: PSI totals move in steps of the kernel's
/// accounting, and half a second of them is noise; one second at two samples a second is not.
pub const MIN_WINDOW_MS: u64 = 1_000;
/// Samples older than this are forgotten (the window is the newest span of at least
/// `MIN_WINDOW_MS`, so only a few are ever needed).
pub const HISTORY_MS: u64 = 10_000;
/// Every task stalled 5% of the time: 50 ms a second of a machine doing nothing, where a
/// desktop starts to stutter (the neighbour saw a p95 of 236 ms per touch).
pub const STALL_FULL: f64 = 0.05;
/// Some task waited for memory 20% of the time: reclaim is in the way of real work.
pub const STALL_SOME: f64 = 0.20;
/// The lower thresholds a take-back needs: a fifth and a quarter of the triggers, so a machine
/// hovering near a trigger does not count as calm.
pub const CALM_FULL: f64 = 0.01;
pub const CALM_SOME: f64 = 0.05;
/// Between two give-backs: the kernel needs a few seconds to reclaim what was unpinned, and a
/// window after that to show whether it helped.
pub const COOLDOWN_MS: u64 = 4_000;
/// How long the pressure must stay low before the ceiling lifts, at first.
pub const BASE_HOLD_MS: u64 = 30_000;
/// The longest hold: after repeated flapping, a take-back at most every 8 minutes.
pub const MAX_HOLD_MS: u64 = 8 * 60_000;
/// A give-back this soon after a take-back means the take-back came too early: the hold doubles.
/// Five minutes: pressure that returns within it is one spell, not two.
pub const FLAP_WINDOW_MS: u64 = 5 * 60_000;
/// Ten calm minutes after a take-back: the hold goes back to `BASE_HOLD_MS`.
pub const HOLD_RESET_MS: u64 = 10 * 60_000;
/// The least one give-back releases: smaller steps would not show in the stall figures.
pub const MIN_STEP: u64 = 256 * MIB;

/// Near OOM: RAM available plus free swap below 1/64 of usable RAM, 256 MiB to 1 GiB.
pub fn emergency_floor(usable_ram: u64) -> u64 {
    (usable_ram / 64).clamp(256 * MIB, GIB)
}

/// Without PSI, "stalling": RAM available plus free swap below 1/16 of usable RAM, 512 MiB to
/// 4 GiB (the kernel is then reclaiming hard); calm above twice that.
pub fn critical_floor(usable_ram: u64) -> u64 {
    (usable_ram / 16).clamp(512 * MIB, 4 * GIB)
}

/// Windows raises its low-memory resource notification at about 32 MB of available RAM per
/// 4 GB, at most 64 MB (the default of `CreateMemoryResourceNotification`).
pub fn windows_low_memory(usable_ram: u64) -> u64 {
    (usable_ram / 128).min(64 * MIB)
}

/// The kernel's cumulative stall totals, in microseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct StallTotals {
    pub some_us: u64,
    pub full_us: u64,
}

/// Parses a PSI file (/proc/pressure/memory, or a cgroup v2 memory.pressure):
/// "some avg10=0.00 avg60=0.00 avg300=0.00 total=123\nfull avg10=... total=45\n".
/// `None` without a `some` total; a missing `full` line (old kernels) counts as 0.
pub fn parse_psi(text: &str) -> Option<StallTotals> {
    let total = |kind: &str| {
        text.lines().find_map(|line| {
            let mut fields = line.split_whitespace();
            (fields.next()? == kind).then_some(())?;
            fields.find_map(|field| field.strip_prefix("total=")?.parse::<u64>().ok())
        })
    };
    Some(StallTotals { some_us: total("some")?, full_us: total("full").unwrap_or(0) })
}

/// One look at the machine.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sample {
    /// A monotonic clock, in milliseconds.
    pub at_ms: u64,
    /// PSI totals; `None` where the kernel has none (old kernels, Windows, macOS).
    pub stall: Option<StallTotals>,
    pub available_ram: u64,
    pub free_swap: u64,
    pub usable_ram: u64,
    /// Bytes we hold pinned now.
    pub held_bytes: u64,
    pub os: Os,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum State {
    /// No ceiling, no stall.
    Calm,
    /// The last window stalled (or memory is short where there is no PSI).
    Stalling,
    /// A ceiling is in place and the stalls stopped: waiting for the hold to lift it.
    Holding,
}

/// The stall shares over the last window.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Reading {
    pub some: f64,
    pub full: f64,
    pub window_ms: u64,
}

/// Why the ceiling came down.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Why {
    Stalled(Reading),
    /// No PSI: RAM available plus free swap below the critical floor, or (Windows) RAM
    /// available below the OS's low-memory level.
    ShortOfMemory { available_ram: u64, free_swap: u64 },
    /// RAM available plus free swap below the emergency floor.
    NearOom { available_ram: u64, free_swap: u64 },
}

impl Why {
    /// For people: "the machine stalled 23% of the last 1.5 s".
    pub fn describe(&self) -> String {
        match self {
            Why::Stalled(r) if r.full >= STALL_FULL => {
                format!("the machine stalled {:.0}% of the last {:.1} s", r.full * 100.0, r.window_ms as f64 / 1000.0)
            }
            Why::Stalled(r) => format!("tasks waited for memory {:.0}% of the last {:.1} s", r.some * 100.0, r.window_ms as f64 / 1000.0),
            Why::ShortOfMemory { available_ram, free_swap } => {
                format!("the machine was short of RAM ({} available, {} of swap free)", gib(*available_ram), gib(*free_swap))
            }
            Why::NearOom { available_ram, free_swap } => {
                format!("the machine was near running out of memory ({} available, {} of swap free)", gib(*available_ram), gib(*free_swap))
            }
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// The ceiling came down to `ceiling`: `bytes` of what we hold must go back.
    GaveBack { ceiling: u64, bytes: u64, why: Why },
    /// The ceiling was lifted after `calm_ms` of low pressure.
    TookBack { calm_ms: u64 },
}

/// What one sample says about the machine.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Verdict {
    NearOom(Why),
    Stalling(Why),
    Calm,
    /// Between the thresholds: neither gives back nor counts toward the hold.
    Between,
    /// Not enough history for a window yet.
    Unknown,
}

#[derive(Debug, Clone)]
pub struct Governor {
    /// (time, totals) of recent samples with PSI, oldest first.
    history: VecDeque<(u64, StallTotals)>,
    last_at_ms: Option<u64>,
    ceiling: Option<u64>,
    state: State,
    reading: Option<Reading>,
    /// Why the ceiling last came down.
    why: Option<Why>,
    /// When the ceiling last came down (for the cooldown).
    lowered_at_ms: Option<u64>,
    took_back_at_ms: Option<u64>,
    calm_since_ms: Option<u64>,
    hold_ms: u64,
}

impl Default for Governor {
    fn default() -> Self {
        Governor {
            history: VecDeque::new(),
            last_at_ms: None,
            ceiling: None,
            state: State::Calm,
            reading: None,
            why: None,
            lowered_at_ms: None,
            took_back_at_ms: None,
            calm_since_ms: None,
            hold_ms: BASE_HOLD_MS,
        }
    }
}

impl Governor {
    /// The ceiling on our pinned bytes; `None`: the pressure sets none.
    pub fn ceiling(&self) -> Option<u64> {
        self.ceiling
    }

    pub fn state(&self) -> State {
        self.state
    }

    /// The stall shares over the last window, where there is PSI and a window yet.
    pub fn reading(&self) -> Option<Reading> {
        self.reading
    }

    /// Why the ceiling last came down.
    pub fn why(&self) -> Option<Why> {
        self.why
    }

    /// How long the pressure must stay low before the ceiling lifts, now.
    pub fn hold_ms(&self) -> u64 {
        self.hold_ms
    }

    /// Takes one sample; returns what changed, if anything.
    pub fn observe(&mut self, sample: &Sample) -> Option<Action> {
        let now = sample.at_ms;
        if self.last_at_ms.is_some_and(|last| now < last) {
            // The clock went backwards (a test, a suspended VM's clock): every stored time is
            // meaningless now. The ceiling stays; only the windows and timers start again.
            self.history.clear();
            self.lowered_at_ms = None;
            self.took_back_at_ms = None;
            self.calm_since_ms = None;
        }
        self.last_at_ms = Some(now);
        let verdict = self.verdict(sample);

        if self.ceiling.is_none() && self.took_back_at_ms.is_some_and(|t| now - t >= HOLD_RESET_MS) {
            self.hold_ms = BASE_HOLD_MS;
        }
        match verdict {
            Verdict::NearOom(why) => {
                self.calm_since_ms = None;
                self.state = State::Stalling;
                self.lower(sample, why)
            }
            Verdict::Stalling(why) => {
                self.calm_since_ms = None;
                self.state = State::Stalling;
                let cooled = self.lowered_at_ms.is_none_or(|t| now - t >= COOLDOWN_MS);
                // The last give-back not carried out yet (the caller releases at its own
                // moment): lowering again would ask for what was never tried.
                let carried_out = self.ceiling.is_none_or(|c| sample.held_bytes <= c);
                if cooled && carried_out {
                    self.lower(sample, why)
                } else {
                    None
                }
            }
            Verdict::Calm => {
                let since = *self.calm_since_ms.get_or_insert(now);
                if self.ceiling.is_some() && now - since >= self.hold_ms {
                    self.ceiling = None;
                    self.took_back_at_ms = Some(now);
                    self.calm_since_ms = None;
                    self.state = State::Calm;
                    Some(Action::TookBack { calm_ms: now - since })
                } else {
                    self.state = if self.ceiling.is_some() { State::Holding } else { State::Calm };
                    None
                }
            }
            Verdict::Between => {
                self.calm_since_ms = None;
                self.state = if self.ceiling.is_some() { State::Holding } else { State::Calm };
                None
            }
            Verdict::Unknown => None,
        }
    }

    /// The ceiling one step below what we hold (or below the ceiling, if we hold more).
    fn lower(&mut self, sample: &Sample, why: Why) -> Option<Action> {
        let now = sample.at_ms;
        let base = self.ceiling.map_or(sample.held_bytes, |c| c.min(sample.held_bytes));
        let step = (base / 4).max(MIN_STEP);
        let ceiling = base.saturating_sub(step);
        if self.ceiling == Some(ceiling) {
            return None; // already at 0
        }
        if self.took_back_at_ms.is_some_and(|t| now - t < FLAP_WINDOW_MS) {
            self.hold_ms = (self.hold_ms * 2).min(MAX_HOLD_MS);
            self.took_back_at_ms = None; // one doubling per take-back
        }
        self.ceiling = Some(ceiling);
        self.why = Some(why);
        self.lowered_at_ms = Some(now);
        let bytes = sample.held_bytes.saturating_sub(ceiling);
        (bytes > 0).then_some(Action::GaveBack { ceiling, bytes, why })
    }

    fn verdict(&mut self, sample: &Sample) -> Verdict {
        let (available_ram, free_swap) = (sample.available_ram, sample.free_swap);
        let spare = available_ram.saturating_add(free_swap);
        let near_oom = spare < emergency_floor(sample.usable_ram);
        self.reading = sample.stall.and_then(|stall| self.window(sample.at_ms, stall));
        if near_oom {
            return Verdict::NearOom(Why::NearOom { available_ram, free_swap });
        }
        if sample.stall.is_some() {
            return match self.reading {
                None => Verdict::Unknown,
                Some(r) if r.full >= STALL_FULL || r.some >= STALL_SOME => Verdict::Stalling(Why::Stalled(r)),
                Some(r) if r.full < CALM_FULL && r.some < CALM_SOME => Verdict::Calm,
                Some(_) => Verdict::Between,
            };
        }
        let floor = critical_floor(sample.usable_ram);
        let low_memory = if sample.os == Os::Windows { windows_low_memory(sample.usable_ram) } else { 0 };
        if spare < floor || available_ram < low_memory {
            Verdict::Stalling(Why::ShortOfMemory { available_ram, free_swap })
        } else if spare >= 2 * floor && available_ram >= 2 * low_memory {
            Verdict::Calm
        } else {
            Verdict::Between
        }
    }

    /// Records the totals and returns the shares over the newest span of at least
    /// `MIN_WINDOW_MS`. Totals that went down (a new cgroup, a counter reset) start afresh.
    fn window(&mut self, now: u64, stall: StallTotals) -> Option<Reading> {
        if self.history.back().is_some_and(|&(_, last)| stall.some_us < last.some_us || stall.full_us < last.full_us) {
            self.history.clear();
        }
        while self.history.front().is_some_and(|&(at, _)| now - at > HISTORY_MS) {
            self.history.pop_front();
        }
        self.history.push_back((now, stall));
        let &(then, old) = self.history.iter().rev().find(|&&(at, _)| now - at >= MIN_WINDOW_MS)?;
        let window_ms = now - then;
        let share = |new: u64, old: u64| ((new - old) as f64 / (window_ms as f64 * 1000.0)).clamp(0.0, 1.0);
        Some(Reading { some: share(stall.some_us, old.some_us), full: share(stall.full_us, old.full_us), window_ms })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const USABLE: u64 = 16 * GIB;

    /// A machine with plenty of RAM and swap (no emergency, no fallback stall) and PSI.
    fn sample(at_ms: u64, some_us: u64, full_us: u64, held: u64) -> Sample {
        Sample {
            at_ms,
            stall: Some(StallTotals { some_us, full_us }),
            available_ram: 2 * GIB,
            free_swap: 8 * GIB,
            usable_ram: USABLE,
            held_bytes: held,
            os: Os::Linux,
        }
    }

    /// Drives a governor through a trace: `stall_share(t)` is the share of each 500 ms step in
    /// which every task stalled (some = full). The engine gives back at once. Returns the
    /// actions with their times.
    fn run(governor: &mut Governor, from_ms: u64, until_ms: u64, held: &mut u64, wanted: u64, totals: &mut u64, stall_share: impl Fn(u64) -> f64) -> Vec<(u64, Action)> {
        let mut actions = Vec::new();
        let mut t = from_ms;
        while t < until_ms {
            t += 500;
            *totals += (stall_share(t) * 500_000.0) as u64;
            if let Some(action) = governor.observe(&sample(t, *totals, *totals, *held)) {
                actions.push((t, action));
            }
            // The engine: gives back above the ceiling, re-pins up to it.
            *held = governor.ceiling().map_or(wanted, |c| c.min(wanted));
        }
        actions
    }

    #[test]
    fn parses_psi_files() {
        let text = "some avg10=1.50 avg60=0.20 avg300=0.05 total=123456\nfull avg10=0.50 avg60=0.00 avg300=0.00 total=7890\n";
        assert_eq!(parse_psi(text), Some(StallTotals { some_us: 123456, full_us: 7890 }));
        assert_eq!(parse_psi("some avg10=0.00 avg60=0.00 avg300=0.00 total=5\n"), Some(StallTotals { some_us: 5, full_us: 0 }));
        assert_eq!(parse_psi(""), None);
        assert_eq!(parse_psi("full avg10=0 total=3"), None);
        assert_eq!(parse_psi("some avg10=0.00 total=x\n"), None);
    }

    #[test]
    fn a_steady_calm_machine_never_gets_a_ceiling() {
        let mut governor = Governor::default();
        let (mut held, mut totals) = (8 * GIB, 0);
        // 0.5% stalled: well below both thresholds.
        let actions = run(&mut governor, 0, 3_600_000, &mut held, 8 * GIB, &mut totals, |_| 0.005);
        assert!(actions.is_empty(), "{actions:?}");
        assert_eq!((governor.ceiling(), governor.state()), (None, State::Calm));
    }

    #[test]
    fn a_stall_gives_back_within_one_cooldown_lowest_step_first() {
        let mut governor = Governor::default();
        let (mut held, mut totals) = (8 * GIB, 0);
        run(&mut governor, 0, 10_000, &mut held, 8 * GIB, &mut totals, |_| 0.0);
        let actions = run(&mut governor, 10_000, 10_000 + COOLDOWN_MS, &mut held, 8 * GIB, &mut totals, |_| 0.3);
        let (at, first) = actions.first().expect("a give-back within one cooldown");
        assert!(*at <= 10_000 + COOLDOWN_MS, "{at}");
        assert!(matches!(first, Action::GaveBack { ceiling, bytes, .. } if *ceiling == 6 * GIB && *bytes == 2 * GIB), "{first:?}");
        assert_eq!(governor.state(), State::Stalling);
        let Action::GaveBack { why, .. } = first else { unreachable!() };
        // The first window (1 s) holds one stalled half second of 30%.
        assert_eq!(why.describe(), "the machine stalled 15% of the last 1.0 s");
    }

    #[test]
    fn stalling_on_steps_down_once_per_cooldown_to_nothing() {
        let mut governor = Governor::default();
        let (mut held, mut totals) = (GIB, 0);
        run(&mut governor, 0, 2_000, &mut held, GIB, &mut totals, |_| 0.0);
        let actions = run(&mut governor, 2_000, 60_000, &mut held, GIB, &mut totals, |_| 0.5);
        let times: Vec<u64> = actions.iter().map(|(t, _)| *t).collect();
        assert!(times.windows(2).all(|w| w[1] - w[0] >= COOLDOWN_MS), "{times:?}");
        // 1 GiB: 768, 512, 256, 0 MiB (steps of at least 256 MiB).
        assert_eq!(actions.len(), 4, "{actions:?}");
        assert_eq!(governor.ceiling(), Some(0));
    }

    #[test]
    fn no_take_back_before_the_hold_then_one() {
        let mut governor = Governor::default();
        let (mut held, mut totals) = (4 * GIB, 0);
        run(&mut governor, 0, 2_000, &mut held, 4 * GIB, &mut totals, |_| 0.0);
        run(&mut governor, 2_000, 4_000, &mut held, 4 * GIB, &mut totals, |_| 0.5);
        assert_eq!(governor.ceiling(), Some(3 * GIB));
        // Calm from 4 s on: the window still holds the stall for a second, then calm counts.
        let early = run(&mut governor, 4_000, 4_000 + BASE_HOLD_MS, &mut held, 4 * GIB, &mut totals, |_| 0.0);
        assert!(early.is_empty(), "{early:?}");
        assert_eq!((governor.ceiling(), governor.state()), (Some(3 * GIB), State::Holding));
        let later = run(&mut governor, 4_000 + BASE_HOLD_MS, 4_000 + BASE_HOLD_MS + 5_000, &mut held, 4 * GIB, &mut totals, |_| 0.0);
        assert!(matches!(later.as_slice(), [(_, Action::TookBack { calm_ms })] if *calm_ms >= BASE_HOLD_MS), "{later:?}");
        assert_eq!((governor.ceiling(), governor.state(), held), (None, State::Calm, 4 * GIB));
    }

    #[test]
    fn pressure_between_the_thresholds_holds_the_ceiling() {
        let mut governor = Governor::default();
        let (mut held, mut totals) = (4 * GIB, 0);
        run(&mut governor, 0, 2_000, &mut held, 4 * GIB, &mut totals, |_| 0.0);
        run(&mut governor, 2_000, 4_000, &mut held, 4 * GIB, &mut totals, |_| 0.5);
        // 3% full: below the trigger, above the calm threshold: no more give-backs, no lift.
        let actions = run(&mut governor, 4_000, 600_000, &mut held, 4 * GIB, &mut totals, |_| 0.03);
        assert!(actions.is_empty(), "{actions:?}");
        assert_eq!((governor.ceiling(), governor.state()), (Some(3 * GIB), State::Holding));
    }

    #[test]
    fn a_give_back_soon_after_a_take_back_doubles_the_hold() {
        let mut governor = Governor::default();
        let (mut held, mut totals) = (4 * GIB, 0);
        let stall_at = |t: u64| if t % 50_000 < 2_000 { 0.5 } else { 0.0 };
        // A burst every 50 s, 48 s of calm between them: the first hold (30 s) lifts once, the
        // next burst doubles it to 60 s, which 48 s of calm never reach again.
        let actions = run(&mut governor, 0, 3_600_000, &mut held, 4 * GIB, &mut totals, stall_at);
        let take_backs = actions.iter().filter(|(_, a)| matches!(a, Action::TookBack { .. })).count();
        assert_eq!(take_backs, 1, "{actions:?}");
        assert_eq!(governor.hold_ms(), 2 * BASE_HOLD_MS);
    }

    #[test]
    fn the_hold_goes_back_to_its_base_after_long_calm() {
        let mut governor = Governor::default();
        let (mut held, mut totals) = (4 * GIB, 0);
        let stall_at = |t: u64| if (10_000..12_000).contains(&t) || (60_000..62_000).contains(&t) { 0.5 } else { 0.0 };
        run(&mut governor, 0, 200_000, &mut held, 4 * GIB, &mut totals, stall_at);
        assert_eq!(governor.hold_ms(), 2 * BASE_HOLD_MS);
        run(&mut governor, 200_000, 200_000 + HOLD_RESET_MS + 60_000, &mut held, 4 * GIB, &mut totals, |_| 0.0);
        assert_eq!((governor.hold_ms(), governor.ceiling()), (BASE_HOLD_MS, None));
    }

    #[test]
    fn near_oom_acts_at_once_whatever_psi_says() {
        let mut governor = Governor::default();
        let mut near_oom = sample(1_000, 0, 0, 4 * GIB);
        near_oom.available_ram = 100 * MIB;
        near_oom.free_swap = 0;
        // The very first sample: no window, no stall, and still it acts.
        let action = governor.observe(&near_oom);
        assert!(matches!(action, Some(Action::GaveBack { ceiling, why: Why::NearOom { .. }, .. }) if ceiling == 3 * GIB), "{action:?}");
        // And again at the next sample: no cooldown near OOM.
        near_oom.at_ms += 500;
        near_oom.held_bytes = 3 * GIB;
        assert!(matches!(governor.observe(&near_oom), Some(Action::GaveBack { .. })));
        assert!(Why::NearOom { available_ram: 100 * MIB, free_swap: 0 }.describe().contains("near running out of memory"));
    }

    #[test]
    fn without_psi_short_memory_is_the_signal() {
        let mut governor = Governor::default();
        let mut s = sample(1_000, 0, 0, 8 * GIB);
        s.stall = None;
        // 16 GiB usable: the critical floor is 1 GiB. 2 GiB + 8 GiB of swap: calm.
        assert_eq!(governor.observe(&s), None);
        assert_eq!(governor.state(), State::Calm);
        s.at_ms += 500;
        (s.available_ram, s.free_swap) = (600 * MIB, 200 * MIB);
        let action = governor.observe(&s);
        assert!(matches!(action, Some(Action::GaveBack { why: Why::ShortOfMemory { .. }, .. })), "{action:?}");
        let Some(Action::GaveBack { why, .. }) = action else { unreachable!() };
        assert!(why.describe().starts_with("the machine was short of RAM"), "{}", why.describe());
        // Windows: RAM below the low-memory level (64 MiB on 16 GiB) though swap is plentiful.
        let mut windows = Governor::default();
        let mut w = sample(1_000, 0, 0, 8 * GIB);
        (w.stall, w.os, w.available_ram, w.free_swap) = (None, Os::Windows, 40 * MIB, 8 * GIB);
        assert!(matches!(windows.observe(&w), Some(Action::GaveBack { .. })));
    }

    #[test]
    fn a_ceiling_not_yet_carried_out_is_not_lowered_again() {
        let mut governor = Governor::default();
        let mut totals = 0;
        for t in (500..=2_000).step_by(500) {
            governor.observe(&sample(t, totals, totals, 4 * GIB));
        }
        for t in (2_500..=30_000).step_by(500) {
            totals += 250_000;
            // The caller never releases: the governor asks once, then waits.
            governor.observe(&sample(t, totals, totals, 4 * GIB));
        }
        assert_eq!(governor.ceiling(), Some(3 * GIB));
    }

    #[test]
    fn time_going_backwards_and_counter_resets_do_no_harm() {
        let mut governor = Governor::default();
        for t in (500..=5_000).step_by(500) {
            governor.observe(&sample(t, t * 1000, t * 100, GIB)); // 100% some, 10% full
        }
        let ceiling = governor.ceiling();
        assert!(ceiling.is_some());
        // The clock jumps back; the counters restart from 0.
        assert_eq!(governor.observe(&sample(100, 0, 0, GIB)), None);
        assert_eq!(governor.ceiling(), ceiling);
        assert_eq!(governor.reading(), None);
    }

    #[derive(Debug, Clone)]
    struct Step {
        dt_ms: u64,
        some_us: u64,
        full_us: u64,
        reset: bool,
        available_ram: u64,
        free_swap: u64,
        psi: bool,
    }

    fn any_step() -> impl Strategy<Value = Step> {
        (0u64..3_000, 0u64..4_000_000, 0u64..4_000_000, proptest::bool::weighted(0.02), 0u64..(64 * GIB), 0u64..(16 * GIB), proptest::bool::weighted(0.9))
            .prop_map(|(dt_ms, some_us, full_us, reset, available_ram, free_swap, psi)| Step { dt_ms, some_us, full_us, reset, available_ram, free_swap, psi })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(crate::fuzz_cases()))]

        /// Any input, however odd (time standing still or going back, totals that reset or
        /// leap, PSI that comes and goes): no panic, and the ceiling never rises while the
        /// machine stalls.
        #[test]
        fn never_panics_and_never_rises_while_stalling(
            steps in proptest::collection::vec(any_step(), 1..200), held in 0u64..(1 << 40), usable in 0u64..(1 << 42),
            back_in_time in proptest::option::of(0usize..200), windows in any::<bool>(),
        ) {
            let mut governor = Governor::default();
            let (mut at, mut some, mut full) = (0u64, 0u64, 0u64);
            for (i, step) in steps.iter().enumerate() {
                at = if back_in_time == Some(i) { at / 2 } else { at.saturating_add(step.dt_ms) };
                if step.reset { (some, full) = (0, 0) } else { some = some.saturating_add(step.some_us); full = full.saturating_add(step.full_us) }
                let before = governor.ceiling();
                let sample = Sample {
                    at_ms: at, stall: step.psi.then_some(StallTotals { some_us: some, full_us: full }),
                    available_ram: step.available_ram, free_swap: step.free_swap, usable_ram: usable, held_bytes: held,
                    os: if windows { Os::Windows } else { Os::Linux },
                };
                let action = governor.observe(&sample);
                if governor.state() == State::Stalling {
                    prop_assert!(governor.ceiling().is_some() || before.is_none());
                    if let (Some(b), Some(a)) = (before, governor.ceiling()) { prop_assert!(a <= b); }
                }
                if let Some(Action::GaveBack { ceiling, bytes, .. }) = action {
                    prop_assert_eq!(Some(ceiling), governor.ceiling());
                    prop_assert_eq!(bytes, held - ceiling);
                }
                if let Some(r) = governor.reading() {
                    prop_assert!((0.0..=1.0).contains(&r.some) && (0.0..=1.0).contains(&r.full) && r.window_ms >= MIN_WINDOW_MS);
                }
            }
        }

        /// A neighbour that bursts every 20-30 s (each burst stalls the machine 1-5 s) never
        /// gets a take-back: the calm between bursts is shorter than the hold. With bursts up
        /// to 3 minutes apart, a bounded number of give-back/take-back cycles an hour.
        #[test]
        fn bursts_do_not_make_it_flap(period_s in 20u64..180, burst_s in 1u64..5, share in 0.1f64..1.0, phase_s in 0u64..30) {
            let mut governor = Governor::default();
            let (mut held, mut totals) = (8 * GIB, 0);
            let stall_at = |t: u64| if (t / 1000 + phase_s) % period_s < burst_s { share } else { 0.0 };
            let actions = run(&mut governor, 0, 3_600_000, &mut held, 8 * GIB, &mut totals, stall_at);
            let take_backs = actions.iter().filter(|(_, a)| matches!(a, Action::TookBack { .. })).count() as u64;
            if period_s <= 30 {
                prop_assert_eq!(take_backs, 0, "{:?}", actions);
            }
            // Bursts at most 3 minutes apart come back within the flap window: every take-back
            // doubles the next hold (30 s, 60 s, 2 min, 4 min), and calm shorter than 3 minutes
            // reaches at most the first three.
            prop_assert!(take_backs <= 3, "{} take-backs: {:?}", take_backs, actions);
        }

        /// A calm trace with jitter below the calm thresholds never gets a ceiling.
        #[test]
        fn calm_with_jitter_never_gets_a_ceiling(jitter in proptest::collection::vec(0.0f64..CALM_FULL, 100..400)) {
            let mut governor = Governor::default();
            let (mut held, mut totals) = (8 * GIB, 0);
            let actions = run(&mut governor, 0, 200_000, &mut held, 8 * GIB, &mut totals, |t| jitter[(t / 500) as usize % jitter.len()]);
            prop_assert!(actions.is_empty());
            prop_assert_eq!(governor.ceiling(), None);
        }
    }
}
