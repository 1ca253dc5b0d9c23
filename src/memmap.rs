//! What kind of memory a byte range is, from the text of Linux's /proc/self/maps, and how much
//! of it is in RAM or swapped, from /proc/self/pagemap entries.
//! Pure: the reading of the files lives in `sys::os`.
//!
//! Why it matters: registering a *private read-only file mapping* with cuMemHostRegister hung
//! for more than 90 s on an H200 (driver 580, flags PORTABLE|READ_ONLY). Such memory must never
//! reach CUDA.

use serde::Serialize;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum MemoryKind {
    /// Private anonymous memory: heap, malloc'd or mmap'd tensors. What weights normally are.
    Anonymous,
    /// A private writable file mapping (copy-on-write): registering copies the pages in.
    PrivateFile,
    /// A shared writable mapping (/dev/shm, torch shared memory, MAP_SHARED files).
    SharedWritable,
    /// Anything not writable: read-only file mappings (safetensors mmap) and the like.
    ReadOnly,
    /// Kernel and device mappings ([vvar], [vdso], /dev/nvidia*): never pin.
    Special,
    /// Not mapped at all (a bad pointer, or freed memory).
    Unmapped,
}

impl MemoryKind {
    /// Rank for a range that spans several mappings: the worst one decides.
    fn badness(self) -> u8 {
        match self {
            MemoryKind::Anonymous => 0,
            MemoryKind::PrivateFile => 1,
            MemoryKind::SharedWritable => 2,
            MemoryKind::ReadOnly => 3,
            MemoryKind::Special => 4,
            MemoryKind::Unmapped => 5,
        }
    }
    /// Host memory that a lock can hold at all.
    pub fn is_host_memory(self) -> bool {
        !matches!(self, MemoryKind::Special | MemoryKind::Unmapped)
    }
}

/// One line of a maps text. Its strings borrow from the text: a reconcile parses thousands of
/// lines (torch's libraries) and must not allocate for each.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mapping<'a> {
    pub start: u64,
    pub end: u64,
    pub readable: bool,
    pub writable: bool,
    pub shared: bool,
    /// Where the mapping starts in its file, and the file's device ("major:minor", hex) and
    /// inode (0 for anonymous memory).
    pub offset: u64,
    pub device: &'a str,
    pub inode: u64,
    pub path: Option<&'a str>,
}

impl Mapping<'_> {
    pub fn kind(&self) -> MemoryKind {
        let path = self.path.unwrap_or("");
        let special = path.starts_with("/dev/") && !path.starts_with("/dev/shm")
            || matches!(path, "[vvar]" | "[vdso]" | "[vsyscall]" | "[vvar_vclock]");
        if special {
            MemoryKind::Special
        } else if !self.writable || !self.readable {
            MemoryKind::ReadOnly
        } else if self.shared {
            MemoryKind::SharedWritable
        } else if self.inode != 0 {
            MemoryKind::PrivateFile
        } else {
            MemoryKind::Anonymous
        }
    }
}

/// Parses one line: `start-end perms offset dev inode [path]`. `None` for a malformed line.
pub fn parse_line(line: &str) -> Option<Mapping<'_>> {
    let mut fields = line.splitn(6, ' ');
    let (start, end) = fields.next()?.split_once('-')?;
    let perms = fields.next()?.as_bytes();
    let offset = u64::from_str_radix(fields.next()?, 16).ok()?;
    let device = fields.next()?;
    let inode = fields.next()?.parse().ok()?;
    let path = fields.next().map(str::trim).filter(|p| !p.is_empty());
    if perms.len() < 4 {
        return None;
    }
    let (start, end) = (u64::from_str_radix(start, 16).ok()?, u64::from_str_radix(end, 16).ok()?);
    if end <= start {
        return None;
    }
    Some(Mapping { start, end, readable: perms[0] == b'r', writable: perms[1] == b'w', shared: perms[3] == b's', offset, device, inode, path })
}

/// All mappings of a maps text, sorted by start. Malformed lines are skipped.
pub fn parse(text: &str) -> Vec<Mapping<'_>> {
    let mut mappings: Vec<Mapping<'_>> = text.lines().filter_map(parse_line).collect();
    mappings.sort_by_key(|m| m.start);
    mappings
}

