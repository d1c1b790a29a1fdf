//! Per-tensor FP8 (docs/numerics.md#per-tensor-fp8): one FP32 scale per tensor, E4M3 or E5M2 codes,
//! one byte per element, with Transformer Engine's current and delayed scaling.
//!
//! * **Current scaling** (`Float8CurrentScaling`): the scale comes from the tensor being
//!   quantized, `scale = fl(fp8_max / amax)` ([`compute_scale_from_amax`]).
//! * **Delayed scaling** (`DelayedScaling`): the scale comes from a window of past amaxes
//!   kept in a [`QuantState`]. As in TE, a cast uses the scale computed at the end of the
//!   **previous** step; the cast records the tensor's amax in the history slot of the current
//!   step, and [`QuantState::end_step`] (TE's `amax_and_scale_update` at autocast exit)
//!   computes the scale for the next step from the whole window, then rolls the window.
//!
//! Elements: `code = satfinite_rne(fl(x · scale))` (or stochastic rounding with 8 Philox
//! bits per element); [`QuantizedTensor::tensor_scale_inv`] is `fl(1 / scale)` and
//! dequantization is `fp8(code) · scale_inv`, as the GEMM epilogue applies it.
//!
//! The tensor amax ignores NaN elements (CUDA `fmaxf`, as TE's amax kernels); NaN elements
//! encode to the format's NaN. An infinite element gives an infinite amax: current scaling
//! then uses scale 1 and delayed scaling keeps the previous scale.
//!
//! Choosing E4M3 for forward tensors and E5M2 for gradients (TE's HYBRID format) is the
//! recipe's job: see [`crate::GemmPolicy::fp8_current_hybrid`].
//!
//! # Implementation
//! `fake_quantize_into` and `quantize` run a fused cast (`fp8/fast.rs`, compiled for
//! baseline and AVX2) that rounds `fl(x · scale)` onto the FP8 grid in the f32 domain with
//! the element rounding the MX kernels use (`crate::grid`) and writes the FP8 value (or the
//! code) directly, bit for bit what the encoder and decoder give, NaN and saturation
//! included (tested against the encoder path - encode, then decode - on whole tensors, both
//! scalings, over several delayed-scaling steps). Current scaling takes two passes (the
//! amax, then the cast); delayed scaling one (the cast uses the previous step's scale and
//! takes the amax on the way).
//!
//! ```
//! use quant::{Fp8Element, MatRef, OperandQuant, QuantState, Quantizer, Usage};
//! let x = [1.0f32, -2.0, 0.5, 7.0];
//! let q = Quantizer::new(OperandQuant::fp8_current(Fp8Element::E4M3), Usage::Rowwise)?;
//! let t = q.quantize(MatRef::new(&x, 2, 2)?, &mut QuantState::new())?;
//! assert_eq!(t.tensor_scale_inv, 1.0 / 64.0);      // scale = 448 / 7
//! assert_eq!(t.codes, vec![0x68, 0xF0, 0x60, 0x7E]); // 64, -128, 32, 448
//! assert_eq!(t.dequantize(), x.to_vec());
//! # Ok::<(), quant::QuantError>(())
//! ```

use fp_formats::{ElementFormat, E4M3, E5M2};
use rayon::prelude::*;

use crate::config::{
    AmaxAlgo, Fp8Element, Fp8Scaling, OperandQuant, QuantFormat, RoundingMode, Usage,
};
use crate::panel::{self, grow, stored_panel, stored_shape, with_scratch};
use crate::{MatRef, QuantError, QuantizedTensor, Quantizer, RngKey};

mod fast;

/// Largest finite value of an FP8 element format (E4M3 448, E5M2 57344).
///
/// ```
/// assert_eq!(quant::fp8::fp8_max(quant::Fp8Element::E5M2), 57344.0);
/// ```
#[inline]
pub const fn fp8_max(element: Fp8Element) -> f32 {
    match element {
        Fp8Element::E4M3 => E4M3::MAX,
        Fp8Element::E5M2 => E5M2::MAX,
    }
}

