//! The integer arithmetic of block sizes, in one place: ceiling division, gcd and lcm.

/// Ceiling division: blocks of `b` tokens that hold `a` tokens.
#[inline]
pub(crate) fn cdiv(a: usize, b: usize) -> usize {
    a.div_ceil(b)
}

/// Greatest common divisor (`gcd(a, 0) == a`).
pub(crate) fn gcd(a: usize, b: usize) -> usize {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

/// Least common multiple of positive `a` and `b`; `None` on overflow.
pub(crate) fn lcm(a: usize, b: usize) -> Option<usize> {
    (a / gcd(a, b)).checked_mul(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_size_arithmetic() {
        assert_eq!(
            (cdiv(0, 16), cdiv(1, 16), cdiv(16, 16), cdiv(17, 16)),
            (0, 1, 1, 2)
        );
        assert_eq!((gcd(12, 18), gcd(0, 7), gcd(7, 0)), (6, 7, 7));
        assert_eq!(
            (lcm(4, 6), lcm(16, 16), lcm(1, 9)),
            (Some(12), Some(16), Some(9))
        );
        assert_eq!(lcm(usize::MAX, usize::MAX - 1), None);
    }
}
