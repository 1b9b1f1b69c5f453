//! An insertion-ordered map with O(1) move-to-end and pop-front: Python's `OrderedDict`
//! as vLLM's ARC lists and store-threshold tracker use it.

use rustc_hash::FxHashMap;

use super::Key;

const NIL: u32 = u32::MAX;

#[derive(Debug, Clone)]
struct Node<V> {
    key: Key,
    value: V,
    prev: u32,
    next: u32,
}

/// Keys in order, oldest first; assigning an existing key keeps its place.
#[derive(Debug, Clone)]
pub struct LinkedMap<V> {
    nodes: Vec<Option<Node<V>>>,
    free: Vec<u32>,
    index: FxHashMap<Key, u32>,
    head: u32,
    tail: u32,
}

impl<V> Default for LinkedMap<V> {
    fn default() -> Self {
        Self {
            nodes: Vec::new(),
            free: Vec::new(),
            index: FxHashMap::default(),
            head: NIL,
            tail: NIL,
        }
    }
}

impl<V> LinkedMap<V> {
    /// Number of keys.
    pub fn len(&self) -> usize {
        self.index.len()
    }

    /// Whether the map is empty.
    pub fn is_empty(&self) -> bool {
        self.index.is_empty()
    }

    /// Whether `key` is present.
    pub fn contains(&self, key: &[u8]) -> bool {
        self.index.contains_key(key)
    }

    fn node(&self, i: u32) -> &Node<V> {
        self.nodes[i as usize].as_ref().expect("linked node")
    }

    fn node_mut(&mut self, i: u32) -> &mut Node<V> {
        self.nodes[i as usize].as_mut().expect("linked node")
    }

    /// The value of `key`.
    pub fn get(&self, key: &[u8]) -> Option<&V> {
        self.index.get(key).map(|&i| &self.node(i).value)
    }

    /// The value of `key`, mutable.
    pub fn get_mut(&mut self, key: &[u8]) -> Option<&mut V> {
        let i = *self.index.get(key)?;
        Some(&mut self.node_mut(i).value)
    }

    fn unlink(&mut self, i: u32) {
        let (prev, next) = {
            let n = self.node(i);
            (n.prev, n.next)
        };
        if prev == NIL {
            self.head = next;
        } else {
            self.node_mut(prev).next = next;
        }
        if next == NIL {
            self.tail = prev;
        } else {
            self.node_mut(next).prev = prev;
        }
    }

    fn link_back(&mut self, i: u32) {
        let tail = self.tail;
        {
            let n = self.node_mut(i);
            n.prev = tail;
            n.next = NIL;
        }
        if tail == NIL {
            self.head = i;
        } else {
            self.node_mut(tail).next = i;
        }
        self.tail = i;
    }

    /// Sets `key` to `value`: a new key goes to the end, an existing one keeps its place.
    pub fn insert(&mut self, key: Key, value: V) {
        if let Some(&i) = self.index.get(&key) {
            self.node_mut(i).value = value;
            return;
        }
        let node = Node {
            key: key.clone(),
            value,
            prev: NIL,
            next: NIL,
        };
        let i = match self.free.pop() {
            Some(i) => {
                self.nodes[i as usize] = Some(node);
                i
            }
            None => {
                self.nodes.push(Some(node));
                (self.nodes.len() - 1) as u32
            }
        };
        self.index.insert(key, i);
        self.link_back(i);
    }

    /// Removes `key`, returning its value.
    pub fn remove(&mut self, key: &[u8]) -> Option<V> {
        let i = self.index.remove(key)?;
        self.unlink(i);
        self.free.push(i);
        self.nodes[i as usize].take().map(|n| n.value)
    }

    /// Moves `key` to the end; false when absent.
    pub fn move_to_end(&mut self, key: &[u8]) -> bool {
        let Some(&i) = self.index.get(key) else {
            return false;
        };
        self.unlink(i);
        self.link_back(i);
        true
    }

    /// Removes the oldest key.
    pub fn pop_front(&mut self) -> Option<(Key, V)> {
        if self.head == NIL {
            return None;
        }
        let key = self.node(self.head).key.clone();
        let value = self.remove(&key)?;
        Some((key, value))
    }

    /// Drops every key.
    pub fn clear(&mut self) {
        *self = Self::default();
    }

    /// The entries, oldest first.
    pub fn iter(&self) -> Iter<'_, V> {
        Iter {
            map: self,
            at: self.head,
        }
    }
}

/// Iterates a [`LinkedMap`] oldest first.
pub struct Iter<'a, V> {
    map: &'a LinkedMap<V>,
    at: u32,
}

impl<'a, V> Iterator for Iter<'a, V> {
    type Item = (&'a Key, &'a V);

    fn next(&mut self) -> Option<Self::Item> {
        if self.at == NIL {
            return None;
        }
        let n = self.map.node(self.at);
        self.at = n.next;
        Some((&n.key, &n.value))
    }
}
