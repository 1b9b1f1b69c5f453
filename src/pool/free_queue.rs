//! The free block queue: intrusive doubly linked lists over block rows, with vLLM's
//! exact ordering operations (`popleft_n`, `remove`, `append_n`, `prepend_n`).
//!
//! One list is vLLM's free queue. A retention policy (`retention.rs`) uses several lists
//! over the same links, popped in list order; the tenant lists of its quotas are another
//! `FreeQueue` whose lists start empty.

use crate::types::BlockId;

/// Link value meaning "not in the queue".
const UNLINKED: u32 = u32::MAX;

/// Intrusive doubly linked lists over `0..n` block ids, each with two sentinels.
///
/// NOTE 1: the links live in one `Vec<[u32; 2]>` indexed by block id; slots `n + 2l` and
/// `n + 2l + 1` are list `l`'s fake head and tail, so every real block always has both
/// neighbours and no operation branches on "first" or "last". A block is in at most one
/// list; which one is the caller's to know.
/// NOTE 2: a block is linked iff its `prev` is not `UNLINKED`; the pool keeps this in
/// step with `ref_cnt == 0` for every non-null block.
/// NOTE 3: nothing here allocates after construction.
#[derive(Debug, Clone)]
pub struct FreeQueue {
    /// `links[b] = [prev, next]`.
    links: Vec<[u32; 2]>,
    /// Blocks, `n`.
    blocks: u32,
    /// Linked blocks over all lists.
    len: usize,
}

const PREV: usize = 0;
const NEXT: usize = 1;

impl FreeQueue {
    /// A queue of one list holding blocks `0..n` in id order (vLLM links the pool's
    /// blocks this way).
    pub fn new(n: usize) -> Self {
        let mut q = Self::empty(n, 1);
        let (head, tail) = (q.head(0), q.tail(0));
        for b in 0..n as u32 {
            q.links[b as usize] = [if b == 0 { head } else { b - 1 }, b + 1];
        }
        if n > 0 {
            q.links[n - 1][NEXT] = tail;
            q.links[head as usize][NEXT] = 0;
            q.links[tail as usize][PREV] = n as u32 - 1;
        }
        q.len = n;
        q
    }

    /// `lists` empty lists over blocks `0..n`.
    pub fn empty(n: usize, lists: usize) -> Self {
        assert!(
            n + 2 * lists < UNLINKED as usize,
            "pool too large for u32 block ids"
        );
        let mut q = Self {
            links: vec![[UNLINKED, UNLINKED]; n],
            blocks: n as u32,
            len: 0,
        };
        for _ in 0..lists {
            q.add_list();
        }
        q
    }

    /// Adds an empty list at the end and returns its index.
    pub fn add_list(&mut self) -> usize {
        let head = self.links.len() as u32;
        self.links.push([UNLINKED, head + 1]);
        self.links.push([head, UNLINKED]);
        self.num_lists() - 1
    }

    /// Number of lists.
    #[inline]
    pub fn num_lists(&self) -> usize {
        (self.links.len() - self.blocks as usize) / 2
    }

    #[inline]
    fn head(&self, list: usize) -> u32 {
        self.blocks + 2 * list as u32
    }

    #[inline]
    fn tail(&self, list: usize) -> u32 {
        self.head(list) + 1
    }

    /// Number of blocks in the queue.
    #[inline]
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the queue is empty.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether `block` is currently linked in the queue.
    #[inline]
    pub fn contains(&self, block: BlockId) -> bool {
        self.links[block as usize][PREV] != UNLINKED
    }

    /// The first block of `list`, if any.
    #[inline]
    pub fn first(&self, list: usize) -> Option<BlockId> {
        let b = self.links[self.head(list) as usize][NEXT];
        (b != self.tail(list)).then_some(b)
    }

    /// Removes the first `n` blocks of a one-list queue (vLLM's; the caller checked
    /// `n <= len`), calling `each` on them in queue order.
    #[inline]
    pub fn popleft_n(&mut self, n: usize, mut each: impl FnMut(BlockId)) {
        debug_assert!(n <= self.len && self.num_lists() == 1);
        if n == 0 {
            return;
        }
        let head = self.head(0);
        let mut cur = self.links[head as usize][NEXT];
        for _ in 0..n {
            let next = self.links[cur as usize][NEXT];
            self.links[cur as usize] = [UNLINKED, UNLINKED];
            each(cur);
            cur = next;
        }
        self.links[head as usize][NEXT] = cur;
        self.links[cur as usize][PREV] = head;
        self.len -= n;
    }

    /// Removes the first `n` blocks (the caller checked `n <= len`), list after list,
    /// calling `each` on them in queue order.
    pub fn popleft_n_lists(&mut self, n: usize, mut each: impl FnMut(BlockId)) {
        debug_assert!(n <= self.len);
        let mut left = n;
        let mut list = 0;
        while left > 0 {
            let (head, tail) = (self.head(list), self.tail(list));
            let mut cur = self.links[head as usize][NEXT];
            while left > 0 && cur != tail {
                let next = self.links[cur as usize][NEXT];
                self.links[cur as usize] = [UNLINKED, UNLINKED];
                each(cur);
                cur = next;
                left -= 1;
            }
            self.links[head as usize][NEXT] = cur;
            self.links[cur as usize][PREV] = head;
            list += 1;
        }
        self.len -= n;
    }

