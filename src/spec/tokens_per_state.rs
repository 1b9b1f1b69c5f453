//! `tokens_per_state`: how many tokens one stored state of an attention page covers
//! (vLLM's `AttentionSpec.tokens_per_state`, an `int | Fraction`). An int above 1
//! compresses several tokens into one state (DeepSeek-V4's sparse MLA); a fraction
//! `1/k` stores `k` states per token (causal Whisper's block pooling). The manager
//! counts blocks of `block_size` tokens either way: only the page size changes.

use std::fmt;

use crate::arith::gcd;

/// Tokens per stored state, a positive rational in lowest terms (a zero term is kept,
/// and refused by the spec's check).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TokensPerState {
    numerator: usize,
    denominator: usize,
}

impl TokensPerState {
    /// One token per state (vLLM's default).
    pub const ONE: Self = Self {
        numerator: 1,
        denominator: 1,
    };

    /// `numerator / denominator`, reduced.
    pub fn new(numerator: usize, denominator: usize) -> Self {
        let g = gcd(numerator, denominator).max(1);
        Self {
            numerator: numerator / g,
            denominator: denominator / g,
        }
    }

    /// The numerator in lowest terms.
    pub fn numerator(&self) -> usize {
        self.numerator
    }

    /// The denominator in lowest terms (1 for an int).
    pub fn denominator(&self) -> usize {
        self.denominator
    }

    /// Whether both terms are positive.
    pub fn is_positive(&self) -> bool {
        self.numerator > 0 && self.denominator > 0
    }

    /// The states `tokens` tokens fill, `floor(tokens / tokens_per_state)` (vLLM's
    /// `get_num_kernel_states`); `None` when it overflows. Needs a positive value.
    pub fn states_in(&self, tokens: usize) -> Option<usize> {
        tokens
            .checked_mul(self.denominator)
            .map(|t| t / self.numerator)
    }
}

impl From<usize> for TokensPerState {
    fn from(tokens: usize) -> Self {
        Self::new(tokens, 1)
    }
}

/// As Python prints vLLM's value: `4`, or `Fraction(1, 4)`.
impl fmt::Display for TokensPerState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.denominator == 1 {
            write!(f, "{}", self.numerator)
        } else {
            write!(f, "Fraction({}, {})", self.numerator, self.denominator)
        }
    }
}
