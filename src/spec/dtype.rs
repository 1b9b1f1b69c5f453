//! Element types of KV cache tensors, named as torch names them.

use std::fmt;
use std::str::FromStr;

use crate::error::{KvError, Result};

/// The element type of a KV cache tensor. Only the byte size matters to the block
/// manager; the name is kept so that specs print and compare like vLLM's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Dtype {
    /// `torch.float32` (`float`).
    Float32,
    /// `torch.float64` (`double`).
    Float64,
    /// `torch.float16` (`half`).
    Float16,
    /// `torch.bfloat16`.
    Bfloat16,
    /// `torch.float8_e4m3fn`.
    Float8E4m3fn,
    /// `torch.float8_e4m3fnuz`.
    Float8E4m3fnuz,
    /// `torch.float8_e5m2`.
    Float8E5m2,
    /// `torch.float8_e5m2fnuz`.
    Float8E5m2fnuz,
    /// `torch.float8_e8m0fnu`.
    Float8E8m0fnu,
    /// `torch.int8`.
    Int8,
    /// `torch.uint8`.
    Uint8,
    /// `torch.int16` (`short`).
    Int16,
    /// `torch.uint16`.
    Uint16,
    /// `torch.int32` (`int`).
    Int32,
    /// `torch.uint32`.
    Uint32,
    /// `torch.int64` (`long`).
    Int64,
    /// `torch.uint64`.
    Uint64,
    /// `torch.bool`.
    Bool,
}

/// Every dtype with its canonical torch name and byte size, in declaration order.
const TABLE: [(Dtype, &str, usize); 18] = [
    (Dtype::Float32, "float32", 4),
    (Dtype::Float64, "float64", 8),
    (Dtype::Float16, "float16", 2),
    (Dtype::Bfloat16, "bfloat16", 2),
    (Dtype::Float8E4m3fn, "float8_e4m3fn", 1),
    (Dtype::Float8E4m3fnuz, "float8_e4m3fnuz", 1),
    (Dtype::Float8E5m2, "float8_e5m2", 1),
    (Dtype::Float8E5m2fnuz, "float8_e5m2fnuz", 1),
    (Dtype::Float8E8m0fnu, "float8_e8m0fnu", 1),
    (Dtype::Int8, "int8", 1),
    (Dtype::Uint8, "uint8", 1),
    (Dtype::Int16, "int16", 2),
    (Dtype::Uint16, "uint16", 2),
    (Dtype::Int32, "int32", 4),
    (Dtype::Uint32, "uint32", 4),
    (Dtype::Int64, "int64", 8),
    (Dtype::Uint64, "uint64", 8),
    (Dtype::Bool, "bool", 1),
];

/// torch's alias attributes (`torch.half is torch.float16`, ...).
const ALIASES: [(&str, Dtype); 6] = [
    ("float", Dtype::Float32),
    ("double", Dtype::Float64),
    ("half", Dtype::Float16),
    ("short", Dtype::Int16),
    ("int", Dtype::Int32),
    ("long", Dtype::Int64),
];

impl Dtype {
    fn entry(self) -> (Dtype, &'static str, usize) {
        TABLE[self as usize]
    }

    /// Bytes per element (torch's `element_size()`).
    pub fn size(self) -> usize {
        self.entry().2
    }

    /// The canonical torch name without the `torch.` prefix, e.g. `"bfloat16"`.
    pub fn name(self) -> &'static str {
        self.entry().1
    }

    /// Parses a torch dtype name: a canonical name (`"bfloat16"`), a torch alias
    /// (`"half"`), either with an optional `"torch."` prefix (what `str(torch.float16)`
    /// gives).
    ///
    /// ```
    /// use kvblocks::spec::Dtype;
    /// assert_eq!(Dtype::parse("torch.half").unwrap(), Dtype::Float16);
    /// assert_eq!(Dtype::parse("bfloat16").unwrap().size(), 2);
    /// ```
    pub fn parse(name: &str) -> Result<Dtype> {
        let bare = name.strip_prefix("torch.").unwrap_or(name);
        TABLE
            .iter()
            .find(|(_, n, _)| *n == bare)
            .map(|(d, _, _)| *d)
            .or_else(|| ALIASES.iter().find(|(n, _)| *n == bare).map(|(_, d)| *d))
            .ok_or_else(|| KvError::InvalidSpec(format!("unknown dtype {name:?}")))
    }
}

impl FromStr for Dtype {
    type Err = KvError;

    fn from_str(s: &str) -> Result<Dtype> {
        Dtype::parse(s)
    }
}

impl fmt::Display for Dtype {
    /// Formats as torch prints it: `torch.bfloat16`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "torch.{}", self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_is_in_declaration_order() {
        for (i, (d, _, _)) in TABLE.iter().enumerate() {
            assert_eq!(*d as usize, i);
        }
    }

    #[test]
    fn parses_names_aliases_and_torch_strings() {
        assert_eq!(Dtype::parse("bfloat16").unwrap(), Dtype::Bfloat16);
        assert_eq!(Dtype::parse("torch.float16").unwrap(), Dtype::Float16);
        assert_eq!(Dtype::parse("half").unwrap(), Dtype::Float16);
        assert_eq!(Dtype::parse("torch.float").unwrap(), Dtype::Float32);
        assert_eq!(Dtype::parse("float8_e4m3fn").unwrap().size(), 1);
        assert_eq!(Dtype::parse("long").unwrap().size(), 8);
        assert!(Dtype::parse("fp8").is_err());
        assert!(Dtype::parse("torch.").is_err());
        assert_eq!(Dtype::Float64.to_string(), "torch.float64");
    }
}