/// Transformer Engine's `compute_scale_from_amax` (docs/numerics.md#current-scaling) with `epsilon = 0`:
/// an amax of 0, ±Inf or NaN gives scale 1; otherwise `scale = fl(fp8_max / amax)` (one
/// correctly rounded f32 division, CUDA `__fdiv_rn`); an infinite result becomes `f32::MAX`;
/// with `power_of_two` the mantissa bits are cleared (rounding the scale down to a power of
/// two, so `f32::MAX` becomes `2^127`).
///
/// ```
/// use quant::fp8::compute_scale_from_amax;
/// assert_eq!(compute_scale_from_amax(7.0, 448.0, false), 64.0);
/// assert_eq!(compute_scale_from_amax(3.0, 448.0, false), 448.0f32 / 3.0);
/// assert_eq!(compute_scale_from_amax(3.0, 448.0, true), 128.0); // 149.33 -> 128
/// assert_eq!(compute_scale_from_amax(0.0, 448.0, false), 1.0);
/// assert_eq!(compute_scale_from_amax(f32::NAN, 448.0, false), 1.0);
/// assert_eq!(compute_scale_from_amax(1e-45, 448.0, false), f32::MAX);
/// ```
#[inline]
pub fn compute_scale_from_amax(amax: f32, fp8_max: f32, power_of_two: bool) -> f32 {
    if amax.is_infinite() || amax == 0.0 || amax.is_nan() {
        return 1.0;
    }
    let mut scale = fp8_max / amax;
    if scale.is_infinite() {
        scale = f32::MAX;
    }
    if scale.is_nan() {
        scale = 1.0;
    }
    if power_of_two {
        scale = f32::from_bits(scale.to_bits() & 0xFF80_0000);
    }
    scale
}

/// Per-tensor quantization state that persists across training steps: the delayed-scaling
/// amax history and scale (Transformer Engine's `fp8_meta`), plus what the last cast used.
///
/// History slot order is TE's: slot 0 holds the current step's amax (every cast of the step
/// folds its amax into it with a max); [`QuantState::update_scale`] reduces the whole window
/// (maximum, or slot 0 for [`AmaxAlgo::MostRecent`]), computes
/// `scale = fl(fl(fp8_max · 2^-margin) / amax)` (kept unchanged when that amax is not
/// finite or not positive; `f32::MAX` when the division overflows), then rolls the window
/// (slot `i` takes slot `i + 1`, the last slot takes slot 0, so slot 1 — the oldest — is
/// dropped) and zeroes slot 0. The initial scale is 1.
///
/// ```
/// use quant::{AmaxAlgo, QuantState};
/// let mut s = QuantState::with_history_len(4);
/// for amax in [3.5, 7.0, 1.0] {
///     s.record_amax(amax);
///     s.update_scale(448.0, 0, AmaxAlgo::Max);
/// }
/// assert_eq!(s.scale(), 64.0); // 448 / max(3.5, 7, 1)
/// assert_eq!(s.amax_history(), &[0.0, 3.5, 7.0, 1.0]);
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct QuantState {
    amax_history: Vec<f32>,
    scale: f32,
    scale_inv: f32,
    last_amax: f32,
    last_scale: f32,
}

impl Default for QuantState {
    fn default() -> Self {
        QuantState::new()
    }
}

impl QuantState {
    /// A fresh state: scale 1, no history yet (the first delayed-scaling cast sizes the
    /// history from its [`Fp8Scaling::Delayed`] settings).
    pub const fn new() -> Self {
        QuantState {
            amax_history: Vec::new(),
            scale: 1.0,
            scale_inv: 1.0,
            last_amax: 0.0,
            last_scale: 1.0,
        }
    }

    /// A fresh state with a zeroed amax history of `len` slots (at least 1).
    pub fn with_history_len(len: usize) -> Self {
        QuantState {
            amax_history: vec![0.0; len.max(1)],
            ..QuantState::new()
        }
    }

    /// The delayed-scaling scale the next cast will use.
    pub fn scale(&self) -> f32 {
        self.scale
    }

    /// `fl(1 / scale())`.
    pub fn scale_inv(&self) -> f32 {
        self.scale_inv
    }

    /// The amax history in TE's slot order (slot 0 = the current step).
    pub fn amax_history(&self) -> &[f32] {
        &self.amax_history
    }

    /// The amax of the last tensor quantized with this state (any scaling).
    pub fn last_amax(&self) -> f32 {
        self.last_amax
    }

