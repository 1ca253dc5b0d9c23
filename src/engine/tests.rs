//! Engine tests: real OS page locks on heap buffers (VmLck is read to check them).

use std::sync::{Arc, Mutex};

use super::*;
use crate::backend::BackendChoice;


const MIB: usize = 1 << 20;
/// The size unit of the engine tests that lock: a quarter MiB, so that each fits the 8 MiB lock
/// limit of a default Docker container or a normal user (scripts/test.sh runs them so) and runs
/// there too.
const UNIT: usize = MIB / 4;
const GIB: f64 = (1u64 << 30) as f64;
/// The engine tests read the process's VmLck: run them one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

/// A page-aligned heap buffer; the test keeps it alive through the keepalive.
fn buffer(bytes: usize) -> (u64, Keepalive) {
    let mut memory = vec![1u8; bytes + 4096];
    let addr = (memory.as_mut_ptr() as u64).div_ceil(4096) * 4096;
    (addr, Arc::new(memory))
}

fn request(owner: u64, priority: i32, ranges: Vec<(u64, u64, Keepalive)>) -> Request {
    Request { owner, label: format!("model {owner}"), priority, backend: BackendChoice::OsLock, model_limit_bytes: None, ranges, foreign: vec![], others_pinned_bytes: 0 }
}

/// Says that `test` did not run, and why, as a line `SKIP <test>: <reason>` written straight to
/// stderr: the test harness captures `println!` of a passing test, so a plain `cargo test` would
/// hide it, and a test that returns early reads as passed. scripts/test.sh counts these lines.
fn skip(test: &str, reason: &str) {
    use std::io::Write;
    // One write, so lines of tests running in parallel do not interleave.
    let _ = std::io::stderr().write_all(format!("SKIP {test}: {reason}\n").as_bytes());
}

/// Whether this process may lock `bytes` more; if not, the test skips (`skip`): run as a user
/// or in a container with a small `ulimit -l` (scripts/test.sh runs the engine tests so), a
/// test that locks more than the limit has nothing to show there.
fn may_lock(test: &str, bytes: usize) -> bool {
    let room = crate::sys::os::lock_limit().map(|limit| limit.saturating_sub(crate::sys::os::self_status_bytes("VmLck").unwrap_or(0)));
    match room {
        Some(room) if room < bytes as u64 => {
            skip(test, &format!("it locks {} KiB, this process may lock {} KiB more (ulimit -l, no CAP_IPC_LOCK)", bytes >> 10, room >> 10));
            false
        }
        _ => true,
    }
}

fn may_lock_mib(test: &str, mib: usize) -> bool {
    may_lock(test, mib * MIB)
}

#[cfg(target_os = "linux")]
fn locked_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("VmLck:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

// One test, so the VmLck figures are not disturbed by others running in parallel.
#[test]
#[cfg(target_os = "linux")]
fn reconcile_pins_releases_and_is_idempotent() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    if !may_lock("reconcile_pins_releases_and_is_idempotent", 16 * UNIT) {
        return;
    }
    let engine = Engine::new();
    engine.configure(Policy::from_user(0.0, 0.0, 0.0).unwrap(), 0, None).unwrap();
    let (a, keep_a) = buffer(8 * UNIT);
    let (b, keep_b) = buffer(8 * UNIT);
    let before = locked_kib();
    let ranges = vec![(a, 8 * UNIT as u64, keep_a.clone()), (b, 8 * UNIT as u64, keep_b.clone())];
    let report = engine.reconcile(request(1, 0, ranges.clone())).unwrap();
    assert_eq!(report.newly_pinned_bytes, 16 * UNIT as u64, "{report:?}");
    assert!(locked_kib() >= before + ((16 * UNIT) >> 10) as u64);
    // Twice: nothing new.
    let again = engine.reconcile(request(1, 0, ranges)).unwrap();
    assert_eq!((again.newly_pinned_bytes, again.released_bytes, again.pinned_bytes), (0, 0, 16 * UNIT as u64));
    // b no longer wanted: released.
    let shrink = engine.reconcile(request(1, 0, vec![(a, 8 * UNIT as u64, keep_a.clone())])).unwrap();
    assert_eq!(shrink.released_bytes, 8 * UNIT as u64);
    // A second owner over the same bytes gets nothing: a byte is never held twice.
    let other = engine.reconcile(request(2, 0, vec![(a, 8 * UNIT as u64, keep_a.clone())])).unwrap();
    assert_eq!(other.newly_pinned_bytes, 0);
    assert_eq!(other.skipped[0].reason, "pinned_for_another_model");
    // The status sees the pinned pages in RAM, none in swap.
    let status = engine.status(false, false);
    let owner = status.owners.iter().find(|o| o.owner == 1).unwrap();
    assert_eq!((owner.resident_bytes, owner.swapped_bytes, owner.pinned_swapped_bytes), (Some(8 * UNIT as u64), Some(0), Some(0)));
    // A model with nothing in RAM (all of it on the GPU): none resident, no pins to check.
    engine.reconcile(request(3, 0, vec![])).unwrap();
    let idle = engine.status(false, false).owners.into_iter().find(|o| o.owner == 3).unwrap();
    assert_eq!((idle.resident_bytes, idle.swapped_bytes, idle.pinned_swapped_bytes), (Some(0), Some(0), None));
    assert!(status.paging.swapped_in_since_start.is_some());
    assert_eq!(engine.release_owner(1), 8 * UNIT as u64);
    assert!(locked_kib() <= before + 8); // back where it was (a page of slack)
    assert_eq!(engine.release_all(), 0);
}

