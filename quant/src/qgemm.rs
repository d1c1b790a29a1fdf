//! The emulated quantized GEMM: `out[M, N] = α · Â[M, K] · B̂[N, K]ᵀ` (the "TN" GEMM of
//! every linear layer), where `Â`, `B̂` are the operands fake-quantized along K without
//! their per-tensor factors (exact in f32, see [`Quantizer::fake_quantize_into`]) and
//! `α = factor_A · factor_B` (NVFP4 `S_dec,A · S_dec,B`, FP8 `scale_inv_A · scale_inv_B`,
//! docs/numerics.md#the-quantized-gemm) multiplies each f32 sum once it is complete, as the
//! hardware's epilogue does. This models the hardware GEMM up to the f32 accumulation order.
//!
//! * When both operands are quantized (any format but FP32), their values (element code
//!   times block scale, without the per-tensor factor) are exactly BF16, and the product
//!   runs on [`quantized_gemm_tn`](crate::gemm::bf16::quantized_gemm_tn): the BF16 GEMM on
//!   AMX-BF16 tiles where the CPU has them (FP32 accumulation in a fixed order,
//!   docs/numerics.md#the-bf16-gemm), the f32 GEMM elsewhere. Two operands whose values
//!   are E2M1 ([`e2m1_values`]: NVFP4, MXFP4) multiply on the E2M1 block GEMM instead
//!   where it runs ([`crate::gemm::e2m1`]: AVX2 CPUs without a BF16 unit; exact group sums
//!   of 16, one rounding per group), their values then always as f32 views. With an FP32
//!   operand on either side it runs on the f32 GEMM ([`sgemm`]).
//!
//! * An [`Operand`] is a row-major `[rows, cols]` tensor ([`MatRef`]) and its [`Quantizer`]:
//!   rowwise, the GEMM operand is the tensor itself; columnwise, its transpose
//!   (`[cols, rows]`).
//! * FP32 operands are never copied: they enter [`sgemm`] as (possibly transposed) strided
//!   views, and an all-FP32 product is bit for bit the plain [`sgemm`] / [`matmul_tn`].
//! * Where the product runs on the tile unit, NVFP4, MX and FP8 operands are quantized
//!   straight into its packed tiles, panel by panel in cache, with no f32 copy
//!   (`Quantizer::fake_quantize_packed`; the same bits). Otherwise quantized operands are
//!   fake-quantized into reusable scratch buffers (per thread, or a caller-provided
//!   [`GemmWorkspace`]); quantization is `O(MK + NK)` against the GEMM's `O(MNK)`.
//!   Columnwise operands stay in the layout of the tensor where the format allows it
//!   ([`Quantizer::fake_quantize_source_layout`]; the GEMM reads them through a transposed
//!   view, like an f32 operand). The BF16 GEMM applies α to each 32 x 32 output
//!   block as it finishes it (in L1); after the f32 and E2M1 GEMMs it is a pass over the
//!   output, split across the rayon pool for large outputs (elementwise, so the bytes do not
//!   depend on the thread count). Either way each element is `fl(fl(Σ) · α)`.
//! * An operand used by two GEMMs can be fake-quantized once ([`fake_operand`]) and passed
//!   to [`quantized_matmul_tn_prequantized`]; when its quantizer is [`transpose_exact`]
//!   (NVFP4 16x16 RNE, BF16 RNE), the same values serve the columnwise usage through
//!   [`FakeOperand::t`] (the linear layer's W for Fprop and Dgrad). The results equal those
//!   of quantizing in each call, bit for bit.
//!
//! [`matmul_tn`]: crate::gemm::matmul_tn
//!
//! ```
//! use quant::qgemm::{quantized_matmul_tn, Operand};
//! use quant::{MatRef, OperandQuant, Quantizer, Usage};
//! let x = [1.0f32, 2.0, 3.0, 4.0]; // [2, 2]
//! let w = [1.0f32, 0.0, 0.0, 1.0];
//! let mut y = [0.0f32; 4];
//! quantized_matmul_tn(
//!     Operand::new(MatRef::new(&x, 2, 2)?, Quantizer::new(OperandQuant::F32, Usage::Rowwise)?),
//!     Operand::new(MatRef::new(&w, 2, 2)?, Quantizer::new(OperandQuant::BF16, Usage::Rowwise)?),
//!     &mut y,
//! )?;
//! assert_eq!(y, [1.0, 2.0, 3.0, 4.0]); // X · Wᵀ
//! # Ok::<(), quant::QuantError>(())
//! ```

use std::cell::Cell;

mod decode;
mod tensors;

pub use tensors::quantized_matmul_tn_tensors;

