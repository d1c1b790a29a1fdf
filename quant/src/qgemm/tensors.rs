//! The quantized GEMM on operands that are quantized already, as codes and scales
//! ([`QuantizedTensor`]), the way a block-scaled tensor core takes them: weights quantized
//! offline, or any tensor a [`Quantizer`](crate::Quantizer) returned. No f32 operand is read
//! and nothing is quantized in the call.

use crate::config::QuantFormat;
use crate::gemm::bf16::Side;
use crate::gemm::pack::pack_panels;
use crate::gemm::MatRef;
use crate::{QuantError, QuantizedTensor};

use super::decode;
use super::{
    check_shapes, e2m1_format, e2m1_gemm_runs, finish, on_bf16_unit, GemmWorkspace, Prepared,
    WORKSPACE,
};

/// `out[M, N] = α · Â · B̂ᵀ` for two quantized tensors in their stored layout, `a` `[M, K]`
/// and `b` `[N, K]` (a rowwise tensor is the operand itself, a columnwise one its
/// transpose: K runs along each tensor's stored rows, as its blocks do), `Â`, `B̂` their
/// element codes times block scales and `α` the product of their per-tensor factors
/// (`tensor_scale_inv`), applied to each finished sum.
///
/// Bit for bit [`quantized_matmul_tn`](super::quantized_matmul_tn) of the tensors the two
/// were quantized from, with the same quantizers (keys, scale rules, state): the values are
/// those its quantizers compute, and the product runs on the same GEMM in the same order
/// (where a BF16 unit runs, the decoded values go straight into its packed tiles, panel by
/// panel in cache; two E2M1 tensors multiply on the E2M1 block GEMM where that runs; an F32
/// tensor on either side sends the product to the f32 GEMM). Nothing is quantized: the cost
/// beside the GEMM's is decoding the codes (NVFP4 sixteen values per AVX-512 step).
///
/// Both tensors must have transformed K with the same Hadamard signs (the Wgrad operands of
/// one recipe), or neither (`hadamard`): otherwise their product is not that of the original
/// tensors, and the call refuses it.
///
/// Errors: [`QuantError::InvalidConfig`] when a tensor's buffers do not match its shape
/// and format (made by hand, or read from a file), its per-tensor factor is not finite, or
/// the two carry different Hadamard masks;
/// [`QuantError::GemmShape`] when the two disagree on K or `out` does not hold `M · N`
/// elements.
///
/// ```
/// use quant::qgemm::{quantized_matmul_tn, quantized_matmul_tn_tensors, Operand};
/// use quant::{GemmPolicy, MatRef, QuantState, Quantizer, Usage};
/// let p = GemmPolicy::nvfp4_paper();
/// let x: Vec<f32> = (0..32 * 64).map(|i| (i as f32 * 0.37).sin()).collect();
/// let w: Vec<f32> = (0..16 * 64).map(|i| (i as f32 * 0.11).cos()).collect();
/// let (x, w) = (MatRef::new(&x, 32, 64)?, MatRef::new(&w, 16, 64)?);
/// let (xq, wq) = (Quantizer::new(p.fprop.a, Usage::Rowwise)?, Quantizer::new(p.fprop.b, Usage::Rowwise)?);
/// // the weight quantized once, offline: 4.5 bits per value
/// let wt = wq.quantize(w, &mut QuantState::new())?;
/// let xt = xq.quantize(x, &mut QuantState::new())?;
/// let (mut y1, mut y2) = (vec![0.0f32; 32 * 16], vec![0.0f32; 32 * 16]);
/// quantized_matmul_tn_tensors(&xt, &wt, &mut y1)?;
/// quantized_matmul_tn(Operand::new(x, xq), Operand::new(w, wq), &mut y2)?;
/// assert_eq!(y1, y2);
/// # Ok::<(), quant::QuantError>(())
/// ```
pub fn quantized_matmul_tn_tensors(
    a: &QuantizedTensor,
    b: &QuantizedTensor,
    out: &mut [f32],
) -> Result<(), QuantError> {
    decode::check(a, "operand A")?;
    decode::check(b, "operand B")?;
    check_shapes(a.rows, a.cols, b.rows, b.cols, out)?;
    if a.hadamard != b.hadamard {
        return Err(QuantError::InvalidConfig(format!(
            "the two tensors were transformed along K differently (Hadamard sign masks {:04x?} and {:04x?}): their product is not that of the original tensors",
            a.hadamard, b.hadamard
        )));
    }
    let mut ws = WORKSPACE.with(|c| c.take()).unwrap_or_default();
    multiply(a, b, out, &mut ws, false);
    WORKSPACE.with(|c| c.set(Some(ws)));
    Ok(())
}