/// The kind of `[addr, addr+len)`: the worst kind among the mappings it touches, `Unmapped` if
/// any byte lies in no mapping. `mappings` must be sorted by start (as `parse` returns them).
pub fn classify(mappings: &[Mapping<'_>], addr: u64, len: u64) -> MemoryKind {
    let Some(end) = addr.checked_add(len) else { return MemoryKind::Unmapped };
    if len == 0 {
        return MemoryKind::Unmapped;
    }
    // First mapping that ends after addr.
    let mut index = mappings.partition_point(|m| m.end <= addr);
    let mut cursor = addr;
    let mut worst = MemoryKind::Anonymous;
    while cursor < end {
        let Some(mapping) = mappings.get(index) else { return MemoryKind::Unmapped };
        if mapping.start > cursor {
            return MemoryKind::Unmapped; // a hole
        }
        let kind = mapping.kind();
        if kind.badness() > worst.badness() {
            worst = kind;
        }
        cursor = mapping.end;
        index += 1;
    }
    worst
}

/// Which part of which file a range of a private writable file mapping shows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileSlice {
    pub path: String,
    pub device: String,
    pub inode: u64,
    /// Where the range's first byte lies in the file.
    pub offset: u64,
}

/// The file behind `[addr, addr+len)` when the whole range lies in one private writable file
/// mapping (`MemoryKind::PrivateFile`) whose file still has a path: what a shared read-only
/// view of the same pages needs. `None` for anything else (a range across mappings, a file
/// deleted since it was mapped). `mappings` sorted by start.
pub fn private_file_slice(mappings: &[Mapping<'_>], addr: u64, len: u64) -> Option<FileSlice> {
    let end = addr.checked_add(len)?;
    let mapping = mappings.get(mappings.partition_point(|m| m.end <= addr))?;
    let path = mapping.path?;
    let whole = mapping.start <= addr && end <= mapping.end && len > 0;
    if !whole || mapping.kind() != MemoryKind::PrivateFile || !path.starts_with('/') || path.ends_with(" (deleted)") {
        return None;
    }
    let offset = mapping.offset.checked_add(addr - mapping.start)?;
    Some(FileSlice { path: path.to_owned(), device: mapping.device.to_owned(), inode: mapping.inode, offset })
}

/// Whether a private file mapping's pages, from their pagemap entries, all still show the file
/// (none copied on write yet): present pages must be file pages (bit 61), and none swapped (a
/// file page is never swapped, a copied one can be).
pub fn no_page_copied(entries: &[u64]) -> bool {
    entries.iter().all(|&e| e >> 62 & 1 == 0 && (e >> 63 == 0 || e >> 61 & 1 == 1))
}

/// One region as Windows' VirtualQuery describes it (MEMORY_BASIC_INFORMATION): its State,
/// Protect and Type fields.
/// (Built everywhere so its rules are unit-tested on Linux too; used only on Windows.)
#[cfg_attr(not(windows), allow(dead_code))]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WindowsRegion {
    pub state: u32,
    pub protect: u32,
    pub kind: u32,
}

#[cfg_attr(not(windows), allow(dead_code))]
impl WindowsRegion {
    pub const MEM_COMMIT: u32 = 0x1000;
    pub const MEM_PRIVATE: u32 = 0x2_0000;
    pub const MEM_MAPPED: u32 = 0x4_0000;
    pub const MEM_IMAGE: u32 = 0x100_0000;
    const PAGE_NOACCESS: u32 = 0x01;
    const PAGE_WRITECOPY: u32 = 0x08;
    const PAGE_EXECUTE_WRITECOPY: u32 = 0x80;
    const PAGE_GUARD: u32 = 0x100;
    const WRITABLE: u32 = 0x04 | 0x08 | 0x40 | 0x80; // READWRITE, WRITECOPY, EXECUTE_READWRITE, EXECUTE_WRITECOPY

