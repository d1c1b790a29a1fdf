//! The one quantizer interface: a validated [`Quantizer`] (operand settings, usage, random
//! key) that quantizes, fake-quantizes and dequantizes a [`MatRef`], with one dispatch on the
//! format to the per-format modules ([`crate::bf16`], [`crate::fp8`], [`crate::mx`],
//! [`crate::nvfp4`], whose kernels are implementation details), and the [`QuantizerBackend`]
//! trait that the CPU ([`Cpu`]) and the GPU (`kernels-cuda`) implement over their storage.
//!
//! [`Quantizer::new`] is the only place operand settings are checked; a `Quantizer` value is
//! valid by construction, so no entry point checks its settings again. Shape-dependent
//! conditions (the Hadamard transform's dimension a multiple of 16, finite input) are checked
//! where the input is seen.
//!
//! All results are in the **stored layout**: `[rows, cols]` for [`Usage::Rowwise`], the
//! transpose `[cols, rows]` for [`Usage::Columnwise`] (quantized from the high-precision
//! tensor, never from the other copy).
//!
//! | format | unscaled values (`fake_quantize_into`) | per-tensor factor |
//! |---|---|---|
//! | F32 | `x` | 1 |
//! | BF16 | `bf16(x)` | 1 |
//! | FP8 | `fp8(code)` | `1 / scale` |
//! | MX | `element(code) · 2^(b-127)` | 1, or 4/3 with `sr_prescale` |
//! | NVFP4 | `e2m1(code) · ue4m3(s_b)` | `S_dec` |
//!
//! Unscaled values are exact in f32, so an emulated GEMM of two fake-quantized operands
//! followed by the product of the factors in the epilogue models the hardware GEMM
//! (docs/numerics.md#the-quantized-gemm) up to accumulation order.
//!
//! **Key and state.** The [`RngKey`] is part of the quantizer ([`Quantizer::with_key`]): it
//! names the operand's random stream, as Transformer Engine's quantizer carries its RNG
//! state, and the GPU kernels need it at the same place. The delayed-scaling [`QuantState`]
//! is an explicit `&mut` argument instead: it is mutable history that outlives the
//! quantizer (it lives in the training state and in checkpoints, one per operand role),
//! while a `Quantizer` is a small `Copy` value built for each call; formats other than
//! delayed FP8 leave it untouched (pass `&mut QuantState::new()`).
//!
//! ```
//! use fp_formats::mx::{MxElement, ScaleRule};
//! use quant::{MatRef, OperandQuant, QuantState, Quantizer, RngKey, Usage};
//! let x: Vec<f32> = (0..64).map(|i| (i as f32 * 0.37).sin()).collect();
//! let x = MatRef::new(&x, 2, 32)?;
//! let q = Quantizer::new(OperandQuant::mx(MxElement::E2M1, ScaleRule::Rceil), Usage::Rowwise)?
//!     .with_key(RngKey { seed: 1, stream: 2 });
//! let mut st = QuantState::new();
//! let t = q.quantize(x, &mut st)?;
//! let y = q.fake_quantize(x, &mut st)?;
//! assert_eq!(t.dequantize(), y);
//! assert!(x.data.iter().zip(&y).all(|(a, b)| (a - b).abs() <= 0.25));
//! # Ok::<(), quant::QuantError>(())
//! ```

use crate::config::{BlockShape, Fp8Scaling, OperandQuant, QuantFormat, Rht, RoundingMode, Usage};
use crate::fp8::QuantState;
use crate::{bf16, fp8, mx, nvfp4, MatRef, QuantError, QuantizedTensor, RngKey};

fn invalid(msg: impl Into<String>) -> QuantError {
    QuantError::InvalidConfig(msg.into())
}

/// A validated quantizer for one operand: its settings, the copy it produces (rowwise or
/// columnwise) and the random key of its stream. `Copy`; build one per operand and call.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Quantizer {
    spec: OperandQuant,
    usage: Usage,
    key: RngKey,
    /// The input tensor's amax, known already ([`Quantizer::with_tensor_amax`]).
    tensor_amax: Option<f32>,
}

