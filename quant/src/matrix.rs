//! The one matrix view of the workspace: a borrowed, read-only, strided f32 matrix.
//!
//! [`MatRef::new`] is the checked constructor every quantizer input goes through (the slice
//! holds exactly `rows * cols` elements, each dimension at most [`MAX_DIM`]); the GEMMs also
//! take strided and transposed views ([`MatRef::t`]), which cost nothing (nothing is copied).
//!
//! ```
//! use quant::MatRef;
//! let x = [1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0];
//! let m = MatRef::new(&x, 2, 3)?;
//! assert_eq!((m.rows, m.cols), (2, 3));
//! assert_eq!(m.t().data[m.t().row_stride], 2.0); // element (1, 0) of the transpose
//! assert!(MatRef::new(&x, 4, 2).is_err()); // 6 elements are not [4, 2]
//! # Ok::<(), quant::QuantError>(())
//! ```

use crate::QuantError;

/// The largest row or column count a quantizer accepts: `2^31 - 1`, the largest dimension
/// the CUDA kernels index with 32-bit integers. With it, a padded shape (dimensions rounded
/// up to 32) and its element count cannot overflow `usize` on a 64-bit target.
pub const MAX_DIM: usize = i32::MAX as usize;

/// A read-only strided matrix view: element `(i, j)` is `data[i * row_stride + j * col_stride]`.
#[derive(Clone, Copy, Debug)]
pub struct MatRef<'a> {
    /// Backing storage.
    pub data: &'a [f32],
    /// Rows.
    pub rows: usize,
    /// Columns.
    pub cols: usize,
    /// Distance between rows.
    pub row_stride: usize,
    /// Distance between columns.
    pub col_stride: usize,
}

impl<'a> MatRef<'a> {
    /// A row-major `[rows, cols]` view of `data`, checked: `data` must hold exactly
    /// `rows * cols` elements and each dimension must be at most [`MAX_DIM`].
    ///
    /// Errors: [`fp_formats::FormatError::ShapeMismatch`] (as [`QuantError::Format`]) for a
    /// wrong length, [`QuantError::DimensionTooLarge`] for a dimension over [`MAX_DIM`].
    ///
    /// ```
    /// use quant::{MatRef, QuantError};
    /// let x = vec![0.0f32; 12];
    /// assert!(MatRef::new(&x, 3, 4).is_ok());
    /// assert!(matches!(MatRef::new(&x, 3, 5), Err(QuantError::Format(_))));
    /// assert!(matches!(MatRef::new(&[], 0, usize::MAX), Err(QuantError::DimensionTooLarge { .. })));
    /// ```
    pub fn new(data: &'a [f32], rows: usize, cols: usize) -> Result<Self, QuantError> {
        if rows > MAX_DIM || cols > MAX_DIM {
            return Err(QuantError::DimensionTooLarge {
                rows,
                cols,
                max: MAX_DIM,
            });
        }
        let expected = rows.saturating_mul(cols);
        if data.len() != expected {
            return Err(fp_formats::FormatError::ShapeMismatch {
                rows,
                cols,
                expected,
                got: data.len(),
            }
            .into());
        }
        Ok(Self::row_major(data, rows, cols))
    }

    /// A row-major `[rows, cols]` view without checks (the GEMMs check [`MatRef`]s against
    /// their storage before use; quantizers check them with [`MatRef::contiguous`]).
    pub fn row_major(data: &'a [f32], rows: usize, cols: usize) -> Self {
        MatRef {
            data,
            rows,
            cols,
            row_stride: cols,
            col_stride: 1,
        }
    }

    /// The transpose (a view; nothing moves).
    pub fn t(self) -> Self {
        MatRef {
            data: self.data,
            rows: self.cols,
            cols: self.rows,
            row_stride: self.col_stride,
            col_stride: self.row_stride,
        }
    }

    /// The elements of a dense row-major view (`rows * cols` elements, row stride `cols`,
    /// column stride 1), the layout the quantizers read: checked again here, in O(1),
    /// because the fields are public and a view may have been built without
    /// [`MatRef::new`].
    ///
    /// Errors: as [`MatRef::new`]; [`QuantError::InvalidConfig`] for a strided or transposed
    /// view.
    ///
    /// ```
    /// use quant::MatRef;
    /// let x = [1.0f32, 2.0, 3.0, 4.0];
    /// let m = MatRef::new(&x, 2, 2)?;
    /// assert_eq!(m.contiguous()?, &x[..]);
    /// assert!(m.t().contiguous().is_err());
    /// # Ok::<(), quant::QuantError>(())
    /// ```
    pub fn contiguous(&self) -> Result<&'a [f32], QuantError> {
        let m = MatRef::new(self.data, self.rows, self.cols)?;
        let dense = self.rows <= 1 || self.row_stride == self.cols;
        let unit = self.cols <= 1 || self.col_stride == 1;
        if !(dense && unit) {
            return Err(QuantError::InvalidConfig(format!(
                "a quantizer reads a dense row-major matrix; this [{}, {}] view has strides ({}, {})",
                self.rows, self.cols, self.row_stride, self.col_stride
            )));
        }
        Ok(m.data)
    }

    /// The sub-view of rows `r0 .. r0 + rows` and columns `c0 .. c0 + cols` (which must lie
    /// in this view, and `rows, cols >= 1`); it fits its storage when this view does.
    pub(crate) fn block(&self, r0: usize, rows: usize, c0: usize, cols: usize) -> MatRef<'a> {
        debug_assert!(rows >= 1 && cols >= 1 && r0 + rows <= self.rows && c0 + cols <= self.cols);
        MatRef {
            data: &self.data[r0 * self.row_stride + c0 * self.col_stride..],
            rows,
            cols,
            row_stride: self.row_stride,
            col_stride: self.col_stride,
        }
    }

    /// Whether every element of the view lies in `data` (strides whose offsets overflow
    /// `usize` do not fit: the GEMMs' AVX-512 packing reads through raw pointers).
    pub(crate) fn fits(&self) -> bool {
        if self.rows == 0 || self.cols == 0 {
            return true;
        }
        let last = (self.rows - 1)
            .checked_mul(self.row_stride)
            .zip((self.cols - 1).checked_mul(self.col_stride))
            .and_then(|(r, c)| r.checked_add(c));
        last.is_some_and(|last| last < self.data.len())
    }
}