use crate::config::{Fp8Scaling, OperandQuant, QuantFormat, RoundingMode, Usage};
use crate::gemm::bf16::{
    quantized_gemm_rounds_inputs, quantized_gemm_sides, Bf16Workspace, PackedB, Side,
};
use crate::gemm::e2m1::{
    e2m1_gemm_tn, e2m1_gemm_tn_packed, e2m1_native, E2m1Workspace, PackedE2m1B,
};
use crate::gemm::{sgemm, MatRef};
use crate::{QuantError, QuantState, Quantizer};

/// One GEMM operand: the high-precision tensor and how to quantize it.
#[derive(Debug)]
pub struct Operand<'a> {
    /// Row-major `[rows, cols]` data (dense: checked with [`MatRef::contiguous`]).
    pub x: MatRef<'a>,
    /// Its quantizer. Rowwise: the GEMM operand is `x` (`[rows, cols]`); columnwise: `xᵀ`
    /// (`[cols, rows]`). Either way the operand's second dimension is the reduction
    /// dimension K.
    pub quantizer: Quantizer,
    /// State for delayed FP8 scaling (required there, unused otherwise).
    pub state: Option<&'a mut QuantState>,
}

impl<'a> Operand<'a> {
    /// An operand without state.
    pub fn new(x: MatRef<'a>, quantizer: Quantizer) -> Self {
        Operand {
            x,
            quantizer,
            state: None,
        }
    }

    /// The same operand with a quantization state.
    pub fn with_state(mut self, state: &'a mut QuantState) -> Self {
        self.state = Some(state);
        self
    }

    /// `(outer, k)`: the GEMM operand's shape.
    pub fn gemm_shape(&self) -> (usize, usize) {
        self.quantizer.stored_shape(self.x.rows, self.x.cols)
    }

    fn quant(&self) -> &OperandQuant {
        self.quantizer.spec()
    }
}

/// Scratch buffers for the fake-quantized operands, reusable across calls.
#[derive(Debug, Default)]
pub struct GemmWorkspace {
    a: Vec<f32>,
    b: Vec<f32>,
    packed: Bf16Workspace,
    e2m1: E2m1Workspace,
}

impl GemmWorkspace {
    /// An empty workspace (buffers grow on first use and are then reused).
    pub fn new() -> Self {
        Self::default()
    }
}

thread_local! {
    static WORKSPACE: Cell<Option<Box<GemmWorkspace>>> = const { Cell::new(None) };
}

/// `out[M, N] = α · Â · B̂ᵀ` (see the module docs), with this thread's workspace.
///
/// Errors: [`QuantError::GemmShape`] when the operands disagree on K or `out` does not hold
/// `M · N` elements; [`QuantError::InvalidConfig`] for an invalid operand configuration or a
/// delayed-scaling FP8 operand without a state; shape and non-finite errors from the
/// quantizers.
pub fn quantized_matmul_tn(
    a: Operand<'_>,
    b: Operand<'_>,
    out: &mut [f32],
) -> Result<(), QuantError> {
    let mut ws = WORKSPACE.with(|c| c.take()).unwrap_or_default();
    let r = quantized_matmul_tn_with(a, b, out, &mut ws);
    WORKSPACE.with(|c| c.set(Some(ws)));
    r
}

/// [`quantized_matmul_tn`] with a caller-provided workspace.
pub fn quantized_matmul_tn_with(
    a: Operand<'_>,
    b: Operand<'_>,
    out: &mut [f32],
    ws: &mut GemmWorkspace,
) -> Result<(), QuantError> {
    for op in [&a, &b] {
        op.x.contiguous()?;
    }
    check_same_transform(&a, &b)?;
    let (m, ka) = a.gemm_shape();
    let (n, kb) = b.gemm_shape();
    check_shapes(m, ka, n, kb, out)?;
    let GemmWorkspace {
        a: wa,
        b: wb,
        packed,
        e2m1: e2m1_ws,
    } = ws;
    let qa = a.quantizer.quantizes();
    let qb = b.quantizer.quantizes();
    let e2m1 = e2m1_gemm_runs(e2m1_values(a.quant()), e2m1_values(b.quant()));
    let rounds = on_bf16_unit(qa, qb, e2m1);
    let (av, fa) = prepare(a, wa, (&mut packed.a, true), rounds)?;
    let (bv, fb) = prepare(b, wb, (&mut packed.b, false), rounds)?;
    let (a, b) = (Prepared::new(av, fa, qa), Prepared::new(bv, fb, qb));
    finish(a, b, e2m1, out, (packed, e2m1_ws));
    Ok(())
}