impl Quantizer {
    /// Checks that the settings are meaningful for the usage and returns the quantizer (with
    /// the default key):
    /// * `Tile16` only with NVFP4; MX needs `Row32`; NVFP4 needs `Row16` or `Tile16` (the
    ///   block shape is ignored by the per-tensor formats F32, BF16 and FP8);
    /// * the Hadamard transform only for NVFP4 and MX, and only with columnwise usage;
    /// * Four Over Six not with the Hadamard transform or stochastic rounding;
    /// * `sr_prescale` only with stochastic rounding; F32 never with stochastic rounding;
    /// * delayed FP8 scaling needs `history_len >= 1`.
    ///
    /// Errors: [`QuantError::InvalidConfig`] naming the broken rule.
    ///
    /// ```
    /// use quant::{BlockShape, OperandQuant, Quantizer, Rht, Usage};
    /// let w = OperandQuant::nvfp4().with_block(BlockShape::Tile16);
    /// assert!(Quantizer::new(w, Usage::Columnwise).is_ok());
    /// assert!(Quantizer::new(OperandQuant::BF16.with_block(BlockShape::Row32), Usage::Rowwise).is_ok());
    /// let bad = OperandQuant::nvfp4().with_rht(Rht::FixedSigns);
    /// assert!(Quantizer::new(bad, Usage::Rowwise).is_err()); // RHT is columnwise only
    /// ```
    pub fn new(spec: OperandQuant, usage: Usage) -> Result<Self, QuantError> {
        let q = &spec;
        if q.rht != Rht::Off && usage != Usage::Columnwise {
            return Err(invalid(
                "the Hadamard transform applies to columnwise usage only",
            ));
        }
        let sr = q.rounding == RoundingMode::Stochastic;
        match q.format {
            QuantFormat::F32 | QuantFormat::Bf16 | QuantFormat::Fp8 { .. } => {
                if q.rht != Rht::Off {
                    return Err(invalid(
                        "the Hadamard transform is only supported for NVFP4 and MX",
                    ));
                }
                if q.format == QuantFormat::F32 && sr {
                    return Err(invalid("F32 has nothing to round stochastically"));
                }
                if let QuantFormat::Fp8 {
                    scaling: Fp8Scaling::Delayed { history_len: 0, .. },
                    ..
                } = q.format
                {
                    return Err(invalid("delayed scaling needs history_len >= 1"));
                }
            }
            QuantFormat::Mx { sr_prescale, .. } => {
                if q.block != BlockShape::Row32 {
                    return Err(invalid(format!(
                        "MX formats use 1x32 blocks (BlockShape::Row32), not {:?}",
                        q.block
                    )));
                }
                if sr_prescale && !sr {
                    return Err(invalid(
                        "sr_prescale (Tseng et al.'s 3/4 prescaling) requires stochastic rounding",
                    ));
                }
            }
            QuantFormat::Nvfp4 { four_over_six } => {
                if q.block == BlockShape::Row32 {
                    return Err(invalid("NVFP4 uses 1x16 blocks or 16x16 tiles, not Row32"));
                }
                if four_over_six.is_some() && (q.rht != Rht::Off || sr) {
                    return Err(invalid(
                        "Four Over Six is not combinable with the Hadamard transform or stochastic rounding",
                    ));
                }
            }
        }
        Ok(Quantizer {
            spec,
            usage,
            key: RngKey::default(),
            tensor_amax: None,
        })
    }

    /// The same quantizer drawing its random bits (stochastic rounding, random Hadamard
    /// signs) from `key`'s stream.
    pub fn with_key(self, key: RngKey) -> Self {
        Quantizer { key, ..self }
    }

