//! The stage plan: one precision per stage of end-to-end training, as data.
//!
//! * `pretrain`: the recipe of pretraining (Fprop, Dgrad and Wgrad per operand; any recipe name
//!   or recipe file, see [`crate::recipe`]);
//! * `sampler`: the RL sampler's inference precision: a recipe whose Fprop policies (at
//!   progress 0: a recipe's late switch to BF16 does not apply) give the weights' and
//!   activations' formats, and `activation-scales`: `dynamic` (a per-tensor scale from each
//!   batch's amax, as training computes it) or `static` (a per-tensor amax calibrated at every
//!   weight sync, as NVFP4 checkpoints carry in `input_scale`; activations beyond it saturate).
//!   Only formats with a per-tensor scale (NVFP4's global scale, FP8 current scaling) differ
//!   between the two; block-scaled MX and BF16 have none. Weights are quantized once per
//!   weight sync, not per token;
//! * `rl-trainer`: the recipe under which the policy-gradient step recomputes the
//!   log-probabilities and takes its gradients (at progress 0).
//!
//! Plans print as TOML (`trainer plans show NAME`) and load from TOML, optionally starting from
//! a built-in with `base = "NAME"` (keys merged, tables key by key); unknown names and fields
//! are errors that list what is valid.
//!
//! ```
//! use trainer::rl::plan::Plan;
//! let p = Plan::resolve("bf16-nvfp4")?;
//! assert_eq!(p.sampler.recipe, "nvfp4-no-bf16-layers");
//! let q = Plan::from_toml_str("base = \"bf16-nvfp4\"\nname = \"mine\"\n[sampler]\nactivation-scales = \"dynamic\"\n")?;
//! assert_eq!((q.name.as_str(), q.sampler.recipe.as_str()), ("mine", "nvfp4-no-bf16-layers"));
//! assert!(Plan::resolve("nvfp5").unwrap_err().to_string().contains("valid: bf16,"));
//! # Ok::<(), trainer::rl::plan::PlanError>(())
//! ```

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::recipe::{check_name, Recipe, RecipeError};

/// How the sampler obtains per-tensor activation scales.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ActivationScales {
    /// From each batch's amax (what training does).
    #[default]
    Dynamic,
    /// A per-linear amax calibrated at every weight sync; activations beyond it saturate.
    Static,
}

/// The sampler stage.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct SamplerStage {
    /// Recipe whose Fprop policies the sampler runs.
    pub recipe: String,
    /// Activation scales.
    pub activation_scales: ActivationScales,
}

/// A stage plan.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct Plan {
    /// Name (names output folders: `A-Z a-z 0-9 . _ -`).
    pub name: String,
    /// One line.
    pub description: String,
    /// Pretraining recipe.
    pub pretrain: String,
    /// The RL sampler.
    pub sampler: SamplerStage,
    /// The RL trainer's recipe.
    pub rl_trainer: String,
}

/// Why a plan could not be found, parsed or accepted.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    /// No built-in plan of that name and no such file.
    #[error("unknown plan '{name}'; valid: {valid} (or the path of a TOML plan file)")]
    Unknown {
        /// The name asked for.
        name: String,
        /// Built-in plan names.
        valid: String,
    },
    /// Not a plan (syntax, unknown fields or variants; serde's message names what is valid).
    #[error("invalid plan TOML: {0}")]
    Parse(String),
    /// A stage's recipe is unknown or invalid.
    #[error("plan '{plan}', stage {stage}: {error}")]
    Recipe {
        /// The plan.
        plan: String,
        /// The stage.
        stage: &'static str,
        /// The recipe error.
        error: RecipeError,
    },
    /// A bad name.
    #[error("invalid plan: {0}")]
    Invalid(String),
    /// A plan file could not be read.
    #[error("plan file {path}: {error}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The error.
        error: std::io::Error,
    },
}

fn plan(
    name: &str,
    description: &str,
    pretrain: &str,
    sampler: &str,
    scales: ActivationScales,
    trainer: &str,
) -> Plan {
    Plan {
        name: name.into(),
        description: description.into(),
        pretrain: pretrain.into(),
        sampler: SamplerStage {
            recipe: sampler.into(),
            activation_scales: scales,
        },
        rl_trainer: trainer.into(),
    }
}

/// Names of the built-in plans.
pub const BUILTIN_PLANS: [&str; 6] = [
    "bf16",
    "bf16-mxfp8",
    "bf16-nvfp4",
    "bf16-nvfp4-dynamic",
    "mxfp8-nvfp4",
    "nvfp4",
];

impl Plan {
    /// The built-in plans, in [`BUILTIN_PLANS`] order.
    pub fn builtins() -> Vec<Plan> {
        use ActivationScales::{Dynamic, Static};
        let nv = "nvfp4-no-bf16-layers";
        vec![
            plan("bf16", "every stage BF16 (the reference)", "bf16", "bf16", Dynamic, "bf16"),
            plan("bf16-mxfp8", "BF16 pretraining and RL trainer, MXFP8 sampler", "bf16", "mxfp8", Dynamic, "bf16"),
            plan("bf16-nvfp4", "BF16 pretraining and RL trainer, NVFP4 sampler (W4A4 in every block, BF16 LM head, static activation scales)", "bf16", nv, Static, "bf16"),
            plan("bf16-nvfp4-dynamic", "bf16-nvfp4 with per-batch activation amax (dynamic scales)", "bf16", nv, Dynamic, "bf16"),
            plan("mxfp8-nvfp4", "MXFP8 pretraining and RL trainer, NVFP4 sampler (static activation scales)", "mxfp8", nv, Static, "mxfp8"),
            plan("nvfp4", "NVFP4 wherever the stage allows: the nvfp4 pretraining recipe, NVFP4 sampler, nvfp4 RL trainer (its BF16 edge blocks and LM head)", "nvfp4", nv, Static, "nvfp4"),
        ]
    }