#[test]
fn a_lowered_model_budget_gives_back_what_is_beyond_it() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    if !may_lock("a_lowered_model_budget_gives_back_what_is_beyond_it", 16 * UNIT) {
        return;
    }
    let engine = Engine::new();
    engine.configure(Policy::from_user(0.0, 0.0, 0.0).unwrap(), 0, None).unwrap();
    let buffers: Vec<(u64, Keepalive)> = (0..4).map(|_| buffer(4 * UNIT)).collect();
    let ranges: Vec<(u64, u64, Keepalive)> = buffers.iter().map(|(a, k)| (*a, 4 * UNIT as u64, k.clone())).collect();
    let all = engine.reconcile(request(1, 0, ranges.clone())).unwrap();
    assert_eq!(all.pinned_bytes, 16 * UNIT as u64);
    // The same model, now with 6 MiB of its own limit: never more than 6 MiB pinned, in whole
    // storages (4 MiB each), so one of them.
    let capped = engine.reconcile(Request { model_limit_bytes: Some(6 * UNIT as u64), ..request(1, 0, ranges.clone()) }).unwrap();
    assert_eq!(capped.pinned_bytes, 4 * UNIT as u64, "{capped:?}");
    assert_eq!(capped.skipped.iter().find(|s| s.reason == "over_budget").map(|s| s.bytes), Some(12 * UNIT as u64));
    // Again: stable, nothing churns.
    let again = engine.reconcile(Request { model_limit_bytes: Some(6 * UNIT as u64), ..request(1, 0, ranges.clone()) }).unwrap();
    assert_eq!((again.pinned_bytes, again.newly_pinned_bytes, again.released_bytes), (4 * UNIT as u64, 0, 0));
    engine.release_all();
}

#[test]
fn higher_priority_evicts_lower_within_a_user_budget() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    if !may_lock("higher_priority_evicts_lower_within_a_user_budget", 16 * UNIT) {
        return;
    }
    let engine = Engine::new();
    engine.configure(Policy::from_user(12.0 * UNIT as f64 / GIB, 0.0, 0.0).unwrap(), 0, None).unwrap();
    let (a, keep_a) = buffer(8 * UNIT);
    let (b, keep_b) = buffer(8 * UNIT);
    let low = engine.reconcile(request(10, 0, vec![(a, 8 * UNIT as u64, keep_a)])).unwrap();
    assert_eq!(low.pinned_bytes, 8 * UNIT as u64);
    let high = engine.reconcile(request(11, 5, vec![(b, 8 * UNIT as u64, keep_b)])).unwrap();
    assert_eq!(high.pinned_bytes, 8 * UNIT as u64);
    assert_eq!(high.evicted, vec![(10, 8 * UNIT as u64)]);
    assert!(engine.lock().events.iter().any(|e| e.contains("model 10")));
    engine.release_all();
}

