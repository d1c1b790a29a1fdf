//! One-line descriptions of quantizer settings, for reports, logs and error messages: an
//! [`OperandQuant`] as `nvfp4/1x16/sr/rht`, a [`GemmPolicy`] as `all bf16` or its six
//! operands.
//!
//! ```
//! use quant::{GemmPolicy, OperandQuant, RoundingMode};
//! let q = OperandQuant::nvfp4().with_rounding(RoundingMode::Stochastic);
//! assert_eq!(q.to_string(), "nvfp4/1x16/sr");
//! assert_eq!(GemmPolicy::BF16.to_string(), "all bf16");
//! assert!(GemmPolicy::nvfp4_paper().to_string().starts_with("fprop[X nvfp4/1x16, W nvfp4/16x16]"));
//! ```

use std::fmt;

use fp_formats::mx::{MxElement, ScaleRule};

use crate::config::{
    AmaxAlgo, BlockShape, Fp8Element, Fp8Scaling, GemmPolicy, OperandQuant, QuantFormat, Rht,
    RoundingMode,
};

impl fmt::Display for OperandQuant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let block = match self.block {
            BlockShape::Row16 => "1x16",
            BlockShape::Tile16 => "16x16",
            BlockShape::Row32 => "1x32",
        };
        match self.format {
            QuantFormat::F32 => f.write_str("f32")?,
            QuantFormat::Bf16 => f.write_str("bf16")?,
            QuantFormat::Fp8 { element, scaling } => {
                let e = match element {
                    Fp8Element::E4M3 => "e4m3",
                    Fp8Element::E5M2 => "e5m2",
                };
                match scaling {
                    Fp8Scaling::Current { power_of_two } => write!(
                        f,
                        "fp8-{e}/current{}",
                        if power_of_two { "-pow2" } else { "" }
                    )?,
                    Fp8Scaling::Delayed {
                        history_len,
                        margin,
                        algo,
                    } => write!(
                        f,
                        "fp8-{e}/delayed(h{history_len},m{margin},{})",
                        match algo {
                            AmaxAlgo::Max => "max",
                            AmaxAlgo::MostRecent => "recent",
                        }
                    )?,
                }
            }
            QuantFormat::Mx {
                element,
                rule,
                sr_prescale,
            } => {
                let e = match element {
                    MxElement::E4M3 => "mxfp8-e4m3",
                    MxElement::E5M2 => "mxfp8-e5m2",
                    MxElement::E2M3 => "mxfp6-e2m3",
                    MxElement::E3M2 => "mxfp6-e3m2",
                    MxElement::E2M1 => "mxfp4",
                };
                let r = match rule {
                    ScaleRule::Floor => "floor",
                    ScaleRule::Rceil => "rceil",
                    ScaleRule::Ceil => "ceil",
                    ScaleRule::Even => "even",
                };
                write!(
                    f,
                    "{e}/{block}/{r}{}",
                    if sr_prescale { "/x3/4" } else { "" }
                )?
            }
            QuantFormat::Nvfp4 { four_over_six } => write!(
                f,
                "nvfp4/{block}{}",
                if four_over_six.is_some() {
                    "/4over6"
                } else {
                    ""
                }
            )?,
        }
        if self.rounding == RoundingMode::Stochastic {
            f.write_str("/sr")?;
        }
        match self.rht {
            Rht::Off => Ok(()),
            Rht::FixedSigns => f.write_str("/rht"),
            Rht::RandomSigns => f.write_str("/rht-rand"),
        }
    }
}

impl fmt::Display for GemmPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ops = self.operands();
        if ops.iter().all(|q| q == &ops[0]) {
            return write!(f, "all {}", ops[0]);
        }
        write!(
            f,
            "fprop[X {}, W {}] dgrad[dY {}, W {}] wgrad[dY {}, X {}]",
            ops[0], ops[1], ops[2], ops[3], ops[4], ops[5]
        )
    }
}
