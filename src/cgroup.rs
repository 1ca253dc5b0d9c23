//! The memory limit of the container (Linux cgroup) we run in, and how much of it is still
//! available. Pure logic: the text of the cgroup files in, figures out (`sys::os` reads them).
//!
//! Why not the plain "limit - usage": a cgroup's usage counts its page cache, and ComfyUI reads
//! every checkpoint through the page cache. After loading a 20 GB model, "limit - usage" says
//! the machine is nearly full while the kernel could hand those clean file pages back at once.
//! Counting them as used made Viking see memory pressure that was not there and pin nothing.
//! So, like the kernel's own MemAvailable, the reclaimable file pages count as available.
//! A limit only counts where it is below the machine's RAM: a cgroup without a limit (the
//! root, or a systemd slice) says nothing that /proc/meminfo does not.

/// One level of the cgroup tree, from our own cgroup up to the root.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Level {
    /// The memory limit; `None` when the file says "max" or is absent.
    pub limit: Option<u64>,
    pub usage: u64,
    /// Clean page-cache pages the kernel can drop (active + inactive file LRU lists; tmpfs
    /// pages sit on the anonymous lists, so they are not in here).
    pub reclaimable_file: u64,
}

/// The tightest container limit and what is available under it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Container {
    pub limit: u64,
    pub available: u64,
}

/// The binding container among `levels`, or `None` when no level limits us below `total_ram`.
/// Every level with a limit constrains us, so the smallest limit and the smallest room win.
pub fn container(levels: &[Level], total_ram: u64) -> Option<Container> {
    let limited: Vec<Container> = levels
        .iter()
        .filter_map(|level| {
            let limit = level.limit.filter(|&limit| limit < total_ram)?;
            let in_use = level.usage.saturating_sub(level.reclaimable_file);
            Some(Container { limit, available: limit.saturating_sub(in_use) })
        })
        .collect();
    Some(Container {
        limit: limited.iter().map(|c| c.limit).min()?,
        available: limited.iter().map(|c| c.available).min()?,
    })
}

/// A number of a cgroup limit file: bytes, or `None` for "max" (v2) or a value no machine has
/// (v1 writes 2^63 rounded down to a page for "no limit").
pub fn parse_limit(text: &str) -> Option<u64> {
    let value: u64 = text.trim().parse().ok()?;
    (value < 1 << 60).then_some(value)
}

/// The value of `key` in a memory.stat text ("key value" per line).
pub fn stat_value(stat: &str, key: &str) -> Option<u64> {
    stat.lines().find_map(|line| {
        let (name, value) = line.split_once(' ')?;
        (name == key).then(|| value.trim().parse().ok()).flatten()
    })
}

/// Reclaimable file pages from a memory.stat: cgroup v1 names its hierarchical counters
/// `total_*`, v2 has only the plain names.
pub fn reclaimable_file(stat: &str) -> u64 {
    let pick = |name: &str| stat_value(stat, &format!("total_{name}")).or_else(|| stat_value(stat, name)).unwrap_or(0);
    pick("inactive_file") + pick("active_file")
}

/// Where our memory cgroup lies, from /proc/self/cgroup: the v2 path ("0::/a/b") or the v1
/// memory controller's ("4:memory:/a/b"). v1 wins when both appear: on a hybrid system the
/// memory controller is bound to v1.
pub fn memory_cgroup_path(proc_self_cgroup: &str) -> Option<(CgroupVersion, String)> {
    let mut v2 = None;
    for line in proc_self_cgroup.lines() {
        let mut fields = line.splitn(3, ':');
        let (_, controllers, path) = (fields.next()?, fields.next()?, fields.next()?);
        if controllers.split(',').any(|c| c == "memory") {
            return Some((CgroupVersion::V1, path.to_string()));
        }
        if controllers.is_empty() {
            v2 = Some((CgroupVersion::V2, path.to_string()));
        }
    }
    v2
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CgroupVersion {
    V1,
    V2,
}

impl CgroupVersion {
    /// The limit files (the tightest binds: v2's memory.high throttles the cgroup with reclaim,
    /// which pinned pages cannot answer), the usage file and the stat file of this version.
    pub fn files(self) -> (&'static [&'static str], &'static str, &'static str) {
        match self {
            CgroupVersion::V1 => (&["memory.limit_in_bytes"], "memory.usage_in_bytes", "memory.stat"),
            CgroupVersion::V2 => (&["memory.max", "memory.high"], "memory.current", "memory.stat"),
        }
    }
}

/// Where the hierarchy of `version` is mounted, from /proc/self/mountinfo: (the mount point,
/// the hierarchy path the mount shows as its root). Inside a container the root is often the
/// container's own cgroup ("/docker/abc"), not the hierarchy's root.
pub fn mount_of(mountinfo: &str, version: CgroupVersion) -> Option<(String, String)> {
    mountinfo.lines().find_map(|line| {
        // "id parent major:minor root mount-point options [optional...] - fstype source super-options"
        let (left, right) = line.split_once(" - ")?;
        let left: Vec<&str> = left.split(' ').collect();
        let right: Vec<&str> = right.split(' ').collect();
        let (root, mount_point, fstype) = (*left.get(3)?, *left.get(4)?, *right.first()?);
        let wanted = match version {
            CgroupVersion::V1 => fstype == "cgroup" && right.get(2)?.split(',').any(|o| o == "memory"),
            CgroupVersion::V2 => fstype == "cgroup2",
        };
        wanted.then(|| (mount_point.to_string(), root.to_string()))
    })
}

