//! Precision recipes as data.
//!
//! A [`Recipe`] says how every linear layer's three GEMMs (Fprop, Dgrad, Wgrad; see
//! `quant::config`) are quantized at every point of training:
//!
//! * `linear`: the default [`GemmPolicy`] of the linear layers;
//! * `overrides`: [`LayerOverride`]s selecting layers by block (the first `n`, the last `n`,
//!   explicit index ranges) and by [`LayerKind`] (`attn-qkv`, `attn-out`, `mlp-up`,
//!   `mlp-down`, `lm-head`); later overrides win over earlier ones;
//! * `attention`: precision of the attention matmuls, `QKᵀ` and `PV` and the backward's four
//!   ([`AttentionPrecision`]);
//! * `schedule`: an optional [`Schedule`] switching to a target policy after a fraction of the
//!   training tokens (all GEMMs, or Fprop only).
//!
//! [`Recipe::policy_for`] resolves all of that for one layer at one point of training.
//!
//! # Built-in recipes
//!
//! [`Recipe::builtin`] knows [`BUILTIN_NAMES`]; `trainer recipes show NAME` prints any of them
//! as TOML. In every recipe below except `fp32`, the LM head is a BF16 GEMM and attention
//! matmuls run in BF16 (docs/numerics.md#what-stays-in-high-precision).
//!
//! | name | linear layers |
//! |---|---|
//! | `fp32` | FP32 GEMMs, FP32 attention (the reference) |
//! | `bf16` | BF16 GEMM inputs (the baseline) |
//! | `fp8-delayed` | per-tensor FP8 HYBRID: E4M3 for X and W, E5M2 for dY; delayed scaling, margin 0, `max` over an amax history of **16** steps (Transformer Engine's default is 1024, tuned for runs of many thousands of steps; on the short runs this crate targets a 1024-step window would pin every scale to the largest amax of nearly the whole run) |
//! | `fp8-current` | per-tensor FP8 HYBRID with current scaling (scale from this step's amax) |
//! | `mxfp8` | MXFP8 E4M3 for all six operands, RCEIL (round-up) E8M0 scales (Mishra et al.; docs/numerics.md#scale-rules) |
//! | `mxfp4` | Tseng et al. (docs/numerics.md#prescaled-stochastic-rounding): Fprop in BF16; Dgrad and Wgrad operands in MXFP4 (OCP FLOOR scales) with stochastic rounding and the 3/4 prescale; 16-point RHT on both Wgrad operands |
//! | `nvfp4` | the NVFP4 paper recipe (docs/numerics.md#the-nvfp4-recipe-per-operand): X 1x16 RNE, W 16x16 RNE, dY 1x16 SR; RHT on both Wgrad operands; first 1 and last 1 blocks in BF16; all GEMMs switch to BF16 after 80% of the tokens |
//! | `nvfp4-no-rht` | `nvfp4` without the Wgrad RHT |
//! | `nvfp4-no-sr` | `nvfp4` with nearest-even gradients |
//! | `nvfp4-no-2d` | `nvfp4` with 1x16 (not 16x16) weight blocks |
//! | `nvfp4-no-bf16-layers` | `nvfp4` with every block in NVFP4 |
//!
//! Deviations of `mxfp4` from Tseng et al., forced by `quant`'s contract: the Hadamard
//! transform is quant's 16-point one (Tseng use 64 points) with Transformer Engine's fixed
//! signs (Tseng draw fresh signs per call; `quant`'s random signs derive from the operand's
//! random stream, so both Wgrad operands would have to share one stream and with it their
//! stochastic-rounding bits), and it is applied to the Wgrad operands only (quant transforms
//! columnwise operands only; Tseng also transform Dgrad, whose dY operand is rowwise).
//!
//! The NVFP4 paper keeps the first 2 and last 8 of 62 blocks in BF16; for the small models
//! trained here the built-in keeps 1 and 1 (Megatron-LM's default). A user recipe changes the
//! counts with `first` / `last` in its override.
//!
//! # User recipes (TOML)
//!
//! A recipe file has the fields of [`Recipe`] (unknown fields are errors). Policies can be
//! written in full, per operand, in the serde form of `quant`'s configuration, or as the name
//! of a preset ([`GemmPolicy::PRESET_NAMES`]: `"fp32"`, `"bf16"`, `"nvfp4"`, ...). A file may start
//! from a built-in with `base = "NAME"`: its tables are merged key by key into the
//! built-in's (arrays such as `overrides` are replaced as a whole):
//!
//! ```toml
//! base = "nvfp4"
//! name = "nvfp4-2-2"
//! description = "nvfp4 with the first 2 and last 2 blocks in BF16, forward-only switch"
//!
//! [[overrides]]
//! first = 2
//! last = 2
//! policy = "bf16"
//!
//! [[overrides]]
//! kinds = ["lm-head"]
//! policy = "bf16"
//!
//! [schedule]
//! switch_at = 0.9
//! forward_only = true
//! ```
//!
//! One operand written in full (`[linear.fprop]` then `a` and `b`; the same for `dgrad`
//! and `wgrad`):
//!
//! ```toml
//! a = { format = { format = "nvfp4" }, block = "row16", rounding = "nearest-even", rht = "off" }
//! b = { format = { format = "mx", element = "e2m1", rule = "floor", sr_prescale = false }, block = "row32", rounding = "nearest-even", rht = "off" }
//! ```
//!
//! Other formats: `{ format = "f32" }`, `{ format = "bf16" }`,
//! `{ format = "fp8", element = "e4m3", scaling = { kind = "current", power_of_two = false } }`,
//! `{ format = "fp8", element = "e5m2", scaling = { kind = "delayed", history_len = 16, margin = 0, algo = "max" } }`.
//!
//! Every policy is checked with `quant::Quantizer::new` for the usage of its slot (e.g. RHT
//! only on the columnwise operands Dgrad W, Wgrad dY and Wgrad X).

