//! The key/value cache of a batch of sequences being decoded: per layer, keys and values
//! `[batch, heads, capacity, head_dim]` after RoPE (and after the BF16 rounding of a BF16
//! attention recipe), i.e. exactly the tensors the attention of the full forward pass reads.

use crate::memory;
use crate::model::ModelConfig;

/// Keys and values of `batch` sequences, up to `capacity` positions each.
#[derive(Clone, Debug)]
pub struct KvCache {
    batch: usize,
    heads: usize,
    head_dim: usize,
    cap: usize,
    len: usize,
    k: Vec<Vec<f32>>,
    v: Vec<Vec<f32>>,
}

impl KvCache {
    /// An empty cache for `batch` sequences of at most `capacity` tokens of model `cfg`.
    /// The memory (`2 · layers · batch · capacity · d_model` floats) is checked first.
    ///
    /// ```
    /// use trainer::model::ModelConfig;
    /// use trainer::rl::kv_cache::KvCache;
    /// let cfg = ModelConfig::preset("tiny")?;
    /// let c = KvCache::new(&cfg, 4, 16)?;
    /// assert_eq!((c.batch(), c.capacity(), c.len()), (4, 16, 0));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn new(
        cfg: &ModelConfig,
        batch: usize,
        capacity: usize,
    ) -> Result<KvCache, memory::TooLarge> {
        let per_layer = batch as u128 * capacity as u128 * cfg.d_model as u128;
        memory::check(
            &format!("a KV cache of {batch} sequences x {capacity} positions"),
            per_layer * 2 * cfg.n_layers as u128 * 4,
        )?;
        let n = per_layer as usize;
        Ok(KvCache {
            batch,
            heads: cfg.n_heads,
            head_dim: cfg.d_model / cfg.n_heads,
            cap: capacity,
            len: 0,
            k: vec![vec![0.0; n]; cfg.n_layers],
            v: vec![vec![0.0; n]; cfg.n_layers],
        })
    }

    /// Sequences.
    pub fn batch(&self) -> usize {
        self.batch
    }

    /// Positions each sequence can hold.
    pub fn capacity(&self) -> usize {
        self.cap
    }

    /// Positions filled.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no position is filled.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Keys and values of layer `layer`, `[batch, heads, capacity, head_dim]`.
    pub fn layer(&self, layer: usize) -> (&[f32], &[f32]) {
        (&self.k[layer], &self.v[layer])
    }

    /// Writes `t` new positions of layer `layer` (`k`, `v`: `[batch, heads, t, head_dim]`)
    /// after the filled ones (the model checked that they fit).
    pub(crate) fn write(&mut self, layer: usize, k: &[f32], v: &[f32], t: usize) {
        let (dh, cap, past) = (self.head_dim, self.cap, self.len);
        for bh in 0..self.batch * self.heads {
            let src = bh * t * dh..(bh + 1) * t * dh;
            let dst = (bh * cap + past) * dh..(bh * cap + past + t) * dh;
            self.k[layer][dst.clone()].copy_from_slice(&k[src.clone()]);
            self.v[layer][dst].copy_from_slice(&v[src]);
        }
    }

    /// Marks `t` more positions filled (after every layer wrote them).
    pub(crate) fn advance(&mut self, t: usize) {
        self.len += t;
    }
}
