//! The reproducible generator of the randomised tests (here and in
//! fastpath-bpf's): xorshift64, so a seed gives the same cases on every
//! machine and version without a dependency. Not for anything but tests.

/// Seed it with anything but 0 (0 stays 0).
pub struct XorShift(pub u64);

impl XorShift {
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// In 0..n (n > 0); the modulo bias does not matter to a test.
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }

    /// True `pct` times in a hundred.
    pub fn chance(&mut self, pct: u64) -> bool {
        self.below(100) < pct
    }

    /// A 128-bit value (an IPv6 address), high half first.
    pub fn addr(&mut self) -> u128 {
        (u128::from(self.next_u64()) << 64) | u128::from(self.next_u64())
    }
}