use std::fmt::{self, Write as _};
use std::path::{Path, PathBuf};

use quant::{BlockShape, GemmPolicy, Rht, RoundingMode};
use serde::{Deserialize, Deserializer, Serialize};

/// Builds a built-in recipe under the given name.
type BuildRecipe = fn(&str) -> Recipe;

/// The built-in recipes, in the order `trainer recipes` lists them: one row per recipe, its
/// name and its definition (built under that name).
const BUILTINS: &[(&str, BuildRecipe)] = &[
    ("fp32", |name| Recipe {
        name: name.into(),
        description: "FP32 GEMMs and FP32 attention: the reference".into(),
        attention: AttentionPrecision::Fp32,
        linear: GemmPolicy::FP32,
        overrides: Vec::new(),
        schedule: None,
    }),
    ("bf16", |name| Recipe {
        name: name.into(),
        description: "BF16 GEMM inputs everywhere: the baseline".into(),
        attention: AttentionPrecision::Bf16,
        linear: GemmPolicy::BF16,
        overrides: Vec::new(),
        schedule: None,
    }),
    ("fp8-delayed", |name| {
        simple(
            name,
            "per-tensor FP8 HYBRID (E4M3 X/W, E5M2 dY), delayed scaling: history 16, \
             margin 0, max; LM head BF16",
            GemmPolicy::fp8_delayed_hybrid(FP8_DELAYED_HISTORY),
        )
    }),
    ("fp8-current", |name| {
        simple(
            name,
            "per-tensor FP8 HYBRID (E4M3 X/W, E5M2 dY), current scaling; LM head BF16",
            GemmPolicy::fp8_current_hybrid(),
        )
    }),
    ("mxfp8", |name| {
        simple(
            name,
            "MXFP8 E4M3 for all operands, RCEIL scales (Mishra et al.); LM head BF16",
            GemmPolicy::mxfp8(),
        )
    }),
    ("mxfp4", |name| {
        simple(
            name,
            "Tseng et al.: BF16 forward; backward GEMMs in MXFP4 with SR (3/4 prescale), \
             RHT on Wgrad; LM head BF16",
            GemmPolicy::mxfp4_tseng(),
        )
    }),
    ("nvfp4", |name| {
        nvfp4_variant(
            name,
            "NVFP4 paper recipe: W 16x16, SR on dY, RHT on Wgrad, first/last block BF16, \
             BF16 after 80% of tokens; LM head BF16",
            GemmPolicy::nvfp4_paper(),
            true,
        )
    }),
    ("nvfp4-no-rht", |name| {
        let mut p = GemmPolicy::nvfp4_paper();
        p.wgrad.a.rht = Rht::Off;
        p.wgrad.b.rht = Rht::Off;
        nvfp4_variant(
            name,
            "nvfp4 ablation: no RHT on the Wgrad operands",
            p,
            true,
        )
    }),
    ("nvfp4-no-sr", |name| {
        let mut p = GemmPolicy::nvfp4_paper();
        p.dgrad.a.rounding = RoundingMode::NearestEven;
        p.wgrad.a.rounding = RoundingMode::NearestEven;
        nvfp4_variant(
            name,
            "nvfp4 ablation: gradients rounded to nearest-even",
            p,
            true,
        )
    }),
    ("nvfp4-no-2d", |name| {
        let mut p = GemmPolicy::nvfp4_paper();
        p.fprop.b.block = BlockShape::Row16;
        p.dgrad.b.block = BlockShape::Row16;
        nvfp4_variant(
            name,
            "nvfp4 ablation: 1x16 weight blocks instead of 16x16",
            p,
            true,
        )
    }),
    ("nvfp4-no-bf16-layers", |name| {
        nvfp4_variant(
            name,
            "nvfp4 ablation: every block in NVFP4 (LM head still BF16)",
            GemmPolicy::nvfp4_paper(),
            false,
        )
    }),
];

