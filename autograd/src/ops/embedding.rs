//! Embedding lookup: rows of a `[V, D]` table gathered by token id; backward scatter-adds.

use crate::cpu::for_rows;
use crate::error::shape_err;
use crate::graph::backward_fn;
use crate::{Error, Graph, Result, Shape, Tensor};

impl Graph<'_> {
    /// Gathers rows of `table: [V, D]` for `ids` (any shape of up to three dimensions, given
    /// by `ids_shape`): the output has shape `ids_shape + [D]`.
    ///
    /// ```
    /// use autograd::{Graph, ParamStore};
    /// let mut ps = ParamStore::new();
    /// let emb = ps.add("emb", &[3, 2], vec![0.0, 1.0, 10.0, 11.0, 20.0, 21.0])?;
    /// let mut g = Graph::new(&mut ps);
    /// let table = g.param(emb)?;
    /// let x = g.embedding(&[2, 0, 2], &[1, 3], table)?;
    /// assert_eq!(g.shape(x)?.dims(), &[1, 3, 2]);
    /// assert_eq!(g.value(x)?, &[20.0, 21.0, 0.0, 1.0, 20.0, 21.0]);
    /// assert!(g.embedding(&[3], &[1], table).is_err()); // out of range
    /// # Ok::<(), autograd::Error>(())
    /// ```
    pub fn embedding(&mut self, ids: &[u32], ids_shape: &[usize], table: Tensor) -> Result<Tensor> {
        let st = self.shape(table)?;
        if st.rank() != 2 {
            return shape_err("embedding", format!("table must be [V, D], got {st}"));
        }
        let (vocab, d) = (st.dims()[0], st.dims()[1]);
        let ishape = Shape::new(ids_shape)?;
        if ishape.numel() != ids.len() {
            return Err(Error::DataLength {
                what: "embedding ids",
                len: ids.len(),
                shape: ishape,
            });
        }
        let mut dims = ids_shape.to_vec();
        dims.push(d);
        let out_shape = Shape::new(&dims)?;
        if let Some(&bad) = ids.iter().find(|&&i| i as usize >= vocab) {
            return Err(Error::IndexOutOfRange {
                op: "embedding",
                index: bad,
                size: vocab,
            });
        }
        if self.dev.is_some() {
            return self.dev_embedding(ids, table, d, out_shape);
        }
        let mut out = self.alloc(out_shape.numel());
        let tv = self.values().get(table);
        for_rows(
            out.as_mut_slice(),
            d,
            #[inline(always)]
            |r, row| {
                let i = ids[r] as usize;
                row.copy_from_slice(&tv[i * d..(i + 1) * d]);
            },
        );
        let bw = self.needs_grad(&[table]).then(|| {
            let ids = ids.to_vec();
            backward_fn(move |ctx, dy| {
                if let Some(mut g) = ctx.take(table) {
                    let gt = g.zeroed();
                    cpu::scatter_add(&ids, dy, d, gt);
                    ctx.put(table, g);
                }
                Ok(())
            })
        });
        Ok(self.push("embedding", out, out_shape, bw))
    }
}

/// CPU kernels.
pub(crate) mod cpu {
    /// `table[ids[r]] += dy[r]` for every row `r` (in order: deterministic).
    pub(crate) fn scatter_add(ids: &[u32], dy: &[f32], d: usize, table: &mut [f32]) {
        for (r, &i) in ids.iter().enumerate() {
            let i = i as usize;
            for (t, &g) in table[i * d..(i + 1) * d]
                .iter_mut()
                .zip(&dy[r * d..(r + 1) * d])
            {
                *t += g;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::ops::test_util::assert_gradcheck;
    use crate::{init, ParamStore};

    #[test]
    fn gradcheck_embedding() {
        let mut ps = ParamStore::new();
        let t = ps.add("table", &[5, 6], init::normal(30, 1.0, 1)).unwrap();
        // repeated ids exercise the scatter-add
        assert_gradcheck(&mut ps, |g| {
            let t = g.param(t)?;
            g.embedding(&[1, 4, 1, 0, 3, 1], &[2, 3], t)
        });
    }
}