/// Whether `q`'s values are E2M1 codes times a scale shared by each aligned group of 16
/// along K (NVFP4 with any block shape, MXFP4): two such operands may multiply on the E2M1
/// block GEMM ([`crate::gemm::e2m1`]), exactly per group, where that runs.
///
/// ```
/// use quant::qgemm::e2m1_values;
/// use quant::{GemmPolicy, OperandQuant};
/// assert!(e2m1_values(&OperandQuant::nvfp4()));
/// assert!(e2m1_values(&GemmPolicy::mxfp4_tseng().dgrad.a));
/// assert!(!e2m1_values(&OperandQuant::BF16));
/// ```
pub fn e2m1_values(q: &OperandQuant) -> bool {
    e2m1_format(q.format)
}

/// [`e2m1_values`] of an operand in `format`.
fn e2m1_format(format: QuantFormat) -> bool {
    use fp_formats::mx::MxElement;
    match format {
        QuantFormat::Nvfp4 { .. } => true,
        QuantFormat::Mx { element, .. } => element == MxElement::E2M1,
        _ => false,
    }
}

/// Whether a product of two operands (each quantized or not; `e2m1`: the product runs on
/// the E2M1 block GEMM) runs on a BF16 unit, whose packing takes quantized values (and
/// rounds BF16 ones) itself.
fn on_bf16_unit(qa: bool, qb: bool, e2m1: bool) -> bool {
    qa && qb && quantized_gemm_rounds_inputs() && !e2m1
}

/// Whether a product of two operands, each with E2M1 values or not, runs on the E2M1 block
/// GEMM on this CPU.
fn e2m1_gemm_runs(a_e2m1: bool, b_e2m1: bool) -> bool {
    a_e2m1 && b_e2m1 && e2m1_native()
}

/// One operand as [`finish`] takes it: the prepared side, its per-tensor factor, whether it
/// is quantized (values exactly BF16), and for B possibly its E2M1 records packed once.
#[derive(Clone, Copy)]
struct Prepared<'a> {
    side: Side<'a>,
    factor: f32,
    quantized: bool,
    e2m1_packed: Option<&'a PackedE2m1B>,
}

impl<'a> Prepared<'a> {
    fn new(side: Side<'a>, factor: f32, quantized: bool) -> Self {
        Prepared {
            side,
            factor,
            quantized,
            e2m1_packed: None,
        }
    }
}

/// A fake-quantized GEMM operand the caller keeps: the unscaled values as an `[outer, K]`
/// view (the stored layout of [`Quantizer::fake_quantize_into`], or a transposed view of it) and
/// the per-tensor factor. Made by [`fake_operand`]; consumed by
/// [`quantized_matmul_tn_prequantized`].
#[derive(Clone, Copy, Debug)]
pub struct FakeOperand<'a> {
    /// Unscaled values, `[outer, K]`.
    pub values: MatRef<'a>,
    /// Per-tensor factor (NVFP4 `S_dec`, 1 for BF16).
    pub factor: f32,
    /// Whether the values come from a quantizer (any format but FP32), hence are exactly
    /// BF16: the GEMM then runs on the BF16 GEMM when the other operand is quantized too.
    pub quantized: bool,
    /// Whether the values are E2M1 codes times group scales ([`e2m1_values`] of the
    /// quantizer): with another such operand the GEMM may run on the E2M1 block GEMM.
    pub e2m1: bool,
}

impl<'a> FakeOperand<'a> {
    /// The transposed operand (`[K, outer]`): for a quantizer that is
    /// [`transpose_exact`], the rowwise result viewed as the columnwise one.
    pub fn t(self) -> Self {
        FakeOperand {
            values: self.values.t(),
            ..self
        }
    }
}

/// Whether a quantized GEMM takes an operand quantized with `q` as it is, its packing doing
/// the quantization: `q` is BF16 with round-to-nearest-even and no transform, and the
/// product runs on a BF16 unit, whose packing rounds its inputs to BF16 the same way
/// ([`quantized_gemm_rounds_inputs`]; both operands quantized). A caller that would
/// fake-quantize such an operand once for several products ([`fake_operand`]) saves a pass
/// by not doing so: each product then rounds it while packing it, to the same bits.
///
/// ```
/// use quant::qgemm::packing_rounds;
/// use quant::gemm::bf16::quantized_gemm_rounds_inputs;
/// use quant::{OperandQuant, RoundingMode};
/// assert_eq!(packing_rounds(&OperandQuant::BF16), quantized_gemm_rounds_inputs());
/// assert!(!packing_rounds(&OperandQuant::BF16.with_rounding(RoundingMode::Stochastic)));
/// assert!(!packing_rounds(&OperandQuant::nvfp4()));
/// ```
pub fn packing_rounds(q: &OperandQuant) -> bool {
    bf16_nearest(q) && quantized_gemm_rounds_inputs()
}