    /// The same quantizer for a tensor whose amax is known: `amax` must be the largest
    /// magnitude of the input ignoring NaN, exactly what a current-scaling FP8 cast of it
    /// measures and leaves as [`QuantState::last_amax`]. A current-scaling FP8 cast then
    /// takes it instead of reading the tensor for it (the same bits); other formats ignore
    /// it. For a second quantization of one tensor, such as a linear layer's input cast
    /// rowwise for Fprop and again columnwise for Wgrad: the amax does not depend on the
    /// orientation or the FP8 element. The cast checks it as it goes (it folds the
    /// magnitudes it reads into an amax of its own) and returns [`QuantError::InvalidConfig`]
    /// for an amax that is not the tensor's.
    ///
    /// ```
    /// use quant::qgemm::{quantized_matmul_tn, Operand};
    /// use quant::{Fp8Element, MatRef, OperandQuant, QuantState, Quantizer, Usage};
    /// let x: Vec<f32> = (0..32 * 16).map(|i| (i as f32 * 0.37).sin()).collect();
    /// let w: Vec<f32> = (0..8 * 16).map(|i| (i as f32 * 0.11).cos()).collect();
    /// let q = Quantizer::new(OperandQuant::fp8_current(Fp8Element::E4M3), Usage::Rowwise)?;
    /// let (xv, wv) = (MatRef::new(&x, 32, 16)?, MatRef::new(&w, 8, 16)?);
    /// let (mut first, mut again) = (vec![0.0f32; 32 * 8], vec![0.0f32; 32 * 8]);
    /// let mut state = QuantState::new();
    /// quantized_matmul_tn(Operand::new(xv, q).with_state(&mut state), Operand::new(wv, q), &mut first)?;
    /// let known = q.with_tensor_amax(state.last_amax());
    /// quantized_matmul_tn(Operand::new(xv, known), Operand::new(wv, q), &mut again)?;
    /// assert_eq!(first, again);
    /// # Ok::<(), quant::QuantError>(())
    /// ```
    pub fn with_tensor_amax(self, amax: f32) -> Self {
        Quantizer {
            tensor_amax: Some(amax),
            ..self
        }
    }

    /// The input's amax, where [`Quantizer::with_tensor_amax`] gave it.
    pub(crate) fn tensor_amax(&self) -> Option<f32> {
        self.tensor_amax
    }

    /// The operand settings.
    pub fn spec(&self) -> &OperandQuant {
        &self.spec
    }

    /// Which copy this quantizer produces.
    pub fn usage(&self) -> Usage {
        self.usage
    }

    /// The random stream.
    pub fn key(&self) -> RngKey {
        self.key
    }

    /// Whether the format rounds at all (anything but F32).
    pub fn quantizes(&self) -> bool {
        self.spec.format != QuantFormat::F32
    }

    /// `(rows, cols)` of the stored layout of a `[rows, cols]` input.
    pub fn stored_shape(&self, rows: usize, cols: usize) -> (usize, usize) {
        crate::panel::stored_shape(rows, cols, self.usage)
    }

    /// Quantizes `x` to its stored representation. `state` is used (and updated) by delayed
    /// FP8 scaling only.
    ///
    /// Errors: a view that is not dense row-major ([`MatRef::contiguous`]), a transformed
    /// dimension that is not a multiple of 16 (RHT), non-finite input (block formats), a
    /// delayed-scaling state whose history length differs from the settings'.
    pub fn quantize(
        &self,
        x: MatRef<'_>,
        state: &mut QuantState,
    ) -> Result<QuantizedTensor, QuantError> {
        let (d, r, c) = (x.contiguous()?, x.rows, x.cols);
        let (u, q, k) = (self.usage, &self.spec, self.key);
        match q.format {
            QuantFormat::F32 => bf16::quantize_f32(d, r, c, u, q),
            QuantFormat::Bf16 => bf16::quantize(d, r, c, u, q, k),
            QuantFormat::Fp8 { .. } => fp8::quantize(self, x, state),
            QuantFormat::Mx { .. } => mx::quantize(d, r, c, u, q, k),
            QuantFormat::Nvfp4 { .. } => nvfp4::quantize(d, r, c, u, q, k),
        }
    }

    /// Fake quantization: writes the **unscaled** dequantized values (see the module table)
    /// in the stored layout into `out` (`rows * cols` elements) and returns the per-tensor
    /// factor that the full dequantized value is multiplied by.
    ///
    /// Errors: as [`Quantizer::quantize`], plus an `out` of the wrong length.
    ///
    /// ```
    /// use quant::{MatRef, OperandQuant, QuantState, Quantizer, Rht, Usage};
    /// let x: Vec<f32> = (0..32 * 16).map(|i| ((i * 7 % 13) as f32 - 6.0) * 0.5).collect();
    /// let x = MatRef::new(&x, 32, 16)?;
    /// let q = Quantizer::new(OperandQuant::nvfp4().with_rht(Rht::FixedSigns), Usage::Columnwise)?;
    /// let mut out = vec![0.0f32; 32 * 16];
    /// let s_dec = q.fake_quantize_into(x, &mut QuantState::new(), &mut out)?;
    /// let t = q.quantize(x, &mut QuantState::new())?;
    /// assert_eq!(s_dec, t.tensor_scale_inv);
    /// assert!(out.iter().zip(&t.dequantize()).all(|(u, f)| u * s_dec == *f));
    /// # Ok::<(), quant::QuantError>(())
    /// ```
    pub fn fake_quantize_into(
        &self,
        x: MatRef<'_>,
        state: &mut QuantState,
        out: &mut [f32],
    ) -> Result<f32, QuantError> {
        let (d, r, c) = (x.contiguous()?, x.rows, x.cols);
        let (u, q, k) = (self.usage, &self.spec, self.key);
        match q.format {
            QuantFormat::F32 => bf16::fake_quantize_into_f32(d, r, c, u, q, out),
            QuantFormat::Bf16 => bf16::fake_quantize_into(d, r, c, u, q, k, out),
            QuantFormat::Fp8 { .. } => fp8::fake_quantize_into(self, x, state, out),
            QuantFormat::Mx { .. } => mx::fake_quantize_into(d, r, c, u, q, k, out),
            QuantFormat::Nvfp4 { .. } => nvfp4::fake_quantize_into(d, r, c, u, q, k, out),
        }
    }