    /// Unlinks `block` from anywhere in the queue in O(1). The caller guarantees it is
    /// linked.
    #[inline]
    pub fn remove(&mut self, block: BlockId) {
        let [prev, next] = self.links[block as usize];
        debug_assert!(prev != UNLINKED && next != UNLINKED);
        self.links[prev as usize][NEXT] = next;
        self.links[next as usize][PREV] = prev;
        self.links[block as usize] = [UNLINKED, UNLINKED];
        self.len -= 1;
    }

    /// Links `blocks` at the tail of list 0, in order.
    #[inline]
    pub fn append_n(&mut self, blocks: &[BlockId]) {
        self.append_to(0, blocks);
    }

    /// Links `blocks`, in their own order, before the head of list 0 (vLLM 0.33
    /// `prepend_n`).
    #[inline]
    pub fn prepend_n(&mut self, blocks: &[BlockId]) {
        self.prepend_to(0, blocks);
    }

    /// Links `blocks` at the tail of `list`, in order.
    #[inline]
    pub fn append_to(&mut self, list: usize, blocks: &[BlockId]) {
        if blocks.is_empty() {
            return;
        }
        let tail = self.tail(list);
        let last = self.links[tail as usize][PREV];
        self.link_chain(last, blocks, tail);
    }

    /// Links `blocks`, in their own order, before the head of `list`.
    #[inline]
    pub fn prepend_to(&mut self, list: usize, blocks: &[BlockId]) {
        if blocks.is_empty() {
            return;
        }
        let head = self.head(list);
        let first = self.links[head as usize][NEXT];
        self.link_chain(head, blocks, first);
    }

    /// Links `blocks` in order between the adjacent nodes `before` and `after`.
    fn link_chain(&mut self, before: u32, blocks: &[BlockId], after: u32) {
        let mut prev = before;
        for &b in blocks {
            debug_assert!(!self.contains(b));
            self.links[prev as usize][NEXT] = b;
            self.links[b as usize][PREV] = prev;
            prev = b;
        }
        self.len += blocks.len();
        self.links[prev as usize][NEXT] = after;
        self.links[after as usize][PREV] = prev;
    }

    /// Iterates the lists in order, each from head to tail (the pop order).
    pub fn iter(&self) -> impl Iterator<Item = BlockId> + '_ {
        (0..self.num_lists()).flat_map(|l| self.iter_list(l))
    }

    /// Iterates `list` from head to tail.
    pub fn iter_list(&self, list: usize) -> impl Iterator<Item = BlockId> + '_ {
        let tail = self.tail(list);
        let mut cur = self.links[self.head(list) as usize][NEXT];
        std::iter::from_fn(move || {
            if cur == tail {
                None
            } else {
                let b = cur;
                cur = self.links[cur as usize][NEXT];
                Some(b)
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn popped(q: &mut FreeQueue, n: usize) -> Vec<BlockId> {
        let mut out = Vec::new();
        q.popleft_n(n, |b| out.push(b));
        out
    }

    #[test]
    fn starts_in_id_order() {
        let q = FreeQueue::new(5);
        assert_eq!(q.iter().collect::<Vec<_>>(), vec![0, 1, 2, 3, 4]);
        assert_eq!(q.len(), 5);
    }

    #[test]
    fn pop_remove_append_prepend_keep_vllm_order() {
        let mut q = FreeQueue::new(6);
        assert_eq!(popped(&mut q, 2), vec![0, 1]);
        q.remove(3);
        assert_eq!(q.iter().collect::<Vec<_>>(), vec![2, 4, 5]);
        q.append_n(&[1, 3]);
        q.prepend_n(&[0]);
        assert_eq!(q.iter().collect::<Vec<_>>(), vec![0, 2, 4, 5, 1, 3]);
        assert_eq!(popped(&mut q, 6), vec![0, 2, 4, 5, 1, 3]);
        assert!(q.is_empty());
        q.prepend_n(&[5, 4]);
        q.append_n(&[1]);
        q.prepend_n(&[2]);
        assert_eq!(q.iter().collect::<Vec<_>>(), vec![2, 5, 4, 1]);
        assert!(!q.contains(0) && q.contains(4));
    }

    proptest::proptest! {
        #[test]
        fn matches_a_vecdeque_model(ops in proptest::collection::vec((0u8..4, 0usize..8), 0..200)) {
            const N: usize = 8;
            let mut q = FreeQueue::new(N);
            let mut model: std::collections::VecDeque<u32> = (0..N as u32).collect();
            for (op, arg) in ops {
                let out: Vec<u32> = (0..N as u32).filter(|b| !model.contains(b)).collect();
                match op {
                    0 => {
                        let n = arg.min(model.len());
                        let got = popped(&mut q, n);
                        let want: Vec<u32> = model.drain(..n).collect();
                        proptest::prop_assert_eq!(got, want);
                    }
                    1 if !model.is_empty() => {
                        let b = model[arg % model.len()];
                        q.remove(b);
                        model.retain(|&x| x != b);
                    }
                    2 => {
                        let take: Vec<u32> = out.iter().copied().take(arg).collect();
                        q.append_n(&take);
                        model.extend(take);
                    }
                    _ => {
                        let take: Vec<u32> = out.iter().copied().take(arg).collect();
                        q.prepend_n(&take);
                        for &b in take.iter().rev() {
                            model.push_front(b);
                        }
                    }
                }
                proptest::prop_assert_eq!(q.iter().collect::<Vec<_>>(), model.iter().copied().collect::<Vec<_>>());
                proptest::prop_assert_eq!(q.len(), model.len());
            }
        }
    }
}
