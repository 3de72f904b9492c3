//! A small seeded random source, so that a generated trace is the same on every machine and in
//! every run with the same seed.

/// SplitMix64: fast, with a full 2^64 period, and good enough for traffic shapes (not for
/// anything secret).
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator whose sequence is fixed by `seed`.
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A uniform number in `[0, 1)`.
    pub fn unit(&mut self) -> f64 {
        // The top 53 bits, the precision of an f64 mantissa.
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// The gap to the next arrival of a Poisson process of `rate` per second, in seconds.
    pub fn exponential(&mut self, rate: f64) -> f64 {
        // 1 - unit() is in (0, 1], so the logarithm is finite.
        -(1.0 - self.unit()).ln() / rate
    }

    /// A uniform index below `n` (which must not be 0).
    pub fn below(&mut self, n: u64) -> u64 {
        ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seed_fixes_the_sequence() {
        let (mut a, mut b) = (Rng::new(7), Rng::new(7));
        let xs: Vec<u64> = (0..5).map(|_| a.next_u64()).collect();
        let ys: Vec<u64> = (0..5).map(|_| b.next_u64()).collect();
        assert_eq!(xs, ys);
        let mut c = Rng::new(8);
        assert_ne!(xs, (0..5).map(|_| c.next_u64()).collect::<Vec<_>>());
    }

    #[test]
    fn unit_and_below_stay_in_range_and_spread() {
        let mut r = Rng::new(1);
        let mut buckets = [0u32; 10];
        for _ in 0..10_000 {
            let u = r.unit();
            assert!((0.0..1.0).contains(&u));
            buckets[r.below(10) as usize] += 1;
        }
        // Each of ten buckets gets about a tenth: far from empty, far from all.
        assert!(
            buckets.iter().all(|&n| (800..1200).contains(&n)),
            "{buckets:?}"
        );
    }

    #[test]
    fn exponential_gaps_average_one_over_the_rate() {
        let mut r = Rng::new(3);
        let mean = (0..20_000).map(|_| r.exponential(4.0)).sum::<f64>() / 20_000.0;
        assert!((mean - 0.25).abs() < 0.01, "{mean}");
    }
}
