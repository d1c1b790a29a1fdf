//! Batching: `(inputs, targets)` windows of `[batch, seq]` tokens, deterministic from a seed
//! and resumable from a saved state.
//!
//! # Sampling schemes
//!
//! A window is `seq + 1` consecutive tokens starting at `s`: the inputs are tokens
//! `s..s+seq`, the targets `s+1..s+seq+1` (the next token at every position).
//!
//! * [`Sampling::Random`] (for training) is epoch-free: every row of every batch starts at an
//!   independent uniform position in `0..=len-seq-1`, drawn from a xoshiro256** stream seeded
//!   with the configured seed (one draw per row, rows in order). Windows may overlap and
//!   there is no notion of an epoch; over many steps every position is covered uniformly.
//! * [`Sampling::Sequential`] (for evaluation, or for data-ordered training) reads
//!   non-overlapping windows in order: row `r` of the `k`-th window starts at `k·seq`; after
//!   the last whole window the cursor wraps to 0 (the partial tail is skipped). The seed is
//!   unused. [`Batcher::reset`] rewinds it, so evaluating "the first `n` batches of the
//!   validation split" gives the same windows every time.
//!
//! # Resuming
//!
//! [`Batcher::state`] returns a [`BatcherState`] (serde) holding the configuration, the
//! stream length, the RNG state and the cursor. [`Batcher::from_state`] rebuilds a batcher
//! that continues exactly where the saved one stopped; it refuses a state saved for a stream
//! of another length.

use serde::{Deserialize, Serialize};

use super::{DataError, Tokens};
use crate::rng::Xoshiro256StarStar;

/// How windows are chosen (see the module docs).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Sampling {
    /// Independent uniform window starts (epoch-free).
    #[default]
    Random,
    /// Consecutive non-overlapping windows, wrapping at the end.
    Sequential,
}

/// Shape and sampling of batches.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BatcherConfig {
    /// Rows per batch.
    pub batch: usize,
    /// Tokens per row (the context length).
    pub seq: usize,
    /// Window selection.
    pub sampling: Sampling,
    /// Seed of the window positions ([`Sampling::Random`] only).
    pub seed: u64,
}

/// One batch: row-major `[batch, seq]` inputs and next-token targets.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Batch {
    /// Input token ids, `batch * seq`, row-major.
    pub inputs: Vec<u32>,
    /// Target ids: `targets[r][t] = inputs[r][t + 1]`, and the token after the window for
    /// the last position.
    pub targets: Vec<u32>,
    /// Rows.
    pub batch: usize,
    /// Tokens per row.
    pub seq: usize,
}

impl Batch {
    /// Row `r` of the inputs.
    pub fn input_row(&self, r: usize) -> &[u32] {
        &self.inputs[r * self.seq..(r + 1) * self.seq]
    }

    /// Row `r` of the targets.
    pub fn target_row(&self, r: usize) -> &[u32] {
        &self.targets[r * self.seq..(r + 1) * self.seq]
    }
}

/// Everything needed to resume a [`Batcher`] exactly.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BatcherState {
    /// The configuration.
    pub config: BatcherConfig,
    /// Length of the token stream the state belongs to.
    pub n_tokens: u64,
    /// The window-position generator ([`Sampling::Random`]).
    pub rng: Xoshiro256StarStar,
    /// Start of the next window ([`Sampling::Sequential`]).
    pub cursor: u64,
    /// Batches produced so far.
    pub batches: u64,
}

/// Produces batches of windows from a token stream (see the module docs).
#[derive(Clone, Debug)]
pub struct Batcher {
    tokens: Tokens,
    config: BatcherConfig,
    rng: Xoshiro256StarStar,
    cursor: usize,
    batches: u64,
    window: Vec<u32>,
}

