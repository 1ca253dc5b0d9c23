//! How many bytes Viking may hold pinned right now. Pure logic: a memory snapshot and a policy
//! in, a budget and the term that bound it out. No I/O here (`engine.rs` takes the snapshot).
//!
//! Pinned pages can never be swapped out, so over-pinning turns swapping into the OOM killer.
//! The budget is the smallest of these terms (all in bytes of pinned memory, ours included):
//! - `user`: the limit the user asked for (bytes, or a share of RAM); absent in auto mode;
//! - `os_cap`: what the OS tolerates page-locked (Windows fails past ~40-50% of RAM), less what
//!   others (ComfyUI's own pinning) already hold;
//! - `headroom`: RAM that must stay un-pinned for everything else: usable RAM - headroom - others;
//! - `pressure`: the pressure governor's ceiling (`pressure.rs`), only while the machine stalls
//!   for memory or has not yet been calm for long enough since it did.
//!
//! Available RAM below the headroom is not a term: on a machine short of RAM with swap on that
//! is the normal state, and pinning weights that are already in RAM takes no new memory. Whether
//! the machine stalls is what the governor watches.
//!
//! Windows' commit charge (RAM + pagefile promised to allocations) is reported, not a term:
//! locking a page neither raises nor, unlocked, lowers it, so giving pins back when it runs
//! short would cost speed and help nothing.

use serde::Serialize;

use crate::error::{Result, VikingError};

pub const GIB: u64 = 1 << 30;

/// Larger than any machine's RAM: a size above this many GiB is a typo, not a wish.
pub const MAX_GIB: f64 = (1u64 << 20) as f64; // 1 PiB

/// The one rule for a size a person gives in GiB (budgets, headroom, a model's limit, a VRAM
/// cap): a finite number from 0 (auto / no limit) to `MAX_GIB`. Returns bytes.
pub fn gib_to_bytes(name: &str, gib: f64) -> Result<u64> {
    if !(gib.is_finite() && (0.0..=MAX_GIB).contains(&gib)) {
        return Err(VikingError::invalid(format!("{name} is {gib}; give a number of GiB from 0 (auto) to {MAX_GIB}")));
    }
    Ok((gib * GIB as f64) as u64)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Os {
    Linux,
    Windows,
    Mac,
    Other,
}

impl Os {
    pub fn current() -> Os {
        if cfg!(target_os = "linux") {
            Os::Linux
        } else if cfg!(windows) {
            Os::Windows
        } else if cfg!(target_os = "macos") {
            Os::Mac
        } else {
            Os::Other
        }
    }

    /// The share of RAM this OS lets a process keep page-locked without trouble.
    pub fn pin_share_cap(self) -> f64 {
        match self {
            Os::Linux => 0.90,
            Os::Windows => 0.40, // page-locking past ~40-50% of RAM fails there (users' reports)
            Os::Mac | Os::Other => 0.50,
        }
    }
}

/// What the machine looks like now. Every figure in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct MemorySnapshot {
    pub total_ram: u64,
    pub available_ram: u64,
    pub swap_total: u64,
    pub swap_used: u64,
    /// The memory limit of the container (cgroup) we run in, if it is below `total_ram`.
    pub container_limit: Option<u64>,
    pub pinned_by_us: u64,
    /// Pinned by others in this process (ComfyUI's own `cudaHostRegister` calls).
    pub pinned_by_others: u64,
    /// Windows: the commit limit (RAM + pagefiles) and what is left of it.
    pub commit_limit: Option<u64>,
    pub commit_available: Option<u64>,
    pub os: Os,
}

impl MemorySnapshot {
    /// RAM this process can use at all: the machine's, or the container's if smaller.
    pub fn usable_ram(&self) -> u64 {
        match self.container_limit {
            Some(limit) if limit < self.total_ram => limit,
            _ => self.total_ram,
        }
    }
}