    /// The kind of memory, as `Mapping::kind` says it for Linux: a view of a file (MEM_MAPPED,
    /// MEM_IMAGE) that is not writable is read-only file memory, which CUDA must never take
    /// (ComfyUI-GGUF's read-only numpy memmap, a safetensors mapping). A committed region of a
    /// type Windows does not document is not pinned.
    pub fn memory_kind(self) -> MemoryKind {
        let writable = self.protect & Self::WRITABLE != 0;
        if self.state != Self::MEM_COMMIT {
            MemoryKind::Unmapped
        } else if self.protect & (Self::PAGE_GUARD | Self::PAGE_NOACCESS) != 0 || self.protect == 0 {
            MemoryKind::Special
        } else if !writable {
            MemoryKind::ReadOnly
        } else {
            match self.kind {
                Self::MEM_PRIVATE => MemoryKind::Anonymous, // heap, VirtualAlloc
                Self::MEM_MAPPED | Self::MEM_IMAGE if self.protect & (Self::PAGE_WRITECOPY | Self::PAGE_EXECUTE_WRITECOPY) != 0 => MemoryKind::PrivateFile,
                Self::MEM_MAPPED | Self::MEM_IMAGE => MemoryKind::SharedWritable,
                _ => MemoryKind::Special,
            }
        }
    }
}

/// The kind of a range that spans these regions (in address order, covering it): the worst.
#[cfg_attr(not(windows), allow(dead_code))]
pub fn classify_windows(regions: &[WindowsRegion]) -> MemoryKind {
    regions.iter().map(|r| r.memory_kind()).max_by_key(|k| k.badness()).unwrap_or(MemoryKind::Unmapped)
}

/// Counts the pages of a slice of /proc/PID/pagemap entries: (present in RAM, swapped out).
/// Bit 63 of an entry: page present; bit 62: page swapped (Documentation/admin-guide/mm/pagemap).
pub fn count_pagemap(entries: &[u64]) -> (u64, u64) {
    entries.iter().fold((0, 0), |(present, swapped), &e| (present + (e >> 63), swapped + ((e >> 62) & 1)))
}

/// What one read of an owner's pages found: its wanted ranges' resident and swapped bytes, and
/// the swapped bytes of its pins that lie inside those ranges.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Residency {
    pub resident_bytes: u64,
    pub swapped_bytes: u64,
    pub pinned_swapped_bytes: u64,
}

/// Reads the pagemap entries of `[addr, addr + len)`, handing them to the visitor in chunks as
/// (first page number, entries); `None` where pagemap cannot be read.
pub type PagemapReader<'a> = dyn FnMut(u64, u64, &mut dyn FnMut(u64, &[u64])) -> Option<()> + 'a;

