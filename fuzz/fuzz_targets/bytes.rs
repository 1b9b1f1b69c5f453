//! The fuzz input as a stream of small numbers, shared by the targets (each reads the
//! subset it needs).

/// Reads the input a byte at a time; zeros once exhausted.
pub struct Bytes<'a>(pub &'a [u8]);

impl Bytes<'_> {
    pub fn u8(&mut self) -> u8 {
        match self.0.split_first() {
            Some((&b, rest)) => {
                self.0 = rest;
                b
            }
            None => 0,
        }
    }

    pub fn u16(&mut self) -> u16 {
        u16::from(self.u8()) | (u16::from(self.u8()) << 8)
    }

    pub fn u32(&mut self) -> u32 {
        u32::from(self.u16()) | (u32::from(self.u16()) << 16)
    }

    /// A byte reduced to `0..n` (0 for `n == 0`).
    pub fn pick(&mut self, n: usize) -> usize {
        usize::from(self.u8()) % n.max(1)
    }

    pub fn done(&self) -> bool {
        self.0.is_empty()
    }
}
