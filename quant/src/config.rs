//! Quantization settings as plain data, so that a whole training recipe is a value.
//!
//! An [`OperandQuant`] says how one GEMM operand is quantized; a [`GemmPolicy`] holds the six
//! operand settings of a linear layer's three GEMMs (see
//! docs/numerics.md#the-precision-model):
//!
//! | GEMM  | computes      | operand A            | operand B            |
//! |-------|---------------|----------------------|----------------------|
//! | Fprop | `Y = X Wᵀ`    | X, rowwise           | W, rowwise           |
//! | Dgrad | `dX = dY W`   | dY, rowwise          | W, columnwise        |
//! | Wgrad | `dW = dYᵀ X`  | dY, columnwise       | X, columnwise        |
//!
//! Every GEMM is computed in "TN" form `out[M,N] = A[M,K] · B[N,K]ᵀ` with both operands
//! quantized along their rows (the reduction dimension K).

use fp_formats::mx::{MxElement, ScaleRule};
use serde::{Deserialize, Serialize};

use crate::QuantError;

/// Which copy of a tensor is quantized.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Usage {
    /// The tensor as stored, `[rows, cols]`, blocks along each row.
    Rowwise,
    /// The transposed tensor, `[cols, rows]`, blocks along each row of the transpose (that is,
    /// down the columns of the original). Stored transposed, as Transformer Engine does.
    Columnwise,
}

/// Element rounding of a quantizer. Scales are always computed deterministically.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RoundingMode {
    /// Round to nearest, ties to even.
    #[default]
    NearestEven,
    /// Stochastic rounding with 8 random bits per element from the Philox stream
    /// (see [`crate::philox`]).
    Stochastic,
}

/// Block geometry of a block-scaled format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum BlockShape {
    /// One scale per 16 consecutive elements of a row (NVFP4 activations and gradients).
    Row16,
    /// One scale per 16x16 tile (NVFP4 weights): the rowwise and columnwise copies are exact
    /// transposes of each other.
    Tile16,
    /// One scale per 32 consecutive elements of a row (MX).
    Row32,
}

/// The random Hadamard transform applied before quantization (columnwise / Wgrad operands).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Rht {
    /// No transform.
    #[default]
    Off,
    /// 16-point transform with Transformer Engine's fixed sign mask `0xD7E8`, shared by all
    /// layers and steps.
    FixedSigns,
    /// 16-point transform with a sign mask drawn per random stream (from the Philox stream
    /// of the operand's [`crate::RngKey`]), as torchao's prototype does.
    RandomSigns,
}

/// How a per-tensor FP8 scale is chosen (docs/numerics.md#per-tensor-fp8).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", tag = "kind")]
pub enum Fp8Scaling {
    /// Scale from the current tensor's amax: `scale = fp8_max / amax`, optionally rounded
    /// down to a power of two.
    Current {
        /// Round the scale down to a power of two.
        power_of_two: bool,
    },
    /// Scale from a history of past amaxes (Transformer Engine `DelayedScaling`). Needs a
    /// [`crate::QuantState`] that persists across steps.
    Delayed {
        /// Length of the amax history window.
        history_len: usize,
        /// Scale is divided by `2^margin`.
        margin: i32,
        /// How the window is reduced to one amax.
        algo: AmaxAlgo,
    },
}

/// Reduction of the delayed-scaling amax history.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum AmaxAlgo {
    /// Maximum over the window.
    Max,
    /// The most recent amax.
    MostRecent,
}

/// The Four Over Six candidate selection for NVFP4 (docs/numerics.md#four-over-six): each block is
/// quantized with its maximum mapped to 6 and to 4, and the candidate with the lower error
/// is kept.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct FourOverSix {
    /// Error measure used to pick the candidate.
    pub error: BlockError,
    /// Use 256 instead of 448 as the E4M3 bound of the global scale (TE default).
    pub e4m3_bound_256: bool,
}

/// Per-block error measure.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum BlockError {
    /// Mean absolute error.
    Mae,
    /// Mean squared error.
    Mse,
}

/// The number format an operand is quantized to.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", tag = "format")]
pub enum QuantFormat {
    /// No quantization (FP32 GEMM input).
    F32,
    /// Round to BF16 (nearest-even, or stochastic from the Philox stream).
    Bf16,
    /// Per-tensor FP8.
    Fp8 {
        /// E4M3 (forward) or E5M2 (backward, HYBRID).
        element: Fp8Element,
        /// Scale selection.
        scaling: Fp8Scaling,
    },
    /// MX block format (1x32 blocks, E8M0 scales).
    Mx {
        /// Element format.
        element: MxElement,
        /// Scale rule.
        rule: ScaleRule,
        /// Tseng et al.'s unbiased stochastic variant: scale the block by 3/4 before
        /// stochastic rounding so nothing clips, and multiply back by 4/3 on dequantization.
        sr_prescale: bool,
    },
    /// NVFP4 (E2M1 elements, UE4M3 scales per 16, FP32 per-tensor scale).
    Nvfp4 {
        /// Four Over Six candidate selection (weights / activations only; not with RHT or SR).
        four_over_six: Option<FourOverSix>,
    },
}