    /// The scale the last FP8 cast with this state used (any scaling).
    pub fn last_scale(&self) -> f32 {
        self.last_scale
    }

    /// Rebuilds a state from what a checkpoint stores: the amax history (TE slot order), the
    /// delayed-scaling scale and the last cast's amax and scale. `restore` of the accessors'
    /// values gives a state equal to the original (`scale_inv` is `1 / scale`, as
    /// [`QuantState::update_scale`] and [`QuantState::set_scale`] compute it).
    ///
    /// ```
    /// use quant::{AmaxAlgo, QuantState};
    /// let mut s = QuantState::with_history_len(3);
    /// s.record_amax(3.0);
    /// s.update_scale(448.0, 0, AmaxAlgo::Max);
    /// let r = QuantState::restore(s.amax_history().to_vec(), s.scale(), s.last_amax(), s.last_scale());
    /// assert_eq!(r, s);
    /// ```
    pub fn restore(amax_history: Vec<f32>, scale: f32, last_amax: f32, last_scale: f32) -> Self {
        QuantState {
            amax_history,
            scale,
            scale_inv: 1.0 / scale,
            last_amax,
            last_scale,
        }
    }

    /// Sets the delayed-scaling scale directly (e.g. when restoring a checkpoint).
    pub fn set_scale(&mut self, scale: f32) {
        self.scale = scale;
        self.scale_inv = 1.0 / scale;
    }

    fn ensure_history(&mut self, len: usize) -> Result<(), QuantError> {
        if len == 0 {
            return Err(QuantError::InvalidConfig(
                "delayed scaling needs history_len >= 1".into(),
            ));
        }
        if self.amax_history.is_empty() {
            self.amax_history = vec![0.0; len];
        } else if self.amax_history.len() != len {
            return Err(QuantError::InvalidConfig(format!(
                "QuantState holds an amax history of {} slots but the operand asks for {len}",
                self.amax_history.len()
            )));
        }
        Ok(())
    }

    /// Folds a tensor amax into the current step's slot (slot 0) with a maximum; a NaN amax
    /// makes the slot NaN. A state without history gets a one-slot history.
    pub fn record_amax(&mut self, amax: f32) {
        if self.amax_history.is_empty() {
            self.amax_history.push(0.0);
        }
        let slot = &mut self.amax_history[0];
        *slot = if amax.is_nan() || slot.is_nan() {
            f32::NAN
        } else {
            slot.max(amax)
        };
    }

    /// TE's `amax_and_scale_update` for one tensor (see the type docs): reduces the
    /// window, updates the scale from it, rolls the window and zeroes slot 0.
    pub fn update_scale(&mut self, fp8_max: f32, margin: i32, algo: AmaxAlgo) {
        let h = &mut self.amax_history;
        if h.is_empty() {
            return;
        }
        let last = h[0];
        // The window maximum, NaN-ignoring like CUDA `fmaxf`.
        let window_max = h.iter().fold(0.0f32, |m, &a| m.max(a));
        let amax = match algo {
            AmaxAlgo::Max => window_max,
            AmaxAlgo::MostRecent => last,
        };
        h.rotate_left(1);
        h[0] = 0.0;
        let scaled_max = fp8_max * 2.0f32.powi(-margin);
        if amax.is_finite() && amax > 0.0 {
            let mut scale = scaled_max / amax;
            if scale.is_infinite() {
                scale = f32::MAX;
            }
            self.scale = scale;
        }
        self.scale_inv = 1.0 / self.scale;
    }

