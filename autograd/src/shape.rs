//! Tensor shapes: up to [`MAX_RANK`] dimensions, row-major, stored inline (`Copy`).

use std::fmt;

use crate::{Error, Result};

/// The largest supported rank. Four covers every tensor of a transformer (`[B, H, T, D]`).
pub const MAX_RANK: usize = 4;

/// The dimensions of a row-major tensor. A rank-0 shape is a scalar with one element.
///
/// ```
/// use autograd::Shape;
/// let s = Shape::new(&[2, 3, 4])?;
/// assert_eq!((s.rank(), s.numel(), s.last(), s.rows()), (3, 24, 4, 6));
/// assert_eq!(s.dims(), &[2, 3, 4]);
/// assert!(Shape::new(&[1, 1, 1, 1, 1]).is_err());
/// # Ok::<(), autograd::Error>(())
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Shape {
    dims: [usize; MAX_RANK],
    rank: u8,
}

impl Shape {
    /// A shape from its dimensions; rank at most [`MAX_RANK`] and an element count that fits
    /// `usize`.
    pub fn new(dims: &[usize]) -> Result<Shape> {
        let bad = || Error::BadShape {
            dims: dims.to_vec(),
            max: MAX_RANK,
        };
        if dims.len() > MAX_RANK {
            return Err(bad());
        }
        dims.iter()
            .try_fold(1usize, |acc, &d| acc.checked_mul(d))
            .ok_or_else(bad)?;
        let mut s = Shape {
            dims: [0; MAX_RANK],
            rank: dims.len() as u8,
        };
        s.dims[..dims.len()].copy_from_slice(dims);
        Ok(s)
    }

    /// The rank-0 shape of a scalar.
    pub const fn scalar() -> Shape {
        Shape {
            dims: [0; MAX_RANK],
            rank: 0,
        }
    }

    /// The dimensions.
    pub fn dims(&self) -> &[usize] {
        &self.dims[..self.rank as usize]
    }

    /// Number of dimensions.
    pub fn rank(&self) -> usize {
        self.rank as usize
    }

    /// Number of elements (1 for a scalar).
    pub fn numel(&self) -> usize {
        self.dims().iter().product()
    }

    /// The last (contiguous) dimension; 1 for a scalar.
    pub fn last(&self) -> usize {
        self.dims().last().copied().unwrap_or(1)
    }

    /// The number of rows when the tensor is seen as a `[rows, last]` matrix.
    pub fn rows(&self) -> usize {
        match self.numel().checked_div(self.last()) {
            Some(r) => r,
            // a zero-width last axis: count the leading positions
            None => self.dims()[..self.rank() - 1].iter().product(),
        }
    }

    /// The same shape with the last dimension replaced.
    pub(crate) fn with_last(&self, last: usize) -> Result<Shape> {
        let mut d = self.dims().to_vec();
        match d.last_mut() {
            Some(l) => *l = last,
            None => d.push(last),
        }
        Shape::new(&d)
    }
}

impl fmt::Debug for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.dims())
    }
}

impl fmt::Display for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.dims())
    }
}
