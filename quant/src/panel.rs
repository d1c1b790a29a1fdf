//! Shared plumbing of the tensor quantizers: the stored layout, row panels for rayon, and
//! per-thread scratch buffers.
//!
//! Every quantizer works on the **stored** layout: the tensor itself (`[rows, cols]`) for
//! [`Usage::Rowwise`], its transpose (`[cols, rows]`) for [`Usage::Columnwise`]. The stored
//! rows are cut into panels of consecutive rows that rayon processes independently; each
//! stored row's result depends only on that row (and the random stream at the row's flat
//! index), so the output is identical for any number of threads.

use std::cell::Cell;

use crate::config::Usage;

/// The stored shape `(stored_rows, stored_cols)` of a `[rows, cols]` tensor.
#[inline]
pub(crate) fn stored_shape(rows: usize, cols: usize, usage: Usage) -> (usize, usize) {
    match usage {
        Usage::Rowwise => (rows, cols),
        Usage::Columnwise => (cols, rows),
    }
}

/// Stored rows per rayon task: about 64 Ki elements, at least 4 rows.
#[inline]
pub(crate) fn panel_rows(stored_cols: usize) -> usize {
    (65_536 / stored_cols.max(1)).clamp(4, 1024)
}

/// Stored rows per rayon task for a usage: columnwise panels take at least 64 stored rows,
/// so that forming the transposed panel reads 256 contiguous bytes of every input row.
#[inline]
pub(crate) fn panel_rows_for(stored_cols: usize, usage: Usage) -> usize {
    match usage {
        Usage::Rowwise => panel_rows(stored_cols),
        Usage::Columnwise => panel_rows(stored_cols).max(64),
    }
}

/// Per-thread scratch buffers. Their contents are stale between uses: callers overwrite
/// what they read.
#[derive(Default)]
pub(crate) struct Scratch {
    /// A transposed (or transformed) panel of the input.
    pub panel: Vec<f32>,
    /// Random bytes for stochastic rounding.
    pub rbits: Vec<u8>,
    /// Unpacked element codes.
    pub codes: Vec<u8>,
}

thread_local! {
    static SCRATCH: Cell<Option<Box<Scratch>>> = const { Cell::new(None) };
}

/// Runs `f` with this thread's scratch buffers. Re-entrant: a nested call (rayon may run
/// another task on this thread while it waits) gets fresh buffers instead of a borrow panic.
pub(crate) fn with_scratch<R>(f: impl FnOnce(&mut Scratch) -> R) -> R {
    let mut s = SCRATCH.with(|c| c.take()).unwrap_or_default();
    let r = f(&mut s);
    SCRATCH.with(|c| c.set(Some(s)));
    r
}

/// The first `n` elements of `v`, growing it (never shrinking) as needed.
#[inline]
pub(crate) fn grow<T: Default + Clone>(v: &mut Vec<T>, n: usize) -> &mut [T] {
    if v.len() < n {
        v.resize(n, T::default());
    }
    &mut v[..n]
}

/// Stored rows `r0 .. r0 + n` as one contiguous row-major `[n, stored_cols]` slice: a
/// sub-slice of `x` for rowwise usage, a transposed copy in `buf` for columnwise usage.
pub(crate) fn stored_panel<'a>(
    x: &'a [f32],
    rows: usize,
    cols: usize,
    usage: Usage,
    r0: usize,
    n: usize,
    buf: &'a mut Vec<f32>,
) -> &'a [f32] {
    match usage {
        Usage::Rowwise => &x[r0 * cols..(r0 + n) * cols],
        Usage::Columnwise => {
            let out = grow(buf, n * rows);
            transpose_into(x, rows, cols, r0, n, out);
            &out[..]
        }
    }
}

/// `out[i * rows + j] = x[j * cols + r0 + i]` for `i < n`, `j < rows`: columns `r0 .. r0 + n`
/// of `x` as rows, through 16x16 register tiles (contiguous 64-byte reads and writes).
fn transpose_into(x: &[f32], rows: usize, cols: usize, r0: usize, n: usize, out: &mut [f32]) {
    const T: usize = 16;
    let mut tile = [[0.0f32; T]; T];
    for j0 in (0..rows).step_by(T) {
        let jn = (rows - j0).min(T);
        for i0 in (0..n).step_by(T) {
            let inn = (n - i0).min(T);
            if jn == T && inn == T {
                for (jj, t) in tile.iter_mut().enumerate() {
                    let s = (j0 + jj) * cols + r0 + i0;
                    *t = x[s..s + T].try_into().expect("16 elements");
                }
                for i in 0..T {
                    let d: &mut [f32; T] = (&mut out[(i0 + i) * rows + j0..][..T])
                        .try_into()
                        .expect("16 elements");
                    for jj in 0..T {
                        d[jj] = tile[jj][i];
                    }
                }
            } else {
                for i in i0..i0 + inn {
                    for jj in 0..jn {
                        out[i * rows + j0 + jj] = x[(j0 + jj) * cols + r0 + i];
                    }
                }
            }
        }
    }
}

/// Stored rows `r0 .. r0 + n` written into `out` (`n * stored_cols` elements): a copy for
/// rowwise usage, the transposed columns for columnwise usage.
pub(crate) fn stored_panel_into(
    x: &[f32],
    rows: usize,
    cols: usize,
    usage: Usage,
    r0: usize,
    n: usize,
    out: &mut [f32],
) {
    match usage {
        Usage::Rowwise => out.copy_from_slice(&x[r0 * cols..(r0 + n) * cols]),
        Usage::Columnwise => transpose_into(x, rows, cols, r0, n, out),
    }
}

/// Stored rows `r0 .. r0 + n` copied into `buf` (so they can be transformed in place).
pub(crate) fn stored_panel_owned<'a>(
    x: &[f32],
    rows: usize,
    cols: usize,
    usage: Usage,
    r0: usize,
    n: usize,
    buf: &'a mut Vec<f32>,
) -> &'a mut [f32] {
    match usage {
        Usage::Rowwise => {
            let out = grow(buf, n * cols);
            out.copy_from_slice(&x[r0 * cols..(r0 + n) * cols]);
            out
        }
        Usage::Columnwise => {
            let out = grow(buf, n * rows);
            transpose_into(x, rows, cols, r0, n, out);
            out
        }
    }
}

/// The stored-layout copy of a whole tensor (`x` itself for rowwise usage).
pub(crate) fn stored_copy(x: &[f32], rows: usize, cols: usize, usage: Usage) -> Vec<f32> {
    match usage {
        Usage::Rowwise => x.to_vec(),
        Usage::Columnwise => {
            let mut buf = Vec::new();
            stored_panel(x, rows, cols, usage, 0, cols, &mut buf);
            buf.truncate(rows * cols);
            buf
        }
    }
}

/// Checks `x.len() == rows * cols`.
pub(crate) fn check_len(x: &[f32], rows: usize, cols: usize) -> Result<(), crate::QuantError> {
    let expected = rows.saturating_mul(cols);
    if x.len() != expected {
        return Err(fp_formats::FormatError::ShapeMismatch {
            rows,
            cols,
            expected,
            got: x.len(),
        }
        .into());
    }
    Ok(())
}

/// Checks an output buffer length for `fake_quantize_into`.
pub(crate) fn check_out(out: &[f32], n: usize) -> Result<(), crate::QuantError> {
    if out.len() != n {
        return Err(fp_formats::FormatError::BadBufferLength {
            expected: n,
            got: out.len(),
        }
        .into());
    }
    Ok(())
}