/// The cgroup directories to read, relative to the mount, from our own cgroup up to the mount's
/// root ("a/b", "a", ""). `path` is ours as /proc/self/cgroup gives it; `mount_root` is the part
/// of the hierarchy the mount shows (see `mount_of`). Levels above the mount cannot be read.
pub fn ancestors(path: &str, mount_root: &str) -> Vec<String> {
    let parts = |p: &str| p.split('/').filter(|s| !s.is_empty()).map(str::to_string).collect::<Vec<_>>();
    let (mut ours, root) = (parts(path), parts(mount_root));
    if ours.starts_with(&root) {
        ours.drain(..root.len());
    }
    (0..=ours.len()).rev().map(|n| ours[..n].join("/")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    #[test]
    fn page_cache_counts_as_available() {
        // The CI machine: 24 GiB, no limit of its own on the root, 19 GiB of it page cache.
        let level = Level { limit: Some(16 * GIB), usage: 15 * GIB, reclaimable_file: 12 * GIB };
        let got = container(&[level], 24 * GIB).unwrap();
        assert_eq!(got, Container { limit: 16 * GIB, available: 13 * GIB });
    }

    #[test]
    fn no_limit_below_ram_means_no_container() {
        let unlimited = Level { limit: None, usage: 20 * GIB, reclaimable_file: 0 };
        let v1_no_limit = Level { limit: parse_limit("9223372036854771712"), usage: 20 * GIB, reclaimable_file: 0 };
        let above_ram = Level { limit: Some(64 * GIB), usage: 20 * GIB, reclaimable_file: 0 };
        assert_eq!(container(&[unlimited, v1_no_limit, above_ram], 24 * GIB), None);
    }

    #[test]
    fn the_tightest_level_wins() {
        let inner = Level { limit: Some(8 * GIB), usage: 2 * GIB, reclaimable_file: 0 };
        let outer = Level { limit: Some(12 * GIB), usage: 11 * GIB, reclaimable_file: GIB / 2 };
        let got = container(&[inner, outer], 32 * GIB).unwrap();
        assert_eq!(got, Container { limit: 8 * GIB, available: 3 * GIB / 2 });
    }

    #[test]
    fn usage_above_limit_leaves_nothing() {
        let level = Level { limit: Some(4 * GIB), usage: 5 * GIB, reclaimable_file: 0 };
        assert_eq!(container(&[level], 8 * GIB).unwrap().available, 0);
    }

    #[test]
    fn parses_limits_and_stats_of_both_versions() {
        assert_eq!(parse_limit("max\n"), None);
        assert_eq!(parse_limit("8589934592\n"), Some(8 * GIB));
        assert_eq!(parse_limit("9223372036854771712"), None);
        let v1 = "cache 100\nrss 5\ninactive_file 1\nactive_file 2\ntotal_inactive_file 40\ntotal_active_file 60\n";
        assert_eq!(reclaimable_file(v1), 100);
        let v2 = "anon 5\nfile 100\nactive_file 30\ninactive_file 70\nshmem 0\n";
        assert_eq!(reclaimable_file(v2), 100);
        assert_eq!(reclaimable_file(""), 0);
        assert_eq!(stat_value("active_file_x 3\nactive_file 7", "active_file"), Some(7));
    }

    #[test]
    fn finds_the_memory_cgroup() {
        let v1 = "9:name=systemd:/\n4:memory:/process_api/abc\n0::/\n";
        assert_eq!(memory_cgroup_path(v1), Some((CgroupVersion::V1, "/process_api/abc".into())));
        let v2 = "0::/user.slice/comfy.service\n";
        assert_eq!(memory_cgroup_path(v2), Some((CgroupVersion::V2, "/user.slice/comfy.service".into())));
        assert_eq!(memory_cgroup_path("3:cpu,cpuacct:/x\n"), None);
        assert_eq!(memory_cgroup_path("5:cpuacct,memory:/y\n"), Some((CgroupVersion::V1, "/y".into())));
    }

    #[test]
    fn ancestors_run_from_our_cgroup_to_the_mount_root() {
        assert_eq!(ancestors("/a/b", "/"), vec!["a/b", "a", ""]);
        assert_eq!(ancestors("/", "/"), vec![""]);
        // A container whose mount shows only its own cgroup.
        assert_eq!(ancestors("/docker/abc", "/docker/abc"), vec![""]);
        assert_eq!(ancestors("/docker/abc/worker", "/docker/abc"), vec!["worker", ""]);
        // A path outside the mount's root (cgroup namespaces): read from the mount root down.
        assert_eq!(ancestors("/x", "/docker/abc"), vec!["x", ""]);
    }

    #[test]
    fn finds_the_cgroup_mounts() {
        let mountinfo = "31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n\
            33 31 0:30 / /sys/fs/cgroup/cpu,cpuacct rw,relatime shared:9 - cgroup cgroup rw,cpu,cpuacct\n\
            35 31 0:32 /docker/abc /sys/fs/cgroup/memory rw,relatime shared:11 - cgroup cgroup rw,memory\n\
            40 23 0:40 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw,nsdelegate\n";
        assert_eq!(mount_of(mountinfo, CgroupVersion::V1), Some(("/sys/fs/cgroup/memory".into(), "/docker/abc".into())));
        assert_eq!(mount_of(mountinfo, CgroupVersion::V2), Some(("/sys/fs/cgroup/unified".into(), "/".into())));
        assert_eq!(mount_of("", CgroupVersion::V2), None);
    }
}