/// The FP8 element of a per-tensor FP8 operand.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Fp8Element {
    /// E4M3, max 448.
    E4M3,
    /// E5M2, max 57344.
    E5M2,
}

/// How one GEMM operand is quantized.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct OperandQuant {
    /// Number format.
    pub format: QuantFormat,
    /// Block geometry (ignored by per-tensor formats).
    pub block: BlockShape,
    /// Element rounding.
    pub rounding: RoundingMode,
    /// Random Hadamard transform (columnwise usage only).
    pub rht: Rht,
}

impl OperandQuant {
    /// No quantization.
    pub const F32: OperandQuant = OperandQuant {
        format: QuantFormat::F32,
        block: BlockShape::Row16,
        rounding: RoundingMode::NearestEven,
        rht: Rht::Off,
    };
    /// BF16 with nearest-even rounding.
    pub const BF16: OperandQuant = OperandQuant {
        format: QuantFormat::Bf16,
        ..OperandQuant::F32
    };

    /// NVFP4 with 1x16 blocks and nearest-even rounding.
    pub const fn nvfp4() -> Self {
        OperandQuant {
            format: QuantFormat::Nvfp4 {
                four_over_six: None,
            },
            block: BlockShape::Row16,
            rounding: RoundingMode::NearestEven,
            rht: Rht::Off,
        }
    }

    /// MX with 1x32 blocks and nearest-even rounding.
    pub const fn mx(element: MxElement, rule: ScaleRule) -> Self {
        OperandQuant {
            format: QuantFormat::Mx {
                element,
                rule,
                sr_prescale: false,
            },
            block: BlockShape::Row32,
            rounding: RoundingMode::NearestEven,
            rht: Rht::Off,
        }
    }

    /// Per-tensor FP8 with current scaling.
    pub const fn fp8_current(element: Fp8Element) -> Self {
        OperandQuant {
            format: QuantFormat::Fp8 {
                element,
                scaling: Fp8Scaling::Current {
                    power_of_two: false,
                },
            },
            ..OperandQuant::F32
        }
    }

    /// The same settings with a different block shape.
    pub const fn with_block(mut self, block: BlockShape) -> Self {
        self.block = block;
        self
    }

    /// The same settings with a different rounding mode.
    pub const fn with_rounding(mut self, rounding: RoundingMode) -> Self {
        self.rounding = rounding;
        self
    }

    /// The same settings with a different Hadamard transform.
    pub const fn with_rht(mut self, rht: Rht) -> Self {
        self.rht = rht;
        self
    }

    /// True when the operand is used as is (FP32).
    pub fn is_identity(&self) -> bool {
        self.format == QuantFormat::F32
    }
}

/// The two operand settings of one GEMM.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct GemmOperands {
    /// Operand A (X for Fprop, dY for Dgrad and Wgrad).
    pub a: OperandQuant,
    /// Operand B (W for Fprop and Dgrad, X for Wgrad).
    pub b: OperandQuant,
}

impl GemmOperands {
    /// Checks that the two operands transform the reduction dimension alike: a Hadamard
    /// transform is orthogonal, so `(H a) . (H b) = a . b` only when both operands get the
    /// same transform, with the same signs. RHT on one operand only, or random signs (which
    /// a training GEMM draws from each operand's own key, so the two masks differ), would
    /// change the product, not just its rounding.
    ///
    /// ```
    /// use quant::{GemmOperands, OperandQuant, Rht};
    /// let rht = OperandQuant::nvfp4().with_rht(Rht::FixedSigns);
    /// assert!(GemmOperands { a: rht, b: rht }.validate_pair().is_ok());
    /// assert!(GemmOperands { a: rht, b: OperandQuant::nvfp4() }.validate_pair().is_err());
    /// let random = OperandQuant::nvfp4().with_rht(Rht::RandomSigns);
    /// assert!(GemmOperands { a: random, b: random }.validate_pair().is_err());
    /// ```
    pub fn validate_pair(&self) -> Result<(), QuantError> {
        if self.a.rht != self.b.rht {
            return Err(QuantError::InvalidConfig(format!(
                "the RHT must be applied to both operands of a GEMM or to neither (A: {:?}, B: {:?}); on one side only it changes the product",
                self.a.rht, self.b.rht
            )));
        }
        if self.a.rht == Rht::RandomSigns {
            return Err(QuantError::InvalidConfig(
                "random RHT signs are not supported in a GEMM policy: each operand draws its signs from its own random stream, so the two operands would be transformed differently; use fixed signs".into(),
            ));
        }
        Ok(())
    }
}

