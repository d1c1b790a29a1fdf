//! Named GEMM policies, the six operand slots of a policy, and whole-policy validation.
//!
//! A recipe file may name a policy instead of writing its six operands
//! ([`GemmPolicy::preset`], [`GemmPolicy::PRESET_NAMES`]); every policy, named or written
//! out, is checked slot by slot against the layout its GEMM reads it in
//! ([`GemmPolicy::validate`]) and describes itself in one line (its `Display`, in
//! [`crate::config`]'s `describe` module).
//!
//! ```
//! use quant::GemmPolicy;
//! let p = GemmPolicy::preset("nvfp4").unwrap();
//! assert_eq!(p, GemmPolicy::nvfp4_paper());
//! p.validate()?;
//! assert_eq!(GemmPolicy::preset("bf16").unwrap().to_string(), "all bf16");
//! assert!(GemmPolicy::preset("fp4").is_none());
//! # Ok::<(), quant::QuantError>(())
//! ```

use fp_formats::mx::{MxElement, ScaleRule};

use crate::config::{
    AmaxAlgo, BlockShape, Fp8Element, Fp8Scaling, GemmOperands, GemmPolicy, OperandQuant,
    QuantFormat, Rht, RoundingMode, Usage,
};
use crate::QuantError;

/// Amax history length of the `fp8-delayed` preset.
pub const FP8_DELAYED_HISTORY: usize = 16;

/// Builds a preset policy.
type BuildPolicy = fn() -> GemmPolicy;

/// One row per named policy: its name and its definition.
const PRESETS: &[(&str, BuildPolicy)] = &[
    ("fp32", || GemmPolicy::FP32),
    ("bf16", || GemmPolicy::BF16),
    ("fp8-current", GemmPolicy::fp8_current_hybrid),
    ("fp8-delayed", || {
        GemmPolicy::fp8_delayed_hybrid(FP8_DELAYED_HISTORY)
    }),
    ("mxfp8", GemmPolicy::mxfp8),
    ("mxfp4", GemmPolicy::mxfp4_tseng),
    ("nvfp4", GemmPolicy::nvfp4_paper),
];

