//! The simulator's deterministic randomness: `SplitMix64`, a generator that is the same on every
//! platform and Rust version, and `Fnv`, the hash that folds a request's facts into a seed. Both
//! exist because the determinism promise (equal seeds and requests, equal replies) rules out std's
//! hashers and `rand`'s unspecified `StdRng`.

/// SplitMix64: tiny, fast, and the same on every platform and Rust version (unlike std's hashers or
/// `rand`'s unspecified `StdRng`), which the determinism promise needs. Also drives `dsh sim`'s
/// seeded injections.
#[derive(Clone, Debug)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    /// A generator whose sequence is fixed by `seed`.
    pub fn new(seed: u64) -> SplitMix64 {
        SplitMix64(seed)
    }

    /// The next value of the sequence.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (0 when n is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u64
    }

    pub(super) fn between(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.below(hi.saturating_sub(lo).saturating_add(1))
    }

    /// Uniform in `[0, 1)`.
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// True with probability `p` (never for 0, always for 1).
    pub fn chance(&mut self, p: f64) -> bool {
        self.unit() < p
    }
}

/// FNV-1a over the request facts the reply may depend on.
pub(super) struct Fnv(pub(super) u64);

impl Fnv {
    pub(super) fn new(seed: u64) -> Fnv {
        let mut h = Fnv(0xcbf2_9ce4_8422_2325);
        h.u64(seed);
        h
    }

    pub(super) fn bytes(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 ^= u64::from(*b);
            self.0 = self.0.wrapping_mul(0x0100_0000_01b3);
        }
    }

    pub(super) fn u64(&mut self, v: u64) {
        self.bytes(&v.to_le_bytes());
    }
}
