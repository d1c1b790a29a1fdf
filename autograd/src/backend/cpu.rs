//! [`CpuBackend`]: the ops' CPU kernels behind the [`Backend`] trait (host `Vec<f32>` buffers).

use quant::gemm::{sgemm, MatRef};

use super::{Act, AdamWCoeffs, Backend, BackendError, NormKind, Out, Result};
use crate::cpu::{sigmoid, store, sum_rows};
use crate::ops::attention_products::AttentionProducts;
use crate::ops::{
    activation, attention, cross_entropy, elementwise, embedding, norm, reduce, rope, shape_ops,
};

/// The CPU kernels of `ops/` (the reference every other backend is compared with).
#[derive(Clone, Copy, Debug, Default)]
pub struct CpuBackend;

fn check(op: &str, what: &str, got: usize, want: usize) -> Result<()> {
    if got != want {
        return Err(BackendError::InvalidArgument(format!(
            "{op}: {what} has {got} elements, expected {want}"
        )));
    }
    Ok(())
}

fn bad_arg(msg: String) -> BackendError {
    BackendError::InvalidArgument(msg)
}

fn tiles(op: &str, n: usize, nb: usize) -> Result<()> {
    if n > 0 && (nb == 0 || !n.is_multiple_of(nb)) {
        return Err(BackendError::InvalidArgument(format!(
            "{op}: {nb} elements do not tile {n}"
        )));
    }
    Ok(())
}

fn rows_of(op: &str, n: usize, d: usize) -> Result<usize> {
    if d == 0 || !n.is_multiple_of(d) {
        return Err(BackendError::InvalidArgument(format!(
            "{op}: {n} elements are not rows of {d}"
        )));
    }
    Ok(n / d)
}

fn bad_target(targets: &[u32], ignore: Option<u32>, v: usize) -> Result<usize> {
    let ignored = |t: u32| ignore == Some(t);
    if let Some(&t) = targets.iter().find(|&&t| !ignored(t) && t as usize >= v) {
        return Err(BackendError::InvalidArgument(format!(
            "cross_entropy: target {t} out of range for {v} classes"
        )));
    }
    Ok(targets.iter().filter(|&&t| !ignored(t)).count())
}

impl Backend for CpuBackend {
    type Buf = Vec<f32>;