/// BF16 with round-to-nearest-even and no transform.
fn bf16_nearest(q: &OperandQuant) -> bool {
    q.format == QuantFormat::Bf16
        && q.rounding == RoundingMode::NearestEven
        && q.rht == crate::config::Rht::Off
}

/// Whether the columnwise fake quantization with `q` of any tensor is exactly the transpose
/// of its rowwise fake quantization (values and factor), so that one result can serve both
/// usages: NVFP4 with 16x16 tiles, round-to-nearest, no Hadamard transform and no Four Over
/// Six (docs/numerics.md#1x16-blocks-and-16x16-tiles: the tile scales and the global amax do not depend on the
/// orientation), and BF16 with round-to-nearest (elementwise). Stochastic rounding is
/// excluded (its random bits follow the stored layout and the operand's stream), as are the
/// formats whose blocks run along K (1x16, MX) or that keep per-operand state (FP8).
///
/// ```
/// use quant::qgemm::transpose_exact;
/// use quant::{BlockShape, GemmPolicy, OperandQuant};
/// let p = GemmPolicy::nvfp4_paper();
/// assert!(transpose_exact(&p.fprop.b) && p.fprop.b == p.dgrad.b);
/// assert!(!transpose_exact(&OperandQuant::nvfp4()));
/// assert!(transpose_exact(&OperandQuant::BF16));
/// ```
pub fn transpose_exact(q: &OperandQuant) -> bool {
    use crate::config::{BlockShape, Rht};
    let plain = q.rht == Rht::Off && q.rounding == RoundingMode::NearestEven;
    match q.format {
        QuantFormat::Nvfp4 { four_over_six } => {
            plain && four_over_six.is_none() && q.block == BlockShape::Tile16
        }
        QuantFormat::Bf16 => plain,
        _ => false,
    }
}

/// Fake-quantizes `op` once into `buf` (exactly `outer · K` elements, see
/// [`Operand::gemm_shape`]) for use in one or more [`quantized_matmul_tn_prequantized`]
/// calls. The values are those [`quantized_matmul_tn`] would compute for the same operand.
///
/// Errors: as [`quantized_matmul_tn`] for the operand; [`QuantError::GemmShape`] when `buf`
/// has the wrong length.
///
/// ```
/// use quant::qgemm::{fake_operand, quantized_matmul_tn, quantized_matmul_tn_prequantized, Operand};
/// use quant::{GemmPolicy, MatRef, Quantizer, Usage};
/// let p = GemmPolicy::nvfp4_paper();
/// let x: Vec<f32> = (0..32 * 16).map(|i| (i as f32 * 0.37).sin()).collect();
/// let w: Vec<f32> = (0..16 * 16).map(|i| (i as f32 * 0.11).cos()).collect();
/// let (xq, wq) = (Quantizer::new(p.fprop.a, Usage::Rowwise)?, Quantizer::new(p.fprop.b, Usage::Rowwise)?);
/// let (x, w) = (MatRef::new(&x, 32, 16)?, MatRef::new(&w, 16, 16)?);
/// let mut wbuf = vec![0.0f32; 16 * 16];
/// let wf = fake_operand(Operand::new(w, wq), &mut wbuf)?;
/// let (mut y1, mut y2) = (vec![0.0f32; 32 * 16], vec![0.0f32; 32 * 16]);
/// quantized_matmul_tn_prequantized(Operand::new(x, xq), wf, &mut y1)?;
/// quantized_matmul_tn(Operand::new(x, xq), Operand::new(w, wq), &mut y2)?;
/// assert_eq!(y1, y2);
/// # Ok::<(), quant::QuantError>(())
/// ```
pub fn fake_operand<'b>(
    op: Operand<'_>,
    buf: &'b mut [f32],
) -> Result<FakeOperand<'b>, QuantError> {
    op.x.contiguous()?;
    let (outer, k) = op.gemm_shape();
    if buf.len() != outer * k {
        return Err(QuantError::GemmShape(format!(
            "operand buffer holds {} elements, [{outer}, {k}] needs {}",
            buf.len(),
            outer * k
        )));
    }
    let mut op = op;
    let mut local = QuantState::new();
    let quantizer = op.quantizer;
    let state = quant_state(&mut op.state, quantizer.spec(), &mut local)?;
    let factor = quantizer.fake_quantize_into(op.x, state, buf)?;
    Ok(FakeOperand {
        values: MatRef::row_major(buf, outer, k),
        factor,
        quantized: quantizer.quantizes(),
        e2m1: e2m1_values(quantizer.spec()),
    })
}