impl Batcher {
    /// A batcher at the start of its stream.
    ///
    /// Errors: `batch` or `seq` zero ([`DataError::InvalidConfig`]); fewer than `seq + 1`
    /// tokens ([`DataError::TooShort`]).
    pub fn new(tokens: Tokens, config: BatcherConfig) -> Result<Self, DataError> {
        if config.batch == 0 || config.seq == 0 {
            return Err(DataError::InvalidConfig(format!(
                "batch ({}) and seq ({}) must be positive",
                config.batch, config.seq
            )));
        }
        if tokens.len() <= config.seq {
            return Err(DataError::TooShort {
                what: format!(
                    "windows of {}+1 tokens from {}",
                    config.seq,
                    tokens.origin()
                ),
                needed: (config.seq as u64).saturating_add(1),
                available: tokens.len() as u64,
            });
        }
        Ok(Batcher {
            rng: Xoshiro256StarStar::seed_from_u64(config.seed),
            window: vec![0; config.seq + 1],
            tokens,
            config,
            cursor: 0,
            batches: 0,
        })
    }

    /// A batcher that continues from a saved state.
    ///
    /// Errors: as [`Batcher::new`], plus [`DataError::StateMismatch`] when the state was
    /// saved for a stream of another length or has a cursor outside the stream.
    pub fn from_state(tokens: Tokens, state: &BatcherState) -> Result<Self, DataError> {
        if state.n_tokens != tokens.len() as u64 {
            return Err(DataError::StateMismatch(format!(
                "saved for {} tokens, this stream ({}) has {}",
                state.n_tokens,
                tokens.origin(),
                tokens.len()
            )));
        }
        let mut b = Batcher::new(tokens, state.config)?;
        // seq < n_tokens here (Batcher::new), so the window length cannot overflow
        let window = state.config.seq as u64 + 1;
        if state
            .cursor
            .checked_add(window)
            .is_none_or(|end| end > state.n_tokens)
        {
            return Err(DataError::StateMismatch(format!(
                "cursor {} leaves no whole window in {} tokens",
                state.cursor, state.n_tokens
            )));
        }
        b.rng = state.rng;
        b.cursor = state.cursor as usize;
        b.batches = state.batches;
        Ok(b)
    }

    /// The state to save for resuming.
    pub fn state(&self) -> BatcherState {
        BatcherState {
            config: self.config,
            n_tokens: self.tokens.len() as u64,
            rng: self.rng,
            cursor: self.cursor as u64,
            batches: self.batches,
        }
    }

    /// The configuration.
    pub fn config(&self) -> &BatcherConfig {
        &self.config
    }

    /// The token stream.
    pub fn tokens(&self) -> &Tokens {
        &self.tokens
    }

    /// Batches produced so far.
    pub fn batches_drawn(&self) -> u64 {
        self.batches
    }

    /// Number of whole sequential windows in the stream (`(len - 1) / seq`): one pass of
    /// [`Sampling::Sequential`] covers this many rows before wrapping.
    pub fn windows_per_pass(&self) -> usize {
        (self.tokens.len() - 1) / self.config.seq
    }

    /// Rewinds to the initial state (fresh seed stream, cursor 0).
    pub fn reset(&mut self) {
        self.rng = Xoshiro256StarStar::seed_from_u64(self.config.seed);
        self.cursor = 0;
        self.batches = 0;
    }

    /// Start of the next window, advancing the stream.
    fn next_start(&mut self) -> usize {
        let seq = self.config.seq;
        match self.config.sampling {
            Sampling::Random => {
                let n_starts = (self.tokens.len() - seq) as u64;
                self.rng.below(n_starts) as usize
            }
            Sampling::Sequential => {
                if self.cursor + seq + 1 > self.tokens.len() {
                    self.cursor = 0;
                }
                let s = self.cursor;
                self.cursor += seq;
                s
            }
        }
    }

    /// The next batch.
    pub fn next_batch(&mut self) -> Batch {
        let BatcherConfig { batch, seq, .. } = self.config;
        let mut inputs = Vec::with_capacity(batch * seq);
        let mut targets = Vec::with_capacity(batch * seq);
        for _ in 0..batch {
            let s = self.next_start();
            self.tokens.copy_to(s, &mut self.window);
            inputs.extend_from_slice(&self.window[..seq]);
            targets.extend_from_slice(&self.window[1..]);
        }
        self.batches += 1;
        Batch {
            inputs,
            targets,
            batch,
            seq,
        }
    }
}

impl Iterator for Batcher {
    type Item = Batch;

    /// Never ends: both schemes are epoch-free streams.
    fn next(&mut self) -> Option<Batch> {
        Some(self.next_batch())
    }
}
