//! Error statistics of a quantization: how far the dequantized tensor is from the input.

/// Summary of the error between an input tensor and its quantize-dequantize image.
///
/// ```
/// use fp_formats::stats::ErrorStats;
/// let x = [1.0f32, 2.0, 3.0, 0.01];
/// let y = [1.0f32, 2.0, 2.0, 0.0];
/// let s = ErrorStats::new(&x, &y, 1);
/// assert_eq!(s.max_abs_error, 1.0);
/// assert_eq!(s.flushed_fraction, 0.25);
/// assert_eq!(s.clipped_fraction, 0.25);
/// assert!(s.sqnr_db > 10.0);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ErrorStats {
    /// Number of elements compared.
    pub count: usize,
    /// Root-mean-square error.
    pub rmse: f64,
    /// Signal-to-quantization-noise ratio in dB: `10 log10(Σx² / Σ(x - x̂)²)`
    /// (`+inf` for an exact quantization).
    pub sqnr_db: f64,
    /// Mean signed error `mean(x̂ - x)` relative to the mean magnitude `mean(|x|)`.
    pub relative_bias: f64,
    /// Largest absolute error.
    pub max_abs_error: f64,
    /// Fraction of elements whose scaled magnitude exceeded the element format's maximum
    /// (as counted by the quantizer).
    pub clipped_fraction: f64,
    /// Fraction of elements that were non-zero but dequantize to zero.
    pub flushed_fraction: f64,
}

impl ErrorStats {
    /// Compares `original` with `dequantized`; `clipped` is the number of elements the
    /// quantizer clipped at the format maximum.
    ///
    /// # Panics
    /// If the slices differ in length.
    pub fn new(original: &[f32], dequantized: &[f32], clipped: usize) -> Self {
        assert_eq!(
            original.len(),
            dequantized.len(),
            "ErrorStats: length mismatch"
        );
        let n = original.len();
        if n == 0 {
            return ErrorStats::default();
        }
        let (mut sig, mut noise, mut err_sum, mut mag_sum, mut max_err) =
            (0.0, 0.0, 0.0, 0.0, 0.0f64);
        let mut flushed = 0usize;
        for (&x, &y) in original.iter().zip(dequantized) {
            let (x, y) = (x as f64, y as f64);
            let e = y - x;
            sig += x * x;
            noise += e * e;
            err_sum += e;
            mag_sum += x.abs();
            max_err = max_err.max(e.abs());
            flushed += (x != 0.0 && y == 0.0) as usize;
        }
        let nf = n as f64;
        ErrorStats {
            count: n,
            rmse: (noise / nf).sqrt(),
            sqnr_db: 10.0 * (sig / noise).log10(),
            relative_bias: if mag_sum > 0.0 {
                err_sum / mag_sum
            } else {
                0.0
            },
            max_abs_error: max_err,
            clipped_fraction: clipped as f64 / nf,
            flushed_fraction: flushed as f64 / nf,
        }
    }
}