/// [`quantized_matmul_tn`] with operand B already fake-quantized ([`fake_operand`], possibly
/// transposed with [`FakeOperand::t`]): bit for bit the result of quantizing B in the call
/// with the same settings.
///
/// Errors: as [`quantized_matmul_tn`].
pub fn quantized_matmul_tn_prequantized(
    a: Operand<'_>,
    b: FakeOperand<'_>,
    out: &mut [f32],
) -> Result<(), QuantError> {
    let b_side = Prepared::new(Side::View(b.values), b.factor, b.quantized);
    with_kept_b(a, (b_side, b.e2m1), (b.values.rows, b.values.cols), out)
}

/// `out = α · Â · B̂ᵀ` for two operands both fake-quantized already ([`fake_operand`], or
/// values assembled by hand with their flags): the GEMM [`quantized_matmul_tn`] runs for
/// the same values, bit for bit (the E2M1 block GEMM for two E2M1 operands where it runs,
/// the BF16 GEMM for two quantized ones, the f32 GEMM otherwise), then α.
///
/// Errors: [`QuantError::GemmShape`] when the operands disagree on K or `out` does not hold
/// `M · N` elements; [`QuantError::InvalidConfig`] for a view that reads past its values.
///
/// ```
/// use quant::qgemm::{fake_operand, quantized_matmul_tn, quantized_matmul_tn_fake, Operand};
/// use quant::{GemmPolicy, MatRef, Quantizer, Usage};
/// let p = GemmPolicy::nvfp4_paper();
/// let x: Vec<f32> = (0..32 * 16).map(|i| (i as f32 * 0.37).sin()).collect();
/// let w: Vec<f32> = (0..16 * 16).map(|i| (i as f32 * 0.11).cos()).collect();
/// let (xq, wq) = (Quantizer::new(p.fprop.a, Usage::Rowwise)?, Quantizer::new(p.fprop.b, Usage::Rowwise)?);
/// let (x, w) = (MatRef::new(&x, 32, 16)?, MatRef::new(&w, 16, 16)?);
/// let (mut xbuf, mut wbuf) = (vec![0.0f32; 32 * 16], vec![0.0f32; 16 * 16]);
/// let xf = fake_operand(Operand::new(x, xq), &mut xbuf)?;
/// let wf = fake_operand(Operand::new(w, wq), &mut wbuf)?;
/// let (mut y1, mut y2) = (vec![0.0f32; 32 * 16], vec![0.0f32; 32 * 16]);
/// quantized_matmul_tn_fake(xf, wf, &mut y1)?;
/// quantized_matmul_tn(Operand::new(x, xq), Operand::new(w, wq), &mut y2)?;
/// assert_eq!(y1, y2);
/// # Ok::<(), quant::QuantError>(())
/// ```
pub fn quantized_matmul_tn_fake(
    a: FakeOperand<'_>,
    b: FakeOperand<'_>,
    out: &mut [f32],
) -> Result<(), QuantError> {
    let (va, vb) = (a.values, b.values);
    check_fits(va)?;
    check_fits(vb)?;
    check_shapes(va.rows, va.cols, vb.rows, vb.cols, out)?;
    let e2m1 = e2m1_gemm_runs(a.e2m1, b.e2m1);
    let pa = Prepared::new(Side::View(va), a.factor, a.quantized);
    let pb = Prepared::new(Side::View(vb), b.factor, b.quantized);
    let mut ws = WORKSPACE.with(|c| c.take()).unwrap_or_default();
    let GemmWorkspace {
        packed,
        e2m1: e2m1_ws,
        ..
    } = &mut *ws;
    finish(pa, pb, e2m1, out, (packed, e2m1_ws));
    WORKSPACE.with(|c| c.set(Some(ws)));
    Ok(())
}

