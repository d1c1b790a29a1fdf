//! Rotary position embedding (RoPE), "rotate half" convention (GPT-NeoX / Llama in Hugging
//! Face): for a head vector `x = [x₁ | x₂]` (halves of `D/2`) at position `p`,
//! `y₁ = x₁ cos θ − x₂ sin θ`, `y₂ = x₁ sin θ + x₂ cos θ` with `θᵢ = p · base^(−2i/D)`.

use std::rc::Rc;

use crate::cpu::{for_rows, store};
use crate::error::{arg_err, shape_err};
use crate::graph::backward_fn;
use crate::{Graph, Result, Tensor};

/// `[T, D/2]` cosines followed by `[T, D/2]` sines, computed in f64 and rounded.
pub(crate) fn rope_table(t: usize, d: usize, base: f32, offset: usize) -> Vec<f32> {
    let h = d / 2;
    let mut tab = vec![0.0f32; 2 * t * h];
    // the frequencies once (the same values as computing them per position)
    let inv: Vec<f64> = (0..h)
        .map(|i| (base as f64).powf(-2.0 * i as f64 / d as f64))
        .collect();
    for p in 0..t {
        for (i, &inv) in inv.iter().enumerate() {
            let th = (p + offset) as f64 * inv;
            tab[p * h + i] = th.cos() as f32;
            tab[t * h + p * h + i] = th.sin() as f32;
        }
    }
    tab
}

impl Graph<'_> {
    /// Rotary embedding of `x: [..., T, D]` (`D` even) at positions `pos_offset..pos_offset+T`
    /// with frequency base `base` (10000 in most models).
    ///
    /// ```
    /// use autograd::{Graph, ParamStore};
    /// let mut ps = ParamStore::new();
    /// let mut g = Graph::new(&mut ps);
    /// // T = 2, D = 2: position 0 is unchanged, position 1 rotates by 1 radian
    /// let x = g.input(&[1.0, 0.0, 1.0, 0.0], &[2, 2])?;
    /// let y = g.rope(x, 10000.0, 0)?;
    /// let v = g.value(y)?;
    /// assert_eq!(&v[..2], &[1.0, 0.0]);
    /// assert!((v[2] - 1f32.cos()).abs() < 1e-7 && (v[3] - 1f32.sin()).abs() < 1e-7);
    /// # Ok::<(), autograd::Error>(())
    /// ```
    pub fn rope(&mut self, x: Tensor, base: f32, pos_offset: usize) -> Result<Tensor> {
        let sx = self.shape(x)?;
        if sx.rank() < 2 || sx.last() % 2 != 0 {
            return shape_err(
                "rope",
                format!("expected [..., T, D] with even D, got {sx}"),
            );
        }
        if !(base > 1.0 && base.is_finite()) {
            return arg_err("rope", format!("base must be finite and > 1, got {base}"));
        }
        let (t, d) = (sx.dims()[sx.rank() - 2], sx.last());
        if self.dev.is_some() {
            return self.dev_rope(x, base, pos_offset, t, d);
        }
        let tab = self.rope_tab(t, d, base, pos_offset);
        let mut out = self.alloc(sx.numel());
        cpu::rope(
            self.values().get(x),
            &tab,
            t,
            d,
            false,
            false,
            out.as_mut_slice(),
        );
        let bw = self.needs_grad(&[x]).then(|| {
            backward_fn(move |ctx, dy| {
                if let Some(mut g) = ctx.take(x) {
                    cpu::rope(dy, &tab, t, d, true, g.acc(), g.slice());
                    ctx.put(x, g);
                }
                Ok(())
            })
        });
        Ok(self.push("rope", out, sx, bw))
    }
}

impl Graph<'_> {
    /// The [`rope_table`] of these sizes, computed once per graph.
    pub(crate) fn rope_tab(&mut self, t: usize, d: usize, base: f32, offset: usize) -> Rc<[f32]> {
        let key = (t, d, base.to_bits(), offset);
        self.rope_cache
            .entry(key)
            .or_insert_with(|| rope_table(t, d, base, offset).into())
            .clone()
    }
}

/// CPU kernels.
pub(crate) mod cpu {
    use super::*;

    /// Rotates every `D`-row of `x` by its position's angles (`inverse`: by minus them, which
    /// is the backward pass); writes or adds to `out`.
    pub(crate) fn rope(
        x: &[f32],
        tab: &[f32],
        t: usize,
        d: usize,
        inverse: bool,
        acc: bool,
        out: &mut [f32],
    ) {
        for_rows(
            out,
            d,
            #[inline(always)]
            |r, row| {
                let put = move |y: &mut f32, v: f32| store(acc, y, v);
                rotate(&x[r * d..(r + 1) * d], tab, t, r % t, inverse, row, put)
            },
        );
    }

