//! Pure arithmetic on byte spans `[start, stop)`: unions, coverage and differences. The engine
//! and the planner use these to compare what is wanted, what is pinned and what others pinned.

/// The union of `spans`, sorted and merged (touching spans merge too).
pub fn merge(spans: &[(u64, u64)]) -> Vec<(u64, u64)> {
    let mut spans: Vec<(u64, u64)> = spans.iter().copied().filter(|(start, stop)| stop > start).collect();
    spans.sort_unstable();
    let mut merged: Vec<(u64, u64)> = Vec::with_capacity(spans.len());
    for (start, stop) in spans {
        match merged.last_mut() {
            Some(last) if start <= last.1 => last.1 = last.1.max(stop),
            _ => merged.push((start, stop)),
        }
    }
    merged
}

/// Bytes in the union of `spans` (any order, overlaps counted once).
pub fn union_bytes(spans: &[(u64, u64)]) -> u64 {
    merge(spans).iter().map(|(start, stop)| stop - start).sum()
}

/// Whether every byte of `[start, stop)` lies in the union of `spans`.
pub fn covers(spans: &[(u64, u64)], start: u64, stop: u64) -> bool {
    let mut cursor = start;
    for (span_start, span_stop) in merge(spans) {
        if span_start > cursor {
            break;
        }
        cursor = cursor.max(span_stop);
        if cursor >= stop {
            return true;
        }
    }
    cursor >= stop
}

/// The bytes of `spans` that lie outside `holes`, merged and sorted.
pub fn subtract(spans: &[(u64, u64)], holes: &[(u64, u64)]) -> Vec<(u64, u64)> {
    let holes = merge(holes);
    let mut left = Vec::new();
    for (start, stop) in merge(spans) {
        let mut cursor = start;
        let first = holes.partition_point(|&(_, hole_stop)| hole_stop <= start);
        for &(hole_start, hole_stop) in &holes[first..] {
            if hole_start >= stop {
                break;
            }
            if hole_start > cursor {
                left.push((cursor, hole_start));
            }
            cursor = cursor.max(hole_stop);
        }
        if cursor < stop {
            left.push((cursor, stop));
        }
    }
    left
}

/// `(addr, len)` pairs as `[start, stop)` spans.
pub fn from_lengths(ranges: impl IntoIterator<Item = (u64, u64)>) -> Vec<(u64, u64)> {
    ranges.into_iter().map(|(addr, len)| (addr, addr.saturating_add(len))).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn examples() {
        assert_eq!(merge(&[(5, 15), (0, 10), (20, 30), (30, 31)]), vec![(0, 15), (20, 31)]);
        assert!(covers(&[(0, 10), (10, 20)], 5, 15));
        assert!(!covers(&[(0, 10), (11, 20)], 5, 15));
        assert_eq!(union_bytes(&[(0, 10), (5, 15), (20, 30)]), 25);
        assert_eq!(subtract(&[(0, 15), (12, 13), (30, 35)], &[(10, 20)]), vec![(0, 10), (30, 35)]);
    }

    /// Spans over a small address space, so that overlaps are common.
    fn arb_spans() -> impl Strategy<Value = Vec<(u64, u64)>> {
        proptest::collection::vec((0u64..200, 0u64..40), 0..12).prop_map(|v| v.into_iter().map(|(s, l)| (s, s + l)).collect())
    }

    /// The set of bytes a list of spans covers, byte by byte (the slow, obvious model).
    fn bytes_of(spans: &[(u64, u64)]) -> std::collections::BTreeSet<u64> {
        spans.iter().flat_map(|&(s, e)| s..e).collect()
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(crate::fuzz_cases()))]
        #[test]
        fn spans_agree_with_byte_sets(a in arb_spans(), b in arb_spans(), probe in (0u64..240, 0u64..40)) {
            let merged = merge(&a);
            // Merged spans are sorted, disjoint, not touching, and cover the same bytes.
            for pair in merged.windows(2) {
                prop_assert!(pair[0].1 < pair[1].0);
            }
            prop_assert_eq!(bytes_of(&merged), bytes_of(&a));
            prop_assert_eq!(union_bytes(&a), bytes_of(&a).len() as u64);
            let difference: std::collections::BTreeSet<u64> = bytes_of(&a).difference(&bytes_of(&b)).copied().collect();
            prop_assert_eq!(bytes_of(&subtract(&a, &b)), difference);
            let (start, stop) = (probe.0, probe.0 + probe.1);
            prop_assert_eq!(covers(&a, start, stop), (start..stop).all(|byte| bytes_of(&a).contains(&byte)));
        }
    }
}