/// Names of the built-in recipes, in the order `trainer recipes` lists them (the names of
/// the built-in table).
pub const BUILTIN_NAMES: [&str; BUILTINS.len()] = names_of(BUILTINS);

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

/// Amax history length of the built-in `fp8-delayed` recipe (see the module docs).
pub use quant::presets::FP8_DELAYED_HISTORY;

/// Fraction of the training tokens after which the built-in `nvfp4` recipes switch to BF16.
pub const NVFP4_SWITCH_AT: f64 = 0.8;

/// The longest recipe name.
pub const MAX_NAME_LEN: usize = 64;

/// Checks a recipe name (see [`Recipe::name`]): it becomes a directory name under `runs/`
/// and `compare --out`, so it may not contain path separators or start with a dot.
pub fn check_name(name: &str) -> Result<(), String> {
    let ok_char = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-');
    if name.is_empty() || name.len() > MAX_NAME_LEN {
        return Err(format!(
            "name {name:?} must have 1 to {MAX_NAME_LEN} characters"
        ));
    }
    if !name.chars().all(ok_char) || name.starts_with('.') {
        return Err(format!(
            "name {name:?} may only use A-Z, a-z, 0-9, '.', '_' and '-' and may not start with '.' (it names the run's directory)"
        ));
    }
    Ok(())
}

/// Why a recipe could not be found, parsed or accepted.
#[derive(Debug, thiserror::Error)]
pub enum RecipeError {
    /// No built-in recipe of that name (and no such file).
    #[error("unknown recipe '{name}'; valid: {valid} (or the path of a TOML recipe file)")]
    UnknownRecipe {
        /// The name asked for.
        name: String,
        /// The built-in names, comma-separated.
        valid: String,
    },
    /// The TOML does not describe a recipe (syntax, types, unknown variants or fields; the
    /// message says which and where).
    #[error("invalid recipe TOML: {0}")]
    Parse(String),
    /// A field that no recipe or quantization setting has.
    #[error("unknown field `{field}` in `{path}`; valid fields there: {known}")]
    UnknownField {
        /// Dotted path of the table holding the field.
        path: String,
        /// The field.
        field: String,
        /// The fields that table accepts.
        known: String,
    },
    /// Settings that parse but do not make sense (e.g. RHT on a rowwise operand).
    #[error("invalid recipe '{name}': {message}")]
    Invalid {
        /// The recipe.
        name: String,
        /// What is wrong.
        message: String,
    },
    /// A recipe file could not be read (also: a spec that looks like a path but names no
    /// file).
    #[error("recipe file {path}: {error}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        error: std::io::Error,
    },
}