    /// Fake quantization with the per-tensor factor applied: the dequantized f32 values in
    /// the stored layout. Equal to `self.quantize(x, state)?.dequantize()` bit for bit.
    ///
    /// Errors: as [`Quantizer::quantize`].
    pub fn fake_quantize(
        &self,
        x: MatRef<'_>,
        state: &mut QuantState,
    ) -> Result<Vec<f32>, QuantError> {
        let mut out = vec![0.0f32; x.data.len()];
        let f = self.fake_quantize_into(x, state, &mut out)?;
        apply_factor(&mut out, f);
        Ok(out)
    }

    /// The source-layout variant of [`Quantizer::fake_quantize_into`]: the same unscaled
    /// values written in the layout of `x` (`out[r * cols + c]` is the stored value at
    /// `(c, r)` for a columnwise quantizer), so that a GEMM reads the columnwise operand
    /// through a transposed view without a transposing copy. Returns the per-tensor factor,
    /// or `None` (nothing written) where the format cannot produce its values that way: F32,
    /// MX with the Hadamard transform, and BF16 / FP8 with stochastic rounding (whose random
    /// bits are indexed in the stored layout). A rowwise quantizer's stored layout is the
    /// source layout: it returns `Some` of [`Quantizer::fake_quantize_into`].
    ///
    /// Errors: as [`Quantizer::fake_quantize_into`].
    ///
    /// ```
    /// use quant::{BlockShape, MatRef, OperandQuant, QuantState, Quantizer, Usage};
    /// let x: Vec<f32> = (0..32 * 48).map(|i| (i as f32 * 0.21).cos()).collect();
    /// let x = MatRef::new(&x, 32, 48)?;
    /// let q = Quantizer::new(OperandQuant::nvfp4(), Usage::Columnwise)?;
    /// let (mut stored, mut source) = (vec![0.0f32; 32 * 48], vec![0.0f32; 32 * 48]);
    /// let f = q.fake_quantize_into(x, &mut QuantState::new(), &mut stored)?;
    /// let g = q.fake_quantize_source_layout(x, &mut QuantState::new(), &mut source)?;
    /// assert_eq!(g, Some(f));
    /// assert!((0..32).all(|r| (0..48).all(|c| source[r * 48 + c] == stored[c * 32 + r])));
    /// # Ok::<(), quant::QuantError>(())
    /// ```
    pub fn fake_quantize_source_layout(
        &self,
        x: MatRef<'_>,
        state: &mut QuantState,
        out: &mut [f32],
    ) -> Result<Option<f32>, QuantError> {
        if self.usage == Usage::Rowwise {
            return self.fake_quantize_into(x, state, out).map(Some);
        }
        let (d, r, c) = (x.contiguous()?, x.rows, x.cols);
        let (q, k) = (&self.spec, self.key);
        let nearest = q.rounding == RoundingMode::NearestEven;
        match q.format {
            // NVFP4 blocks run along the stored rows; a dedicated pass quantizes them in place.
            QuantFormat::Nvfp4 { .. } => {
                nvfp4::fake_quantize_columnwise_source_layout(d, r, c, q, k, out).map(Some)
            }
            // MX blocks run down 32-row strips of the source: a lane-wise kernel quantizes
            // them without a transpose (not with RHT, whose transform runs along the stored
            // rows).
            QuantFormat::Mx { .. } => {
                mx::fake_quantize_columnwise_source_layout(d, r, c, q, k, out)
            }
            // BF16 and per-tensor FP8 round each element on its own (FP8's one scale comes
            // from the whole tensor's amax, whatever the usage): the rowwise rounding is the
            // columnwise one transposed.
            QuantFormat::Bf16 | QuantFormat::Fp8 { .. } if nearest => Quantizer {
                usage: Usage::Rowwise,
                ..*self
            }
            .fake_quantize_into(x, state, out)
            .map(Some),
            _ => Ok(None),
        }
    }