/// The six operand settings of a linear layer.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct GemmPolicy {
    /// `Y = X Wᵀ`: X rowwise, W rowwise.
    pub fprop: GemmOperands,
    /// `dX = dY W`: dY rowwise, W columnwise.
    pub dgrad: GemmOperands,
    /// `dW = dYᵀ X`: dY columnwise, X columnwise.
    pub wgrad: GemmOperands,
}

impl QuantFormat {
    /// Whether values are quantized below BF16 (FP8, MX or NVFP4 elements).
    ///
    /// ```
    /// use quant::QuantFormat;
    /// assert!(!QuantFormat::Bf16.is_low_precision());
    /// assert!(QuantFormat::Nvfp4 { four_over_six: Default::default() }.is_low_precision());
    /// ```
    pub fn is_low_precision(&self) -> bool {
        !matches!(self, QuantFormat::F32 | QuantFormat::Bf16)
    }
}

impl GemmPolicy {
    /// Whether any of the six operands is quantized below BF16.
    ///
    /// ```
    /// use quant::GemmPolicy;
    /// assert!(GemmPolicy::nvfp4_paper().quantizes());
    /// assert!(!GemmPolicy::BF16.quantizes());
    /// ```
    pub fn quantizes(&self) -> bool {
        [self.fprop, self.dgrad, self.wgrad]
            .iter()
            .any(|g| g.a.format.is_low_precision() || g.b.format.is_low_precision())
    }

    /// Checks every GEMM's pair of operands ([`GemmOperands::validate_pair`]), naming the
    /// GEMM that fails.
    pub fn validate_pairs(&self) -> Result<(), QuantError> {
        for (name, g) in [
            ("fprop", self.fprop),
            ("dgrad", self.dgrad),
            ("wgrad", self.wgrad),
        ] {
            g.validate_pair().map_err(|e| match e {
                QuantError::InvalidConfig(m) => QuantError::InvalidConfig(format!("{name}: {m}")),
                e => e,
            })?;
        }
        Ok(())
    }

    /// The same setting for all six operands.
    pub const fn uniform(q: OperandQuant) -> Self {
        let g = GemmOperands { a: q, b: q };
        GemmPolicy {
            fprop: g,
            dgrad: g,
            wgrad: g,
        }
    }

    /// Plain FP32 GEMMs.
    pub const FP32: GemmPolicy = GemmPolicy::uniform(OperandQuant::F32);
    /// BF16 GEMM inputs (the baseline recipe).
    pub const BF16: GemmPolicy = GemmPolicy::uniform(OperandQuant::BF16);

    /// The NVFP4 paper recipe (docs/numerics.md#the-nvfp4-recipe-per-operand): Fprop X 1x16 RNE, W 16x16 RNE;
    /// Dgrad dY 1x16 SR, W 16x16 RNE; Wgrad dY 1x16 SR + RHT, X 1x16 RNE + RHT.
    pub const fn nvfp4_paper() -> Self {
        let act = OperandQuant::nvfp4();
        let w = act.with_block(BlockShape::Tile16);
        let grad = act.with_rounding(RoundingMode::Stochastic);
        GemmPolicy {
            fprop: GemmOperands { a: act, b: w },
            dgrad: GemmOperands { a: grad, b: w },
            wgrad: GemmOperands {
                a: grad.with_rht(Rht::FixedSigns),
                b: act.with_rht(Rht::FixedSigns),
            },
        }
    }

    /// Per-tensor FP8 with current scaling, HYBRID: E4M3 forward operands, E5M2 gradients.
    pub const fn fp8_current_hybrid() -> Self {
        let fwd = OperandQuant::fp8_current(Fp8Element::E4M3);
        let grad = OperandQuant::fp8_current(Fp8Element::E5M2);
        GemmPolicy {
            fprop: GemmOperands { a: fwd, b: fwd },
            dgrad: GemmOperands { a: grad, b: fwd },
            wgrad: GemmOperands { a: grad, b: fwd },
        }
    }

    /// MXFP8 (E4M3 everywhere, RCEIL scales), as in the MXFP8 recipe paper.
    pub const fn mxfp8() -> Self {
        GemmPolicy::uniform(OperandQuant::mx(MxElement::E4M3, ScaleRule::Rceil))
    }
}