/// The kinds of linear layer a GPT has.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum LayerKind {
    /// The fused query/key/value projection.
    AttnQkv,
    /// The attention output projection.
    AttnOut,
    /// The MLP up projection.
    MlpUp,
    /// The MLP down projection.
    MlpDown,
    /// The LM head (output projection to the vocabulary; outside the blocks).
    LmHead,
}

impl LayerKind {
    /// The linear layers inside a transformer block, in order.
    pub const IN_BLOCK: [LayerKind; 4] = [
        LayerKind::AttnQkv,
        LayerKind::AttnOut,
        LayerKind::MlpUp,
        LayerKind::MlpDown,
    ];

    /// The TOML / CLI name (`attn-qkv`, ...).
    pub fn name(self) -> &'static str {
        match self {
            LayerKind::AttnQkv => "attn-qkv",
            LayerKind::AttnOut => "attn-out",
            LayerKind::MlpUp => "mlp-up",
            LayerKind::MlpDown => "mlp-down",
            LayerKind::LmHead => "lm-head",
        }
    }
}

impl fmt::Display for LayerKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Precision of the attention matmuls (`QKᵀ` and `PV`, and the backward's four).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum AttentionPrecision {
    /// BF16 inputs (Q, K, V, the probabilities P, and backward dO and dS), FP32
    /// accumulation on the BF16 GEMM ([`autograd::AttentionProducts::Bf16`]).
    #[default]
    Bf16,
    /// FP32.
    Fp32,
}

/// A half-open range of block indices, `start..end`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BlockRange {
    /// First block.
    pub start: usize,
    /// One past the last block.
    pub end: usize,
}

/// A policy for a selection of layers.
///
/// A layer inside a block is selected when its kind is in `kinds` (or `kinds` is empty) and
/// its block is among the first `first` blocks, the last `last` blocks or in one of `blocks`
/// (or none of the three restricts blocks, i.e. `first = last = 0` and `blocks` is empty).
/// The LM head belongs to no block: an override selects it only when it does not restrict
/// blocks and its `kinds` is empty or contains `lm-head`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LayerOverride {
    /// Select the first `first` blocks.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub first: usize,
    /// Select the last `last` blocks.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub last: usize,
    /// Select blocks in these ranges.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub blocks: Vec<BlockRange>,
    /// Select these layer kinds (all when empty).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub kinds: Vec<LayerKind>,
    /// The policy of the selected layers.
    #[serde(deserialize_with = "de_policy", serialize_with = "ser_policy")]
    pub policy: GemmPolicy,
}

impl LayerOverride {
    /// An override of every layer of the given kinds.
    pub fn kinds(kinds: &[LayerKind], policy: GemmPolicy) -> Self {
        LayerOverride {
            first: 0,
            last: 0,
            blocks: Vec::new(),
            kinds: kinds.to_vec(),
            policy,
        }
    }

    /// An override of every layer in the first `first` and last `last` blocks.
    pub fn edge_blocks(first: usize, last: usize, policy: GemmPolicy) -> Self {
        LayerOverride {
            first,
            last,
            blocks: Vec::new(),
            kinds: Vec::new(),
            policy,
        }
    }

    /// True when the override restricts blocks at all.
    pub fn restricts_blocks(&self) -> bool {
        self.first > 0 || self.last > 0 || !self.blocks.is_empty()
    }

    /// Whether the override applies to a layer.
    pub fn selects(&self, block_index: usize, n_blocks: usize, kind: LayerKind) -> bool {
        if !self.kinds.is_empty() && !self.kinds.contains(&kind) {
            return false;
        }
        if kind == LayerKind::LmHead {
            return !self.restricts_blocks();
        }
        !self.restricts_blocks()
            || block_index < self.first
            || block_index + self.last >= n_blocks
            || self
                .blocks
                .iter()
                .any(|r| (r.start..r.end).contains(&block_index))
    }
}

/// A late switch to another policy (docs/numerics.md#bf16-tail).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Schedule {
    /// Fraction of the total training tokens after which the switch is in effect (in
    /// `[0, 1]`; 1 means never).
    pub switch_at: f64,
    /// Switch only the Fprop GEMM (Dgrad and Wgrad keep their policy).
    #[serde(default)]
    pub forward_only: bool,
    /// The policy switched to (for every linear layer, overrides included).
    #[serde(deserialize_with = "de_policy", serialize_with = "ser_policy")]
    pub target: GemmPolicy,
}

