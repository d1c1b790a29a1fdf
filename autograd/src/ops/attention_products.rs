//! The arithmetic of attention's matrix products: FP32, or BF16 operands with FP32
//! accumulation on the CPU's BF16 GEMM unit.
//!
//! Attention multiplies five pairs of matrices per head and query block: `S = QKᵀ` and
//! `O = PV` forward; `dV = Pᵀ dO`, `dP = dO Vᵀ`, `dQ = dS K` and `dK = dSᵀ Q` backward
//! (`S` recomputed). With [`AttentionProducts::Bf16`] every operand of every product is
//! rounded to BF16 (round to nearest even), as FlashAttention does in BF16 on a GPU: Q, K and
//! V, and inside the kernel the probabilities `P`, the output gradient `dO` and the score
//! gradient `dS` (softmax, its log-sum-exp and `dS = P ⊙ (dP − δ)` stay FP32). The products
//! then run on [`quantized_gemm_tn`], the GEMM the quantized linear layers use: on the BF16
//! unit where the CPU has one (AMX tiles or `vdpbf16ps`, which round their packed inputs
//! themselves), else on the f32 GEMM from rounded copies (exact products, FP32 sums). Which
//! of them runs is a property of the machine, as for the linear layers; on either, each
//! output element depends only on its two operand rows, never on the number of rows or
//! threads.

use quant::gemm::bf16::{quantized_gemm_rounds_inputs, quantized_gemm_tn, Bf16Workspace};
use quant::gemm::{sgemm, MatRef};

/// How attention's matrix products multiply ([`crate::Graph::causal_attention_with`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum AttentionProducts {
    /// FP32 operands, FP32 products and sums (the f32 GEMM).
    #[default]
    F32,
    /// Every operand rounded to BF16 (Q, K, V and, inside the kernel, P, dO and dS), FP32
    /// accumulation on the machine's BF16 GEMM (module docs). The rounding of Q, K and V
    /// passes gradients straight through.
    Bf16,
}

impl AttentionProducts {
    /// `Bf16` when `bf16`, else `F32`.
    ///
    /// ```
    /// use autograd::AttentionProducts;
    /// assert_eq!(AttentionProducts::bf16_if(true), AttentionProducts::Bf16);
    /// ```
    pub fn bf16_if(bf16: bool) -> Self {
        if bf16 {
            Self::Bf16
        } else {
            Self::F32
        }
    }
}

/// One worker's multiplier: `c = alpha · A B + beta · c` in the arithmetic of its
/// [`AttentionProducts`], with the scratch the BF16 products need.
pub(crate) struct Multiplier {
    bf16: Option<Bf16Scratch>,
}

/// Packed tiles, the product before its epilogue and rounded operand copies.
#[derive(Default)]
struct Bf16Scratch {
    ws: Bf16Workspace,
    product: Vec<f32>,
    a: Vec<f32>,
    b: Vec<f32>,
}

impl Multiplier {
    pub(crate) fn new(products: AttentionProducts) -> Self {
        Self {
            bf16: (products == AttentionProducts::Bf16).then(Bf16Scratch::default),
        }
    }

    /// `c = alpha · A B + beta · c` for `A: [M, K]`, `B: [K, N]` views and `c` row-major
    /// `[M, N]`; `beta` is 0 (`c` is overwritten, its old contents never read) or 1.
    #[inline(always)]
    pub(crate) fn mul(
        &mut self,
        alpha: f32,
        a: MatRef<'_>,
        b: MatRef<'_>,
        beta: f32,
        c: &mut [f32],
    ) {
        match &mut self.bf16 {
            None => sgemm(alpha, a, b, beta, c),
            Some(s) => s.mul(alpha, a, b, beta, c),
        }
    }
}

impl Bf16Scratch {
    #[inline(always)]
    fn mul(&mut self, alpha: f32, a: MatRef<'_>, b: MatRef<'_>, beta: f32, c: &mut [f32]) {
        if !quantized_gemm_rounds_inputs() {
            // no BF16 unit: the f32 GEMM on rounded copies, alpha and beta included
            let a = rounded_copy(a, &mut self.a);
            let b = rounded_copy(b, &mut self.b);
            sgemm(alpha, a, b, beta, c);
            return;
        }
        let direct = alpha == 1.0 && beta == 0.0;
        let mut product = std::mem::take(&mut self.product);
        let out: &mut [f32] = if direct {
            c
        } else {
            product.resize(c.len(), 0.0);
            &mut product
        };
        quantized_gemm_tn(a, b.t(), out, &mut self.ws);
        if !direct {
            if beta == 0.0 {
                for (c, &p) in c.iter_mut().zip(&product) {
                    *c = alpha * p;
                }
            } else {
                for (c, &p) in c.iter_mut().zip(&product) {
                    *c = alpha * p + beta * *c;
                }
            }
        }
        self.product = product;
    }
}