/// `out = α · Â · Bᵀ` for an operand B the caller keeps (and whether its values are E2M1),
/// `(N, K)`, A quantized in the call on this thread's workspace.
fn with_kept_b(
    a: Operand<'_>,
    (b, b_e2m1): (Prepared<'_>, bool),
    (n, kb): (usize, usize),
    out: &mut [f32],
) -> Result<(), QuantError> {
    a.x.contiguous()?;
    let (m, ka) = a.gemm_shape();
    check_shapes(m, ka, n, kb, out)?;
    let mut ws = WORKSPACE.with(|c| c.take()).unwrap_or_default();
    let qa = a.quantizer.quantizes();
    let GemmWorkspace {
        a: wa,
        packed,
        e2m1: e2m1_ws,
        ..
    } = &mut *ws;
    let e2m1 = e2m1_gemm_runs(e2m1_values(a.quant()), b_e2m1);
    let rounds = on_bf16_unit(qa, b.quantized, e2m1);
    let r = prepare(a, wa, (&mut packed.a, true), rounds)
        .map(|(av, fa)| finish(Prepared::new(av, fa, qa), b, e2m1, out, (packed, e2m1_ws)));
    WORKSPACE.with(|c| c.set(Some(ws)));
    r
}

/// A fake-quantized operand B kept across many products (a weight frozen between two
/// weight syncs): its values ([`FakeOperand`]) and, where the product runs on a BF16 unit
/// or the E2M1 block GEMM, the same values packed once for it ([`PackedB`],
/// [`PackedE2m1B`]), so that [`quantized_matmul_tn_frozen`] skips packing them in every
/// call. Owning both, it cannot pair packed operands with other values.
#[derive(Clone, Debug)]
pub struct FrozenOperand {
    values: Vec<f32>,
    rows: usize,
    cols: usize,
    factor: f32,
    quantized: bool,
    e2m1: bool,
    tiles: Option<FrozenTiles>,
}

/// What a [`FrozenOperand`] keeps packed.
#[derive(Clone, Debug)]
enum FrozenTiles {
    Bf16(PackedB),
    E2m1(PackedE2m1B),
}

impl FrozenOperand {
    /// Keeps a copy of `b` (a row-major `[outer, K]` or transposed view) and, when it is
    /// quantized and a BF16 unit (or, for E2M1 values, the E2M1 block GEMM) runs, the
    /// operand packed for it.
    ///
    /// Errors: [`QuantError::InvalidConfig`] when `b`'s view does not fit its storage.
    ///
    /// ```
    /// use quant::qgemm::{fake_operand, quantized_matmul_tn_frozen, quantized_matmul_tn_prequantized, FrozenOperand, Operand};
    /// use quant::{GemmPolicy, MatRef, Quantizer, Usage};
    /// let p = GemmPolicy::nvfp4_paper();
    /// let x: Vec<f32> = (0..32 * 16).map(|i| (i as f32 * 0.37).sin()).collect();
    /// let w: Vec<f32> = (0..16 * 16).map(|i| (i as f32 * 0.11).cos()).collect();
    /// let (xq, wq) = (Quantizer::new(p.fprop.a, Usage::Rowwise)?, Quantizer::new(p.fprop.b, Usage::Rowwise)?);
    /// let (x, w) = (MatRef::new(&x, 32, 16)?, MatRef::new(&w, 16, 16)?);
    /// let mut wbuf = vec![0.0f32; 16 * 16];
    /// let wf = fake_operand(Operand::new(w, wq), &mut wbuf)?;
    /// let frozen = FrozenOperand::new(wf)?;
    /// let (mut y1, mut y2) = (vec![0.0f32; 32 * 16], vec![0.0f32; 32 * 16]);
    /// quantized_matmul_tn_frozen(Operand::new(x, xq), &frozen, &mut y1)?;
    /// quantized_matmul_tn_prequantized(Operand::new(x, xq), wf, &mut y2)?;
    /// assert_eq!(y1, y2);
    /// # Ok::<(), quant::QuantError>(())
    /// ```
    pub fn new(b: FakeOperand<'_>) -> Result<FrozenOperand, QuantError> {
        let v = b.values;
        check_fits(v)?;
        let values: Vec<f32> = (0..v.rows)
            .flat_map(|r| (0..v.cols).map(move |c| v.data[r * v.row_stride + c * v.col_stride]))
            .collect();
        let kept = MatRef::row_major(&values, v.rows, v.cols);
        // E2M1 records where that GEMM runs and the values split, else BF16 tiles where a
        // BF16 unit runs
        let tiles = b
            .e2m1
            .then(|| PackedE2m1B::new(kept).map(FrozenTiles::E2m1))
            .flatten()
            .or_else(|| {
                b.quantized
                    .then(|| PackedB::new(kept).map(FrozenTiles::Bf16))
                    .flatten()
            });
        Ok(FrozenOperand {
            rows: v.rows,
            cols: v.cols,
            factor: b.factor,
            quantized: b.quantized,
            e2m1: b.e2m1,
            tiles,
            values,
        })
    }

    /// `(outer, K)` of the kept operand.
    pub fn dims(&self) -> (usize, usize) {
        (self.rows, self.cols)
    }

    /// The kept operand as a [`FakeOperand`] (`[outer, K]`).
    pub fn fake(&self) -> FakeOperand<'_> {
        FakeOperand {
            values: MatRef::row_major(&self.values, self.rows, self.cols),
            factor: self.factor,
            quantized: self.quantized,
            e2m1: self.e2m1,
        }
    }
}

