//! The null block's reference count, which vLLM 0.32 and 0.33 keep differently.
//!
//! vLLM 0.33 (the default) never counts references to the null block: `touch` and
//! `free_blocks` skip it, its `ref_cnt` stays 0, and a popped table starts at its first
//! real block. vLLM 0.32 treats a table's null entries as references like any other:
//! `touch` counts the null block up (a sliding-window or Mamba hit padded with nulls),
//! `free_blocks` counts it down (a finished table whose skipped prefix was nulled), and
//! `pop_blocks_for_free` hands the table over whole, leading nulls included. The null
//! block is never linked in the free queue either way, so its 0.32 count drifts and goes
//! negative; nothing in vLLM decides on it, but it shows in `null_block.ref_cnt`.

/// Whether the null block's references are counted, and their count.
///
/// NOTE 1: `count` is 0 whenever `counted` is false.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NullBlockRefs {
    counted: bool,
    count: i64,
}

impl NullBlockRefs {
    /// Counting on (vLLM 0.32) or off (vLLM 0.33), from a count of 0.
    pub fn new(counted: bool) -> Self {
        Self { counted, count: 0 }
    }

    /// Whether references are counted: tables then hold their null entries, and a
    /// popped table keeps its leading nulls.
    #[inline]
    pub fn counted(&self) -> bool {
        self.counted
    }

    /// The null block's `ref_cnt` (0 when not counted).
    #[inline]
    pub fn get(&self) -> i64 {
        self.count
    }

    /// `n` references taken (`touch`) or, negative, dropped (`free_blocks`).
    #[inline]
    pub(super) fn add(&mut self, n: i64) {
        if self.counted {
            self.count += n;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::NullBlockRefs;

    #[test]
    fn counts_only_when_on() {
        let mut off = NullBlockRefs::new(false);
        off.add(3);
        assert_eq!(off.get(), 0);
        let mut on = NullBlockRefs::new(true);
        on.add(1);
        on.add(-3);
        assert_eq!((on.counted(), on.get()), (true, -2));
    }
}