    /// [`Quantizer::fake_quantize_into`] straight into the packed tiles of the BF16 GEMM (as
    /// its A operand when `a_layout`, else as B): the same values, quantized and packed
    /// panel by panel while in cache, with no f32 copy of the operand. Rowwise operands are
    /// packed block-major ([`crate::gemm::pack::pack_panels`]); columnwise ones, where the
    /// format has a source-layout kernel ([`Quantizer::fake_quantize_source_layout`]),
    /// chunk-major from it ([`crate::gemm::pack::pack_panels_chunk_major`]). Returns the
    /// per-tensor factor and whether the tiles are chunk-major, or `None` (nothing packed)
    /// where this path does not apply: F32 and BF16 (which the GEMM rounds itself), NVFP4
    /// with Four Over Six, MX with RHT, columnwise FP8 with stochastic rounding, empty
    /// tensors.
    ///
    /// Errors: as [`Quantizer::fake_quantize_into`].
    pub(crate) fn fake_quantize_packed(
        &self,
        x: MatRef<'_>,
        state: &mut QuantState,
        a_layout: bool,
        buf: &mut crate::gemm::TileWords,
    ) -> Result<Option<(f32, bool)>, QuantError> {
        let (d, shape) = (x.contiguous()?, (x.rows, x.cols, self.usage));
        let (q, k) = (&self.spec, self.key);
        match q.format {
            QuantFormat::F32 | QuantFormat::Bf16 => Ok(None),
            QuantFormat::Fp8 { .. } => fp8::fake_quantize_packed(self, x, state, a_layout, buf),
            QuantFormat::Mx { .. } => mx::fake_quantize_packed(d, shape, q, k, a_layout, buf),
            QuantFormat::Nvfp4 { .. } => nvfp4::fake_quantize_packed(d, shape, q, k, a_layout, buf),
        }
    }

    /// This quantizer with rowwise usage.
    pub(crate) fn as_rowwise(&self) -> Quantizer {
        Quantizer {
            usage: Usage::Rowwise,
            ..*self
        }
    }

    /// Fake quantization with the factor applied that also returns how many elements the
    /// quantizer clipped at the format maximum (for [`crate::stats`]).
    pub(crate) fn fake_quantize_counting(
        &self,
        x: MatRef<'_>,
        state: &mut QuantState,
    ) -> Result<(Vec<f32>, usize), QuantError> {
        let (d, r, c) = (x.contiguous()?, x.rows, x.cols);
        let (u, q, k) = (self.usage, &self.spec, self.key);
        let mut out = vec![0.0f32; d.len()];
        let (f, clipped) = match q.format {
            QuantFormat::F32 => (bf16::fake_quantize_into_f32(d, r, c, u, q, &mut out)?, 0),
            QuantFormat::Bf16 => bf16::fake_quantize_counting(d, r, c, u, q, k, &mut out)?,
            QuantFormat::Fp8 { .. } => fp8::fake_quantize_counting(self, x, state, &mut out)?,
            QuantFormat::Mx { .. } => mx::fake_quantize_counting(d, r, c, u, q, k, &mut out)?,
            QuantFormat::Nvfp4 { .. } => {
                let t = nvfp4::quantize(d, r, c, u, q, k)?;
                let clipped = crate::stats::nvfp4_clipped(self, x, &t)?;
                return Ok((t.dequantize(), clipped));
            }
        };
        apply_factor(&mut out, f);
        Ok((out, clipped))
    }
}

/// Multiplies by the per-tensor factor (skipped when it is 1, which is exact anyway).
pub(crate) fn apply_factor(v: &mut [f32], f: f32) {
    use rayon::prelude::*;
    if f != 1.0 {
        v.par_iter_mut().for_each(|x| *x *= f);
    }
}

