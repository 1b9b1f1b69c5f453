//! Block ids bound for the device pages (`kvblocks.device`): the checks a list of ids
//! passes before any page moves, and the facts about it that choose how pages move (runs of
//! consecutive ids, whether sources and destinations overlap).
//!
//! The Python module stages ids as `i64` in one persistent buffer and hands the slices
//! here; nothing in this file knows about pages, only about id lists.

use std::fmt;

/// Lists up to this long are checked for duplicates and overlaps pairwise (no sort, no
/// allocation); longer ones are sorted.
const PAIRWISE: usize = 32;

/// What a list of block ids must satisfy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IdRules {
    /// Every id must be below this (the block count of the pages or of the host pool).
    pub limit: u64,
    /// Destinations: no id may appear twice.
    pub unique: bool,
    /// Device destinations while the null block is protected: id 0 may not appear.
    pub forbid_null: bool,
}

/// Why a list of block ids was refused. Checked in this order: range, duplicates, null
/// block (the order `kvblocks.device` has always reported them in).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IdError {
    /// An id below 0 or at/above the limit (the smallest if negative, else the largest).
    OutOfRange {
        /// The offending id.
        id: i64,
        /// The limit it breaks.
        limit: u64,
    },
    /// An id present twice in a list that must be unique (the smallest such id).
    Duplicate(i64),
    /// Block 0 in a list of device destinations while the null block is protected.
    NullBlock,
}

impl fmt::Display for IdError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            IdError::OutOfRange { id, limit } => {
                write!(f, "block id {id} out of range [0, {limit})")
            }
            IdError::Duplicate(id) => write!(f, "duplicate destination block id {id}"),
            IdError::NullBlock => write!(
                f,
                "block 0 is the null block and is never written \
                 (protect_null_block=False allows it)"
            ),
        }
    }
}

/// Checks `ids` against `rules`.
///
/// ```
/// use kvblocks::device_ids::{check, IdError, IdRules};
/// let dst = IdRules { limit: 8, unique: true, forbid_null: true };
/// assert_eq!(check(&[3, 1, 7], dst), Ok(()));
/// assert_eq!(check(&[3, 8], dst), Err(IdError::OutOfRange { id: 8, limit: 8 }));
/// assert_eq!(check(&[3, 3], dst), Err(IdError::Duplicate(3)));
/// assert_eq!(check(&[0, 3], dst), Err(IdError::NullBlock));
/// ```
pub fn check(ids: &[i64], rules: IdRules) -> Result<(), IdError> {
    let (Some(&min), Some(&max)) = (ids.iter().min(), ids.iter().max()) else {
        return Ok(());
    };
    let limit = rules.limit;
    if min < 0 {
        return Err(IdError::OutOfRange { id: min, limit });
    }
    if max as u64 >= limit {
        return Err(IdError::OutOfRange { id: max, limit });
    }
    if rules.unique {
        if let Some(id) = duplicate(ids) {
            return Err(IdError::Duplicate(id));
        }
    }
    if rules.forbid_null && min == 0 {
        return Err(IdError::NullBlock);
    }
    Ok(())
}

/// The smallest id present twice, if any (ids are in `0..limit`, checked).
fn duplicate(ids: &[i64]) -> Option<i64> {
    if ids.len() <= PAIRWISE {
        return ids
            .iter()
            .enumerate()
            .filter(|&(i, a)| ids[i + 1..].contains(a))
            .map(|(_, &a)| a)
            .min();
    }
    if let Some(mut seen) = Bitmap::spanning(ids) {
        // The smallest duplicate, as the sorted path finds it.
        return ids.iter().filter(|&&id| !seen.insert(id)).min().copied();
    }
    let mut sorted = ids.to_vec();
    sorted.sort_unstable();
    sorted.windows(2).find(|w| w[0] == w[1]).map(|w| w[0])
}

/// One bit per id between the smallest and the largest of a list, when that span is at
/// most 64 ids per list entry (then cheaper than sorting).
struct Bitmap {
    base: i64,
    bits: Vec<u64>,
}

impl Bitmap {
    fn spanning(ids: &[i64]) -> Option<Self> {
        let (&min, &max) = (ids.iter().min()?, ids.iter().max()?);
        let span = u64::try_from(max.checked_sub(min)?).ok()? / 64 + 1;
        (span <= ids.len() as u64).then(|| Bitmap {
            base: min,
            bits: vec![0; span as usize],
        })
    }

    /// Whether `id` is marked (false outside the span).
    fn contains(&self, id: i64) -> bool {
        let Some(at) = id
            .checked_sub(self.base)
            .and_then(|at| usize::try_from(at).ok())
        else {
            return false;
        };
        self.bits
            .get(at / 64)
            .is_some_and(|word| word & (1u64 << (at % 64)) != 0)
    }

    /// Marks `id` (within the span); false if it was marked already.
    fn insert(&mut self, id: i64) -> bool {
        let at = (id - self.base) as usize;
        let (word, bit) = (at / 64, 1u64 << (at % 64));
        let fresh = self.bits[word] & bit == 0;
        self.bits[word] |= bit;
        fresh
    }
}