    fn name(&self) -> &'static str {
        "cpu"
    }

    fn zeros(&self, n: usize) -> Result<Vec<f32>> {
        Ok(vec![0.0; n])
    }

    fn upload(&self, data: &[f32]) -> Result<Vec<f32>> {
        Ok(data.to_vec())
    }

    fn download(&self, b: &Vec<f32>) -> Result<Vec<f32>> {
        Ok(b.clone())
    }

    fn len(&self, b: &Vec<f32>) -> usize {
        b.len()
    }

    fn add(&self, a: &Vec<f32>, b: &Vec<f32>, out: &mut Vec<f32>) -> Result<()> {
        tiles("add", a.len(), b.len())?;
        check("add", "out", out.len(), a.len())?;
        elementwise::cpu::add(a, b, b.len(), out);
        Ok(())
    }

    fn mul(&self, a: &Vec<f32>, b: &Vec<f32>, out: Out<'_, Vec<f32>>) -> Result<()> {
        tiles("mul", a.len(), b.len())?;
        check("mul", "out", out.1.len(), a.len())?;
        elementwise::cpu::mul_into(a, b, b.len(), out.0, out.1);
        Ok(())
    }

    fn scale(&self, x: &Vec<f32>, s: f32, out: Out<'_, Vec<f32>>) -> Result<()> {
        check("scale", "out", out.1.len(), x.len())?;
        elementwise::cpu::scale(x, s, out.0, out.1);
        Ok(())
    }

    fn copy_or_add(&self, src: &Vec<f32>, out: Out<'_, Vec<f32>>) -> Result<()> {
        check("copy_or_add", "out", out.1.len(), src.len())?;
        elementwise::cpu::copy_or_add(src, out.0, out.1);
        Ok(())
    }

    fn sum_rows(&self, src: &Vec<f32>, n: usize, dst: Out<'_, Vec<f32>>) -> Result<()> {
        check("sum_rows", "dst", dst.1.len(), n)?;
        if n > 0 {
            rows_of("sum_rows", src.len(), n)?;
        }
        sum_rows(src, n, dst.1, dst.0);
        Ok(())
    }

    fn sum(&self, x: &Vec<f32>, factor: f64, out: &mut Vec<f32>) -> Result<()> {
        check("sum", "out", out.len(), 1)?;
        out[0] = (reduce::cpu::sum_f64(x) * factor) as f32;
        Ok(())
    }

    fn fill_scaled(&self, dy: &Vec<f32>, factor: f64, out: Out<'_, Vec<f32>>) -> Result<()> {
        check("fill_scaled", "dy", dy.len(), 1)?;
        let v = (dy[0] as f64 * factor) as f32;
        out.1.iter_mut().for_each(|d| store(out.0, d, v));
        Ok(())
    }

    fn swap_axes(
        &self,
        src: &Vec<f32>,
        dims: [usize; 4],
        a: usize,
        b: usize,
        out: Out<'_, Vec<f32>>,
    ) -> Result<()> {
        let n = dims.iter().try_fold(1usize, |p, &d| p.checked_mul(d));
        let n = n.ok_or_else(|| bad_arg(format!("swap_axes: dims {dims:?} overflow")))?;
        if a >= b || b > 3 {
            return Err(bad_arg(format!("swap_axes: axes ({a}, {b})")));
        }
        check("swap_axes", "src", src.len(), n)?;
        check("swap_axes", "out", out.1.len(), n)?;
        shape_ops::cpu::swap_axes(src, dims, a, b, out.0, out.1);
        Ok(())
    }

    fn columns(
        &self,
        src: &Vec<f32>,
        c: usize,
        off: usize,
        s: usize,
        add: bool,
        out: &mut Vec<f32>,
    ) -> Result<()> {
        let (full, part) = if add {
            (out.len(), src.len())
        } else {
            (src.len(), out.len())
        };
        if c == 0 || full % c != 0 || off.checked_add(s).is_none_or(|e| e > c) {
            return Err(bad_arg(format!(
                "columns: {off}..{off}+{s} of rows of {c} in {full} elements"
            )));
        }
        check("columns", "part", part, full / c * s)?;
        for r in 0..full / c {
            let (wide, narrow) = (r * c + off..r * c + off + s, r * s..(r + 1) * s);
            if add {
                out[wide]
                    .iter_mut()
                    .zip(&src[narrow])
                    .for_each(|(d, v)| *d += v);
            } else {
                out[narrow].copy_from_slice(&src[wide]);
            }
        }
        Ok(())
    }

    fn round_bf16(&self, x: &Vec<f32>, out: &mut Vec<f32>) -> Result<()> {
        check("round_bf16", "out", out.len(), x.len())?;
        for (y, &v) in out.iter_mut().zip(x) {
            *y = fp_formats::round_to_bf16(v);
        }
        Ok(())
    }

    fn act_fwd(&self, kind: Act, x: &Vec<f32>, y: &mut Vec<f32>) -> Result<()> {
        check("activation", "y", y.len(), x.len())?;
        let f = match kind {
            Act::Gelu => activation::cpu::gelu_fwd,
            Act::Silu => activation::cpu::silu_fwd,
        };
        y.iter_mut().zip(x).for_each(|(y, &x)| *y = f(x));
        Ok(())
    }

    fn act_bwd(&self, kind: Act, x: &Vec<f32>, dy: &Vec<f32>, dx: Out<'_, Vec<f32>>) -> Result<()> {
        check("activation backward", "dy", dy.len(), x.len())?;
        check("activation backward", "dx", dx.1.len(), x.len())?;
        let df = match kind {
            Act::Gelu => activation::cpu::gelu_bwd,
            Act::Silu => activation::cpu::silu_bwd,
        };
        for ((d, &g), &x) in dx.1.iter_mut().zip(dy).zip(x) {
            store(dx.0, d, g * df(x));
        }
        Ok(())
    }

    fn swiglu_fwd(&self, gate: &Vec<f32>, up: &Vec<f32>, y: &mut Vec<f32>) -> Result<()> {
        check("swiglu", "up", up.len(), gate.len())?;
        check("swiglu", "y", y.len(), gate.len())?;
        for ((y, &g), &u) in y.iter_mut().zip(gate).zip(up) {
            *y = g * sigmoid(g) * u;
        }
        Ok(())
    }

    fn swiglu_bwd(
        &self,
        gate: &Vec<f32>,
        up: &Vec<f32>,
        dy: &Vec<f32>,
        dgate: Option<Out<'_, Vec<f32>>>,
        dup: Option<Out<'_, Vec<f32>>>,
    ) -> Result<()> {
        let n = gate.len();
        check("swiglu backward", "up", up.len(), n)?;
        check("swiglu backward", "dy", dy.len(), n)?;
        if let Some((acc, g)) = dgate {
            check("swiglu backward", "dgate", g.len(), n)?;
            for (((d, &dy), &x), &u) in g.iter_mut().zip(dy).zip(gate).zip(up) {
                store(acc, d, dy * u * activation::cpu::silu_grad(x));
            }
        }
        if let Some((acc, g)) = dup {
            check("swiglu backward", "dup", g.len(), n)?;
            for ((d, &dy), &x) in g.iter_mut().zip(dy).zip(gate) {
                store(acc, d, dy * x * sigmoid(x));
            }
        }
        Ok(())
    }

    fn rmsnorm_fwd(
        &self,
        x: &Vec<f32>,
        w: &Vec<f32>,
        eps: f32,
        y: &mut Vec<f32>,
        rstd: Option<&mut Vec<f32>>,
    ) -> Result<()> {
        let rows = rows_of("rmsnorm", x.len(), w.len())?;
        check("rmsnorm", "y", y.len(), x.len())?;
        let mut none = Vec::new();
        let st = match rstd {
            Some(r) => {
                check("rmsnorm", "rstd", r.len(), rows)?;
                r
            }
            None => &mut none,
        };
        norm::cpu::rms_fwd(x, w, eps, w.len(), y, st);
        Ok(())
    }

    fn layernorm_fwd(
        &self,
        x: &Vec<f32>,
        w: &Vec<f32>,
        b: Option<&Vec<f32>>,
        eps: f32,
        y: &mut Vec<f32>,
        stats: Option<&mut Vec<f32>>,
    ) -> Result<()> {
        let rows = rows_of("layernorm", x.len(), w.len())?;
        check("layernorm", "y", y.len(), x.len())?;
        if let Some(b) = b {
            check("layernorm", "bias", b.len(), w.len())?;
        }
        let mut none = Vec::new();
        let st = match stats {
            Some(s) => {
                check("layernorm", "stats", s.len(), 2 * rows)?;
                s
            }
            None => &mut none,
        };
        norm::cpu::ln_fwd(x, w, b.map(|b| &b[..]), eps, w.len(), y, st);
        Ok(())
    }

    fn norm_bwd(
        &self,
        kind: NormKind,
        x: &Vec<f32>,
        w: &Vec<f32>,
        stats: &Vec<f32>,
        dy: &Vec<f32>,
        dx: Option<Out<'_, Vec<f32>>>,
        dw: Option<Out<'_, Vec<f32>>>,
        db: Option<Out<'_, Vec<f32>>>,
    ) -> Result<()> {
        let d = w.len();
        let rows = rows_of("norm backward", x.len(), d)?;
        check("norm backward", "dy", dy.len(), x.len())?;
        let k = match kind {
            NormKind::Rms => norm::cpu::Kind::Rms,
            NormKind::Layer => norm::cpu::Kind::Layer,
        };
        let per_row = if kind == NormKind::Rms { 1 } else { 2 };
        check("norm backward", "stats", stats.len(), per_row * rows)?;
        if let Some((_, g)) = &dx {
            check("norm backward", "dx", g.len(), x.len())?;
        }
        for g in [&dw, &db].into_iter().flatten() {
            check("norm backward", "parameter gradient", g.1.len(), d)?;
        }
        fn un<'a>(o: Option<Out<'a, Vec<f32>>>) -> Option<(bool, &'a mut [f32])> {
            o.map(|(a, b)| (a, &mut b[..]))
        }
        norm::cpu::norm_bwd(k, x, w, stats, dy, d, un(dx), un(dw), un(db));
        Ok(())
    }

    fn rope(
        &self,
        x: &Vec<f32>,
        table: &Vec<f32>,
        t: usize,
        d: usize,
        inverse: bool,
        out: Out<'_, Vec<f32>>,
    ) -> Result<()> {
        if d == 0 || !d.is_multiple_of(2) || t == 0 || !x.len().is_multiple_of(t * d) {
            return Err(BackendError::InvalidArgument(format!(
                "rope: {} elements are not [.., {t}, {d}] with even {d}",
                x.len()
            )));
        }
        check("rope", "table", table.len(), t * d)?;
        check("rope", "out", out.1.len(), x.len())?;
        rope::cpu::rope(x, table, t, d, inverse, out.0, out.1);
        Ok(())
    }

    fn embedding_fwd(
        &self,
        table: &Vec<f32>,
        d: usize,
        ids: &[u32],
        out: &mut Vec<f32>,
    ) -> Result<()> {
        let vocab = rows_of("embedding", table.len(), d)?;
        check("embedding", "out", out.len(), ids.len() * d)?;
        if let Some(&i) = ids.iter().find(|&&i| i as usize >= vocab) {
            return Err(BackendError::InvalidArgument(format!(
                "embedding: id {i} out of range for {vocab} rows"
            )));
        }
        for (row, &i) in out.chunks_exact_mut(d).zip(ids) {
            row.copy_from_slice(&table[i as usize * d..(i as usize + 1) * d]);
        }
        Ok(())
    }

    fn embedding_bwd(
        &self,
        ids: &[u32],
        dy: &Vec<f32>,
        d: usize,
        table_grad: Out<'_, Vec<f32>>,
    ) -> Result<()> {
        let vocab = rows_of("embedding backward", table_grad.1.len(), d)?;
        check("embedding backward", "dy", dy.len(), ids.len() * d)?;
        if let Some(&i) = ids.iter().find(|&&i| i as usize >= vocab) {
            return Err(BackendError::InvalidArgument(format!(
                "embedding: id {i} out of range for {vocab} rows"
            )));
        }
        if !table_grad.0 {
            table_grad.1.fill(0.0);
        }
        embedding::cpu::scatter_add(ids, dy, d, table_grad.1);
        Ok(())
    }

    fn cross_entropy_fwd(
        &self,
        logits: &Vec<f32>,
        v: usize,
        targets: &[u32],
        ignore: Option<u32>,
        stats: &mut Vec<f32>,
        loss: &mut Vec<f32>,
    ) -> Result<usize> {
        let rows = targets.len();
        check("cross_entropy", "logits", logits.len(), rows * v)?;
        check("cross_entropy", "stats", stats.len(), 2 * rows)?;
        check("cross_entropy", "loss", loss.len(), 1)?;
        let count = bad_target(targets, ignore, v)?;
        for (r, st) in stats.chunks_exact_mut(2).enumerate() {
            let row = &logits[r * v..(r + 1) * v];
            let lse = cross_entropy::cpu::logsumexp(row);
            let t = targets[r];
            st[0] = if ignore == Some(t) {
                0.0
            } else {
                lse - row[t as usize]
            };
            st[1] = lse;
        }
        let total: f64 = stats.chunks_exact(2).map(|s| s[0] as f64).sum();
        loss[0] = if count == 0 {
            0.0
        } else {
            (total / count as f64) as f32
        };
        Ok(count)
    }

    fn cross_entropy_bwd(
        &self,
        logits: &Vec<f32>,
        v: usize,
        targets: &[u32],
        ignore: Option<u32>,
        stats: &Vec<f32>,
        dy: &Vec<f32>,
        dx: Out<'_, Vec<f32>>,
    ) -> Result<()> {
        let rows = targets.len();
        check("cross_entropy backward", "logits", logits.len(), rows * v)?;
        check("cross_entropy backward", "stats", stats.len(), 2 * rows)?;
        check("cross_entropy backward", "dy", dy.len(), 1)?;
        check("cross_entropy backward", "dx", dx.1.len(), rows * v)?;
        let count = bad_target(targets, ignore, v)?;
        let scale = if count == 0 {
            0.0
        } else {
            dy[0] / count as f32
        };
        let acc = dx.0;
        for (r, gr) in dx.1.chunks_exact_mut(v.max(1)).enumerate().take(rows) {
            let t = targets[r];
            if ignore == Some(t) {
                gr.iter_mut().for_each(|d| store(acc, d, 0.0));
                continue;
            }
            let lse = stats[2 * r + 1];
            for (d, &x) in gr.iter_mut().zip(&logits[r * v..(r + 1) * v]) {
                store(acc, d, scale * crate::cpu::exp(x - lse));
            }
            gr[t as usize] -= scale;
        }
        Ok(())
    }

    fn attention_fwd(
        &self,
        q: &Vec<f32>,
        k: &Vec<f32>,
        v: &Vec<f32>,
        bh: usize,
        t: usize,
        d: usize,
        products: AttentionProducts,
        o: &mut Vec<f32>,
        lse: &mut Vec<f32>,
    ) -> Result<()> {
        let n = bh * t * d;
        for (what, len) in [
            ("q", q.len()),
            ("k", k.len()),
            ("v", v.len()),
            ("o", o.len()),
        ] {
            check("attention", what, len, n)?;
        }
        check("attention", "lse", lse.len(), bh * t)?;
        attention::cpu::forward(q, k, v, t, d, products, o, lse);
        Ok(())
    }

    fn attention_bwd(
        &self,
        qkvo: [&Vec<f32>; 4],
        lse: &Vec<f32>,
        dout: &Vec<f32>,
        bh: usize,
        t: usize,
        d: usize,
        products: AttentionProducts,
        dq: Out<'_, Vec<f32>>,
        dk: Out<'_, Vec<f32>>,
        dv: Out<'_, Vec<f32>>,
    ) -> Result<()> {
        let n = bh * t * d;
        for (what, len) in [
            ("q", qkvo[0].len()),
            ("k", qkvo[1].len()),
            ("v", qkvo[2].len()),
            ("o", qkvo[3].len()),
            ("dout", dout.len()),
            ("dq", dq.1.len()),
            ("dk", dk.1.len()),
            ("dv", dv.1.len()),
        ] {
            check("attention backward", what, len, n)?;
        }
        check("attention backward", "lse", lse.len(), bh * t)?;
        let beta = |acc: bool| if acc { 1.0 } else { 0.0 };
        let betas = [beta(dq.0), beta(dk.0), beta(dv.0)];
        let x = [&qkvo[0][..], &qkvo[1][..], &qkvo[2][..], &qkvo[3][..]];
        attention::cpu::backward(x, lse, dout, t, d, products, [dq.1, dk.1, dv.1], betas);
        Ok(())
    }

    fn gemm(
        &self,
        m: usize,
        n: usize,
        k: usize,
        alpha: f32,
        a: &Vec<f32>,
        ta: bool,
        b: &Vec<f32>,
        tb: bool,
        beta: f32,
        c: &mut Vec<f32>,
    ) -> Result<()> {
        check("gemm", "a", a.len(), m * k)?;
        check("gemm", "b", b.len(), k * n)?;
        check("gemm", "c", c.len(), m * n)?;
        let am = if ta {
            MatRef::row_major(a, k, m).t()
        } else {
            MatRef::row_major(a, m, k)
        };
        let bm = if tb {
            MatRef::row_major(b, n, k).t()
        } else {
            MatRef::row_major(b, k, n)
        };
        sgemm(alpha, am, bm, beta, c);
        Ok(())
    }

    fn grad_norm(&self, grads: &[&Vec<f32>]) -> Result<f32> {
        let s: Vec<&[f32]> = grads.iter().map(|g| &g[..]).collect();
        Ok(optim::grad_norm(&s))
    }

    fn adamw(
        &self,
        p: &mut Vec<f32>,
        g: &Vec<f32>,
        m: &mut Vec<f32>,
        v: &mut Vec<f32>,
        c: &AdamWCoeffs,
    ) -> Result<()> {
        for (what, len) in [("g", g.len()), ("m", m.len()), ("v", v.len())] {
            check("adamw", what, len, p.len())?;
        }
        // optim adamw.rs `update_impl`, element by element
        for (((p, &g), m), v) in p.iter_mut().zip(g).zip(m.iter_mut()).zip(v.iter_mut()) {
            let g = g * c.grad_scale;
            let decayed = *p * c.decay;
            let m_new = if c.small_w1 != 0 {
                *m + c.w1 * (g - *m)
            } else {
                g - (g - *m) * c.one_minus_w1
            };
            let v_new = *v * c.beta2 + c.one_minus_beta2 * g * g;
            let denom = v_new.sqrt() / c.bc2_sqrt + c.eps;
            *p = decayed + (c.neg_step_size * m_new) / denom;
            *m = m_new;
            *v = v_new;
        }
        Ok(())
    }
}
