//! Division by a number fixed when a policy is built, without a division instruction.
//!
//! A 64-bit division takes 14 to 46 cycles on the x86 cores Sluice runs on, and the token bucket
//! divided three times per decision: most of its cost. A policy's periods, rates and windows do
//! not change after it is built, so each precomputes a [`Divisor`] for them once, and a decision
//! divides with a multiplication and two shifts instead. The quotient is exact for every
//! dividend, so the algorithms decide exactly as they did with `/`.

use crate::arith;

/// `n / d` for a fixed `d > 0` and any `u64` `n`, by the method of Granlund and Montgomery
/// ("Division by invariant integers using multiplication", 1994, figure 4.1): with
/// `l = ⌈log₂ d⌉` and `m = ⌊2⁶⁴·(2ˡ − d)/d⌋ + 1`, which fits in 64 bits,
/// `n / d = (t + ((n − t) >> min(l, 1))) >> max(l − 1, 0)` where `t = ⌊m·n / 2⁶⁴⌋`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct Divisor {
    d: u64,
    magic: u64,
    shift1: u32,
    shift2: u32,
}

impl Divisor {
    /// A divisor of `d`; 0 counts as 1, so that a rate of nothing cannot divide by zero.
    pub(crate) const fn new(d: u64) -> Self {
        let d = if d == 0 { 1 } else { d };
        let l = if d == 1 {
            0
        } else {
            64 - (d - 1).leading_zeros()
        };
        let magic = ((((1u128 << l) - d as u128) << 64) / d as u128 + 1) as u64;
        Divisor {
            d,
            magic,
            shift1: if l > 0 { 1 } else { 0 },
            shift2: l.saturating_sub(1),
        }
    }

    /// The divisor itself.
    pub(crate) const fn get(self) -> u64 {
        self.d
    }

    /// `⌊n / d⌋`.
    #[inline]
    pub(crate) fn div(self, n: u64) -> u64 {
        // `t <= n`, so neither the subtraction nor the sum can overflow.
        let t = ((u128::from(self.magic) * u128::from(n)) >> 64) as u64;
        (t + ((n - t) >> self.shift1)) >> self.shift2
    }

    /// `⌈n / d⌉`.
    #[inline]
    pub(crate) fn div_ceil(self, n: u64) -> u64 {
        let q = self.div(n);
        // `q·d <= n`, so the product cannot overflow.
        q + u64::from(q * self.d != n)
    }

    /// `n mod d`.
    #[inline]
    pub(crate) fn rem(self, n: u64) -> u64 {
        n - self.div(n) * self.d
    }

    /// `⌊a·b / d⌋`, saturating at `u64::MAX`, as [`arith::mul_div_floor`].
    #[inline]
    pub(crate) fn mul_div_floor(self, a: u64, b: u64) -> u64 {
        match a.checked_mul(b) {
            Some(p) => self.div(p),
            None => arith::mul_div_floor(a, b, self.d),
        }
    }

    /// `⌈a·b / d⌉`, saturating at `u64::MAX`, as [`arith::mul_div_ceil`].
    #[inline]
    pub(crate) fn mul_div_ceil(self, a: u64, b: u64) -> u64 {
        match a.checked_mul(b) {
            Some(p) => self.div_ceil(p),
            None => arith::mul_div_ceil(a, b, self.d),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Divisors where the method changes shape: 1, powers of two and their neighbours, the
    /// largest, and the periods the policies use.
    fn edge_divisors() -> Vec<u64> {
        let mut ds = vec![
            1,
            3,
            5,
            7,
            10,
            1_000_000_000,
            60_000_000_000,
            86_400_000_000_000,
        ];
        for k in 1..64 {
            let p = 1u64 << k;
            ds.extend([p - 1, p, p + 1]);
        }
        ds.extend([u64::MAX - 1, u64::MAX]);
        ds
    }

    fn edge_dividends(d: u64) -> Vec<u64> {
        let mut ns = vec![
            0,
            1,
            2,
            d - 1,
            d,
            d.saturating_add(1),
            u64::MAX - 1,
            u64::MAX,
        ];
        for m in [2, 3, 1_000_003] {
            if let Some(x) = d.checked_mul(m) {
                ns.extend([x - 1, x, x.saturating_add(1)]);
            }
        }
        ns
    }

    #[test]
    fn exact_at_the_edges() {
        for d in edge_divisors() {
            let div = Divisor::new(d);
            for n in edge_dividends(d) {
                assert_eq!(div.div(n), n / d, "{n} / {d}");
                assert_eq!(div.div_ceil(n), n.div_ceil(d), "⌈{n} / {d}⌉");
                assert_eq!(div.rem(n), n % d, "{n} mod {d}");
            }
        }
    }

    #[test]
    fn zero_divides_as_one() {
        assert_eq!(Divisor::new(0).div(17), 17);
        assert_eq!(Divisor::new(0).get(), 1);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(4096))]

        #[test]
        fn exact_for_any_dividend_and_divisor(n: u64, d in 1u64.., shift in 0u32..64) {
            // Shifting spreads the divisors over every magnitude, not only near 2⁶⁴.
            let d = (d >> shift).max(1);
            let div = Divisor::new(d);
            prop_assert_eq!(div.div(n), n / d);
            prop_assert_eq!(div.div_ceil(n), n.div_ceil(d));
            prop_assert_eq!(div.rem(n), n % d);
        }

        #[test]
        fn products_as_the_wide_helpers(a: u64, b in 0u64..1 << 40, d in 1u64..) {
            let div = Divisor::new(d);
            prop_assert_eq!(div.mul_div_floor(a, b), arith::mul_div_floor(a, b, d));
            prop_assert_eq!(div.mul_div_ceil(a, b), arith::mul_div_ceil(a, b, d));
        }
    }
}
