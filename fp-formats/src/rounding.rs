//! Rounding modes and overflow policies shared by every encoder in this crate.

/// How a value that falls between two representable neighbours is resolved.
///
/// Rounding acts on the magnitude grid of the target format (sign-magnitude), so
/// `TowardZero` truncates the magnitude, while `TowardPositive` / `TowardNegative`
/// depend on the sign, exactly as IEEE 754 defines them.
///
/// `Stochastic(r)` consumes 8 caller-supplied random bits per element and follows the
/// hardware rule (docs/numerics.md#stochastic-rounding): with `f` the fractional position of `|x|` between its
/// lower neighbour `lo` and upper neighbour `hi`, the result is `hi` exactly when
/// `r + floor(256 f) >= 256`, so `P(hi) = floor(256 f) / 256`. The rounding is therefore
/// biased toward zero by less than `(hi - lo) / 256` per element (never away from zero),
/// and exactly unbiased when `256 f` is an integer.
///
/// ```
/// use fp_formats::{E2M1, ElementFormat, Overflow, Rounding};
/// // 1.2 lies 0.4 of the way from 1.0 to 1.5: floor(256 * 0.4) = 102, so r >= 154 rounds up.
/// assert_eq!(E2M1::from_f32(1.2, Rounding::Stochastic(153), Overflow::Saturate).to_f32(), 1.0);
/// assert_eq!(E2M1::from_f32(1.2, Rounding::Stochastic(154), Overflow::Saturate).to_f32(), 1.5);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Rounding {
    /// Round to nearest, ties to the neighbour with an even last mantissa bit (IEEE default).
    NearestEven,
    /// Truncate the magnitude.
    TowardZero,
    /// Round toward +infinity.
    TowardPositive,
    /// Round toward -infinity.
    TowardNegative,
    /// Stochastic rounding driven by 8 random bits (see the type-level docs).
    Stochastic(u8),
}

/// What happens to a finite value whose rounded magnitude exceeds the largest finite value.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum Overflow {
    /// Clamp to the largest finite magnitude (PTX `satfinite`). Infinities saturate too;
    /// NaN still maps to NaN where the format has one.
    #[default]
    Saturate,
    /// IEEE / ml_dtypes behaviour: an overflowing result becomes Inf where the format has
    /// Inf, otherwise NaN where it has NaN, otherwise the largest finite value. As in
    /// IEEE 754, the directed modes that round toward zero for the value's sign
    /// (`TowardZero`, and `TowardNegative` / `TowardPositive` for positive / negative
    /// values) give the largest finite value instead.
    Propagate,
}