/// Counts `ranges` (sorted, not overlapping) and the pins inside them in one read of each page:
/// a status with the whole model pinned reads its page tables once, not twice. `pins` are sorted
/// by address; those not inside one range (file pages Viking maps itself) come back for a read
/// of their own. A page counts for every range or pin it overlaps; each figure is capped at the
/// bytes it describes.
pub fn residency_in_one_pass(
    page: u64,
    ranges: &[(u64, u64)],
    pins: &[(u64, u64)],
    read: &mut PagemapReader<'_>,
) -> Option<(Residency, Vec<(u64, u64)>)> {
    let mut found = Residency::default();
    let mut outside = Vec::new();
    let mut next_pin = 0;
    for &(start, len) in ranges {
        let end = start + len;
        while next_pin < pins.len() && pins[next_pin].0 < start {
            outside.push(pins[next_pin]);
            next_pin += 1;
        }
        let mut inside = Vec::new();
        while next_pin < pins.len() && pins[next_pin].0 < end {
            let pin = pins[next_pin];
            if pin.0 + pin.1 <= end { inside.push(pin) } else { outside.push(pin) }
            next_pin += 1;
        }
        let pages = |(addr, len): (u64, u64)| (addr / page, (addr + len).div_ceil(page));
        let mut swapped_in_pin = vec![0u64; inside.len()];
        let (mut present, mut swapped, mut first_open) = (0, 0, 0);
        read(start, len, &mut |first_page, entries| {
            let (chunk_present, chunk_swapped) = count_pagemap(entries);
            present += chunk_present;
            swapped += chunk_swapped;
            let chunk_end = first_page + entries.len() as u64;
            // Pins before `first_open` end before this chunk (chunks come in address order).
            for (i, &pin) in inside.iter().enumerate().skip(first_open) {
                let (pin_first, pin_last) = pages(pin);
                if pin_last <= first_page {
                    first_open = i + 1;
                    continue;
                }
                if pin_first >= chunk_end {
                    break;
                }
                let slice = &entries[(pin_first.max(first_page) - first_page) as usize..(pin_last.min(chunk_end) - first_page) as usize];
                swapped_in_pin[i] += count_pagemap(slice).1;
            }
        })?;
        found.resident_bytes += (present * page).min(len);
        found.swapped_bytes += (swapped * page).min(len);
        found.pinned_swapped_bytes += inside.iter().zip(&swapped_in_pin).map(|(pin, &n)| (n * page).min(pin.1)).sum::<u64>();
    }
    outside.extend_from_slice(&pins[next_pin..]);
    Some((found, outside))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const MAPS: &str = "\
55d0c0a00000-55d0c0a21000 rw-p 00000000 00:00 0                          [heap]
7f0000000000-7f0000100000 rw-p 00000000 00:00 0 
7f0000100000-7f0000200000 r--p 00000000 fd:01 1234                       /models/flux.safetensors
7f0000200000-7f0000300000 rw-p 00000000 fd:01 1234                       /models/flux.safetensors
7f0000300000-7f0000400000 rw-s 00000000 00:05 77                         /dev/shm/torch_1_2
7f0000400000-7f0000500000 r--s 00000000 fd:01 99                         /data/shared.bin
7f0000600000-7f0000700000 rw-s 00000000 00:05 12                         /dev/nvidia0
7ffd5a1f0000-7ffd5a1f4000 r--p 00000000 00:00 0                          [vvar]
7ffd5a1f4000-7ffd5a1f6000 r-xp 00000000 00:00 0                          [vdso]
";

    #[test]
    fn parses_every_line_kind() {
        let maps = parse(MAPS);
        assert_eq!(maps.len(), 9);
        let kinds: Vec<_> = maps.iter().map(Mapping::kind).collect();
        use MemoryKind::*;
        assert_eq!(kinds, [Anonymous, Anonymous, ReadOnly, PrivateFile, SharedWritable, ReadOnly, Special, Special, Special]);
        assert_eq!(maps[2].path, Some("/models/flux.safetensors"));
        assert_eq!(maps[1].path, None);
        assert_eq!((maps[3].offset, maps[3].device, maps[3].inode), (0, "fd:01", 1234));
    }

    #[test]
    fn a_private_file_range_names_its_file_slice() {
        let text = MAPS.replace("7f0000200000-7f0000300000 rw-p 00000000", "7f0000200000-7f0000300000 rw-p 00003000");
        let maps = parse(&text);
        let slice = private_file_slice(&maps, 0x7f0000210010, 0x100).unwrap();
        assert_eq!(slice, FileSlice { path: "/models/flux.safetensors".into(), device: "fd:01".into(), inode: 1234, offset: 0x13010 });
        assert_eq!(private_file_slice(&maps, 0x7f00002ff000, 0x2000), None, "runs past the mapping");
        assert_eq!(private_file_slice(&maps, 0x7f0000100000, 0x100), None, "read-only");
        assert_eq!(private_file_slice(&maps, 0x7f0000000000, 0x100), None, "anonymous");
        assert_eq!(private_file_slice(&maps, 0x7f0000200000, 0), None, "empty");
        let deleted = parse("7f0000200000-7f0000300000 rw-p 00000000 fd:01 1234   /models/a.safetensors (deleted)\n");
        assert_eq!(private_file_slice(&deleted, 0x7f0000200000, 0x100), None);
    }

    #[test]
    fn copied_pages_are_seen_in_pagemap_entries() {
        let (file_page, absent, copied, swapped) = (1u64 << 63 | 1 << 61, 0u64, 1u64 << 63, 1u64 << 62);
        assert!(no_page_copied(&[file_page, absent, file_page]));
        assert!(!no_page_copied(&[file_page, copied]));
        assert!(!no_page_copied(&[absent, swapped]));
        assert!(no_page_copied(&[]));
    }

    #[test]
    fn classify_takes_the_worst_and_sees_holes() {
        let maps = parse(MAPS);
        assert_eq!(classify(&maps, 0x7f0000000000, 0x1000), MemoryKind::Anonymous);
        assert_eq!(classify(&maps, 0x7f00000ff000, 0x2000), MemoryKind::ReadOnly); // anon + read-only file
        assert_eq!(classify(&maps, 0x7f0000200000, 0x100000), MemoryKind::PrivateFile);
        assert_eq!(classify(&maps, 0x7f0000480000, 0x100000), MemoryKind::Unmapped); // runs into a hole
        assert_eq!(classify(&maps, 0x1000, 0x10), MemoryKind::Unmapped);
        assert_eq!(classify(&maps, u64::MAX - 1, 16), MemoryKind::Unmapped); // wraps
        assert_eq!(classify(&maps, 0x7f0000000000, 0), MemoryKind::Unmapped);
    }

    #[test]
    fn malformed_lines_are_skipped() {
        for line in ["", "garbage", "zz-10 rw-p 0 0 0", "10-5 rw-p 0 00:00 0", "10-20 rw 0 00:00 0", "10-20 rw-p 0 00:00 x"] {
            assert_eq!(parse_line(line), None, "{line:?}");
        }
    }

    #[test]
    fn pagemap_bits() {
        let present = 1u64 << 63;
        let swapped = 1u64 << 62;
        assert_eq!(count_pagemap(&[present | 0x1234, swapped | 7, 0, present]), (2, 1));
    }

    /// A fake pagemap: page `n`'s entry is `flags[n]`, handed out in chunks of `chunk` pages.
    fn fake_reader(flags: &[u64], chunk: usize, page: u64) -> Box<PagemapReader<'_>> {
        Box::new(move |addr: u64, len: u64, visit: &mut dyn FnMut(u64, &[u64])| {
            let (first, last) = ((addr / page) as usize, (addr + len).div_ceil(page) as usize);
            if last > flags.len() {
                return None;
            }
            let mut at = first;
            while at < last {
                let stop = (at + chunk).min(last);
                visit(at as u64, &flags[at..stop]);
                at = stop;
            }
            Some(())
        })
    }

    /// What the status read before: each range and each pin read on its own.
    fn separate_reads(flags: &[u64], page: u64, ranges: &[(u64, u64)], pins: &[(u64, u64)]) -> (Residency, u64) {
        let count = |(addr, len): (u64, u64)| {
            let (present, swapped) = count_pagemap(&flags[(addr / page) as usize..(addr + len).div_ceil(page) as usize]);
            ((present * page).min(len), (swapped * page).min(len))
        };
        let inside = |&(addr, len): &(u64, u64)| ranges.iter().any(|&(s, l)| addr >= s && addr + len <= s + l);
        let mut found = Residency::default();
        for &range in ranges {
            let (present, swapped) = count(range);
            found.resident_bytes += present;
            found.swapped_bytes += swapped;
        }
        found.pinned_swapped_bytes = pins.iter().filter(|p| inside(p)).map(|&p| count(p).1).sum();
        (found, pins.iter().filter(|p| !inside(p)).map(|&p| count(p).1).sum())
    }

    #[test]
    fn one_pass_counts_pins_inside_and_returns_the_rest() {
        let (present, swapped) = (1u64 << 63, 1u64 << 62);
        let page = 4096;
        // pages 0..8: present, swapped, present, absent, swapped, swapped, present, swapped
        let flags = [present, swapped, present, 0, swapped, swapped, present, swapped];
        let ranges = [(0, 4 * page), (4 * page, 2 * page + 100)];
        let pins = [(page, page), (3 * page, 2 * page), (4 * page, page), (7 * page, page)];
        let mut read = fake_reader(&flags, 3, page);
        let (found, outside) = residency_in_one_pass(page, &ranges, &pins, &mut *read).unwrap();
        assert_eq!(found, Residency { resident_bytes: 2 * page + page, swapped_bytes: page + 2 * page, pinned_swapped_bytes: 2 * page });
        // the pin over both ranges and the one past them are left for a read of their own
        assert_eq!(outside, vec![(3 * page, 2 * page), (7 * page, page)]);
        let mut unreadable = |_: u64, _: u64, _: &mut dyn FnMut(u64, &[u64])| None;
        assert_eq!(residency_in_one_pass(page, &ranges, &pins, &mut unreadable), None);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(crate::fuzz_cases()))]
        #[test]
        fn parser_never_panics(text in "\\PC{0,200}") {
            let maps = parse(&text);
            for m in &maps { prop_assert!(m.start < m.end); }
            let _ = classify(&maps, 0x1000, 0x1000);
        }

        #[test]
        fn one_pass_matches_separate_reads(
            flags in proptest::collection::vec(prop_oneof![Just(0u64), Just(1u64 << 63), Just(1u64 << 62)], 1..64),
            cuts in proptest::collection::vec((0u64..64 * 16, 1u64..8 * 16), 0..6),
            pin_cuts in proptest::collection::vec((0u64..64 * 16, 1u64..4 * 16), 0..8),
            chunk in 1usize..9,
        ) {
            // Addresses in units of 1/16 page, so spans start and end inside pages too.
            let page = 4096u64;
            let limit = flags.len() as u64 * page;
            let to_spans = |cuts: &[(u64, u64)]| {
                let mut spans: Vec<(u64, u64)> = cuts.iter().map(|&(a, l)| (a * page / 16, l * page / 16))
                    .filter(|&(a, l)| a + l <= limit).collect();
                spans.sort();
                // keep them apart: no two overlap
                let mut kept: Vec<(u64, u64)> = Vec::new();
                for span in spans {
                    if kept.last().is_none_or(|&(a, l)| a + l <= span.0) { kept.push(span) }
                }
                kept
            };
            let (ranges, pins) = (to_spans(&cuts), to_spans(&pin_cuts));
            let mut read = fake_reader(&flags, chunk, page);
            let (found, outside) = residency_in_one_pass(page, &ranges, &pins, &mut *read).unwrap();
            let (expected, outside_swapped) = separate_reads(&flags, page, &ranges, &pins);
            prop_assert_eq!(found, expected);
            let counted: u64 = outside.iter().map(|&(a, l)| {
                let swapped = count_pagemap(&flags[(a / page) as usize..(a + l).div_ceil(page) as usize]).1;
                (swapped * page).min(l)
            }).sum();
            prop_assert_eq!(counted, outside_swapped);
        }

        #[test]
        fn parser_gives_back_the_fields_of_a_well_formed_line(
            start in 0u64..1 << 47, len in 1u64..1 << 30, perms in "[r-][w-][x-][ps]", offset in any::<u32>(),
            device in "[0-9a-f]{2}:[0-9a-f]{2}", inode in any::<u32>(), path in proptest::option::of("/[a-z0-9_./ -]{0,40}[a-z]"),
        ) {
            let line = format!("{start:x}-{:x} {perms} {offset:08x} {device} {inode:<26} {}", start + len, path.as_deref().unwrap_or(""));
            let mapping = parse_line(&line).unwrap();
            let flags = perms.as_bytes();
            prop_assert_eq!((mapping.start, mapping.end, mapping.offset, mapping.inode), (start, start + len, offset as u64, inode as u64));
            prop_assert_eq!((mapping.readable, mapping.writable, mapping.shared), (flags[0] == b'r', flags[1] == b'w', flags[3] == b's'));
            prop_assert_eq!((mapping.device, mapping.path), (device.as_str(), path.as_deref()));
        }

        #[test]
        fn classify_inside_one_mapping_is_that_mapping(offset in 0u64..0x100000, len in 1u64..0x1000) {
            let maps = parse(MAPS);
            let start = 0x7f0000200000 + offset.min(0x100000 - len);
            prop_assert_eq!(classify(&maps, start, len), MemoryKind::PrivateFile);
        }
    }

    #[test]
    fn windows_regions_are_classified_like_linux_mappings() {
        let region = |state, protect, kind| WindowsRegion { state, protect, kind };
        let (commit, private, mapped, image) =
            (WindowsRegion::MEM_COMMIT, WindowsRegion::MEM_PRIVATE, WindowsRegion::MEM_MAPPED, WindowsRegion::MEM_IMAGE);
        assert_eq!(region(commit, 0x04, private).memory_kind(), MemoryKind::Anonymous); // heap
        assert_eq!(region(commit, 0x02, mapped).memory_kind(), MemoryKind::ReadOnly); // a read-only file view
        assert_eq!(region(commit, 0x20, image).memory_kind(), MemoryKind::ReadOnly); // code of a DLL
        assert_eq!(region(commit, 0x08, mapped).memory_kind(), MemoryKind::PrivateFile); // copy-on-write view
        assert_eq!(region(commit, 0x04, mapped).memory_kind(), MemoryKind::SharedWritable); // shared memory
        assert_eq!(region(0x2000, 0, private).memory_kind(), MemoryKind::Unmapped); // reserved only
        assert_eq!(region(commit, 0x104, private).memory_kind(), MemoryKind::Special); // guard page
        assert_eq!(region(commit, 0x04, 0x8_0000).memory_kind(), MemoryKind::Special); // a type Windows does not document
        // A range over heap and a read-only view is read-only: the worst decides.
        assert_eq!(classify_windows(&[region(commit, 0x04, private), region(commit, 0x02, mapped)]), MemoryKind::ReadOnly);
        assert_eq!(classify_windows(&[]), MemoryKind::Unmapped);
    }
}
