//! RMSNorm and LayerNorm over the last dimension, with a learned gain (and LayerNorm bias).
//! Forward saves one or two f32 statistics per row; backward recomputes the rest.

use rayon::prelude::*;

use crate::backend::NormKind;
use crate::cpu::{for_rows_with, rows_per_task, simd, store, sum, sum_sq, PAR_MIN};
use crate::error::{arg_err, shape_err};
use crate::graph::backward_fn;
use crate::{Graph, Result, Shape, Tensor};

fn check(op: &'static str, sx: Shape, sw: Shape, eps: f32) -> Result<usize> {
    let d = sx.last();
    if sx.rank() == 0 || sw.dims() != [d] {
        return shape_err(
            op,
            format!("input {sx} needs a gain of shape [{d}], got {sw}"),
        );
    }
    if !(eps >= 0.0 && eps.is_finite()) {
        return arg_err(
            op,
            format!("epsilon must be finite and non-negative, got {eps}"),
        );
    }
    Ok(d)
}

impl Graph<'_> {
    /// RMSNorm over the last dimension: `y = x / sqrt(mean(x²) + eps) ⊙ w`, `w: [D]`.
    ///
    /// ```
    /// use autograd::{Graph, ParamStore};
    /// let mut ps = ParamStore::new();
    /// let mut g = Graph::new(&mut ps);
    /// let x = g.input(&[3.0, 4.0, 1.0, 1.0], &[2, 2])?;
    /// let w = g.input(&[1.0, 2.0], &[2])?;
    /// let y = g.rmsnorm(x, w, 0.0)?;
    /// let v = g.value(y)?; // row 0: rms = sqrt(12.5)
    /// assert!((v[0] - 3.0 / 12.5f32.sqrt()).abs() < 1e-6 && (v[3] - 2.0).abs() < 1e-6);
    /// let z = g.layernorm(x, w, None, 0.0)?;
    /// assert_eq!(g.value(z)?[..2], [-1.0, 2.0]);
    /// # Ok::<(), autograd::Error>(())
    /// ```
    pub fn rmsnorm(&mut self, x: Tensor, w: Tensor, eps: f32) -> Result<Tensor> {
        let (sx, sw) = (self.shape(x)?, self.shape(w)?);
        let d = check("rmsnorm", sx, sw, eps)?;
        if self.dev.is_some() {
            return self.dev_norm(NormKind::Rms, x, w, None, eps);
        }
        let rg = self.needs_grad(&[x, w]);
        let mut out = self.alloc(sx.numel());
        let mut rstd = vec![0.0f32; if rg { sx.rows() } else { 0 }];
        let v = self.values();
        cpu::rms_fwd(v.get(x), v.get(w), eps, d, out.as_mut_slice(), &mut rstd);
        let bw = rg.then(|| {
            backward_fn(move |ctx, dy| {
                let (gx, gw) = (ctx.take(x), ctx.take(w));
                let (xv, wv) = (ctx.vals.get(x), ctx.vals.get(w));
                let (mut gx, mut gw) = (gx, gw);
                cpu::norm_bwd(
                    cpu::Kind::Rms,
                    xv,
                    wv,
                    &rstd,
                    dy,
                    d,
                    gx.as_mut().map(|g| (g.acc(), g.slice())),
                    gw.as_mut().map(|g| (g.acc(), g.slice())),
                    None,
                );
                if let Some(g) = gx {
                    ctx.put(x, g);
                }
                if let Some(g) = gw {
                    ctx.put(w, g);
                }
                Ok(())
            })
        });
        Ok(self.push("rmsnorm", out, sx, bw))
    }

    /// LayerNorm over the last dimension: `y = (x − mean) / sqrt(var + eps) ⊙ w (+ b)`,
    /// `w, b: [D]`, biased variance (as PyTorch).
    pub fn layernorm(
        &mut self,
        x: Tensor,
        w: Tensor,
        b: Option<Tensor>,
        eps: f32,
    ) -> Result<Tensor> {
        let (sx, sw) = (self.shape(x)?, self.shape(w)?);
        let d = check("layernorm", sx, sw, eps)?;
        if let Some(b) = b {
            let sb = self.shape(b)?;
            if sb != sw {
                return shape_err("layernorm", format!("bias {sb} differs from gain {sw}"));
            }
        }
        if self.dev.is_some() {
            return self.dev_norm(NormKind::Layer, x, w, b, eps);
        }
        let inputs: Vec<Tensor> = [Some(x), Some(w), b].into_iter().flatten().collect();
        let rg = self.needs_grad(&inputs);
        let mut out = self.alloc(sx.numel());
        let mut stats = vec![0.0f32; if rg { 2 * sx.rows() } else { 0 }];
        let v = self.values();
        let bv = b.map(|b| v.get(b));
        cpu::ln_fwd(
            v.get(x),
            v.get(w),
            bv,
            eps,
            d,
            out.as_mut_slice(),
            &mut stats,
        );
        let bw = rg.then(|| {
            backward_fn(move |ctx, dy| {
                let (mut gx, mut gw) = (ctx.take(x), ctx.take(w));
                let mut gb = b.and_then(|b| ctx.take(b));
                let (xv, wv) = (ctx.vals.get(x), ctx.vals.get(w));
                cpu::norm_bwd(
                    cpu::Kind::Layer,
                    xv,
                    wv,
                    &stats,
                    dy,
                    d,
                    gx.as_mut().map(|g| (g.acc(), g.slice())),
                    gw.as_mut().map(|g| (g.acc(), g.slice())),
                    gb.as_mut().map(|g| (g.acc(), g.slice())),
                );
                if let Some(g) = gx {
                    ctx.put(x, g);
                }
                if let Some(g) = gw {
                    ctx.put(w, g);
                }
                if let (Some(b), Some(g)) = (b, gb) {
                    ctx.put(b, g);
                }
                Ok(())
            })
        });
        Ok(self.push("layernorm", out, sx, bw))
    }
}

