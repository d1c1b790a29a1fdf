//! Deterministic initialisers (SplitMix64 + Box–Muller): same seed, same values, everywhere.

/// A small deterministic generator (SplitMix64) for parameter initialisation and tests.
///
/// ```
/// use autograd::init::Rng;
/// let mut r = Rng::new(7);
/// let u = r.uniform();
/// assert!((0.0..1.0).contains(&u));
/// assert_eq!(Rng::new(7).next_u64(), Rng::new(7).next_u64());
/// ```
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// A generator from a seed.
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

    /// Uniform in `[0, 1)` with 24 random bits.
    pub fn uniform(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 * (1.0 / (1u64 << 24) as f32)
    }

    /// Standard normal (Box–Muller, computed in f64).
    pub fn normal(&mut self) -> f32 {
        let u1 = ((self.next_u64() >> 11) as f64 + 1.0) / (1u64 << 53) as f64;
        let u2 = (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
        ((-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()) as f32
    }
}

/// `n` values from `N(0, std²)`.
///
/// ```
/// let w = autograd::init::normal(1000, 0.02, 1);
/// let mean = w.iter().sum::<f32>() / 1000.0;
/// assert!(mean.abs() < 0.005);
/// ```
pub fn normal(n: usize, std: f32, seed: u64) -> Vec<f32> {
    let mut r = Rng::new(seed);
    (0..n).map(|_| r.normal() * std).collect()
}

/// `n` values uniform in `[lo, hi)`.
pub fn uniform(n: usize, lo: f32, hi: f32, seed: u64) -> Vec<f32> {
    let mut r = Rng::new(seed);
    (0..n).map(|_| lo + (hi - lo) * r.uniform()).collect()
}