#[test]
#[cfg(target_os = "linux")]
fn injected_faults_leave_a_consistent_ledger() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    if !may_lock("injected_faults_leave_a_consistent_ledger", 16 * UNIT) {
        return;
    }
    let engine = Engine::new();
    engine.configure(Policy::from_user(0.0, 0.0, 0.0).unwrap(), 0, None).unwrap();
    let buffers: Vec<(u64, Keepalive)> = (0..3).map(|_| buffer(4 * UNIT)).collect();
    let ranges = || buffers.iter().map(|(a, k)| (*a, 4 * UNIT as u64, k.clone())).collect::<Vec<_>>();
    let before = locked_kib();

    // The 2nd pin fails: the others are pinned, the failure is reported, nothing half-done.
    engine.set_faults(Faults { fail_pin_nth: 2, ..Faults::default() });
    let report = engine.reconcile(request(1, 0, ranges())).unwrap();
    assert_eq!((report.regions_registered, report.failures.len()), (2, 1), "{report:?}");
    assert_eq!(report.pinned_bytes, 8 * UNIT as u64);
    assert!(locked_kib() - before >= ((8 * UNIT) >> 10) as u64 && locked_kib() - before < ((12 * UNIT) >> 10) as u64);
    assert_eq!(engine.lock().counters.failures, 1);

    // The next unpin fails: that memory stays pinned, so its keepalive is kept for good.
    let (failures_before, _) = crate::backend::release_failures();
    engine.set_faults(Faults { fail_unpin_nth: 1, ..Faults::default() });
    let first = engine.lock().ledger.entries().map(|e| e.addr()).min().unwrap();
    let handle = buffers.iter().find(|(a, _)| *a == first).unwrap().1.clone();
    assert_eq!(engine.release_owner(1), 8 * UNIT as u64);
    assert_eq!(crate::backend::release_failures().0, failures_before + 1);
    assert!(Arc::strong_count(&handle) >= 3, "the failed region's memory must not be freed");
    assert_eq!(engine.lock().ledger.total_bytes(), 0);

    // A lost device: nothing pins, every failure is reported, no panic.
    engine.set_faults(Faults { device_lost: true, ..Faults::default() });
    let lost = engine.reconcile(request(2, 0, ranges())).unwrap();
    assert_eq!((lost.pinned_bytes, lost.failures.len()), (0, 3));
    assert!(lost.failures[0].contains("CUDA_ERROR_DEVICE_UNAVAILABLE"));
    engine.set_faults(Faults::default());
    // Clean up the range the injected unpin failure left locked (a test-only leak).
    // SAFETY: `first` is the start of a buffer of 4 units that `handle` keeps alive; the failed
    // unpin left exactly that range locked, so this unlock is its one release.
    unsafe { crate::sys::os::unlock(first, 4 * UNIT as u64).unwrap() };
}

#[test]
fn bad_ranges_are_rejected_before_anything_is_pinned() {
    let engine = Engine::new();
    let keep: Keepalive = Arc::new(());
    for (addr, len) in [(0, 10), (4096, 0), (u64::MAX - 10, 100)] {
        let error = engine.reconcile(request(1, 0, vec![(addr, len, keep.clone())])).err().unwrap();
        assert!(matches!(error, VikingError::InvalidInput(_)), "{error}");
    }
    assert!(engine.configure(Policy::default(), -1, None).is_err());
    assert!(engine.configure(Policy::default(), 64, None).is_err());
    assert_eq!(engine.lock().ledger.total_bytes(), 0);
}

/// CUDA reports Viking's own registrations as pinned, so the caller passes them back as
/// "foreign": they must not count as someone else's. Before, they did, and the headroom and OS
/// cap terms then subtracted the model's own pins on every reconcile after the first.
#[test]
fn our_own_pins_passed_back_as_foreign_are_not_counted_as_others() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    if !may_lock("our_own_pins_passed_back_as_foreign_are_not_counted_as_others", 16 * UNIT) {
        return;
    }
    let engine = Engine::new();
    engine.configure(Policy::from_user(0.0, 0.0, 0.0).unwrap(), 0, None).unwrap();
    let (a, keep_a) = buffer(8 * UNIT);
    let (b, keep_b) = buffer(4 * UNIT);
    let ranges = vec![(a, 8 * UNIT as u64, keep_a.clone())];
    let first = engine.reconcile(request(1, 0, ranges.clone())).unwrap();
    assert_eq!(first.pinned_bytes, 8 * UNIT as u64);
    let limit_before = first.budget.limit_bytes;
    // As the CUDA backend makes Python see it: our range is_pinned(), and someone else pinned b.
    let as_cuda_sees_it = Request { foreign: vec![(a, 8 * UNIT as u64), (b, 4 * UNIT as u64)], ..request(1, 0, ranges.clone()) };
    let second = engine.reconcile(as_cuda_sees_it).unwrap();
    assert_eq!((second.newly_pinned_bytes, second.released_bytes, second.pinned_bytes), (0, 0, 8 * UNIT as u64));
    assert_eq!(engine.lock().foreign_bytes, 4 * UNIT as u64, "only b is someone else's");
    assert_eq!(engine.status(false, false).memory.pinned_by_others, 4 * UNIT as u64);
    // The budget moved by b's 4 MiB only (the machine's available RAM may drift a little).
    let moved = limit_before.abs_diff(second.budget.limit_bytes);
    assert!(moved < 4 * UNIT as u64 + (64 << 20), "limit moved by {moved}");
    drop(keep_b);
    engine.release_all();
}