/// The first column of a name table, at compile time.
const fn names_of<T, const N: usize>(table: &[(&'static str, T)]) -> [&'static str; N] {
    let mut out = [""; N];
    let mut i = 0;
    while i < N {
        out[i] = table[i].0;
        i += 1;
    }
    out
}

impl GemmPolicy {
    /// The names [`GemmPolicy::preset`] knows, in order.
    pub const PRESET_NAMES: [&'static str; PRESETS.len()] = names_of(PRESETS);

    /// The six operand slots in order, each with a label for messages and the layout its
    /// GEMM reads it in.
    pub const OPERAND_SLOTS: [(&'static str, Usage); 6] = [
        ("fprop.a (X)", Usage::Rowwise),
        ("fprop.b (W)", Usage::Rowwise),
        ("dgrad.a (dY)", Usage::Rowwise),
        ("dgrad.b (W)", Usage::Columnwise),
        ("wgrad.a (dY)", Usage::Columnwise),
        ("wgrad.b (X)", Usage::Columnwise),
    ];

    /// The policy a preset name stands for.
    pub fn preset(name: &str) -> Option<GemmPolicy> {
        PRESETS
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, policy)| policy())
    }

    /// The six operand settings in the order of [`GemmPolicy::OPERAND_SLOTS`].
    pub fn operands(&self) -> [OperandQuant; 6] {
        [
            self.fprop.a,
            self.fprop.b,
            self.dgrad.a,
            self.dgrad.b,
            self.wgrad.a,
            self.wgrad.b,
        ]
    }

    /// Checks every operand against its slot's layout ([`crate::Quantizer::new`]) and each
    /// GEMM's two operands against each other ([`GemmPolicy::validate_pairs`]); the message
    /// names the slot or GEMM.
    ///
    /// ```
    /// use quant::{GemmPolicy, OperandQuant, Rht};
    /// let mut p = GemmPolicy::nvfp4_paper();
    /// assert!(p.validate().is_ok());
    /// p.fprop.a = p.fprop.a.with_rht(Rht::FixedSigns); // the RHT is for columnwise operands
    /// assert!(p.validate().unwrap_err().to_string().contains("fprop.a (X)"));
    /// ```
    pub fn validate(&self) -> Result<(), QuantError> {
        for ((label, usage), q) in Self::OPERAND_SLOTS.iter().zip(self.operands()) {
            crate::Quantizer::new(q, *usage)
                .map(|_| ())
                .map_err(|e| match e {
                    QuantError::InvalidConfig(m) => {
                        QuantError::InvalidConfig(format!("{label}: {m}"))
                    }
                    e => e,
                })?;
        }
        self.validate_pairs()
    }

    /// Per-tensor FP8 HYBRID with delayed scaling (E4M3 forward operands, E5M2 gradients;
    /// margin 0, `max` over `history_len` steps).
    pub const fn fp8_delayed_hybrid(history_len: usize) -> GemmPolicy {
        let scaling = Fp8Scaling::Delayed {
            history_len,
            margin: 0,
            algo: AmaxAlgo::Max,
        };
        let fwd = OperandQuant {
            format: QuantFormat::Fp8 {
                element: Fp8Element::E4M3,
                scaling,
            },
            ..OperandQuant::F32
        };
        let grad = OperandQuant {
            format: QuantFormat::Fp8 {
                element: Fp8Element::E5M2,
                scaling,
            },
            ..OperandQuant::F32
        };
        GemmPolicy {
            fprop: GemmOperands { a: fwd, b: fwd },
            dgrad: GemmOperands { a: grad, b: fwd },
            wgrad: GemmOperands { a: grad, b: fwd },
        }
    }

    /// Tseng et al.'s MXFP4 recipe: BF16 Fprop; every Dgrad and Wgrad operand in MXFP4
    /// (FLOOR scales) with stochastic rounding and the 3/4 prescale; RHT (fixed signs) on
    /// both Wgrad operands.
    pub const fn mxfp4_tseng() -> GemmPolicy {
        let sr = OperandQuant {
            format: QuantFormat::Mx {
                element: MxElement::E2M1,
                rule: ScaleRule::Floor,
                sr_prescale: true,
            },
            block: BlockShape::Row32,
            rounding: RoundingMode::Stochastic,
            rht: Rht::Off,
        };
        let sr_rht = sr.with_rht(Rht::FixedSigns);
        GemmPolicy {
            fprop: GemmOperands {
                a: OperandQuant::BF16,
                b: OperandQuant::BF16,
            },
            dgrad: GemmOperands { a: sr, b: sr },
            wgrad: GemmOperands {
                a: sr_rht,
                b: sr_rht,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_preset_is_valid_and_named_once() {
        for (i, name) in GemmPolicy::PRESET_NAMES.iter().enumerate() {
            assert!(!GemmPolicy::PRESET_NAMES[..i].contains(name), "{name}");
            let p = GemmPolicy::preset(name).unwrap();
            p.validate().unwrap_or_else(|e| panic!("{name}: {e}"));
        }
        assert_eq!(
            GemmPolicy::preset("fp8-delayed"),
            Some(GemmPolicy::fp8_delayed_hybrid(FP8_DELAYED_HISTORY))
        );
    }

    #[test]
    fn validate_names_the_slot_and_the_gemm() {
        let mut p = GemmPolicy::BF16;
        p.dgrad.b = OperandQuant::nvfp4().with_block(BlockShape::Row32);
        let e = p.validate().unwrap_err().to_string();
        assert!(e.contains("dgrad.b (W)"), "{e}");
        let mut p = GemmPolicy::nvfp4_paper();
        p.wgrad.b.rht = Rht::Off;
        let e = p.validate().unwrap_err().to_string();
        assert!(e.contains("wgrad: the RHT must be applied to both"), "{e}");
    }
}