/// [`quantized_matmul_tn_prequantized`] with a [`FrozenOperand`] as B: the same product bit
/// for bit, its B tiles read as packed once instead of packed again.
///
/// Errors: as [`quantized_matmul_tn`].
pub fn quantized_matmul_tn_frozen(
    a: Operand<'_>,
    b: &FrozenOperand,
    out: &mut [f32],
) -> Result<(), QuantError> {
    // the tiles exist only where a BF16 unit (the E2M1 GEMM) runs, and serve only a
    // product on it, i.e. with A quantized (A's values E2M1) too
    match &b.tiles {
        Some(FrozenTiles::E2m1(t)) if e2m1_gemm_runs(e2m1_values(a.quant()), true) => {
            // the values stay B's side for the BF16 GEMM should A's values not split
            let mut b_side = Prepared::new(Side::View(b.fake().values), b.factor, true);
            b_side.e2m1_packed = Some(t);
            with_kept_b(a, (b_side, true), (b.rows, b.cols), out)
        }
        Some(FrozenTiles::Bf16(t)) if a.quantizer.quantizes() => {
            let b_side = Prepared::new(Side::PackedB(t), b.factor, b.quantized);
            with_kept_b(a, (b_side, false), (b.rows, b.cols), out)
        }
        _ => quantized_matmul_tn_prequantized(a, b.fake(), out),
    }
}

/// Both operands must transform the reduction dimension with the same Hadamard signs (or not
/// at all): otherwise the product itself changes. Random signs are allowed when the two keys
/// give the same mask.
fn check_same_transform(a: &Operand<'_>, b: &Operand<'_>) -> Result<(), QuantError> {
    let (ma, mb) = (
        crate::hadamard::sign_mask(a.quant().rht, a.quantizer.key()),
        crate::hadamard::sign_mask(b.quant().rht, b.quantizer.key()),
    );
    if ma != mb {
        return Err(QuantError::InvalidConfig(format!(
            "the two GEMM operands transform the reduction dimension differently (RHT sign masks {ma:04x?} and {mb:04x?}): the RHT must use the same signs on both operands or be off on both"
        )));
    }
    Ok(())
}

/// A hand-made view must not read past its values.
fn check_fits(v: MatRef<'_>) -> Result<(), QuantError> {
    if v.fits() {
        return Ok(());
    }
    Err(QuantError::InvalidConfig(format!(
        "a [{}, {}] view with strides ({}, {}) reads past its {} values",
        v.rows,
        v.cols,
        v.row_stride,
        v.col_stride,
        v.data.len()
    )))
}

fn check_shapes(m: usize, ka: usize, n: usize, kb: usize, out: &[f32]) -> Result<(), QuantError> {
    if ka != kb {
        return Err(QuantError::GemmShape(format!(
            "operand A is [{m}, {ka}] and operand B is [{n}, {kb}]: the reduction dimensions differ"
        )));
    }
    if out.len() != m * n {
        return Err(QuantError::GemmShape(format!(
            "output holds {} elements, [{m}, {n}] needs {}",
            out.len(),
            m * n
        )));
    }
    Ok(())
}

/// Elements per parallel task of the α epilogue (elementwise, so the result does not depend
/// on it or on the thread count).
const EPILOGUE_CHUNK: usize = 1 << 16;