impl Schedule {
    /// Whether the switch is in effect at `progress` (fraction of tokens seen).
    pub fn active(&self, progress: f64) -> bool {
        self.switch_at < 1.0 && progress >= self.switch_at
    }
}

/// A precision recipe (see the module docs).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Recipe {
    /// Name (built-in name or user choice): 1 to [`MAX_NAME_LEN`] characters from
    /// `A-Z a-z 0-9 . _ -`, not starting with `.`, because it names output directories.
    pub name: String,
    /// One line saying what the recipe is.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub description: String,
    /// Precision of the attention matmuls.
    #[serde(default)]
    pub attention: AttentionPrecision,
    /// The default policy of linear layers.
    #[serde(deserialize_with = "de_policy", serialize_with = "ser_policy")]
    pub linear: GemmPolicy,
    /// Per-layer overrides; later entries win.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub overrides: Vec<LayerOverride>,
    /// Optional late switch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schedule: Option<Schedule>,
}

// ----------------------------------------------------------------------------------------
// Policies.

/// [`GemmPolicy::validate`]'s message without the error's prefix (the recipe's own error
/// adds the field path).
fn validate_policy(p: &GemmPolicy) -> Result<(), String> {
    p.validate().map_err(|e| match e {
        quant::QuantError::InvalidConfig(m) => m,
        e => e.to_string(),
    })
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

/// Serializes the uniform FP32 and BF16 policies by their preset names (nothing is hidden:
/// all six operands are the same plain format) and every other policy in full.
fn ser_policy<S: serde::Serializer>(p: &GemmPolicy, serializer: S) -> Result<S::Ok, S::Error> {
    if *p == GemmPolicy::BF16 {
        serializer.serialize_str("bf16")
    } else if *p == GemmPolicy::FP32 {
        serializer.serialize_str("fp32")
    } else {
        p.serialize(serializer)
    }
}

/// Deserializes a policy written in full or as a preset name.
fn de_policy<'de, D: Deserializer<'de>>(deserializer: D) -> Result<GemmPolicy, D::Error> {
    struct V;
    impl<'de> serde::de::Visitor<'de> for V {
        type Value = GemmPolicy;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            write!(
                f,
                "a policy preset name ({}) or a table with fprop, dgrad, wgrad",
                GemmPolicy::PRESET_NAMES.join(", ")
            )
        }
        fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<GemmPolicy, E> {
            GemmPolicy::preset(s).ok_or_else(|| {
                E::custom(format!(
                    "unknown policy preset '{s}'; valid: {}",
                    GemmPolicy::PRESET_NAMES.join(", ")
                ))
            })
        }
        fn visit_map<A: serde::de::MapAccess<'de>>(self, map: A) -> Result<GemmPolicy, A::Error> {
            GemmPolicy::deserialize(serde::de::value::MapAccessDeserializer::new(map))
        }
    }
    deserializer.deserialize_any(V)
}

// ----------------------------------------------------------------------------------------
// Recipes.

fn nvfp4_variant(name: &str, description: &str, linear: GemmPolicy, bf16_edges: bool) -> Recipe {
    let mut overrides = Vec::new();
    if bf16_edges {
        overrides.push(LayerOverride::edge_blocks(1, 1, GemmPolicy::BF16));
    }
    overrides.push(LayerOverride::kinds(&[LayerKind::LmHead], GemmPolicy::BF16));
    Recipe {
        name: name.into(),
        description: description.into(),
        attention: AttentionPrecision::Bf16,
        linear,
        overrides,
        schedule: Some(Schedule {
            switch_at: NVFP4_SWITCH_AT,
            forward_only: false,
            target: GemmPolicy::BF16,
        }),
    }
}

fn simple(name: &str, description: &str, linear: GemmPolicy) -> Recipe {
    Recipe {
        name: name.into(),
        description: description.into(),
        attention: AttentionPrecision::Bf16,
        linear,
        overrides: vec![LayerOverride::kinds(&[LayerKind::LmHead], GemmPolicy::BF16)],
        schedule: None,
    }
}