impl QuantizedTensor {
    /// Dequantizes to f32 in the stored layout (`[rows, cols]`, padding dropped), with the
    /// per-tensor factor applied, for every format.
    ///
    /// # Panics
    /// If the buffers do not match the shape (a tensor not made by a quantizer).
    ///
    /// ```
    /// use quant::{Fp8Element, MatRef, OperandQuant, QuantState, Quantizer, Usage};
    /// let x = [0.5f32, -3.0, 112.0, 0.0]; // E5M2 scale 57344 / 112 = 512
    /// let q = Quantizer::new(OperandQuant::fp8_current(Fp8Element::E5M2), Usage::Columnwise)?;
    /// let t = q.quantize(MatRef::new(&x, 2, 2)?, &mut QuantState::new())?;
    /// assert_eq!(t.dequantize(), vec![0.5, 112.0, -3.0, 0.0]); // transposed
    /// # Ok::<(), quant::QuantError>(())
    /// ```
    pub fn dequantize(&self) -> Vec<f32> {
        match self.format {
            QuantFormat::F32 => bf16::dequantize_f32(self),
            QuantFormat::Bf16 => bf16::dequantize(self),
            QuantFormat::Fp8 { .. } => fp8::dequantize(self),
            QuantFormat::Mx { .. } => mx::dequantize(self),
            QuantFormat::Nvfp4 { .. } => nvfp4::dequantize(self),
        }
    }
}

/// A quantizer implementation over some tensor storage: the CPU ([`Cpu`], host slices) and
/// the GPU (`kernels_cuda::GpuContext`, device matrices; its emulator `kernels_cuda::emu::Emu`
/// for NVFP4). Every backend takes the same validated [`Quantizer`], so the settings are
/// checked once, by [`Quantizer::new`], whatever runs them; the results are in
/// [`QuantizedTensor`]'s layout, bit for bit the CPU's.
///
/// ```
/// use quant::{Cpu, MatRef, OperandQuant, QuantState, Quantizer, QuantizerBackend, Usage};
/// fn roundtrip<B: QuantizerBackend>(b: &B, q: &Quantizer, x: B::Source<'_>)
///     -> Result<B::Values, B::Error> {
///     let t = b.quantize(q, x, &mut QuantState::new())?;
///     b.dequantize(&t)
/// }
/// let x: Vec<f32> = (0..64).map(|i| i as f32 / 8.0).collect();
/// let q = Quantizer::new(OperandQuant::nvfp4(), Usage::Rowwise)?;
/// let y = roundtrip(&Cpu, &q, MatRef::new(&x, 4, 16)?)?;
/// assert_eq!(y, q.fake_quantize(MatRef::new(&x, 4, 16)?, &mut QuantState::new())?);
/// # Ok::<(), quant::QuantError>(())
/// ```
pub trait QuantizerBackend {
    /// The high-precision input: a row-major `[rows, cols]` f32 matrix in this backend's
    /// storage.
    type Source<'a>;
    /// A quantized operand in this backend's storage.
    type Quantized;
    /// Dequantized f32 values in this backend's storage.
    type Values;
    /// The backend's error type (quant's errors convert into it).
    type Error: From<QuantError>;

    /// Quantizes `x` with `q` (its stored layout; see [`Quantizer::quantize`]).
    fn quantize(
        &self,
        q: &Quantizer,
        x: Self::Source<'_>,
        state: &mut QuantState,
    ) -> Result<Self::Quantized, Self::Error>;

    /// The values of `t` in its stored layout with the per-tensor factor applied (see
    /// [`QuantizedTensor::dequantize`]).
    fn dequantize(&self, t: &Self::Quantized) -> Result<Self::Values, Self::Error>;
}

/// The CPU backend: [`Quantizer`]'s own methods over host [`MatRef`]s.
#[derive(Clone, Copy, Debug, Default)]
pub struct Cpu;

impl QuantizerBackend for Cpu {
    type Source<'a> = MatRef<'a>;
    type Quantized = QuantizedTensor;
    type Values = Vec<f32>;
    type Error = QuantError;

    fn quantize(
        &self,
        q: &Quantizer,
        x: MatRef<'_>,
        state: &mut QuantState,
    ) -> Result<QuantizedTensor, QuantError> {
        q.quantize(x, state)
    }

    fn dequantize(&self, t: &QuantizedTensor) -> Result<Vec<f32>, QuantError> {
        Ok(t.dequantize())
    }
}