/// `out = α · Â · B̂ᵀ` from the prepared `[M, K]` and `[N, K]` operands (views, or packed
/// into `packed` by the quantizer), their factors and whether each is quantized (then
/// exactly BF16; an operand is packed only when both are and the tile unit runs). With
/// `e2m1` (the product runs on the E2M1 block GEMM: both sides are views of their values, B
/// possibly packed for it too) the E2M1 GEMM multiplies, unless a group of either operand
/// does not split: then the BF16 GEMM does, as it would without.
fn finish(
    a: Prepared<'_>,
    b: Prepared<'_>,
    e2m1: bool,
    out: &mut [f32],
    (packed, e2m1_ws): (&mut Bf16Workspace, &mut E2m1Workspace),
) {
    let (av, fa, qa) = (a.side, a.factor, a.quantized);
    let (bv, fb, qb) = (b.side, b.factor, b.quantized);
    let k = match av {
        Side::View(v) => v.cols,
        Side::Packed { k, .. } => k,
        Side::PackedB(p) => p.dims().1,
    };
    let on_e2m1 = match (e2m1, av, bv, b.e2m1_packed) {
        (true, Side::View(a), _, Some(p)) => e2m1_gemm_tn_packed(a, p, out, e2m1_ws),
        (true, Side::View(a), Side::View(b), None) => e2m1_gemm_tn(a, b, out, e2m1_ws),
        _ => false,
    };
    let alpha = fa * fb;
    // whether the product applied α itself: the BF16 GEMM does, to each output block as it
    // finishes it; two quantized views without a BF16 unit (`quantized_gemm_tn` there) and
    // an FP32 operand (B̂ᵀ: [K, N]) run on the f32 GEMM, and the E2M1 GEMM, with a pass
    let scaled = !on_e2m1
        && match (av, bv) {
            (Side::View(a), Side::View(b)) if !(qa && qb && quantized_gemm_rounds_inputs()) => {
                sgemm(1.0, a, b.t(), 0.0, out);
                false
            }
            (a, b) => {
                quantized_gemm_sides(a, b, out, packed, alpha);
                true
            }
        };
    if alpha != 1.0 && k > 0 && !scaled {
        // One O(MN) pass; split across the rayon pool only when large.
        if out.len() >= 2 * EPILOGUE_CHUNK {
            use rayon::prelude::*;
            out.par_chunks_mut(EPILOGUE_CHUNK)
                .for_each(|c| c.iter_mut().for_each(|v| *v *= alpha));
        } else {
            out.iter_mut().for_each(|v| *v *= alpha);
        }
    }
}

/// The operand's delayed-scaling state, or `local` when it needs none.
fn quant_state<'s>(
    state: &'s mut Option<&mut QuantState>,
    q: &OperandQuant,
    local: &'s mut QuantState,
) -> Result<&'s mut QuantState, QuantError> {
    let delayed = matches!(
        q.format,
        QuantFormat::Fp8 {
            scaling: Fp8Scaling::Delayed { .. },
            ..
        }
    );
    match state.as_deref_mut() {
        Some(s) => Ok(s),
        None if delayed => Err(QuantError::InvalidConfig(
            "a delayed-scaling FP8 operand needs a QuantState".into(),
        )),
        None => Ok(local),
    }
}

/// The operand as an `[outer, K]` view and its per-tensor factor. `gemm_rounds`: both
/// operands are quantized and the GEMM runs on the tile unit, which rounds its inputs to
/// BF16 (nearest even) itself ([`quantized_gemm_rounds_inputs`]). Then a BF16
/// round-to-nearest operand goes in unrounded (the same bits without a pass over it), and
/// a quantized operand is quantized straight into the packed tiles `tiles.0` (as the
/// GEMM's A operand when `tiles.1`, else as B) with no f32 copy where its format allows
/// ([`Quantizer::fake_quantize_packed`]): [`Side::Packed`].
fn prepare<'a>(
    op: Operand<'a>,
    buf: &'a mut Vec<f32>,
    tiles: (&mut crate::gemm::TileWords, bool),
    gemm_rounds: bool,
) -> Result<(Side<'a>, f32), QuantError> {
    let (outer, k) = op.gemm_shape();
    let quantizer = op.quantizer;
    if !quantizer.quantizes() || (gemm_rounds && bf16_nearest(quantizer.spec())) {
        return Ok(match quantizer.usage() {
            Usage::Rowwise => (Side::View(op.x), 1.0),
            Usage::Columnwise => (Side::View(op.x.t()), 1.0),
        });
    }
    let mut op = op;
    let mut local = QuantState::new();
    let state = quant_state(&mut op.state, quantizer.spec(), &mut local)?;
    if gemm_rounds {
        if let Some((f, chunk_major)) =
            quantizer.fake_quantize_packed(op.x, state, tiles.1, tiles.0)?
        {
            let side = Side::Packed {
                rows: outer,
                k,
                chunk_major,
            };
            return Ok((side, f));
        }
    }
    let n = outer * k;
    if buf.len() < n {
        buf.resize(n, 0.0);
    }
    let dst = &mut buf[..n];
    if quantizer.usage() == Usage::Columnwise {
        // Where the format allows it, the columnwise operand's values are produced in the
        // source layout and the GEMM reads them through a transposed view: no transposing
        // copy, and the GEMM packs the view like an f32 operand's. The packed operand, hence
        // the product, is the same bit for bit as from the stored (transposed) layout.
        if let Some(f) = quantizer.fake_quantize_source_layout(op.x, state, dst)? {
            return Ok((
                Side::View(MatRef::row_major(dst, op.x.rows, op.x.cols).t()),
                f,
            ));
        }
    }
    let f = quantizer.fake_quantize_into(op.x, state, dst)?;
    Ok((Side::View(MatRef::row_major(dst, outer, k)), f))
}