impl Recipe {
    /// A built-in recipe by name ([`BUILTIN_NAMES`]).
    ///
    /// ```
    /// use trainer::recipe::Recipe;
    /// assert_eq!(Recipe::builtin("nvfp4").unwrap().name, "nvfp4");
    /// let err = Recipe::builtin("nvfp5").unwrap_err().to_string();
    /// assert!(err.starts_with("unknown recipe 'nvfp5'; valid: fp32, bf16, fp8-delayed"));
    /// ```
    pub fn builtin(name: &str) -> Result<Recipe, RecipeError> {
        BUILTINS
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(n, build)| build(n))
            .ok_or_else(|| RecipeError::UnknownRecipe {
                name: name.into(),
                valid: BUILTIN_NAMES.join(", "),
            })
    }

    /// Every built-in recipe, in [`BUILTIN_NAMES`] order.
    pub fn builtins() -> Vec<Recipe> {
        BUILTINS.iter().map(|(name, build)| build(name)).collect()
    }

    /// A built-in name, or else the path of a TOML recipe file.
    ///
    /// Errors: [`RecipeError::Io`] when `spec` looks like a path (it has a `/` or ends in
    /// `.toml`) or names a file that cannot be read; [`RecipeError::UnknownRecipe`] (listing
    /// the built-ins) when it is neither a built-in nor a file.
    pub fn resolve(spec: &str) -> Result<Recipe, RecipeError> {
        if BUILTIN_NAMES.contains(&spec) {
            return Recipe::builtin(spec);
        }
        let path = Path::new(spec);
        let looks_like_path = spec.contains(std::path::MAIN_SEPARATOR)
            || spec.contains('/')
            || path
                .extension()
                .is_some_and(|e| e.eq_ignore_ascii_case("toml"));
        if path.exists() || looks_like_path {
            return Recipe::from_file(path);
        }
        Recipe::builtin(spec)
    }

    /// Reads a TOML recipe file.
    pub fn from_file(path: &Path) -> Result<Recipe, RecipeError> {
        let text = std::fs::read_to_string(path).map_err(|e| RecipeError::Io {
            path: path.to_path_buf(),
            error: e,
        })?;
        Recipe::from_toml_str(&text)
    }

    /// Parses a TOML recipe (see the module docs), checks for unknown fields at every depth
    /// and validates it.
    pub fn from_toml_str(text: &str) -> Result<Recipe, RecipeError> {
        let mut table: toml::Table = text
            .parse()
            .map_err(|e: toml::de::Error| RecipeError::Parse(e.to_string()))?;
        let recipe: Recipe = match table.remove("base") {
            None => toml::from_str(text).map_err(|e| RecipeError::Parse(e.to_string()))?,
            Some(toml::Value::String(base)) => {
                let mut merged = Recipe::builtin(&base)?.to_table();
                if !table.contains_key("name") {
                    merged.insert("name".into(), format!("{base}-custom").into());
                }
                merge(&mut merged, table);
                table = merged;
                toml::Value::Table(table.clone())
                    .try_into()
                    .map_err(|e: toml::de::Error| RecipeError::Parse(e.to_string()))?
            }
            Some(other) => {
                return Err(RecipeError::Parse(format!(
                    "`base` must be a built-in recipe name (a string), not {}",
                    other.type_str()
                )))
            }
        };
        check_policy_fields(&table, &recipe.to_table())?;
        recipe.validate()?;
        Ok(recipe)
    }

    /// Checks the settings: every policy against `quant`'s rules for its operand slots, the
    /// schedule fraction, the block ranges.
    pub fn validate(&self) -> Result<(), RecipeError> {
        let invalid = |message: String| RecipeError::Invalid {
            name: self.name.clone(),
            message,
        };
        check_name(&self.name).map_err(invalid)?;
        validate_policy(&self.linear).map_err(|m| invalid(format!("linear.{m}")))?;
        for (i, o) in self.overrides.iter().enumerate() {
            validate_policy(&o.policy)
                .map_err(|m| invalid(format!("overrides[{i}].policy.{m}")))?;
            if let Some(r) = o.blocks.iter().find(|r| r.start >= r.end) {
                return Err(invalid(format!(
                    "overrides[{i}].blocks: empty range {}..{}",
                    r.start, r.end
                )));
            }
        }
        if let Some(s) = &self.schedule {
            validate_policy(&s.target).map_err(|m| invalid(format!("schedule.target.{m}")))?;
            if !(0.0..=1.0).contains(&s.switch_at) {
                return Err(invalid(format!(
                    "schedule.switch_at = {} must be in [0, 1]",
                    s.switch_at
                )));
            }
        }
        Ok(())
    }

    /// The policy of one linear layer at one point of training.
    ///
    /// `block_index` is the layer's block (`0..n_blocks`; ignored for the LM head),
    /// `progress` the fraction of the training tokens already seen. The result is the
    /// `linear` default, replaced by the last override that selects the layer, then by the
    /// schedule's target (entirely, or its Fprop only) once the switch is in effect.
    ///
    /// ```
    /// use quant::GemmPolicy;
    /// use trainer::recipe::{LayerKind, Recipe};
    /// let r = Recipe::builtin("nvfp4").unwrap();
    /// let mid = r.policy_for(3, 8, LayerKind::MlpUp, 0.5);
    /// assert_eq!(mid, GemmPolicy::nvfp4_paper());
    /// assert_eq!(r.policy_for(0, 8, LayerKind::MlpUp, 0.5), GemmPolicy::BF16); // first block
    /// assert_eq!(r.policy_for(7, 8, LayerKind::AttnQkv, 0.5), GemmPolicy::BF16); // last block
    /// assert_eq!(r.policy_for(3, 8, LayerKind::MlpUp, 0.85), GemmPolicy::BF16); // switched
    /// ```
    pub fn policy_for(
        &self,
        block_index: usize,
        n_blocks: usize,
        kind: LayerKind,
        progress: f64,
    ) -> GemmPolicy {
        debug_assert!(kind == LayerKind::LmHead || block_index < n_blocks);
        let mut p = self.linear;
        for o in &self.overrides {
            if o.selects(block_index, n_blocks, kind) {
                p = o.policy;
            }
        }
        if let Some(s) = &self.schedule {
            if s.active(progress) {
                if s.forward_only {
                    p.fprop = s.target.fprop;
                } else {
                    p = s.target;
                }
            }
        }
        p
    }

    /// The serialized recipe as a TOML table.
    pub fn to_table(&self) -> toml::Table {
        toml::Table::try_from(self).expect("a recipe always serializes")
    }

    /// The recipe as TOML: scalar fields first, one table per GEMM with the two operands as
    /// inline tables, `[[overrides]]` as an array of tables. Parses back to an equal recipe.
    pub fn to_toml(&self) -> String {
        let mut out = String::new();
        emit_table(&mut out, &[], &self.to_table());
        out.trim_start().to_string()
    }

    /// A table of the policy of every layer of a model with `n_blocks` blocks at `progress`.
    pub fn plan(&self, n_blocks: usize, progress: f64) -> String {
        let mut out = String::new();
        for b in 0..n_blocks {
            for k in LayerKind::IN_BLOCK {
                let p = self.policy_for(b, n_blocks, k, progress);
                let _ = writeln!(out, "block {b:>3} {:<8} {}", k.name(), p);
            }
        }
        let p = self.policy_for(0, n_blocks, LayerKind::LmHead, progress);
        let _ = writeln!(out, "          {:<8} {}", LayerKind::LmHead.name(), p);
        out
    }
}