/// CPU kernels.
pub(crate) mod cpu {
    use super::*;

    #[derive(Clone, Copy, PartialEq, Eq)]
    pub(crate) enum Kind {
        Rms,
        Layer,
    }

    /// Writes `y` and, when `rstd_out` is not empty, one `1/rms` per row.
    pub(crate) fn rms_fwd(
        x: &[f32],
        w: &[f32],
        eps: f32,
        d: usize,
        y: &mut [f32],
        rstd_out: &mut [f32],
    ) {
        for_rows_with(
            y,
            d,
            rstd_out,
            1,
            #[inline(always)]
            |r, yr, st| {
                let xr = &x[r * d..(r + 1) * d];
                let rs = 1.0 / (sum_sq(xr) / d as f32 + eps).sqrt();
                for ((y, &x), &w) in yr.iter_mut().zip(xr).zip(w) {
                    *y = x * rs * w;
                }
                if let Some(s) = st.first_mut() {
                    *s = rs;
                }
            },
        );
    }

    /// Writes `y` and, when `stats` is not empty, `(mean, 1/std)` per row.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn ln_fwd(
        x: &[f32],
        w: &[f32],
        b: Option<&[f32]>,
        eps: f32,
        d: usize,
        y: &mut [f32],
        stats: &mut [f32],
    ) {
        for_rows_with(
            y,
            d,
            stats,
            2,
            #[inline(always)]
            |r, yr, st| {
                let xr = &x[r * d..(r + 1) * d];
                let mu = sum(xr) / d as f32;
                // two-pass variance (16 lanes)
                let mut acc = [0.0f32; 16];
                let c = xr.chunks_exact(16);
                let mut var: f32 = c.remainder().iter().map(|v| (v - mu) * (v - mu)).sum();
                for ch in c {
                    for (a, &v) in acc.iter_mut().zip(ch) {
                        *a += (v - mu) * (v - mu);
                    }
                }
                var = (var + acc.iter().sum::<f32>()) / d as f32;
                let rs = 1.0 / (var + eps).sqrt();
                match b {
                    Some(b) => {
                        for (((y, &x), &w), &b) in yr.iter_mut().zip(xr).zip(w).zip(b) {
                            *y = (x - mu) * rs * w + b;
                        }
                    }
                    None => {
                        for ((y, &x), &w) in yr.iter_mut().zip(xr).zip(w) {
                            *y = (x - mu) * rs * w;
                        }
                    }
                }
                if st.len() == 2 {
                    st[0] = mu;
                    st[1] = rs;
                }
            },
        );
    }

    /// Backward of both norms (`stats`: `1/rms` per row, or `(mean, 1/std)` per row). `dx`, `dw`, `db` are `(accumulate, buffer)` when wanted.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn norm_bwd(
        kind: Kind,
        x: &[f32],
        w: &[f32],
        stats: &[f32],
        dy: &[f32],
        d: usize,
        dx: Option<(bool, &mut [f32])>,
        dw: Option<(bool, &mut [f32])>,
        db: Option<(bool, &mut [f32])>,
    ) {
        if d == 0 {
            return;
        }
        let rows = x.len() / d;
        let (want_w, want_b) = (dw.is_some(), db.is_some());
        let per = if x.len() < PAR_MIN {
            rows.max(1)
        } else {
            rows_per_task(d)
        };
        // One task per chunk of rows: writes its dx rows, returns partial dw / db.
        let task = |ci: usize, dxc: Option<(bool, &mut [f32])>| {
            simd(
                #[inline(always)]
                || -> (Vec<f32>, Vec<f32>) {
                    let mut pw = vec![0.0f32; if want_w { d } else { 0 }];
                    let mut pb = vec![0.0f32; if want_b { d } else { 0 }];
                    let (acc, mut dxc) = match dxc {
                        Some((a, s)) => (a, Some(s)),
                        None => (false, None),
                    };
                    let r0 = ci * per;
                    let r1 = (r0 + per).min(rows);
                    for r in r0..r1 {
                        let xr = &x[r * d..(r + 1) * d];
                        let dyr = &dy[r * d..(r + 1) * d];
                        let (mu, rs) = match kind {
                            Kind::Rms => (0.0, stats[r]),
                            Kind::Layer => (stats[2 * r], stats[2 * r + 1]),
                        };
                        if want_w {
                            for ((p, &g), &x) in pw.iter_mut().zip(dyr).zip(xr) {
                                *p += g * (x - mu) * rs;
                            }
                        }
                        if want_b {
                            for (p, &g) in pb.iter_mut().zip(dyr) {
                                *p += g;
                            }
                        }
                        if let Some(dxc) = dxc.as_deref_mut() {
                            let dxr = &mut dxc[(r - r0) * d..(r - r0 + 1) * d];
                            // Σ g·x̂ and Σ g with g = w ⊙ dy
                            let mut sgx = [0.0f32; 16];
                            let mut sg = [0.0f32; 16];
                            let n16 = d / 16 * 16;
                            for i in (0..n16).step_by(16) {
                                for l in 0..16 {
                                    let g = w[i + l] * dyr[i + l];
                                    sgx[l] += g * (xr[i + l] - mu);
                                    sg[l] += g;
                                }
                            }
                            let (mut a, mut b) = (0.0f32, 0.0f32);
                            for i in n16..d {
                                let g = w[i] * dyr[i];
                                a += g * (xr[i] - mu);
                                b += g;
                            }
                            let sgx = (a + sgx.iter().sum::<f32>()) * rs; // Σ g·x̂
                            let sg = b + sg.iter().sum::<f32>();
                            let inv_d = 1.0 / d as f32;
                            match kind {
                                Kind::Rms => {
                                    let c = sgx * inv_d * rs;
                                    for (((o, &g), &w), &x) in
                                        dxr.iter_mut().zip(dyr).zip(w).zip(xr)
                                    {
                                        store(acc, o, rs * (w * g) - x * rs * c);
                                    }
                                }
                                Kind::Layer => {
                                    let (mg, mgx) = (sg * inv_d, sgx * inv_d);
                                    for (((o, &g), &w), &x) in
                                        dxr.iter_mut().zip(dyr).zip(w).zip(xr)
                                    {
                                        let xh = (x - mu) * rs;
                                        store(acc, o, rs * (w * g - mg - xh * mgx));
                                    }
                                }
                            }
                        }
                    }
                    (pw, pb)
                },
            )
        };
        let nchunks = rows.div_ceil(per);
        let partials: Vec<(Vec<f32>, Vec<f32>)> = match dx {
            Some((acc, s)) => s
                .par_chunks_mut(per * d)
                .enumerate()
                .map(|(ci, c)| task(ci, Some((acc, c))))
                .collect(),
            None => (0..nchunks)
                .into_par_iter()
                .map(|ci| task(ci, None))
                .collect(),
        };
        for (target, second) in [(dw, false), (db, true)] {
            if let Some((acc, t)) = target {
                if !acc {
                    t.fill(0.0);
                }
                for p in &partials {
                    let p = if second { &p.1 } else { &p.0 };
                    for (t, v) in t.iter_mut().zip(p) {
                        *t += v;
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::ops::test_util::assert_gradcheck;
    use crate::{init, Error, Graph, ParamStore};

    #[test]
    fn gradcheck_rmsnorm() {
        let mut ps = ParamStore::new();
        let x = ps.add("x", &[3, 20], init::normal(60, 1.0, 1)).unwrap();
        let w = ps.add("w", &[20], init::normal(20, 1.0, 2)).unwrap();
        assert_gradcheck(&mut ps, |g| {
            let (x, w) = (g.param(x)?, g.param(w)?);
            g.rmsnorm(x, w, 1e-5)
        });
    }

    #[test]
    fn gradcheck_layernorm() {
        let mut ps = ParamStore::new();
        let x = ps.add("x", &[2, 2, 18], init::normal(72, 1.0, 3)).unwrap();
        let w = ps.add("w", &[18], init::normal(18, 1.0, 4)).unwrap();
        let b = ps.add("b", &[18], init::normal(18, 1.0, 5)).unwrap();
        assert_gradcheck(&mut ps, |g| {
            let (x, w, b) = (g.param(x)?, g.param(w)?, g.param(b)?);
            let y = g.layernorm(x, w, Some(b), 1e-5)?;
            let z = g.layernorm(x, w, None, 1e-3)?;
            g.add(y, z)
        });
    }

    #[test]
    fn large_norms_match_small_path_and_reject_bad_shapes() {
        // a row count that takes the parallel path, compared against row-by-row evaluation
        let (rows, d) = (300, 128);
        let xs = init::normal(rows * d, 1.0, 9);
        let ws = init::normal(d, 1.0, 10);
        let mut ps = ParamStore::new();
        let w = ps.add("w", &[d], ws).unwrap();
        let mut g = Graph::new(&mut ps);
        let x = g.variable(&xs, &[rows, d]).unwrap();
        let wt = g.param(w).unwrap();
        let y = g.rmsnorm(x, wt, 1e-6).unwrap();
        let y2 = g.layernorm(x, wt, None, 1e-6).unwrap();
        let y = g.add(y, y2).unwrap();
        let l = g.sum(y).unwrap();
        g.backward(l).unwrap();
        let big = g.grad(x).unwrap().unwrap().to_vec();
        drop(g);
        let gw_big = ps.grad(w).unwrap().to_vec();
        ps.zero_grad();
        let mut gw_small = vec![0.0f64; d];
        for r in 0..rows {
            let mut g = Graph::new(&mut ps);
            let x = g.variable(&xs[r * d..(r + 1) * d], &[1, d]).unwrap();
            let wt = g.param(w).unwrap();
            let y = g.rmsnorm(x, wt, 1e-6).unwrap();
            let y2 = g.layernorm(x, wt, None, 1e-6).unwrap();
            let y = g.add(y, y2).unwrap();
            let l = g.sum(y).unwrap();
            g.backward(l).unwrap();
            assert_eq!(g.grad(x).unwrap().unwrap(), &big[r * d..(r + 1) * d]);
            drop(g);
            for (a, &b) in gw_small.iter_mut().zip(ps.grad(w).unwrap()) {
                *a += b as f64;
            }
            ps.zero_grad();
        }
        for (a, b) in gw_small.iter().zip(&gw_big) {
            assert!((a - *b as f64).abs() < 1e-3 * (1.0 + a.abs()), "{a} vs {b}");
        }
        let mut g = Graph::new(&mut ps);
        let x = g.input(&[0.0; 6], &[2, 3]).unwrap();
        let wt = g.param(w).unwrap();
        assert!(matches!(g.rmsnorm(x, wt, 1e-5), Err(Error::Shape { .. })));
        let w3 = g.input(&[1.0; 3], &[3]).unwrap();
        assert!(matches!(
            g.layernorm(x, w3, None, -1.0),
            Err(Error::InvalidArgument { .. })
        ));
    }
}