    /// Ends a training step for this tensor: for an operand with delayed FP8 scaling, runs
    /// [`QuantState::update_scale`] with its element maximum, margin and algorithm; does
    /// nothing for every other format, so a trainer can call it on all its states.
    ///
    /// ```
    /// use quant::{AmaxAlgo, Fp8Element, Fp8Scaling, MatRef, OperandQuant, QuantFormat,
    ///             QuantState, Quantizer, Usage};
    /// let q = OperandQuant {
    ///     format: QuantFormat::Fp8 {
    ///         element: Fp8Element::E4M3,
    ///         scaling: Fp8Scaling::Delayed { history_len: 16, margin: 0, algo: AmaxAlgo::Max },
    ///     },
    ///     ..OperandQuant::F32
    /// };
    /// let mut s = QuantState::new();
    /// let x = [7.0f32, -1.0];
    /// let t = Quantizer::new(q, Usage::Rowwise)?.quantize(MatRef::new(&x, 1, 2)?, &mut s)?;
    /// assert_eq!(t.tensor_scale_inv, 1.0); // first step: initial scale 1
    /// s.end_step(&q)?;
    /// assert_eq!(s.scale(), 64.0); // the next step casts with 448 / 7
    /// # Ok::<(), quant::QuantError>(())
    /// ```
    pub fn end_step(&mut self, q: &OperandQuant) -> Result<(), QuantError> {
        if let QuantFormat::Fp8 {
            element,
            scaling:
                Fp8Scaling::Delayed {
                    history_len,
                    margin,
                    algo,
                },
        } = q.format
        {
            self.ensure_history(history_len)?;
            self.update_scale(fp8_max(element), margin, algo);
        }
        Ok(())
    }
}

/// The resolved settings of one FP8 cast.
struct Cast {
    element: Fp8Element,
    scale: f32,
    sr: Option<RngKey>,
}

fn settings(q: &OperandQuant) -> Result<(Fp8Element, Fp8Scaling), QuantError> {
    match q.format {
        QuantFormat::Fp8 { element, scaling } => Ok((element, scaling)),
        other => Err(QuantError::InvalidConfig(format!(
            "fp8 quantizer called with {other:?}"
        ))),
    }
}

/// The tensor amax, NaN-ignoring, in parallel (exact for any thread count).
pub(crate) fn tensor_amax(x: &[f32]) -> f32 {
    x.par_chunks(1 << 16)
        .map(chunk_amax)
        .reduce(|| 0.0, f32::max)
}

/// `max |x|` of one chunk, NaN-ignoring (0 when empty or all NaN), compiled for the widest
/// vectors this CPU has: the same value as `fp_formats::nvfp4::block_amax` (a maximum of
/// the same magnitudes, in any order), with 64 running maxima (four AVX-512 or eight AVX2
/// registers) so that the maxima do not wait on one another.
fn chunk_amax(x: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    {
        #[target_feature(enable = "avx512f")]
        fn avx512(x: &[f32]) -> f32 {
            amax_64(x)
        }
        #[target_feature(enable = "avx2")]
        fn avx2(x: &[f32]) -> f32 {
            amax_64(x)
        }
        if fp_formats::cpu::has_avx512f() {
            // SAFETY: the running CPU supports AVX-512F (checked just above).
            return unsafe { avx512(x) };
        }
        if fp_formats::cpu::has_avx2() {
            // SAFETY: the running CPU supports AVX2 (checked just above).
            return unsafe { avx2(x) };
        }
    }
    amax_64(x)
}

/// [`chunk_amax`]'s loop: 64 lanes of `m = |v| > m ? |v| : m` (one `maxps` each, which keeps
/// `m` for a NaN `v`), then the lanes and the tail by `block_amax`.
#[inline(always)]
fn amax_64(x: &[f32]) -> f32 {
    let mut m = [0.0f32; 64];
    let chunks = x.chunks_exact(64);
    let tail = chunks.remainder();
    for c in chunks {
        for (m, v) in m.iter_mut().zip(c) {
            let a = v.abs();
            *m = if a > *m { a } else { *m };
        }
    }
    let (lanes, tail) = (
        fp_formats::nvfp4::block_amax(&m),
        fp_formats::nvfp4::block_amax(tail),
    );
    if tail > lanes {
        tail
    } else {
        lanes
    }
}

#[inline(always)]
pub(crate) fn decode(element: Fp8Element, code: u8) -> f32 {
    match element {
        Fp8Element::E4M3 => E4M3(code).to_f32(),
        Fp8Element::E5M2 => E5M2(code).to_f32(),
    }
}