/// The user's limit on pinned bytes.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(tag = "mode", content = "value", rename_all = "snake_case")]
pub enum Limit {
    /// No limit of the user's own: only the safety terms apply.
    Auto,
    Bytes(u64),
    /// A share of usable RAM, in (0, 1].
    ShareOfRam(f64),
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Policy {
    pub limit: Limit,
    /// RAM that must stay un-pinned; `None` picks a default from the machine's RAM.
    pub headroom_bytes: Option<u64>,
}

impl Default for Policy {
    fn default() -> Self {
        Policy { limit: Limit::Auto, headroom_bytes: None }
    }
}

impl Policy {
    /// Builds a policy from the numbers a user types, rejecting the ones that make no sense.
    /// `budget_gib`: 0 = auto. `share`: 0 = unused, else in (0, 1]. `headroom_gib`: negative = auto.
    pub fn from_user(budget_gib: f64, share: f64, headroom_gib: f64) -> Result<Policy> {
        let budget_bytes = gib_to_bytes("budget_gib", budget_gib)?;
        if !(share.is_finite() && (0.0..=1.0).contains(&share)) {
            return Err(VikingError::invalid(format!(
                "share of RAM is {share}; it must be between 0 (unused) and 1 (all of RAM)"
            )));
        }
        // Negative headroom means auto; anything else follows the one GiB rule.
        let headroom_bytes = if headroom_gib < 0.0 { None } else { Some(gib_to_bytes("headroom_gib", headroom_gib)?) };
        let limit = if budget_bytes > 0 {
            if share > 0.0 {
                return Err(VikingError::invalid("give either budget_gib or a share of RAM, not both"));
            }
            Limit::Bytes(budget_bytes)
        } else if share > 0.0 {
            Limit::ShareOfRam(share)
        } else {
            Limit::Auto
        };
        Ok(Policy { limit, headroom_bytes })
    }
}

/// Default free-RAM headroom: 20% of RAM, at least 4 GiB and at most 16 GiB, never more than
/// half of RAM (a 4 GiB machine keeps 2 GiB).
pub fn default_headroom(usable_ram: u64) -> u64 {
    let fifth = usable_ram / 5;
    fifth.clamp(4 * GIB, 16 * GIB).min(usable_ram / 2)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Term {
    User,
    OsCap,
    Headroom,
    Pressure,
}

/// The pressure governor's ceiling on our pinned bytes, with why it is there.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PressureCeiling {
    pub bytes: u64,
    /// "gave back 3.1 GiB at 12:04:31 UTC: the machine stalled 23% of the last 1.5 s".
    pub reason: String,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Budget {
    /// Bytes we may hold pinned in all, what we hold now included.
    pub limit_bytes: u64,
    /// Bytes we hold now.
    pub pinned_bytes: u64,
    /// `limit_bytes - pinned_bytes`, or 0: what more we may pin now.
    pub room_bytes: u64,
    /// Bytes we should give back now (pressure, or a lowered limit).
    pub excess_bytes: u64,
    pub headroom_bytes: u64,
    pub bound_by: Term,
    /// Every term's value, for the status.
    pub terms: Vec<(Term, u64)>,
    /// One sentence for people: "limited by headroom: 4.0 GiB must stay free".
    pub reason: String,
}

impl Budget {
    /// The pressure governor holds a ceiling now.
    #[cfg(test)]
    pub fn under_pressure(&self) -> bool {
        self.terms.iter().any(|(term, _)| matches!(term, Term::Pressure))
    }
}

/// Bytes for people: GiB from 1 GiB up, MiB below.
pub fn gib(bytes: u64) -> String {
    if bytes >= GIB {
        format!("{:.1} GiB", bytes as f64 / GIB as f64)
    } else {
        format!("{:.1} MiB", bytes as f64 / (1u64 << 20) as f64)
    }
}

/// The budget now. `pressure`: the pressure governor's ceiling, if it holds one.
pub fn compute(snapshot: &MemorySnapshot, policy: &Policy, pressure: Option<&PressureCeiling>) -> Budget {
    let usable = snapshot.usable_ram();
    let headroom = policy.headroom_bytes.unwrap_or_else(|| default_headroom(usable));
    let others = snapshot.pinned_by_others;

    let mut terms = Vec::with_capacity(4);
    match policy.limit {
        Limit::Auto => {}
        Limit::Bytes(bytes) => terms.push((Term::User, bytes)),
        Limit::ShareOfRam(share) => terms.push((Term::User, (usable as f64 * share) as u64)),
    }
    let os_cap = (usable as f64 * snapshot.os.pin_share_cap()) as u64;
    terms.push((Term::OsCap, os_cap.saturating_sub(others)));
    terms.push((Term::Headroom, usable.saturating_sub(headroom).saturating_sub(others)));
    if let Some(ceiling) = pressure {
        terms.push((Term::Pressure, ceiling.bytes));
    }

    // The first smallest term wins; `terms` always holds OsCap and Headroom.
    let (bound_by, limit_bytes) = terms.iter().copied().min_by_key(|&(_, bytes)| bytes).expect("terms is never empty");
    let reason = match bound_by {
        Term::User => format!("limited by your budget: {}", gib(limit_bytes)),
        Term::OsCap => format!(
            "limited by the {:?} cap: at most {:.0}% of RAM page-locked ({} already pinned by others)",
            snapshot.os,
            snapshot.os.pin_share_cap() * 100.0,
            gib(others)
        ),
        Term::Headroom => format!("limited by headroom: {} must stay free", gib(headroom)),
        Term::Pressure => format!("limited by memory pressure: {}", pressure.map_or("", |p| p.reason.as_str())),
    };
    Budget {
        limit_bytes,
        pinned_bytes: snapshot.pinned_by_us,
        room_bytes: limit_bytes.saturating_sub(snapshot.pinned_by_us),
        excess_bytes: snapshot.pinned_by_us.saturating_sub(limit_bytes),
        headroom_bytes: headroom,
        bound_by,
        terms,
        reason,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn machine(total_gib: u64, available_gib: u64) -> MemorySnapshot {
        MemorySnapshot {
            total_ram: total_gib * GIB,
            available_ram: available_gib * GIB,
            swap_total: 0,
            swap_used: 0,
            container_limit: None,
            pinned_by_us: 0,
            pinned_by_others: 0,
            commit_limit: None,
            commit_available: None,
            os: Os::Linux,
        }
    }

    #[test]
    fn windows_commit_charge_never_takes_pins_back() {
        // Nearly no commit charge left: unlocking would not give any back, so nothing is
        // released for it (the budget is what RAM and headroom allow).
        let mut snapshot = machine(32, 20);
        snapshot.os = Os::Windows;
        snapshot.pinned_by_us = 8 * GIB;
        snapshot.commit_limit = Some(48 * GIB);
        snapshot.commit_available = Some(GIB);
        let budget = compute(&snapshot, &Policy::from_user(0.0, 0.0, 4.0).unwrap(), None);
        assert_eq!(budget.excess_bytes, 0, "{budget:?}");
        assert!(!budget.under_pressure() && budget.limit_bytes >= 8 * GIB, "{budget:?}");
    }

    #[test]
    fn auto_on_a_32_gib_linux_box_is_bound_by_headroom() {
        let budget = compute(&machine(32, 20), &Policy::default(), None);
        // 20% of 32 GiB = 6.4 GiB headroom.
        assert_eq!(budget.bound_by, Term::Headroom);
        assert_eq!(budget.headroom_bytes, 32 * GIB / 5);
        assert_eq!(budget.limit_bytes, 32 * GIB - 32 * GIB / 5);
        assert!(budget.reason.starts_with("limited by headroom: 6.4 GiB must stay free"), "{}", budget.reason);
    }

    #[test]
    fn user_budget_binds_when_smallest() {
        let policy = Policy::from_user(8.0, 0.0, -1.0).unwrap();
        let budget = compute(&machine(64, 50), &policy, None);
        assert_eq!((budget.bound_by, budget.limit_bytes), (Term::User, 8 * GIB));
        assert_eq!(budget.reason, "limited by your budget: 8.0 GiB");
    }

    #[test]
    fn windows_caps_at_forty_percent_less_others() {
        let mut snapshot = machine(64, 60);
        snapshot.os = Os::Windows;
        snapshot.pinned_by_others = 4 * GIB;
        let budget = compute(&snapshot, &Policy::default(), None);
        assert_eq!(budget.bound_by, Term::OsCap);
        assert_eq!(budget.limit_bytes, (64.0 * GIB as f64 * 0.4) as u64 - 4 * GIB);
    }

    #[test]
    fn container_limit_replaces_total_ram() {
        let mut snapshot = machine(128, 100);
        snapshot.container_limit = Some(16 * GIB);
        let budget = compute(&snapshot, &Policy::default(), None);
        assert_eq!(budget.headroom_bytes, 4 * GIB);
        assert_eq!(budget.limit_bytes, 12 * GIB);
    }

    #[test]
    fn available_ram_below_the_headroom_is_no_pressure() {
        // The machine: a 7 GiB cgroup with swap, 648 MiB available, a 3.5 GiB headroom.
        // Pinning the weights already in RAM takes no new memory: the budget is the headroom
        // term, not "what we hold less the shortfall" (which pinned nothing there).
        let mut snapshot = machine(64, 0);
        (snapshot.container_limit, snapshot.available_ram) = (Some(7 * GIB), 648 << 20);
        snapshot.pinned_by_us = 2 * GIB;
        let budget = compute(&snapshot, &Policy::default(), None);
        assert!(!budget.under_pressure(), "{budget:?}");
        assert_eq!((budget.bound_by, budget.limit_bytes, budget.excess_bytes), (Term::Headroom, 7 * GIB - 7 * GIB / 2, 0));
    }

    #[test]
    fn the_pressure_ceiling_asks_for_bytes_back() {
        let mut snapshot = machine(32, 20);
        snapshot.pinned_by_us = 10 * GIB;
        let ceiling = PressureCeiling { bytes: 8 * GIB, reason: "gave back 2.0 GiB at 12:04:31 UTC: the machine stalled 23% of the last 1.5 s".into() };
        let budget = compute(&snapshot, &Policy::default(), Some(&ceiling));
        assert!(budget.under_pressure());
        assert_eq!((budget.bound_by, budget.limit_bytes), (Term::Pressure, 8 * GIB));
        assert_eq!((budget.room_bytes, budget.excess_bytes), (0, 2 * GIB));
        assert_eq!(budget.reason, "limited by memory pressure: gave back 2.0 GiB at 12:04:31 UTC: the machine stalled 23% of the last 1.5 s");
        // A ceiling above another term does not bind, but is still listed.
        let high = PressureCeiling { bytes: 30 * GIB, reason: String::new() };
        let budget = compute(&snapshot, &Policy::default(), Some(&high));
        assert_eq!(budget.bound_by, Term::Headroom);
        assert!(budget.under_pressure());
    }

    #[test]
    fn share_of_ram() {
        let policy = Policy::from_user(0.0, 0.25, 0.0).unwrap();
        let budget = compute(&machine(64, 60), &policy, None);
        assert_eq!((budget.bound_by, budget.limit_bytes), (Term::User, 16 * GIB));
    }

    #[test]
    fn headroom_larger_than_ram_gives_zero() {
        let policy = Policy::from_user(0.0, 0.0, 100.0).unwrap();
        let budget = compute(&machine(16, 10), &policy, None);
        assert_eq!(budget.limit_bytes, 0);
    }

    #[test]
    fn bad_user_input_is_rejected_with_a_hint() {
        for (budget, share, headroom) in
            [(-1.0, 0.0, -1.0), (f64::NAN, 0.0, -1.0), (f64::INFINITY, 0.0, -1.0), (1e9, 0.0, -1.0), (0.0, 1.5, -1.0), (0.0, f64::NAN, -1.0), (0.0, 0.0, f64::NAN), (0.0, 0.0, 1e12), (4.0, 0.5, -1.0)]
        {
            let error = Policy::from_user(budget, share, headroom).unwrap_err();
            assert!(matches!(error, VikingError::InvalidInput(_)), "{budget} {share} {headroom}");
        }
    }

    #[test]
    fn default_headroom_bounds() {
        assert_eq!(default_headroom(8 * GIB), 4 * GIB);
        assert_eq!(default_headroom(4 * GIB), 2 * GIB);
        assert_eq!(default_headroom(256 * GIB), 16 * GIB);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(crate::fuzz_cases()))]
        #[test]
        fn budget_never_exceeds_any_term_nor_usable_ram(
            total in 1u64..(1 << 42), avail_frac in 0.0f64..1.0, us in 0u64..(1 << 40), others in 0u64..(1 << 40),
            container in proptest::option::of(1u64..(1 << 42)), budget_gib in 0.0f64..4096.0, headroom_gib in -1.0f64..64.0,
            windows in any::<bool>(), ceiling in proptest::option::of(0u64..(1 << 42)),
        ) {
            let snapshot = MemorySnapshot {
                total_ram: total, available_ram: (total as f64 * avail_frac) as u64, swap_total: 0, swap_used: 0,
                container_limit: container, pinned_by_us: us, pinned_by_others: others,
                commit_limit: None, commit_available: if windows { Some(total / 3) } else { None },
                os: if windows { Os::Windows } else { Os::Linux },
            };
            let policy = Policy::from_user(budget_gib, 0.0, headroom_gib).unwrap();
            let pressure = ceiling.map(|bytes| PressureCeiling { bytes, reason: String::new() });
            let budget = compute(&snapshot, &policy, pressure.as_ref());
            prop_assert_eq!(budget.under_pressure(), ceiling.is_some());
            for &(_, bytes) in &budget.terms { prop_assert!(budget.limit_bytes <= bytes); }
            prop_assert!(budget.limit_bytes <= snapshot.usable_ram());
            prop_assert_eq!(budget.room_bytes, budget.limit_bytes.saturating_sub(us));
            prop_assert!(budget.room_bytes == 0 || budget.excess_bytes == 0);
        }
    }
}
