//! `--device cpu|cuda|auto`: where `train`, `compare`, `sample` and `rl` compute, decided
//! before anything is written; `train` and `compare` print the choice with their other run
//! lines on stdout, `rl` on stderr (`sample`, whose stdout is the generated text, prints
//! nothing about it).
//!
//! `train` runs its forward and backward passes on a CUDA device through autograd's `Graph`
//! ([`trainer::train::Trainer::set_device`]) when the device linear runs every GEMM operand of
//! the recipe (FP32, BF16, FP8, MXFP8 / MXFP4, NVFP4: every built-in recipe). `compare` trains
//! each of its runs there the same way (`trainer::compare::Comparison::device`; the runs go one
//! after another, as they do on the CPU, and the report names the device); `auto` picks the
//! device only when every recipe compared can use it. `sample` runs its KV-cache sampler there
//! (`trainer::sample::Sampler::set_device`), `rl` its sampler, held-out evaluation
//! (`trainer::rl::run::RlRun::set_sampler_device`) and update (the policy's forward, backward
//! and AdamW: `trainer::rl::run::RlRun::set_update_device`); `rl`'s default is `cpu`, and a
//! resumed run's plan is checked once its checkpoint is read. `--device cuda` where a recipe cannot use the device is an error before
//! anything is written; `auto` then chooses the CPU and says why.

use std::sync::Arc;

use anyhow::{bail, Result};
use autograd::backend::{linear_blocker, DeviceBackend};
use clap::ValueEnum;
use trainer::recipe::Recipe;

/// The `--device` flag.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum DeviceArg {
    /// The CUDA device when one is present and the command runs on it, else the CPU.
    #[default]
    Auto,
    /// The CPU.
    Cpu,
    /// The first CUDA device (compute capability 9.0+); an error without one.
    Cuda,
}

/// Why `recipe` cannot train on the device, if it cannot: an operand setting the device
/// linear has no kernel for (autograd's `linear_blocker`).
fn recipe_blocker(recipe: &Recipe) -> Option<String> {
    let mut policies = vec![&recipe.linear];
    policies.extend(recipe.overrides.iter().map(|o| &o.policy));
    policies.extend(recipe.schedule.as_ref().map(|s| &s.target));
    policies
        .into_iter()
        .find_map(|p| linear_blocker(p))
        .map(|op| {
            format!(
                "recipe {} has GEMM operands the device has no kernel for: {op}",
                recipe.name
            )
        })
}

/// Why one of `recipes` cannot run on the device, if one cannot.
pub fn blocked(recipes: &[&Recipe]) -> Option<String> {
    recipes.iter().find_map(|r| recipe_blocker(r))
}

/// Resolves `arg`: the device to compute on (`None`: the CPU) and the line that
/// says so (`device: ...`). `recipes` are the recipes the command runs on the device (every
/// recipe of a `compare`; `auto` picks the device only when all of them can use it).
/// `--device cuda` fails here, before any output is written.
pub fn resolve(
    arg: DeviceArg,
    recipes: &[&Recipe],
) -> Result<(Option<Arc<DeviceBackend>>, String)> {
    let blocker = blocked(recipes);
    match arg {
        DeviceArg::Cpu => Ok((None, "device: cpu".into())),
        DeviceArg::Cuda => {
            let be = match DeviceBackend::cuda() {
                Ok(be) => be,
                Err(e) => bail!("--device cuda: {e}"),
            };
            if let Some(why) = blocker {
                bail!("--device cuda: {why}; use --device cpu");
            }
            Ok((Some(be), "device: cuda".into()))
        }
        DeviceArg::Auto => match (DeviceBackend::cuda(), blocker) {
            (Err(e), _) => Ok((None, format!("device: cpu (auto: {e})"))),
            (Ok(_), Some(why)) => Ok((
                None,
                format!("device: cpu (auto: a CUDA device is present, but {why})"),
            )),
            (Ok(be), None) => Ok((Some(be), "device: cuda (auto)".into())),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recipes_on_the_device() {
        for r in Recipe::builtins() {
            assert_eq!(recipe_blocker(&r), None, "{}", r.name);
        }
        let mut r = Recipe::builtin("nvfp4").unwrap();
        r.linear.fprop.a = quant::OperandQuant::BF16.with_rounding(quant::RoundingMode::Stochastic);
        let why = recipe_blocker(&r).unwrap();
        assert!(why.contains("stochastic rounding"), "{why}");
    }
}