/// A checkpoint's file pages (read-only memory) are locked off the caller's thread: the
/// reconcile holds them at once, the lock follows, a release waits for it, and a lock that
/// fails there is reported by the owner's next reconcile, which tries again.
#[test]
#[cfg(target_os = "linux")]
fn read_only_file_pages_are_locked_off_the_callers_thread() {
    use crate::backend::file_view::FileView;
    use std::io::Write;
    use std::os::unix::io::AsRawFd;

    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    if !may_lock("read_only_file_pages_are_locked_off_the_callers_thread", 16 * UNIT) {
        return;
    }
    let path = std::env::temp_dir().join(format!("viking_deferred_{}", std::process::id()));
    std::fs::File::create(&path).unwrap().write_all(&vec![3u8; 16 * UNIT]).unwrap();
    let file = std::fs::File::open(&path).unwrap();
    let view = FileView::open(file.as_raw_fd() as i64, 0, 16 * UNIT as u64).unwrap();
    let (addr, len) = (view.addr(), view.len());
    let keep: Keepalive = Arc::new(view);
    let engine = Engine::new();
    engine.configure(Policy::from_user(0.0, 0.0, 0.0).unwrap(), 0, None).unwrap();
    let before = locked_kib();

    let report = engine.reconcile(request(1, 0, vec![(addr, len, keep.clone())])).unwrap();
    assert_eq!((report.pinned_bytes, report.newly_pinned_bytes), (len, len), "held at once: {report:?}");
    assert!(engine.settle(std::time::Duration::from_secs(30)));
    assert!(locked_kib() >= before + ((16 * UNIT) >> 10) as u64, "locked by the worker");
    assert_eq!(engine.status(false, false).pending_bytes, 0);
    assert_eq!(engine.release_owner(1), len);
    assert!(locked_kib() <= before + 8, "unlocked on release");

    // The next pin fails on the worker: nothing is locked, and the next reconcile says so
    // and locks it again.
    let failures_before = engine.deferred_failures();
    engine.set_faults(Faults { fail_pin_nth: 1, ..Faults::default() });
    let report = engine.reconcile(request(1, 0, vec![(addr, len, keep.clone())])).unwrap();
    assert!(report.failures.is_empty(), "{report:?}");
    assert!(engine.settle(std::time::Duration::from_secs(30)));
    assert_eq!(engine.deferred_failures(), failures_before + 1);
    assert!(locked_kib() <= before + 8);
    engine.set_faults(Faults::default());
    let again = engine.reconcile(request(1, 0, vec![(addr, len, keep.clone())])).unwrap();
    assert_eq!((again.failures.len(), again.newly_pinned_bytes, again.pinned_bytes), (1, len, len), "{again:?}");
    assert!(engine.settle(std::time::Duration::from_secs(30)));
    assert!(locked_kib() >= before + ((16 * UNIT) >> 10) as u64);
    let counters = engine.lock().counters;
    assert_eq!((counters.registrations, counters.failures), (2, 1), "a failed lock counts as a failure, not a registration");

    // Released while its lock may still be queued or under way: it waits or cancels, and
    // nothing stays locked.
    engine.release_owner(1);
    engine.reconcile(request(1, 0, vec![(addr, len, keep.clone())])).unwrap();
    engine.release_all();
    assert!(engine.settle(std::time::Duration::from_secs(30)));
    assert!(locked_kib() <= before + 8, "nothing left locked");
    drop(keep);
    std::fs::remove_file(path).unwrap();
}

/// A process that may lock only a little (a normal user, a container without CAP_IPC_LOCK):
/// the OS lock pins up to that limit and names it for the rest; nothing fails, nothing is
/// counted that is not locked. Where nothing limits this process, the test runs itself again in
/// a child process that is given a limit (`in_a_child_with_a_lock_limit`).
#[test]
#[cfg(target_os = "linux")]
fn a_lock_limit_is_a_named_bound_and_nothing_is_phantom() {
    const NAME: &str = "a_lock_limit_is_a_named_bound_and_nothing_is_phantom";
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let Some(limit) = crate::sys::os::lock_limit() else {
        if let Err(reason) = in_a_child_with_a_lock_limit(NAME, 8 * MIB as u64) {
            skip(NAME, &format!("nothing limits locked memory here (CAP_IPC_LOCK or an unlimited ulimit -l), and {reason}"));
        }
        return;
    };
    let engine = Engine::new();
    engine.configure(Policy::from_user(0.0, 0.0, 0.0).unwrap(), 0, None).unwrap();
    // Twice the limit, in 1 MiB storages.
    let storages = (2 * limit).div_ceil(MIB as u64).max(2);
    let buffers: Vec<(u64, Keepalive)> = (0..storages).map(|_| buffer(MIB)).collect();
    let ranges: Vec<(u64, u64, Keepalive)> = buffers.iter().map(|(a, k)| (*a, MIB as u64, k.clone())).collect();
    let report = engine.reconcile(request(1, 0, ranges.clone())).unwrap();
    assert!(report.failures.is_empty(), "{report:?}");
    let skipped = report.skipped.iter().find(|s| s.reason == "lock_limit").expect("the limit is named");
    assert!(skipped.description.contains("ulimit -l") && skipped.description.contains("CAP_IPC_LOCK"));
    assert_eq!(report.pinned_bytes + skipped.bytes, report.wanted_bytes, "{report:?}");
    assert!(locked_kib() * 1024 <= limit && report.pinned_bytes <= limit);
    // What is counted is locked.
    assert!(locked_kib() * 1024 >= report.pinned_bytes, "{} KiB locked, {} counted", locked_kib(), report.pinned_bytes);
    // Again: nothing fails, nothing changes.
    let again = engine.reconcile(request(1, 0, ranges)).unwrap();
    assert!(again.failures.is_empty() && again.newly_pinned_bytes == 0 && again.pinned_bytes == report.pinned_bytes, "{again:?}");
    assert_eq!(engine.release_owner(1), report.pinned_bytes);
}