/// Whether no id is in both lists.
pub fn disjoint(a: &[i64], b: &[i64]) -> bool {
    if a.len().min(b.len()) <= PAIRWISE {
        let (short, long) = if a.len() <= b.len() { (a, b) } else { (b, a) };
        if short.len() * long.len() <= PAIRWISE * PAIRWISE * 4 {
            return !short.iter().any(|x| long.contains(x));
        }
    }
    if let Some(mut in_b) = Bitmap::spanning(b) {
        b.iter().for_each(|&id| {
            in_b.insert(id);
        });
        return !a.iter().any(|&id| in_b.contains(id));
    }
    let mut sorted = b.to_vec();
    sorted.sort_unstable();
    !a.iter().any(|x| sorted.binary_search(x).is_ok())
}

/// `(position, length)` of the maximal runs in which every column advances by exactly 1
/// from one position to the next, or `None` when there are more than `most` runs. Columns
/// have equal lengths; none gives no runs.
///
/// ```
/// use kvblocks::device_ids::runs;
/// let src = [1, 2, 3, 9, 10];
/// let dst = [5, 6, 8, 9, 10];
/// assert_eq!(runs(&[&src, &dst], 8), Some(vec![(0, 2), (2, 1), (3, 2)]));
/// assert_eq!(runs(&[&src, &dst], 2), None);
/// ```
pub fn runs(columns: &[&[i64]], most: usize) -> Option<Vec<(usize, usize)>> {
    let n = columns.first().map_or(0, |c| c.len());
    let mut out = Vec::new();
    if n == 0 {
        return Some(out);
    }
    let mut start = 0;
    for i in 1..n {
        if columns
            .iter()
            .any(|c| c[i].checked_sub(c[i - 1]) != Some(1))
        {
            if out.len() + 1 >= most {
                return None;
            }
            out.push((start, i - start));
            start = i;
        }
    }
    out.push((start, n - start));
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const SRC: IdRules = IdRules {
        limit: 100,
        unique: false,
        forbid_null: false,
    };
    const DST: IdRules = IdRules {
        limit: 100,
        unique: true,
        forbid_null: true,
    };

    #[test]
    fn checks_in_order() {
        assert_eq!(check(&[], DST), Ok(()));
        assert_eq!(check(&[0, 0, 5], SRC), Ok(()));
        assert_eq!(
            check(&[-3, 200], DST),
            Err(IdError::OutOfRange { id: -3, limit: 100 })
        );
        assert_eq!(
            check(&[0, 0, 200], DST),
            Err(IdError::OutOfRange {
                id: 200,
                limit: 100
            })
        );
        assert_eq!(check(&[0, 4, 4], DST), Err(IdError::Duplicate(4)));
        assert_eq!(check(&[4, 0], DST), Err(IdError::NullBlock));
        assert_eq!(
            IdError::OutOfRange { id: 7, limit: 5 }.to_string(),
            "block id 7 out of range [0, 5)"
        );
    }

    #[test]
    fn runs_stop_counting_past_most() {
        assert_eq!(runs(&[], 4), Some(vec![]));
        assert_eq!(runs(&[&[4]], 1), Some(vec![(0, 1)]));
        assert_eq!(runs(&[&[1, 3, 5]], 3), Some(vec![(0, 1), (1, 1), (2, 1)]));
        assert_eq!(runs(&[&[1, 3, 5]], 2), None);
        assert_eq!(
            runs(&[&[i64::MAX, i64::MIN]], 4),
            Some(vec![(0, 1), (1, 1)])
        );
    }

    proptest! {
        #[test]
        fn match_naive(a in proptest::collection::vec(-2i64..120, 0..80),
                       b in proptest::collection::vec(0i64..120, 0..80),
                       most in 1usize..90) {
            let naive_dup = {
                let mut seen = std::collections::BTreeMap::new();
                for &x in &a { *seen.entry(x).or_insert(0) += 1; }
                seen.into_iter().find(|&(_, c)| c > 1).map(|(x, _)| x)
            };
            let expected = if a.iter().any(|&x| x < 0) {
                Err(IdError::OutOfRange { id: *a.iter().min().unwrap(), limit: 100 })
            } else if a.iter().any(|&x| x >= 100) {
                Err(IdError::OutOfRange { id: *a.iter().max().unwrap(), limit: 100 })
            } else if let Some(d) = naive_dup {
                Err(IdError::Duplicate(d))
            } else if a.contains(&0) {
                Err(IdError::NullBlock)
            } else {
                Ok(())
            };
            prop_assert_eq!(check(&a, DST), expected);
            prop_assert_eq!(disjoint(&a, &b), !a.iter().any(|x| b.contains(x)));
            let n = a.len().min(b.len());
            let (a, b) = (&a[..n], &b[..n]);
            let cuts: Vec<usize> = (1..n)
                .filter(|&i| a[i] - a[i - 1] != 1 || b[i] - b[i - 1] != 1)
                .collect();
            let expected = if n == 0 {
                Some(vec![])
            } else if cuts.len() + 1 > most {
                None
            } else {
                let starts: Vec<usize> = std::iter::once(0).chain(cuts.iter().copied()).collect();
                let ends: Vec<usize> = cuts.iter().copied().chain(std::iter::once(n)).collect();
                Some(starts.iter().zip(&ends).map(|(&s, &e)| (s, e - s)).collect())
            };
            prop_assert_eq!(runs(&[a, b], most), expected);
        }
    }
}
