//! Token statistics: unigram entropy (the loss of the best context-free model) and the
//! empirical conditional entropy given the previous `k` tokens.
//!
//! The unigram entropy is the baseline a language model must beat: a model that has learned
//! only token frequencies reaches a cross-entropy loss equal to it (in nats, as the loss is
//! measured). Trainer tests check "loss clearly below unigram entropy".
//!
//! The conditional entropies are plug-in estimates on the same data (they are what a
//! count-based `k`-gram model would score on its own training data), so they are optimistic
//! for large `k` on small data; they show how much structure short contexts already explain.

use std::collections::HashMap;

use super::Tokens;

/// Converts bits to nats.
pub const NATS_PER_BIT: f64 = std::f64::consts::LN_2;

/// Summary statistics of a token stream.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenStats {
    /// Number of tokens.
    pub n_tokens: u64,
    /// Vocabulary size of the stream.
    pub vocab_size: u32,
    /// Distinct token ids that occur.
    pub distinct: usize,
    /// Unigram entropy in bits per token.
    pub unigram_bits: f64,
}

impl TokenStats {
    /// Computes the statistics (one pass).
    pub fn of(tokens: &Tokens) -> Self {
        let counts = unigram_counts(tokens);
        TokenStats {
            n_tokens: tokens.len() as u64,
            vocab_size: tokens.vocab_size(),
            distinct: counts.iter().filter(|&&c| c > 0).count(),
            unigram_bits: entropy_bits(&counts),
        }
    }

    /// Unigram entropy in nats per token (the unit of a cross-entropy loss).
    pub fn unigram_nats(&self) -> f64 {
        self.unigram_bits * NATS_PER_BIT
    }
}

/// Occurrence count of every id `0..vocab_size`.
pub fn unigram_counts(tokens: &Tokens) -> Vec<u64> {
    let mut counts = vec![0u64; tokens.vocab_size() as usize];
    tokens.for_each_chunk(|c| {
        for &t in c {
            counts[t as usize] += 1;
        }
    });
    counts
}

/// Shannon entropy, in bits, of the empirical distribution given by `counts` (0 for no data).
pub fn entropy_bits(counts: &[u64]) -> f64 {
    let total: u64 = counts.iter().sum();
    if total == 0 {
        return 0.0;
    }
    let n = total as f64;
    -counts
        .iter()
        .filter(|&&c| c > 0)
        .map(|&c| {
            let p = c as f64 / n;
            p * p.log2()
        })
        .sum::<f64>()
}

/// Unigram entropy of a token stream in bits per token.
///
/// ```
/// use trainer::data::{unigram_entropy_bits, Tokens};
/// assert_eq!(unigram_entropy_bits(&Tokens::from_text("abab")), 1.0);
/// assert_eq!(unigram_entropy_bits(&Tokens::from_text("aaaa")), 0.0);
/// ```
pub fn unigram_entropy_bits(tokens: &Tokens) -> f64 {
    entropy_bits(&unigram_counts(tokens))
}

/// Unigram entropy of a token stream in nats per token.
pub fn unigram_entropy_nats(tokens: &Tokens) -> f64 {
    unigram_entropy_bits(tokens) * NATS_PER_BIT
}

/// Empirical conditional entropy `H(x_t | x_{t-k} .. x_{t-1})` in bits per token, over the
/// positions `t >= k` (`k = 0` is the unigram entropy). `k` is at most 3 (ids must then fit
/// in 16 bits, which every stream here satisfies).
///
/// ```
/// use trainer::data::{conditional_entropy_bits, Tokens};
/// let t = Tokens::from_text("abababab");
/// assert_eq!(conditional_entropy_bits(&t, 1), 0.0); // the next letter is determined
/// ```
pub fn conditional_entropy_bits(tokens: &Tokens, k: usize) -> f64 {
    assert!(k <= 3, "context length {k} > 3");
    if k == 0 {
        return unigram_entropy_bits(tokens);
    }
    if tokens.len() <= k {
        return 0.0;
    }
    // H(next | ctx) = H(ctx, next) - H(ctx), both over the same positions.
    let mut joint: HashMap<u64, u64> = HashMap::new();
    let mut ctx: HashMap<u64, u64> = HashMap::new();
    let mut window: u64 = 0;
    let mask: u64 = (1u64 << (16 * k)) - 1;
    let mut i = 0usize;
    tokens.for_each_chunk(|c| {
        for &t in c {
            if i >= k {
                *ctx.entry(window).or_insert(0) += 1;
                *joint.entry((window << 16) | t as u64).or_insert(0) += 1;
            }
            window = ((window << 16) | t as u64) & mask;
            i += 1;
        }
    });
    // Sorted counts make the floating-point sum independent of the hash order.
    let h = |m: &HashMap<u64, u64>| {
        let mut c: Vec<u64> = m.values().copied().collect();
        c.sort_unstable();
        entropy_bits(&c)
    };
    (h(&joint) - h(&ctx)).max(0.0)
}