/// Runs the test `name` of this test binary in a child process that may lock at most
/// `limit_bytes`: RLIMIT_MEMLOCK lowered, and CAP_IPC_LOCK (which lifts the limit) dropped from
/// the bounding set, so that root does not get it back on exec. Panics if the child's test fails
/// or does not run; `Err(reason)` where no child can be given a limit here (not root).
#[cfg(target_os = "linux")]
fn in_a_child_with_a_lock_limit(name: &str, limit_bytes: u64) -> std::result::Result<(), String> {
    use std::os::unix::process::CommandExt;
    const CAP_IPC_LOCK: libc::c_ulong = 14;
    // SAFETY: geteuid only reads this process's credentials.
    if unsafe { libc::geteuid() } != 0 {
        return Err("only root can take CAP_IPC_LOCK away from a child it starts".into());
    }
    let inheritable = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    if inheritable.lines().find_map(|l| l.strip_prefix("CapInh:")).and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok()).is_none_or(|caps| caps >> CAP_IPC_LOCK & 1 == 1) {
        return Err("CAP_IPC_LOCK is in this process's inheritable set, which a child keeps".into());
    }
    let exe = std::env::current_exe().map_err(|e| format!("no path to this test binary: {e}"))?;
    let mut command = std::process::Command::new(exe);
    command.args(["--exact", &format!("engine::tests::{name}"), "--nocapture", "--test-threads=1"]);
    // SAFETY: runs in the forked child before exec, where only async-signal-safe calls are
    // allowed: prctl and setrlimit are system calls that allocate nothing and take no locks;
    // `limit` is a local on the child's own stack.
    unsafe {
        command.pre_exec(move || {
            let limit = libc::rlimit { rlim_cur: limit_bytes, rlim_max: limit_bytes };
            if libc::prctl(libc::PR_CAPBSET_DROP, CAP_IPC_LOCK, 0, 0, 0) != 0 || libc::setrlimit(libc::RLIMIT_MEMLOCK, &limit) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let output = command.output().map_err(|e| format!("the child could not start: {e}"))?;
    let (stdout, stderr) = (String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    assert!(output.status.success(), "the test under a {limit_bytes}-byte lock limit failed:\n{stdout}\n{stderr}");
    assert!(stdout.contains("1 passed") && !stderr.contains("SKIP "), "the test did not run in the child:\n{stdout}\n{stderr}");
    Ok(())
}

/// A private writable file mapping (how torch maps a safetensors file it loads copy-on-write),
/// for the test below; unmapped on drop.
#[cfg(target_os = "linux")]
struct PrivateFileMapping {
    addr: u64,
    len: u64,
}

#[cfg(target_os = "linux")]
impl PrivateFileMapping {
    fn new(file: &std::fs::File, len: usize) -> PrivateFileMapping {
        use std::os::unix::io::AsRawFd;
        // SAFETY: a new mapping at an address the kernel picks, so nothing of ours is replaced;
        // `file` is open for the call. The mapping is unmapped once, on drop.
        let addr = unsafe { libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_PRIVATE, file.as_raw_fd(), 0) };
        assert_ne!(addr, libc::MAP_FAILED);
        PrivateFileMapping { addr: addr as u64, len: len as u64 }
    }
}

#[cfg(target_os = "linux")]
impl Drop for PrivateFileMapping {
    fn drop(&mut self) {
        // SAFETY: exactly the mapping made in `new`, which this value owns alone; nothing reads
        // it after drop (the test holds it through its keepalive until the end).
        unsafe { libc::munmap(self.addr as *mut libc::c_void, self.len as usize) };
    }
}

/// The OS lock holds a private file mapping's pages as the file's own pages, through a shared
/// view, off the caller's thread: nothing is copied (the pages stay file pages, this process's anonymous memory does
/// not grow), the pages stay in RAM when the kernel is asked to drop the file's cache, and the
/// release unlocks them. A range with a page already written to (copied) is locked itself.
#[test]
#[cfg(target_os = "linux")]
fn a_private_file_mapping_is_locked_as_its_file_pages_without_a_copy() {
    use std::io::Write;
    use std::os::unix::io::AsRawFd;

    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    if !may_lock("a_private_file_mapping_is_locked_as_its_file_pages_without_a_copy", 32 * UNIT) {
        return;
    }
    let path = std::env::temp_dir().join(format!("viking_private_{}", std::process::id()));
    let contents: Vec<u8> = (0..32 * UNIT).map(|i| (i / 4096) as u8).collect();
    std::fs::File::create(&path).unwrap().write_all(&contents).unwrap();
    let file = std::fs::File::open(&path).unwrap();
    let (mapping, len) = (PrivateFileMapping::new(&file, 32 * UNIT), 16 * UNIT as u64);
    let addr = mapping.addr + 4096 * 3 + 100; // a tensor need not start on a page
    let keep: Keepalive = Arc::new(mapping);
    let anon_kib = || crate::sys::os::self_status_bytes("RssAnon").unwrap() >> 10;
    let copied_pages = |addr, len| {
        let mut copied = false;
        crate::sys::os::pagemap_chunks(addr, len, &mut |_, entries| copied |= !crate::memmap::no_page_copied(entries)).unwrap();
        copied
    };
    let engine = Engine::new();
    engine.configure(Policy::from_user(0.0, 0.0, 0.0).unwrap(), 0, None).unwrap();
    let (locked_before, anon_before) = (locked_kib(), anon_kib());

    let report = engine.reconcile(request(1, 0, vec![(addr, len, keep.clone())])).unwrap();
    assert_eq!((report.pinned_bytes, report.failures.len()), (len, 0), "{report:?}");
    assert!(engine.settle(std::time::Duration::from_secs(30)), "locked off the caller's thread");
    let owner = &engine.status(false, false).owners[0];
    assert_eq!(owner.file_page_bytes, len, "held through a view");
    assert!(locked_kib() >= locked_before + ((16 * UNIT) >> 10) as u64, "locked");
    assert!(anon_kib() < anon_before + ((4 * UNIT) >> 10) as u64, "copied: RssAnon {} -> {} KiB", anon_before, anon_kib());
    // SAFETY: each address is inside the readable 32 MiB mapping (`addr + len` stays below its
    // end), which `keep` holds mapped.
    let seen: Vec<u8> = (0..len as usize / 4096).map(|page| unsafe { *((addr + page as u64 * 4096) as *const u8) }).collect();
    assert!(seen.iter().enumerate().all(|(page, &byte)| byte == contents[(addr - keep_addr(&keep)) as usize + page * 4096]));
    assert!(!copied_pages(addr, len), "reading shows the file's pages");
    // Asked to drop the file's cached pages, the kernel keeps the locked ones.
    // SAFETY: posix_fadvise only advises the kernel about an open descriptor; it touches no
    // memory of ours.
    unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    assert_eq!(crate::sys::os::resident_in_ram(addr, len), Some(len), "the locked pages stayed in RAM");
    assert_eq!(engine.release_owner(1), len);
    assert!(locked_kib() <= locked_before + 8, "unlocked on release");

    // A page written to is this process's copy, which a view of the file would not hold: the
    // range is locked itself.
    // SAFETY: one byte inside the mapping, which is private and writable and held by `keep`;
    // nothing else reads or writes it now.
    unsafe { *((addr + 4096) as *mut u8) = 0xAB };
    let report = engine.reconcile(request(1, 0, vec![(addr, len, keep.clone())])).unwrap();
    assert_eq!(report.pinned_bytes, len, "{report:?}");
    assert_eq!(engine.status(false, false).owners[0].file_page_bytes, 0, "locked itself");
    assert!(locked_kib() >= locked_before + ((16 * UNIT) >> 10) as u64);
    engine.release_all();
    assert!(locked_kib() <= locked_before + 8);
    drop(keep);
    std::fs::remove_file(path).unwrap();
}

#[cfg(target_os = "linux")]
fn keep_addr(keep: &Keepalive) -> u64 {
    keep.downcast_ref::<PrivateFileMapping>().unwrap().addr
}

/// Mapped views (backend/mapped.rs): the rules are the backend's business only for the device
/// address, so they are checked here on real OS-lock pins, with the host address standing in.
#[test]
#[cfg(target_os = "linux")]
fn a_pin_a_mapped_view_holds_is_never_released_and_stays_counted() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    if !may_lock_mib("a_pin_a_mapped_view_holds_is_never_released_and_stays_counted", 16) {
        return;
    }
    let engine = Engine::new();
    engine.configure(Policy::from_user(0.0, 0.0, 0.0).unwrap(), 0, None).unwrap();
    let (a, keep_a) = buffer(8 * MIB);
    let (b, keep_b) = buffer(8 * MIB);
    let before = locked_kib();
    let both = vec![(a, 8 * MIB as u64, keep_a.clone()), (b, 8 * MIB as u64, keep_b.clone())];
    assert_eq!(engine.reconcile(request(1, 0, both.clone())).unwrap().pinned_bytes, 16 * MIB as u64);

    // What cannot be viewed: memory Viking does not pin, a range over a pin's end, no bytes,
    // and (for the device) a pin of the OS lock, which has no device address.
    let (loose, _keep_loose) = buffer(MIB);
    assert!(matches!(engine.host_view(loose, 4096), Err(VikingError::InvalidInput(_))));
    assert!(matches!(engine.host_view(a + 4096, 8 * MIB as u64), Err(VikingError::InvalidInput(_))));
    assert!(matches!(engine.host_view(a, 0), Err(VikingError::InvalidInput(_))));
    match engine.mapped_view(a, 4096) {
        Err(VikingError::BackendUnavailable { backend: "cuda", reason }) => assert!(reason.contains("os-lock"), "{reason}"),
        other => panic!("a view of an OS-lock pin: {:?}", other.map(|v| v.device_addr)),
    }

    let view = engine.host_view(a + 4096, 64 * 1024).unwrap();
    assert_eq!((view.host_addr, view.len), (a + 4096, 64 * 1024));
    let owner = |engine: &Engine| engine.status(false, false).owners.into_iter().find(|o| o.owner == 1).unwrap();
    assert_eq!(owner(&engine).mapped_view_bytes, 8 * MIB as u64);

    // The model no longer wants `a`: its pin stays while the view lives, then goes.
    let only_b = vec![(b, 8 * MIB as u64, keep_b.clone())];
    let shrink = engine.reconcile(request(1, 0, only_b.clone())).unwrap();
    assert_eq!((shrink.released_bytes, shrink.pinned_bytes), (0, 16 * MIB as u64), "{shrink:?}");
    // Pressure relief (a headroom larger than this machine's RAM) and a lower budget take the
    // other pin, never the viewed one, which stays pinned and counted.
    engine.configure(Policy::from_user(0.0, 0.0, 1024.0).unwrap(), 0, None).unwrap();
    assert_eq!(engine.relieve_pressure(), 8 * MIB as u64);
    assert_eq!(engine.status(false, false).pinned_bytes, 8 * MIB as u64);
    assert!(locked_kib() >= before + 8 * 1024);
    engine.configure(Policy::from_user(0.0, 0.0, 0.0).unwrap(), 0, None).unwrap();
    // Forgetting the model keeps the viewed pin too (counted under its owner number)...
    assert_eq!(engine.release_owner(1), 0);
    assert_eq!(engine.release_all(), 0);
    let status = engine.status(false, false);
    assert_eq!(status.pinned_bytes, 8 * MIB as u64);
    assert_eq!(status.owners.iter().map(|o| o.mapped_view_bytes).sum::<u64>(), 8 * MIB as u64);
    assert!(locked_kib() >= before + 8 * 1024);
    // ...until its last view is gone: the next release (or pressure round) lets it go.
    let second = engine.host_view(a, 4096).unwrap();
    drop(view);
    assert_eq!(engine.release_all(), 0, "a second view still holds it");
    drop(second);
    assert_eq!(engine.relieve_pressure(), 0); // swept, not given back under pressure
    assert_eq!(engine.status(false, false).pinned_bytes, 0);
    assert!(locked_kib() <= before + 8);
}

/// The device address of a CUDA registration (needs a GPU; skips with a reason without one).
#[test]
fn a_cuda_registration_has_a_device_address_that_a_view_holds() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    if let Err(error) = CudaBackend::open(0) {
        skip("a_cuda_registration_has_a_device_address_that_a_view_holds", &error.to_string());
        return;
    }
    let engine = Engine::new();
    engine.configure(Policy::from_user(0.0, 0.0, 0.0).unwrap(), 0, None).unwrap();
    let (a, keep_a) = buffer(8 * MIB);
    let report = engine.reconcile(Request { backend: BackendChoice::Cuda, ..request(1, 0, vec![(a, 8 * MIB as u64, keep_a)]) }).unwrap();
    assert_eq!(report.pinned_bytes, 8 * MIB as u64, "{report:?}");
    let view = engine.mapped_view(a + 4096, 4096).unwrap();
    let cuda = engine.lock().cuda().unwrap();
    assert_ne!(view.device_addr, 0);
    if cuda.info().unified_addressing {
        assert_eq!(view.device_addr, a + 4096, "under unified addressing the device sees the host address");
    }
    assert_eq!(cuda.device_pointer(a).unwrap() + 4096, view.device_addr);
    assert_eq!(engine.release_owner(1), 0);
    drop(view);
    assert_eq!(engine.release_all(), 8 * MIB as u64);
    // The registration is gone: the driver no longer knows the address.
    assert!(cuda.device_pointer(a).is_err());
}