/// `x` rounded to BF16 into `buf`, as a row-major view.
fn rounded_copy<'b>(x: MatRef<'_>, buf: &'b mut Vec<f32>) -> MatRef<'b> {
    buf.clear();
    buf.extend((0..x.rows).flat_map(|r| {
        (0..x.cols)
            .map(move |c| fp_formats::round_to_bf16(x.data[r * x.row_stride + c * x.col_stride]))
    }));
    MatRef::row_major(buf, x.rows, x.cols)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pseudo(n: usize, seed: u32) -> Vec<f32> {
        let mut s = seed.wrapping_mul(747_796_405).wrapping_add(1);
        (0..n)
            .map(|_| {
                s = s.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                (s >> 8) as f32 / (1u32 << 24) as f32 * 4.0 - 2.0
            })
            .collect()
    }

    /// Each BF16 product equals an f64 sum of the rounded operands' products within the
    /// bound of K sequential FP32 roundings (`K · u · Σ|a b|`, u = 2⁻²⁴), for transposed
    /// views, alpha, and both betas, and bit for bit the machine's arithmetic on the rounded
    /// operands; the f32 multiplier stays exactly `sgemm`.
    #[test]
    fn bf16_products_are_products_of_rounded_operands() {
        let (m, k, n) = (5, 37, 7);
        let a = pseudo(m * k, 1);
        let bt = pseudo(n * k, 2); // B stored transposed: [N, K]
        let c0 = pseudo(m * n, 3);
        let (av, bv) = (
            MatRef::row_major(&a, m, k),
            MatRef::row_major(&bt, n, k).t(),
        );
        let r = fp_formats::round_to_bf16;
        for (alpha, beta) in [(1.0, 0.0), (0.25, 0.0), (0.5, 1.0)] {
            let mut c = c0.clone();
            Multiplier::new(AttentionProducts::Bf16).mul(alpha, av, bv, beta, &mut c);
            for i in 0..m {
                for j in 0..n {
                    let (mut s, mut abs) = (0.0f64, 0.0f64);
                    for p in 0..k {
                        let x = r(a[i * k + p]) as f64 * r(bt[j * k + p]) as f64;
                        s += x;
                        abs += x.abs();
                    }
                    let want = alpha as f64 * s + beta as f64 * c0[i * n + j] as f64;
                    let bound = alpha as f64 * (k as f64 + 2.0) * abs * 2f64.powi(-24)
                        + 2f64.powi(-24) * want.abs()
                        + 1e-30;
                    let got = c[i * n + j] as f64;
                    assert!(
                        (got - want).abs() <= bound,
                        "({i}, {j}): {got} vs {want} (bound {bound})"
                    );
                }
            }
            // bit for bit: on a BF16 unit its arithmetic's scalar reference (which rounds its
            // inputs) then the f32 epilogue; elsewhere the f32 GEMM on rounded copies
            let mut exact = c0.clone();
            match quant::gemm::bf16::quantized_gemm_arithmetic() {
                Some(arith) => {
                    for i in 0..m {
                        for j in 0..n {
                            let p = arith.dot_reference(&a[i * k..][..k], &bt[j * k..][..k]);
                            let e = &mut exact[i * n + j];
                            *e = if beta == 0.0 {
                                alpha * p
                            } else {
                                alpha * p + beta * *e
                            };
                        }
                    }
                }
                None => {
                    let (ra, rbt): (Vec<f32>, Vec<f32>) = (
                        a.iter().map(|&x| r(x)).collect(),
                        bt.iter().map(|&x| r(x)).collect(),
                    );
                    let (rav, rbv) = (MatRef::row_major(&ra, m, k), MatRef::row_major(&rbt, n, k));
                    sgemm(alpha, rav, rbv.t(), beta, &mut exact);
                }
            }
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<u32>>();
            assert_eq!(bits(&c), bits(&exact), "alpha {alpha}, beta {beta}");
            let mut f = c0.clone();
            let mut g = c0.clone();
            Multiplier::new(AttentionProducts::F32).mul(alpha, av, bv, beta, &mut f);
            sgemm(alpha, av, bv, beta, &mut g);
            assert_eq!(f, g);
        }
    }

    /// With beta 0 the old contents of `c` are never read: NaN there does not leak.
    #[test]
    fn overwriting_ignores_the_old_output() {
        let a = [1.0f32, 2.0];
        let b = [3.0f32, 4.0];
        let mut c = [f32::NAN];
        let (av, bv) = (MatRef::row_major(&a, 1, 2), MatRef::row_major(&b, 2, 1));
        Multiplier::new(AttentionProducts::Bf16).mul(0.5, av, bv, 0.0, &mut c);
        assert_eq!(c, [5.5]);
    }
}