/// [`quantized_matmul_tn_tensors`] after its checks, on the workspace `ws`: where the
/// product runs on a BF16 unit (both quantized, and not on the E2M1 GEMM) the values are
/// decoded straight into its tiles, else (or with `views`: the test comparing the two) into
/// f32 buffers that the GEMM reads as views.
fn multiply(
    a: &QuantizedTensor,
    b: &QuantizedTensor,
    out: &mut [f32],
    ws: &mut GemmWorkspace,
    views: bool,
) {
    let (qa, qb) = (quantized(a), quantized(b));
    let e2m1 = e2m1_gemm_runs(e2m1_format(a.format), e2m1_format(b.format));
    let k = a.cols;
    let (sa, sb) = if on_bf16_unit(qa, qb, e2m1) && !views {
        // straight into the BF16 unit's tiles, a panel of decoded rows at a time
        let tiles = |t: &QuantizedTensor, buf, a_layout| {
            pack_panels(
                t.rows,
                k,
                a_layout,
                buf,
                |_, _| (),
                |r0, dst| decode::rows_into(t, r0, dst),
            );
            Side::Packed {
                rows: t.rows,
                k,
                chunk_major: false,
            }
        };
        (
            tiles(a, &mut ws.packed.a, true),
            tiles(b, &mut ws.packed.b, false),
        )
    } else {
        let values = |t: &QuantizedTensor, buf: &mut Vec<f32>| {
            let n = t.rows * k;
            if buf.len() < n {
                buf.resize(n, 0.0);
            }
            decode_parallel(t, &mut buf[..n]);
        };
        values(a, &mut ws.a);
        values(b, &mut ws.b);
        (view(&ws.a, a.rows, k), view(&ws.b, b.rows, k))
    };
    let pa = Prepared::new(sa, a.tensor_scale_inv, qa);
    let pb = Prepared::new(sb, b.tensor_scale_inv, qb);
    finish(pa, pb, e2m1, out, (&mut ws.packed, &mut ws.e2m1));
}

/// The first `rows x k` values of `buf` as a row-major view.
fn view(buf: &[f32], rows: usize, k: usize) -> Side<'_> {
    Side::View(MatRef::row_major(&buf[..rows * k], rows, k))
}

/// All of `t`'s unscaled values into `dst` (`t.rows x t.cols`), 64 rows per parallel task.
fn decode_parallel(t: &QuantizedTensor, dst: &mut [f32]) {
    use rayon::prelude::*;
    if t.cols == 0 {
        return;
    }
    const ROWS: usize = 64;
    dst.par_chunks_mut(ROWS * t.cols)
        .enumerate()
        .for_each(|(i, d)| decode::rows_into(t, i * ROWS, d));
}

/// Whether `t` holds quantized values (any format but FP32), exactly BF16 without the
/// per-tensor factor.
fn quantized(t: &QuantizedTensor) -> bool {
    t.format != QuantFormat::F32
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{OperandQuant, QuantState, Quantizer, Usage};

    /// The f32 buffers that CPUs without a BF16 unit multiply (as views) give the bits of
    /// the packed tiles here, and on those CPUs the product the views take is the one the
    /// quantizing GEMM takes (`tests/qgemm_tensors.rs`).
    #[test]
    fn decoded_views_equal_decoded_tiles() {
        let (m, n, k) = (70, 45, 200);
        let x: Vec<f32> = (0..m * k).map(|i| (i as f32 * 0.37).sin() * 3.0).collect();
        let w: Vec<f32> = (0..n * k).map(|i| (i as f32 * 0.11).cos()).collect();
        for spec in [OperandQuant::nvfp4(), OperandQuant::BF16] {
            let q = Quantizer::new(spec, Usage::Rowwise).unwrap();
            let t = |v, rows| {
                q.quantize(MatRef::new(v, rows, k).unwrap(), &mut QuantState::new())
                    .unwrap()
            };
            let (a, b) = (t(&x, m), t(&w, n));
            let (mut tiles, mut views) = (vec![0.0f32; m * n], vec![0.0f32; m * n]);
            let mut ws = GemmWorkspace::new();
            multiply(&a, &b, &mut views, &mut ws, true);
            if !crate::gemm::bf16::quantized_gemm_rounds_inputs() {
                eprintln!("skipped the comparison: no BF16 unit here, only the views run");
                return;
            }
            multiply(&a, &b, &mut tiles, &mut ws, false);
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&tiles), bits(&views), "{spec:?}");
        }
    }
}