/// Where the cast of a tensor goes.
enum Sink<'a> {
    /// One code byte per element.
    Codes(&'a mut [u8]),
    /// The FP8 value per element.
    Values(&'a mut [f32]),
    /// The FP8 values of a rowwise cast packed into BF16 GEMM tiles (A layout when the
    /// first flag is true): as the `[rows, cols]` operand ([`crate::gemm::pack::pack_panels`]),
    /// or, when the second flag is true, as its transpose, chunk-major
    /// ([`crate::gemm::pack::pack_panels_chunk_major`]).
    Packed(bool, bool, &'a mut crate::gemm::TileWords),
}

/// What one cast of a tensor used and found.
struct Outcome {
    scale: f32,
    amax: f32,
    clipped: usize,
}

/// One FP8 cast of `x` into `out` (stored layout), with the scale of the operand's scaling:
/// * current scaling: an amax pass, then the cast with [`compute_scale_from_amax`];
/// * delayed scaling: one pass that casts with `state.scale()` and takes the amax, which is
///   then recorded in the history slot of the current step.
///
/// Either way `state` ends with the amax and scale of this cast. `portable` forces the
/// baseline build of the kernel (tests).
fn cast(
    qz: &Quantizer,
    x: MatRef<'_>,
    state: &mut QuantState,
    out: Sink<'_>,
    portable: bool,
) -> Result<Outcome, QuantError> {
    let (usage, q, key) = (qz.usage(), qz.spec(), qz.key());
    let x = MatRef::new(x.data, x.rows, x.cols)?;
    let (element, scaling) = settings(q)?;
    let sr = (q.rounding == RoundingMode::Stochastic).then_some(key);
    let o = match scaling {
        Fp8Scaling::Current { power_of_two } => {
            // A given amax (`Quantizer::with_tensor_amax`) replaces the amax pass; the cast
            // then folds the magnitudes it reads anyway into an amax of its own (the same
            // NaN-ignoring maximum) and refuses a given amax that differs.
            let given = qz.tensor_amax();
            let amax = given.unwrap_or_else(|| tensor_amax(x.data));
            let scale = compute_scale_from_amax(amax, fp8_max(element), power_of_two);
            let c = Cast { element, scale, sr };
            let st = cast_tensor(x, usage, &c, out, given.is_some(), portable);
            if given.is_some_and(|g| g.to_bits() != st.amax.to_bits()) {
                return Err(QuantError::InvalidConfig(format!(
                    "the tensor amax given for an FP8 current-scaling cast ({amax:e}) is not the \
                     tensor's ({:e}): Quantizer::with_tensor_amax needs the exact max |x|",
                    st.amax
                )));
            }
            Outcome {
                scale,
                amax,
                clipped: st.clipped,
            }
        }
        Fp8Scaling::Delayed { history_len, .. } => {
            state.ensure_history(history_len)?;
            let scale = state.scale;
            let c = Cast { element, scale, sr };
            let st = cast_tensor(x, usage, &c, out, true, portable);
            state.record_amax(st.amax);
            Outcome {
                scale,
                amax: st.amax,
                clipped: st.clipped,
            }
        }
    };
    state.last_amax = o.amax;
    state.last_scale = o.scale;
    Ok(o)
}

/// Runs the fused cast ([`fast`]) over the stored layout in parallel row panels: fake
/// quantized values straight from the input (rowwise) or in place on the transposed panel
/// (columnwise), codes from the stored panel. With `amax` the result holds `max |x|`.
fn cast_tensor(
    x: MatRef<'_>,
    usage: Usage,
    c: &Cast,
    out: Sink<'_>,
    amax: bool,
    portable: bool,
) -> fast::CastStats {
    let (x, rows, cols) = (x.data, x.rows, x.cols);
    let (srows, scols) = stored_shape(rows, cols, usage);
    if srows == 0 || scols == 0 {
        return fast::CastStats::default();
    }
    let p = panel::panel_rows_for(scols, usage);
    let (element, scale) = (c.element, c.scale);
    let zero = fast::CastStats::default;
    match out {
        Sink::Values(o) => o
            .par_chunks_mut(p * scols)
            .enumerate()
            .map(|(pi, dst)| {
                let (r0, n) = (pi * p, dst.len() / scols);
                with_scratch(|s| {
                    let rb = random_bytes(c.sr, &mut s.rbits, r0 * scols, n * scols);
                    match usage {
                        Usage::Rowwise => {
                            let src = &x[r0 * scols..(r0 + n) * scols];
                            fast::cast_panel(element, src, scale, rb, dst, amax, portable)
                        }
                        Usage::Columnwise => {
                            panel::stored_panel_into(x, rows, cols, usage, r0, n, dst);
                            let src = fast::InPlace;
                            fast::cast_panel(element, src, scale, rb, dst, amax, portable)
                        }
                    }
                })
            })
            .reduce(zero, fast::CastStats::merge),
        Sink::Packed(a_layout, transposed, buf) => {
            debug_assert_eq!(usage, Usage::Rowwise);
            let merge = fast::CastStats::merge;
            let panel = |r0: usize, dst: &mut [f32]| {
                let n = dst.len() / scols;
                with_scratch(|s| {
                    let rb = random_bytes(c.sr, &mut s.rbits, r0 * scols, n * scols);
                    let src = &x[r0 * scols..(r0 + n) * scols];
                    fast::cast_panel(element, src, scale, rb, dst, amax, portable)
                })
            };
            if transposed {
                let pack = crate::gemm::pack::pack_panels_chunk_major;
                pack(scols, srows, a_layout, buf, merge, panel)
            } else {
                crate::gemm::pack::pack_panels(srows, scols, a_layout, buf, merge, panel)
            }
        }
        Sink::Codes(o) => o
            .par_chunks_mut(p * scols)
            .enumerate()
            .map(|(pi, dst)| {
                let (r0, n) = (pi * p, dst.len() / scols);
                with_scratch(|s| {
                    let rb = random_bytes(c.sr, &mut s.rbits, r0 * scols, n * scols);
                    let src = stored_panel(x, rows, cols, usage, r0, n, &mut s.panel);
                    if element == Fp8Element::E4M3 && rb.is_none() && !amax {
                        // E4M3 codes with RNE: fp-formats' slice encoder (AVX2 where
                        // available) is ~20% faster here than the grid kernel, same bytes.
                        return fast::CastStats {
                            clipped: e4m3_codes_rne(src, scale, dst),
                            amax: 0.0,
                        };
                    }
                    fast::cast_panel(element, src, scale, rb, dst, amax, portable)
                })
            })
            .reduce(zero, fast::CastStats::merge),
    }
}

/// E4M3 codes of `fl(src[i] · scale)` with saturating RNE through
/// `E4M3::encode_slice_rne_sat` (bit-identical to the grid kernel, tested); returns the
/// number of clipped elements (`|x · scale| > 448`).
fn e4m3_codes_rne(src: &[f32], scale: f32, codes: &mut [u8]) -> usize {
    let max = fp8_max(Fp8Element::E4M3);
    let mut clipped = 0usize;
    let mut ys = [0.0f32; 512];
    for (o, v) in codes.chunks_mut(512).zip(src.chunks(512)) {
        let ys = &mut ys[..v.len()];
        for (y, &v) in ys.iter_mut().zip(v) {
            *y = v * scale;
            clipped += (y.abs() > max) as usize;
        }
        E4M3::encode_slice_rne_sat(ys, o);
    }
    clipped
}

/// The random bytes `start .. start + len` (flat indices in the stored layout) of the stream
/// `sr` in `buf` (stochastic rounding only).
fn random_bytes(sr: Option<RngKey>, buf: &mut Vec<u8>, start: usize, len: usize) -> Option<&[u8]> {
    sr.map(|key| {
        let rb = grow(buf, len);
        crate::philox::fill_random_bytes(key, start as u64, rb);
        &*rb
    })
}

/// Quantizes to per-tensor FP8 in the stored layout (`[rows, cols]` rowwise, `[cols, rows]`
/// columnwise), one code byte per element. Delayed scaling casts with `state.scale()` and
/// records the amax in `state`; call [`QuantState::end_step`] after the step.
///
/// Errors: a format other than FP8, RHT requested, `x.len() != rows * cols`, or a state
/// whose history length differs from the operand's.
pub(crate) fn quantize(
    qz: &Quantizer,
    x: MatRef<'_>,
    state: &mut QuantState,
) -> Result<QuantizedTensor, QuantError> {
    quantize_impl(qz, x, state, false)
}

/// [`quantize`]; `portable` forces the baseline build of the kernel (tests).
fn quantize_impl(
    qz: &Quantizer,
    x: MatRef<'_>,
    state: &mut QuantState,
    portable: bool,
) -> Result<QuantizedTensor, QuantError> {
    let (usage, q) = (qz.usage(), qz.spec());
    MatRef::new(x.data, x.rows, x.cols)?;
    settings(q)?;
    let (srows, scols) = stored_shape(x.rows, x.cols, usage);
    let mut codes = vec![0u8; srows * scols];
    let sink = Sink::Codes(&mut codes);
    let o = cast(qz, x, state, sink, portable)?;
    Ok(QuantizedTensor {
        format: q.format,
        block: q.block,
        usage,
        rows: srows,
        cols: scols,
        padded_rows: srows,
        padded_cols: scols,
        codes,
        scales: Vec::new(),
        amax: o.amax,
        tensor_scale_inv: 1.0 / o.scale,
        hadamard: None,
    })
}

/// Fake quantization: writes the FP8 values `fp8(code)` (without the per-tensor factor) in
/// the stored layout into `out` (`rows * cols` elements) and returns the per-tensor factor
/// `scale_inv = fl(1 / scale)`. The values are those of [`quantize`] and [`dequantize`]
/// without the factor, bit for bit, computed by the fused cast (`fp8/fast.rs`) without
/// producing codes.
pub(crate) fn fake_quantize_into(
    qz: &Quantizer,
    x: MatRef<'_>,
    state: &mut QuantState,
    out: &mut [f32],
) -> Result<f32, QuantError> {
    fake_quantize_counting(qz, x, state, out).map(|(f, _)| f)
}

/// [`fake_quantize_into`] that also returns the number of clipped elements.
pub(crate) fn fake_quantize_counting(
    qz: &Quantizer,
    x: MatRef<'_>,
    state: &mut QuantState,
    out: &mut [f32],
) -> Result<(f32, usize), QuantError> {
    fake_impl(qz, x, state, out, false)
}

/// [`fake_quantize_counting`]; `portable` forces the baseline build of the kernel (tests).
fn fake_impl(
    qz: &Quantizer,
    x: MatRef<'_>,
    state: &mut QuantState,
    out: &mut [f32],
    portable: bool,
) -> Result<(f32, usize), QuantError> {
    panel::check_out(out, x.data.len())?;
    let sink = Sink::Values(out);
    let o = cast(qz, x, state, sink, portable)?;
    Ok((1.0 / o.scale, o.clipped))
}

/// [`fake_quantize_into`] packed straight into the BF16 GEMM's tiles (`a_layout`: as its A
/// operand, else as B): the same values and the same state update, with no f32 copy of the
/// operand. A columnwise operand with nearest rounding is the rowwise cast transposed (one
/// scale per tensor), packed chunk-major. Returns `(1 / scale, chunk_major)`, or `None` for
/// columnwise stochastic rounding (its random bits follow the stored layout) or an empty
/// tensor, which the caller quantizes the usual way.
///
/// # Errors
/// As [`fake_quantize_into`].
pub(crate) fn fake_quantize_packed(
    qz: &Quantizer,
    x: MatRef<'_>,
    state: &mut QuantState,
    a_layout: bool,
    buf: &mut crate::gemm::TileWords,
) -> Result<Option<(f32, bool)>, QuantError> {
    let columnwise = qz.usage() == Usage::Columnwise;
    let sr = qz.spec().rounding == RoundingMode::Stochastic;
    if (columnwise && sr) || x.rows == 0 || x.cols == 0 {
        return Ok(None);
    }
    let rowwise = qz.as_rowwise();
    let o = cast(
        &rowwise,
        x,
        state,
        Sink::Packed(a_layout, columnwise, buf),
        false,
    )?;
    Ok(Some((1.0 / o.scale, columnwise)))
}

/// Dequantizes an FP8 tensor: `fp8(code) · tensor_scale_inv`, stored layout.
///
/// # Panics
/// If the tensor is not per-tensor FP8.
pub(crate) fn dequantize(t: &QuantizedTensor) -> Vec<f32> {
    let QuantFormat::Fp8 { element, .. } = t.format else {
        panic!("fp8::dequantize called on {:?}", t.format);
    };
    let s = t.tensor_scale_inv;
    t.codes
        .par_iter()
        .map(|&c| decode(element, c) * s)
        .collect()
}

#[cfg(test)]
mod tests;
