//! The crate's error type.

use crate::Shape;

/// Why an op, a backward pass or a parameter operation was rejected.
///
/// Every shape problem a user can cause is reported here instead of panicking.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The inputs of an op do not have compatible shapes.
    #[error("{op}: {msg}")]
    Shape {
        /// The op that rejected its inputs.
        op: &'static str,
        /// What was wrong.
        msg: String,
    },
    /// A tensor has more dimensions than [`crate::MAX_RANK`], or its element count overflows.
    #[error("shape {dims:?} is not supported (rank at most {max}, element count must fit usize)")]
    BadShape {
        /// The requested dimensions.
        dims: Vec<usize>,
        /// The maximum rank.
        max: usize,
    },
    /// A data buffer does not hold as many elements as its shape says.
    #[error("{what}: {len} values for shape {shape} ({} elements)", shape.numel())]
    DataLength {
        /// What was being created.
        what: &'static str,
        /// Values given.
        len: usize,
        /// The shape they were given for.
        shape: Shape,
    },
    /// A tensor handle from another graph (or from a graph that no longer exists).
    #[error("tensor handle does not belong to this graph")]
    ForeignTensor,
    /// A parameter id that this store did not hand out.
    #[error("unknown parameter id {0}")]
    UnknownParam(usize),
    /// A parameter name that is not in the store.
    #[error("unknown parameter name {0:?}")]
    UnknownParamName(String),
    /// Two parameters with the same name.
    #[error("duplicate parameter name {0:?}")]
    DuplicateParam(String),
    /// A token id or class index outside the table / vocabulary.
    #[error("{op}: index {index} out of range for size {size}")]
    IndexOutOfRange {
        /// The op that received the index.
        op: &'static str,
        /// The offending index.
        index: u32,
        /// The table or vocabulary size.
        size: usize,
    },
    /// `backward` was asked to start from a tensor that is not a scalar.
    #[error("backward needs a scalar loss, got shape {0}")]
    NotScalar(Shape),
    /// `backward` was called a second time on the same graph.
    #[error("backward has already run on this graph; build a new graph for the next step")]
    BackwardTwice,
    /// A bad argument that is not a shape (e.g. a zero head count or a non-positive epsilon).
    #[error("{op}: {msg}")]
    InvalidArgument {
        /// The op that rejected the argument.
        op: &'static str,
        /// What was wrong.
        msg: String,
    },
    /// The quantized GEMM rejected its operands or settings.
    #[error(transparent)]
    Quant(#[from] quant::QuantError),
    /// A device call failed (no driver, out of device memory, a PTX that does not load, ...);
    /// the message says what to do.
    #[error(transparent)]
    Device(#[from] crate::backend::BackendError),
    /// The op has no CUDA kernel yet (see the crate README for the list).
    #[error("{op} has no CUDA kernel yet: run this model on the CPU (--device cpu)")]
    NoDeviceKernel {
        /// The op.
        op: &'static str,
    },
    /// Host data was asked of a tensor or parameter that lives on a device (or the reverse).
    #[error("{what}: the data lives on the {device:?} device; {hint}")]
    WrongDevice {
        /// What was asked.
        what: &'static str,
        /// Where the data is.
        device: crate::Device,
        /// What to call instead.
        hint: &'static str,
    },
}

/// `Result` with this crate's [`Error`].
pub type Result<T> = std::result::Result<T, Error>;

pub(crate) fn shape_err<T>(op: &'static str, msg: impl Into<String>) -> Result<T> {
    Err(Error::Shape {
        op,
        msg: msg.into(),
    })
}

pub(crate) fn arg_err<T>(op: &'static str, msg: impl Into<String>) -> Result<T> {
    Err(Error::InvalidArgument {
        op,
        msg: msg.into(),
    })
}