/// The pressure governor's ceiling, wired through the engine: a stall gives pins back (lowest
/// priority first) with a reason that says when and why, reconcile pins nothing above the
/// ceiling while it holds, and pins again once the hold has passed in calm.
#[test]
fn the_pressure_ceiling_gives_back_holds_and_lifts() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    if !may_lock_mib("the_pressure_ceiling_gives_back_holds_and_lifts", 24) {
        return;
    }
    let engine = Engine::new();
    engine.configure(Policy::from_user(0.0, 0.0, 0.0).unwrap(), 0, None).unwrap();
    let (a, keep_a) = buffer(16 * MIB);
    let (b, keep_b) = buffer(8 * MIB);
    let low = vec![(a, 16 * MIB as u64, keep_a)];
    let high = vec![(b, 8 * MIB as u64, keep_b)];
    assert_eq!(engine.reconcile(request(1, 0, low.clone())).unwrap().pinned_bytes, 16 * MIB as u64);
    assert_eq!(engine.reconcile(request(2, 5, high.clone())).unwrap().pinned_bytes, 8 * MIB as u64);
    // A machine with RAM to spare: only the stall figures speak.
    let machine = MemorySnapshot { available_ram: 8 << 30, swap_total: 8 << 30, swap_used: 0, ..memory_snapshot(0, 0) };
    let feed = |from_ms: u64, to_ms: u64, share: f64, totals: &mut u64| {
        for at_ms in (from_ms..=to_ms).step_by(500) {
            *totals += (share * 500_000.0) as u64;
            engine.lock().observe_pressure(at_ms, Some(StallTotals { some_us: *totals, full_us: *totals }), &machine);
        }
    };
    let mut totals = 0;
    feed(0, 2_000, 0.0, &mut totals);
    assert_eq!(engine.status(false, false).pressure.state, pressure::State::Calm);
    // The machine stalls 40% of the time: the ceiling comes down by at least 256 MiB, to 0.
    feed(2_500, 3_500, 0.4, &mut totals);
    assert_eq!(engine.relieve_pressure(), 24 * MIB as u64);
    let status = engine.status(false, false);
    assert_eq!((status.pressure.state, status.pressure.ceiling_bytes, status.pinned_bytes), (pressure::State::Stalling, Some(0), 0));
    let given = status.pressure.last_give_back.clone().expect("a give-back in the status");
    assert_eq!(given.bytes, 24 * MIB as u64);
    // The first window that shows it: one stalled half second in the last second.
    assert_eq!(given.reason, "the machine stalled 20% of the last 1.0 s");
    assert!(status.budget.reason.starts_with("limited by memory pressure: gave back 24.0 MiB at "), "{}", status.budget.reason);
    assert!(status.budget.reason.ends_with(" UTC, the machine stalled 20% of the last 1.0 s"), "{}", status.budget.reason);
    let released: Vec<&String> = status.events.iter().filter(|e| e.starts_with("memory pressure: released")).collect();
    assert!(released.len() == 2 && released[0].contains("'model 1'") && released[1].contains("'model 2'"), "{released:?}");
    // While the ceiling holds, a reconcile pins nothing.
    let held = engine.reconcile(request(2, 5, high.clone())).unwrap();
    assert_eq!((held.pinned_bytes, held.budget.bound_by), (0, budget::Term::Pressure), "{held:?}");
    // Calm, but not for the hold yet: still nothing.
    feed(4_000, 30_000, 0.0, &mut totals);
    assert_eq!(engine.status(false, false).pressure.state, pressure::State::Holding);
    assert_eq!(engine.reconcile(request(2, 5, high.clone())).unwrap().pinned_bytes, 0);
    // Calm for the hold: the ceiling lifts and the next reconcile pins again.
    feed(30_500, 40_000, 0.0, &mut totals);
    let status = engine.status(false, false);
    assert_eq!((status.pressure.state, status.pressure.ceiling_bytes), (pressure::State::Calm, None));
    assert!(status.pressure.last_take_back.is_some());
    assert_eq!(engine.reconcile(request(2, 5, high)).unwrap().pinned_bytes, 8 * MIB as u64);
    engine.release_all();
}