    /// A built-in plan.
    pub fn builtin(name: &str) -> Result<Plan, PlanError> {
        Plan::builtins()
            .into_iter()
            .find(|p| p.name == name)
            .ok_or_else(|| PlanError::Unknown {
                name: name.into(),
                valid: BUILTIN_PLANS.join(", "),
            })
    }

    /// A built-in name, or else the path of a TOML plan file (a spec with a `/` or ending in
    /// `.toml` is always a path).
    pub fn resolve(spec: &str) -> Result<Plan, PlanError> {
        if BUILTIN_PLANS.contains(&spec) {
            return Plan::builtin(spec);
        }
        let path = Path::new(spec);
        if path.exists() || spec.contains('/') || spec.ends_with(".toml") {
            let text = std::fs::read_to_string(path).map_err(|error| PlanError::Io {
                path: path.into(),
                error,
            })?;
            return Plan::from_toml_str(&text);
        }
        Plan::builtin(spec)
    }

    /// Parses a plan (with an optional `base`) and validates it.
    pub fn from_toml_str(text: &str) -> Result<Plan, PlanError> {
        let parse = |e: toml::de::Error| PlanError::Parse(e.to_string());
        let mut table: toml::Table = text.parse().map_err(parse)?;
        let plan: Plan = match table.remove("base") {
            None => toml::from_str(text).map_err(parse)?,
            Some(toml::Value::String(base)) => {
                let mut merged = Plan::builtin(&base)?.to_table();
                if !table.contains_key("name") {
                    merged.insert("name".into(), format!("{base}-custom").into());
                }
                for (k, v) in table {
                    match (merged.get_mut(&k), v) {
                        (Some(toml::Value::Table(b)), toml::Value::Table(o)) => b.extend(o),
                        (_, v) => {
                            merged.insert(k, v);
                        }
                    }
                }
                toml::Value::Table(merged).try_into().map_err(parse)?
            }
            Some(other) => {
                return Err(PlanError::Parse(format!(
                    "`base` must be a built-in plan name (a string), not {}",
                    other.type_str()
                )))
            }
        };
        plan.validate()?;
        Ok(plan)
    }

    /// The plan as a TOML table.
    pub fn to_table(&self) -> toml::Table {
        toml::Table::try_from(self).expect("a plan serializes to TOML")
    }

    /// The plan as TOML text.
    pub fn to_toml(&self) -> String {
        toml::to_string(self).expect("a plan serializes to TOML")
    }

    /// Checks the name and that every stage's recipe resolves and is valid.
    pub fn validate(&self) -> Result<(), PlanError> {
        check_name(&self.name).map_err(PlanError::Invalid)?;
        for stage in ["pretrain", "sampler", "rl-trainer"] {
            self.recipe(stage)?;
        }
        Ok(())
    }

    /// The resolved recipe of a stage (`pretrain`, `sampler` or `rl-trainer`).
    pub fn recipe(&self, stage: &'static str) -> Result<Recipe, PlanError> {
        let spec = match stage {
            "pretrain" => &self.pretrain,
            "sampler" => &self.sampler.recipe,
            "rl-trainer" => &self.rl_trainer,
            _ => return Err(PlanError::Invalid(format!("no stage {stage}"))),
        };
        let wrap = |error| PlanError::Recipe {
            plan: self.name.clone(),
            stage,
            error,
        };
        let r = Recipe::resolve(spec).map_err(wrap)?;
        r.validate().map_err(wrap)?;
        Ok(r)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builtins_round_trip_and_validate() {
        for p in Plan::builtins() {
            p.validate().unwrap();
            assert_eq!(Plan::from_toml_str(&p.to_toml()).unwrap(), p);
        }
        assert_eq!(Plan::builtins().len(), BUILTIN_PLANS.len());
    }

    #[test]
    fn errors_list_what_is_valid() {
        let e = Plan::from_toml_str("base = \"bf16\"\nsampler = { recipe = \"bf16\", scales = 1 }")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("scales") && e.contains("activation-scales"),
            "{e}"
        );
        let e = Plan::from_toml_str("base = \"bf16\"\nrl-trainer = \"nvfp5\"")
            .unwrap_err()
            .to_string();
        assert!(e.contains("rl-trainer") && e.contains("valid: fp32"), "{e}");
        let e = Plan::from_toml_str("base = \"bf17\"")
            .unwrap_err()
            .to_string();
        assert!(e.contains("valid: bf16, bf16-mxfp8"), "{e}");
        let e = Plan::from_toml_str("base = \"bf16\"\nname = \"../x\"")
            .unwrap_err()
            .to_string();
        assert!(e.contains("may only use"), "{e}");
        let e =
            Plan::from_toml_str("base = \"bf16\"\n[sampler]\nactivation-scales = \"sometimes\"")
                .unwrap_err()
                .to_string();
        assert!(e.contains("dynamic") && e.contains("static"), "{e}");
    }
}