/// Merges `over` into `base`: tables key by key, everything else replaced.
fn merge(base: &mut toml::Table, over: toml::Table) {
    for (k, v) in over {
        match (base.get_mut(&k), v) {
            (Some(toml::Value::Table(b)), toml::Value::Table(o)) => merge(b, o),
            (_, v) => {
                base.insert(k, v);
            }
        }
    }
}

/// Checks the policies of a recipe table for keys the parsed recipe does not have: serde
/// ignores unknown fields in `quant`'s types, which do not deny them (the recipe's own
/// structs do). `canonical` is the re-serialized recipe.
fn check_policy_fields(input: &toml::Table, canonical: &toml::Table) -> Result<(), RecipeError> {
    let pair = |t: &toml::Table, c: &toml::Table, k: &str, path: &str| match (t.get(k), c.get(k)) {
        (Some(i), Some(c)) => check_known(i, c, path),
        _ => Ok(()),
    };
    pair(input, canonical, "linear", "linear")?;
    if let (Some(toml::Value::Table(i)), Some(toml::Value::Table(c))) =
        (input.get("schedule"), canonical.get("schedule"))
    {
        pair(i, c, "target", "schedule.target")?;
    }
    if let (Some(toml::Value::Array(i)), Some(toml::Value::Array(c))) =
        (input.get("overrides"), canonical.get("overrides"))
    {
        for (n, (i, c)) in i.iter().zip(c).enumerate() {
            if let (toml::Value::Table(i), toml::Value::Table(c)) = (i, c) {
                pair(i, c, "policy", &format!("overrides[{n}].policy"))?;
            }
        }
    }
    Ok(())
}

