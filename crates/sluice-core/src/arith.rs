//! Overflow-free integer arithmetic for rates.
//!
//! Rates are rationals (`amount` per `per` nanoseconds). The products fit in `u64` almost always,
//! so the fast path stays in `u64` and only falls back to `u128` when a product overflows.

/// `floor(a * b / c)`, saturating at `u64::MAX`. `c` must not be zero.
pub(crate) fn mul_div_floor(a: u64, b: u64, c: u64) -> u64 {
    debug_assert!(c != 0);
    match a.checked_mul(b) {
        Some(p) => p / c,
        None => u64::try_from(u128::from(a) * u128::from(b) / u128::from(c)).unwrap_or(u64::MAX),
    }
}

/// `ceil(a * b / c)`, saturating at `u64::MAX`. `c` must not be zero.
pub(crate) fn mul_div_ceil(a: u64, b: u64, c: u64) -> u64 {
    debug_assert!(c != 0);
    match a.checked_mul(b) {
        Some(p) => p.div_ceil(c),
        None => u64::try_from((u128::from(a) * u128::from(b)).div_ceil(u128::from(c)))
            .unwrap_or(u64::MAX),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exact_and_rounded_quotients() {
        assert_eq!(mul_div_floor(7, 3, 2), 10);
        assert_eq!(mul_div_ceil(7, 3, 2), 11);
        assert_eq!(mul_div_ceil(6, 3, 2), 9);
    }

    #[test]
    fn products_beyond_u64_fall_back_to_wide_math() {
        let big = u64::MAX / 2;
        assert_eq!(mul_div_floor(big, 4, 4), big);
        assert_eq!(mul_div_ceil(big, 4, 2), u64::MAX - 1);
        assert_eq!(mul_div_floor(u64::MAX, u64::MAX, 1), u64::MAX);
    }
}
