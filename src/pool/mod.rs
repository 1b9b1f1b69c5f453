//! The block pool: blocks as rows, the LRU free queue and the prefix cache map.