/// Finds a key of `input` missing from `canonical` (same shape otherwise).
fn check_known(
    input: &toml::Value,
    canonical: &toml::Value,
    path: &str,
) -> Result<(), RecipeError> {
    match (input, canonical) {
        (toml::Value::Table(i), toml::Value::Table(c)) => {
            for (k, v) in i {
                let sub = format!("{path}.{k}");
                match c.get(k) {
                    Some(cv) => check_known(v, cv, &sub)?,
                    None => {
                        let mut known: Vec<&str> = c.keys().map(String::as_str).collect();
                        // The one optional field, absent from the serialized form when unset.
                        if c.get("format").and_then(|f| f.as_str()) == Some("nvfp4") {
                            known.push("four_over_six");
                        }
                        return Err(RecipeError::UnknownField {
                            path: path.into(),
                            field: k.clone(),
                            known: known.join(", "),
                        });
                    }
                }
            }
            Ok(())
        }
        _ => Ok(()),
    }
}

/// True for a key that TOML allows unquoted.
fn is_bare_key(k: &str) -> bool {
    !k.is_empty()
        && k.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

fn key(k: &str) -> String {
    if is_bare_key(k) {
        k.to_string()
    } else {
        toml::Value::String(k.to_string()).to_string()
    }
}

/// Tables written inline: operand settings, and tables without nested tables.
fn is_inline(t: &toml::Table) -> bool {
    t.contains_key("rounding") || !t.values().any(|v| v.is_table() || is_table_array(v))
}

/// True for a value written as its own `[table]` below a non-top-level table.
fn is_expanded(v: &toml::Value) -> bool {
    matches!(v, toml::Value::Table(t) if !is_inline(t))
}

fn is_table_array(v: &toml::Value) -> bool {
    matches!(v, toml::Value::Array(a) if !a.is_empty() && a.iter().all(|x| x.is_table()))
}

/// Writes `t` (at `path`) as TOML: plain keys, then sub-tables, then arrays of tables.
fn emit_table(out: &mut String, path: &[String], t: &toml::Table) {
    let mut plain = Vec::new();
    let mut tables = Vec::new();
    let mut arrays = Vec::new();
    for (k, v) in t {
        match v {
            toml::Value::Table(sub) if !is_inline(sub) || path.is_empty() => tables.push((k, sub)),
            toml::Value::Array(a) if is_table_array(v) && path.is_empty() => arrays.push((k, a)),
            _ => plain.push((k, v)),
        }
    }
    for (k, v) in plain {
        let _ = writeln!(out, "{} = {}", key(k), v);
    }
    for (k, sub) in tables {
        let mut p = path.to_vec();
        p.push(key(k));
        if sub.values().any(|v| !is_expanded(v)) {
            let _ = writeln!(out, "\n[{}]", p.join("."));
        }
        emit_table(out, &p, sub);
    }
    for (k, items) in arrays {
        let mut p = path.to_vec();
        p.push(key(k));
        for item in items {
            let _ = writeln!(out, "\n[[{}]]", p.join("."));
            if let toml::Value::Table(it) = item {
                emit_table(out, &p, it);
            }
        }
    }
}