    /// Rotates one `D`-row `x` at position `p` of the `[T, D/2]` cos / sin table `tab`
    /// (`inverse`: by minus the angles) into `y` through `put(&mut y_i, value)` (a plain
    /// store, an add, ...). The pairs run in groups of [`LANES`] of fixed length, so that a
    /// head of `D` = 32 or 64 (16 or 32 pairs) is one or two vector steps rather than the
    /// scalar tail of a loop vectorised for longer rows; each pair's arithmetic is the same
    /// either way.
    #[inline(always)]
    pub(crate) fn rotate(
        x: &[f32],
        tab: &[f32],
        t: usize,
        p: usize,
        inverse: bool,
        y: &mut [f32],
        put: impl Fn(&mut f32, f32),
    ) {
        let h = x.len() / 2;
        let sgn = if inverse { -1.0 } else { 1.0 };
        let (c, s) = (&tab[p * h..(p + 1) * h], &tab[(t + p) * h..(t + p + 1) * h]);
        let (x1, x2) = x.split_at(h);
        let (y1, y2) = y[..2 * h].split_at_mut(h);
        let pair = |a: f32, b: f32, cs: f32, sn: f32| {
            let sn = sgn * sn;
            (a * cs - b * sn, a * sn + b * cs)
        };
        let groups = y1
            .chunks_exact_mut(LANES)
            .zip(y2.chunks_exact_mut(LANES))
            .zip(x1.chunks_exact(LANES).zip(x2.chunks_exact(LANES)))
            .zip(c.chunks_exact(LANES).zip(s.chunks_exact(LANES)));
        for (((y1, y2), (a, b)), (cs, sn)) in groups {
            // every load before any store, and each output half stored by its own loop: the
            // compiler cannot tell these slices apart once inlined, and would not reorder
            let (mut r1, mut r2) = ([0.0f32; LANES], [0.0f32; LANES]);
            for i in 0..LANES {
                (r1[i], r2[i]) = pair(a[i], b[i], cs[i], sn[i]);
            }
            for (y, r) in y1.iter_mut().zip(r1) {
                put(y, r);
            }
            for (y, r) in y2.iter_mut().zip(r2) {
                put(y, r);
            }
        }
        for i in h - h % LANES..h {
            let (r1, r2) = pair(x1[i], x2[i], c[i], s[i]);
            put(&mut y1[i], r1);
            put(&mut y2[i], r2);
        }
    }

    /// Pairs rotated per vector step (16 f32 lanes of AVX-512).
    const LANES: usize = 16;
}

#[cfg(test)]
mod tests {
    use crate::ops::test_util::assert_gradcheck;
    use crate::{init, Error, Graph, ParamStore};

    #[test]
    fn gradcheck_rope() {
        let mut ps = ParamStore::new();
        let x = ps
            .add("x", &[2, 2, 3, 8], init::normal(96, 1.0, 1))
            .unwrap();
        assert_gradcheck(&mut ps, |g| {
            let x = g.param(x)?;
            let a = g.rope(x, 10000.0, 0)?;
            let b = g.rope(x, 100.0, 5)?;
            g.mul(a, b)
        });
    }

    /// The grouped rotation has the bits of the pair formula written out element by element,
    /// for half-widths with and without a partial group of 16, both directions, stored and
    /// added (inside [`simd`](crate::cpu::simd), as the ops call it).
    #[test]
    fn rotate_has_the_bits_of_the_pair_formula() {
        use super::cpu::rotate;
        use super::rope_table;
        use crate::cpu::simd;
        for h in [1, 3, 15, 16, 17, 32, 37, 64] {
            let (t, d) = (5, 2 * h);
            let tab = rope_table(t, d, 10000.0, 3);
            let x = init::normal(d, 1.0, h as u64);
            let start = init::normal(d, 1.0, 100 + h as u64);
            for p in [0, t - 1] {
                for inverse in [false, true] {
                    let sgn = if inverse { -1.0f32 } else { 1.0 };
                    let mut rotated = vec![0.0f32; d];
                    for i in 0..h {
                        let (cs, sn) = (tab[p * h + i], sgn * tab[(t + p) * h + i]);
                        rotated[i] = x[i] * cs - x[h + i] * sn;
                        rotated[h + i] = x[i] * sn + x[h + i] * cs;
                    }
                    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                    let mut set = vec![f32::NAN; d];
                    simd(|| rotate(&x, &tab, t, p, inverse, &mut set, |y, v| *y = v));
                    assert_eq!(bits(&set), bits(&rotated), "h {h} p {p} inverse {inverse}");
                    let mut added = start.clone();
                    simd(|| rotate(&x, &tab, t, p, inverse, &mut added, |y, v| *y += v));
                    let want: Vec<f32> = start.iter().zip(&rotated).map(|(s, r)| s + r).collect();
                    assert_eq!(bits(&added), bits(&want), "h {h} p {p} inverse {inverse}");
                }
            }
        }
    }

    #[test]
    fn rope_preserves_norm_and_rejects_odd_dims() {
        let mut ps = ParamStore::new();
        let mut g = Graph::new(&mut ps);
        let xs = init::normal(4 * 16, 1.0, 3);
        let x = g.input(&xs, &[4, 16]).unwrap();
        let y = g.rope(x, 10000.0, 7).unwrap();
        let (a, b) = (g.value(x).unwrap(), g.value(y).unwrap());
        for r in 0..4 {
            let n = |v: &[f32]| v[r * 16..(r + 1) * 16].iter().map(|x| x * x).sum::<f32>();
            assert!((n(a) - n(b)).abs() < 1e-4);
        }
        let z = g.input(&[0.0; 6], &[2, 3]).unwrap();
        assert!(matches!(g.rope(z, 10000.0, 0), Err(Error::Shape { .. })));
        assert!(matches!(
            g.rope(x, 0.5, 0),
            Err(Error::InvalidArgument { .. })
        ));
    }
}
