//! Typed errors. Every fallible operation in this crate reports through [`OptimError`]; none panics on
//! bad input (wrong shapes, bad hyperparameters, non-finite gradient norms, corrupt state bytes).

use thiserror::Error;

/// Everything that can go wrong in this crate.
///
/// ```
/// use optim::{AdamW, AdamWConfig, OptimError, ParamSpec};
///
/// let mut opt = AdamW::new(AdamWConfig::default(), &[ParamSpec::new(4, 0)]).unwrap();
/// let mut p = vec![0.0f32; 3]; // wrong length
/// let g = vec![0.0f32; 3];
/// let err = opt.step(&mut [&mut p[..]], &[&g[..]], 1e-3).unwrap_err();
/// assert_eq!(err, OptimError::ParamLenMismatch { index: 0, expected: 4, got: 3 });
/// ```
#[derive(Debug, Clone, PartialEq, Error)]
pub enum OptimError {
    /// `step` received a different number of parameter slices than the optimizer was built for.
    #[error("expected {expected} parameter slices, got {got}")]
    ParamCountMismatch {
        /// Number of parameters the optimizer was built for.
        expected: usize,
        /// Number of parameter slices passed.
        got: usize,
    },
    /// `step` received a different number of gradient slices than parameter slices.
    #[error("expected {expected} gradient slices, got {got}")]
    GradCountMismatch {
        /// Number of parameters the optimizer was built for.
        expected: usize,
        /// Number of gradient slices passed.
        got: usize,
    },
    /// A parameter slice has the wrong length.
    #[error("parameter {index}: expected {expected} elements, got {got}")]
    ParamLenMismatch {
        /// Index of the parameter.
        index: usize,
        /// Length given at construction.
        expected: usize,
        /// Length of the slice passed.
        got: usize,
    },
    /// A gradient slice has the wrong length.
    #[error("gradient {index}: expected {expected} elements, got {got}")]
    GradLenMismatch {
        /// Index of the parameter.
        index: usize,
        /// Length given at construction.
        expected: usize,
        /// Length of the slice passed.
        got: usize,
    },
    /// A [`ParamSpec`](crate::ParamSpec) names a group that does not exist.
    #[error("parameter {index} refers to group {group}, but only {groups} group(s) exist")]
    UnknownGroup {
        /// Index of the parameter.
        index: usize,
        /// The group id it names.
        group: usize,
        /// Number of groups.
        groups: usize,
    },
    /// A hyperparameter (or schedule parameter, or step argument) is out of range.
    #[error("invalid {name} = {value}: {reason}")]
    InvalidHyperparameter {
        /// Which value.
        name: &'static str,
        /// The offending value (as f64 so that integers and floats both fit).
        value: f64,
        /// What was expected.
        reason: &'static str,
    },
    /// The global gradient norm is NaN or infinite. Nothing was modified; the caller should skip the
    /// step (and, with loss scaling, lower the scale).
    #[error("global gradient norm is not finite ({norm}); gradients left unchanged")]
    NonFiniteGradNorm {
        /// The norm that was computed (NaN or +inf).
        norm: f32,
    },
    /// Saved optimizer state could not be loaded.
    #[error("cannot load optimizer state: {0}")]
    State(StateError),
}

/// Why a saved optimizer state was rejected by `load_state` / `from_state`.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum StateError {
    /// The bytes end before the structure they describe.
    #[error("truncated: needed {needed} bytes, {available} available")]
    Truncated {
        /// Bytes required.
        needed: u64,
        /// Bytes present.
        available: u64,
    },
    /// More bytes than the header announces.
    #[error("{extra} unexpected trailing bytes")]
    TrailingBytes {
        /// Number of extra bytes.
        extra: u64,
    },
    /// The bytes do not start with the state magic; not an optimizer state at all.
    #[error("not an optimizer state (bad magic)")]
    BadMagic,
    /// Written by an incompatible version of this crate.
    #[error("unsupported state format version {found} (this build reads version {supported})")]
    UnsupportedVersion {
        /// Version in the header.
        found: u32,
        /// Version this build reads.
        supported: u32,
    },
    /// The stored CRC-32 does not match the contents: the bytes were corrupted.
    #[error("checksum mismatch: stored {stored:#010x}, computed {computed:#010x}")]
    ChecksumMismatch {
        /// Checksum in the trailer.
        stored: u32,
        /// Checksum of the bytes read.
        computed: u32,
    },
    /// The state belongs to a different optimizer (e.g. SGD state loaded into AdamW).
    #[error("state was saved by optimizer kind {found}, expected {expected}")]
    WrongKind {
        /// The kind this optimizer writes.
        expected: &'static str,
        /// The kind code in the header.
        found: u32,
    },
    /// The parameter layout (count, lengths, group ids) differs from the optimizer's.
    #[error("parameter layout mismatch: {0}")]
    LayoutMismatch(String),
    /// The hyperparameters or groups differ from the optimizer's.
    #[error("hyperparameter mismatch: {0}")]
    ConfigMismatch(String),
    /// Internally inconsistent contents (valid checksum, impossible values).
    #[error("malformed state: {0}")]
    Malformed(&'static str),
}

// Not `#[from]`: that would also expose the state error as `source()`, and error reporters
// that print the chain (anyhow's `{:#}`) would print its text twice.
impl From<StateError> for OptimError {
    fn from(e: StateError) -> Self {
        OptimError::State(e)
    }
}
