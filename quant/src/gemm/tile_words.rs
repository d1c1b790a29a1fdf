//! [`TileWords`]: the growable buffer that the GEMMs' packed operands live in (the BF16
//! tiles, the E2M1 GEMM's B records), allocated in whole cache lines so that every tile or
//! record starts on one.
//!
//! The tile unit loads a tile as 16 rows of 64 bytes. From a buffer that starts off a
//! 64-byte boundary (a `Vec<u32>` is only 4-byte aligned, and the allocator's large blocks
//! sit 16 bytes into a page) each row spans two cache lines, and the kernel waits on twice
//! the lines: on the AMX host the BF16 GEMM ran 1.5-2x slower on such tiles.

use std::ops::{Deref, DerefMut};

/// Words per cache line.
const LINE_WORDS: usize = 16;

/// One 64-byte cache line of packed words, the unit [`TileWords`] allocates in.
#[derive(Clone, Copy, Debug, Default)]
#[repr(C, align(64))]
struct Line([u32; LINE_WORDS]);

// SAFETY: `Line` is 64 bytes of `u32` with alignment 64: no padding, every bit pattern
// valid, all zeros a valid value.
unsafe impl bytemuck::Zeroable for Line {}
// SAFETY: as above; `Line` is `Copy`, `repr(C)` and `'static`.
unsafe impl bytemuck::Pod for Line {}

/// A growable `[u32]` whose first word is 64-byte aligned (the packed tiles of
/// [`super::bf16`], 1 KiB each, and the 384-byte B records of [`super::e2m1`]: each starts
/// on a cache line). Dereferences to its words; grows with [`TileWords::grow_to`], never
/// shrinks.
#[derive(Clone, Debug, Default)]
pub(crate) struct TileWords {
    lines: Vec<Line>,
}

impl TileWords {
    /// Grows the buffer to hold at least `words` words (new words zero; a whole number of
    /// lines, so [`TileWords::len`] may exceed `words` by up to 15).
    pub(crate) fn grow_to(&mut self, words: usize) {
        let lines = words.div_ceil(LINE_WORDS);
        if self.lines.len() < lines {
            self.lines.resize(lines, Line::default());
        }
    }
}

impl Deref for TileWords {
    type Target = [u32];

    fn deref(&self) -> &[u32] {
        bytemuck::cast_slice(&self.lines)
    }
}

impl DerefMut for TileWords {
    fn deref_mut(&mut self) -> &mut [u32] {
        bytemuck::cast_slice_mut(&mut self.lines)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_start_on_a_cache_line_and_survive_growth() {
        let mut w = TileWords::default();
        assert!(w.is_empty());
        w.grow_to(17);
        assert_eq!(w.len(), 32);
        assert!(w.iter().all(|&x| x == 0));
        w[16] = 7;
        // a large block, where the allocator's header would misalign a plain Vec<u32>
        w.grow_to(1 << 20);
        assert_eq!((w.len(), w[16]), (1 << 20, 7));
        assert_eq!(w.as_ptr() as usize % 64, 0);
        w.grow_to(5); // never shrinks
        assert_eq!(w.len(), 1 << 20);
    }
}
