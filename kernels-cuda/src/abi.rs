//! The host side of the kernels' ABI, shared by the GPU path ([`crate::QuantJob`]) and the CPU
//! emulation test (`tests/emulated.rs`): the kernel argument structs (mirrors of the C structs in
//! `cuda/*.cu`, layouts asserted on both sides), the flag bits, and the validation, output
//! shapes, launch grids and per-tensor results of every quantization ([`Plan`]). Not a stable
//! API.

use cudarc::driver::DeviceRepr;
use fp_formats::mx::{MxElement, ScaleRule};
use fp_formats::nvfp4::GlobalScale;
use quant::{
    BlockShape, Fp8Element, Fp8Scaling, OperandQuant, QuantError, QuantFormat, QuantState,
    QuantizedTensor, Quantizer, RngKey, RoundingMode, Usage,
};

use crate::{KernelError, Result};

// ------------------------------------------------------------------------------------------
// Kernel argument structs (mirrors of the C structs; the layouts are asserted on both sides)
// ------------------------------------------------------------------------------------------

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct Nvfp4Args {
    pub x: u64,
    pub row_codes: u64,
    pub row_scales: u64,
    pub col_codes: u64,
    pub col_scales: u64,
    pub amax: u64,
    pub row_seed: u64,
    pub row_stream: u64,
    pub col_seed: u64,
    pub col_stream: u64,
    pub rows: i32,
    pub cols: i32,
    pub flags: i32,
    pub rht_mask: u32,
}
const _: () = assert!(std::mem::size_of::<Nvfp4Args>() == 96);
const _: () = assert!(std::mem::offset_of!(Nvfp4Args, row_seed) == 48);
const _: () = assert!(std::mem::offset_of!(Nvfp4Args, rows) == 80);
// SAFETY: plain-old-data with the C layout of `Nvfp4Args` in cuda/nvfp4.cu.
unsafe impl DeviceRepr for Nvfp4Args {}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct MxArgs {
    pub x: u64,
    pub row_codes: u64,
    pub row_scales: u64,
    pub col_codes: u64,
    pub col_scales: u64,
    pub amax: u64,
    pub row_seed: u64,
    pub row_stream: u64,
    pub col_seed: u64,
    pub col_stream: u64,
    pub rows: i32,
    pub cols: i32,
    pub flags: i32,
    pub rht_mask: u32,
    pub elem: i32,
    pub rule: i32,
}
const _: () = assert!(std::mem::size_of::<MxArgs>() == 104);
const _: () = assert!(std::mem::offset_of!(MxArgs, rows) == 80);
const _: () = assert!(std::mem::offset_of!(MxArgs, elem) == 96);
// SAFETY: plain-old-data with the C layout of `MxArgs` in cuda/mx.cu.
unsafe impl DeviceRepr for MxArgs {}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct Fp8Args {
    pub x: u64,
    pub row_codes: u64,
    pub col_codes: u64,
    pub amax: u64,
    pub meta: u64,
    pub row_seed: u64,
    pub row_stream: u64,
    pub col_seed: u64,
    pub col_stream: u64,
    pub rows: i32,
    pub cols: i32,
    pub flags: i32,
    pub elem: i32,
    pub host_scale: f32,
    pub pad: i32,
}
const _: () = assert!(std::mem::size_of::<Fp8Args>() == 96);
const _: () = assert!(std::mem::offset_of!(Fp8Args, rows) == 72);
const _: () = assert!(std::mem::offset_of!(Fp8Args, host_scale) == 88);
// SAFETY: plain-old-data with the C layout of `Fp8Args` in cuda/fp8.cu.
unsafe impl DeviceRepr for Fp8Args {}

// Flag bits (cuda/*.cu `#define`s).
pub const ROW: i32 = 1;
pub const COL: i32 = 2;
pub const ROW_TILE: i32 = 4;
pub const COL_TILE: i32 = 8;
pub const ROW_SR: i32 = 16;
pub const COL_SR: i32 = 32;
pub const COL_RHT: i32 = 64;
pub const VEC4: i32 = 128;
pub const MX_ROW_PRESCALE: i32 = 256;
pub const MX_COL_PRESCALE: i32 = 512;
pub const FP8_SCALE_HOST: i32 = 256;
pub const FP8_SCALE_POW2: i32 = 512;

// ------------------------------------------------------------------------------------------
// Validation (mirrors quant's checks and messages)
// ------------------------------------------------------------------------------------------

pub(crate) fn invalid(msg: impl Into<String>) -> KernelError {
    KernelError::Quant(QuantError::InvalidConfig(msg.into()))
}

fn stored_shape(rows: usize, cols: usize, usage: Usage) -> (usize, usize) {
    match usage {
        Usage::Rowwise => (rows, cols),
        Usage::Columnwise => (cols, rows),
    }
}

/// The input's shape.
#[derive(Clone, Copy, Debug)]
pub struct Dims {
    /// Rows.
    pub rows: usize,
    /// Columns.
    pub cols: usize,
}

/// What one usage (the rowwise or columnwise copy) of a quantization produces.
#[derive(Clone, Copy, Debug)]
pub struct Side {
    pub usage: Usage,
    pub format: QuantFormat,
    pub block: BlockShape,
    pub key: RngKey,
    pub sr: bool,
    pub tile: bool,
    pub mask: Option<u16>,
    pub prescale: bool,
    pub rows: usize,
    pub cols: usize,
    pub padded_rows: usize,
    pub padded_cols: usize,
    pub codes_len: usize,
    pub scale_len: usize,
}

impl Side {
    /// The host tensor of this side: its downloaded `codes` and `scales` (already cut to
    /// `codes_len` / `scale_len`) with the per-tensor results of [`Plan::results`].
    pub fn host_tensor(
        &self,
        codes: Vec<u8>,
        scales: Vec<u8>,
        (amax, tensor_scale_inv): (f32, f32),
    ) -> QuantizedTensor {
        QuantizedTensor {
            format: self.format,
            block: self.block,
            usage: self.usage,
            rows: self.rows,
            cols: self.cols,
            padded_rows: self.padded_rows,
            padded_cols: self.padded_cols,
            codes,
            scales,
            amax,
            tensor_scale_inv,
            hadamard: self.mask,
        }
    }
}

fn check_nonempty(x: Dims) -> Result<()> {
    if x.rows == 0 || x.cols == 0 {
        return Err(KernelError::Unsupported(
            "empty tensors (use quant on the CPU)".into(),
        ));
    }
    // Grid y and the kernels' int indices.
    if x.rows > 65_535 * 64 - 64 || x.cols >= (1 << 30) {
        return Err(KernelError::Unsupported(format!(
            "shape {}x{} too large",
            x.rows, x.cols
        )));
    }
    Ok(())
}

/// The settings and key of a quantizer given for the `usage` side of a plan (its settings
/// were validated by [`Quantizer::new`]; this checks only that it was made for this side).
fn side_of(qz: &Quantizer, usage: Usage) -> Result<(&OperandQuant, RngKey)> {
    if qz.usage() != usage {
        return Err(invalid(format!(
            "a {:?} quantizer given for the {usage:?} copy",
            qz.usage()
        )));
    }
    Ok((qz.spec(), qz.key()))
}

fn nvfp4_side(x: Dims, usage: Usage, qz: &Quantizer) -> Result<Side> {
    let (q, key) = side_of(qz, usage)?;
    let QuantFormat::Nvfp4 { four_over_six } = q.format else {
        return Err(invalid(format!(
            "nvfp4 quantizer called with format {:?}",
            q.format
        )));
    };
    let tile = q.block == BlockShape::Tile16;
    let sr = q.rounding == RoundingMode::Stochastic;
    if four_over_six.is_some() {
        return Err(KernelError::Unsupported("NVFP4 Four Over Six".into()));
    }
    let (rows, cols) = stored_shape(x.rows, x.cols, usage);
    let mask = quant::hadamard::sign_mask(q.rht, key);
    if mask.is_some() && cols % 16 != 0 {
        return Err(invalid(format!(
            "the Hadamard transform needs the transformed dimension (rows = {}) to be a multiple of 16",
            x.rows
        )));
    }
    let padded_cols = cols.div_ceil(16) * 16;
    let padded_rows = if tile { rows.div_ceil(16) * 16 } else { rows };
    Ok(Side {
        usage,
        format: q.format,
        block: q.block,
        key,
        sr,
        tile,
        mask,
        prescale: false,
        rows,
        cols,
        padded_rows,
        padded_cols,
        codes_len: padded_rows * padded_cols / 2,
        scale_len: padded_rows * padded_cols / 16,
    })
}

fn mx_side(x: Dims, usage: Usage, qz: &Quantizer) -> Result<(Side, MxElement, ScaleRule)> {
    let (q, key) = side_of(qz, usage)?;
    let QuantFormat::Mx {
        element,
        rule,
        sr_prescale,
    } = q.format
    else {
        return Err(invalid(format!("mx quantizer called with {:?}", q.format)));
    };
    let sr = q.rounding == RoundingMode::Stochastic;
    if matches!(element, MxElement::E2M3 | MxElement::E3M2) {
        return Err(KernelError::Unsupported(
            "MXFP6 (E2M3 / E3M2) elements".into(),
        ));
    }
    let (rows, cols) = stored_shape(x.rows, x.cols, usage);
    let mask = quant::hadamard::sign_mask(q.rht, key);
    if mask.is_some() && cols % 16 != 0 {
        return Err(invalid(format!(
            "the Hadamard transform needs the transformed dimension (rows = {}) to be a multiple of 16",
            x.rows
        )));
    }
    let padded_cols = cols.div_ceil(32) * 32;
    let side = Side {
        usage,
        format: q.format,
        block: q.block,
        key,
        sr,
        tile: false,
        mask,
        prescale: sr_prescale,
        rows,
        cols,
        padded_rows: rows,
        padded_cols,
        codes_len: rows * element.packed_len(padded_cols),
        scale_len: rows * padded_cols / 32,
    };
    Ok((side, element, rule))
}

fn fp8_side(x: Dims, usage: Usage, qz: &Quantizer) -> Result<(Side, Fp8Element, Fp8Scaling)> {
    let (q, key) = side_of(qz, usage)?;
    let QuantFormat::Fp8 { element, scaling } = q.format else {
        return Err(invalid(format!("fp8 quantizer called with {:?}", q.format)));
    };
    let (rows, cols) = stored_shape(x.rows, x.cols, usage);
    let side = Side {
        usage,
        format: q.format,
        block: q.block,
        key,
        sr: q.rounding == RoundingMode::Stochastic,
        tile: false,
        mask: None,
        prescale: false,
        rows,
        cols,
        padded_rows: rows,
        padded_cols: cols,
        codes_len: rows * cols,
        scale_len: 0,
    };
    Ok((side, element, scaling))
}

// ------------------------------------------------------------------------------------------
// Plans
// ------------------------------------------------------------------------------------------

/// The quantization kernel and its arguments (device pointers still zero until
/// [`Plan::set_pointers`]).
#[derive(Clone, Copy, Debug)]
pub enum Args {
    /// `nb_nvfp4_quantize`.
    Nvfp4(Nvfp4Args),
    /// `nb_mx_quantize`.
    Mx(MxArgs),
    /// `nb_fp8_quantize`.
    Fp8(Fp8Args),
}

/// The amax pass that runs before the quantization kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AmaxPass {
    /// None (MX computes its amax inside the quantization kernel).
    None,
    /// `nb_amax` over the flat input (grid-stride over `rows * cols / 4` float4s).
    Plain,
    /// `nb_amax_rht_col` (plain and post-RHT columnwise amax) with [`Plan::amax_grid`].
    RhtCol,
}

/// Everything about one quantization except the buffers: validated settings, kernel
/// arguments, launch grids and output shapes.
#[derive(Clone, Copy, Debug)]
pub struct Plan {
    /// Input shape.
    pub dims: Dims,
    /// Quantization kernel arguments.
    pub args: Args,
    /// The amax pass.
    pub amax_pass: AmaxPass,
    /// Grid of `nb_amax_rht_col` (256 threads per block).
    pub amax_grid: (u32, u32, u32),
    /// Grid of the quantization kernel (256 threads per block).
    pub grid: (u32, u32, u32),
    /// The rowwise copy, if requested.
    pub row: Option<Side>,
    /// The columnwise copy, if requested.
    pub col: Option<Side>,
    /// FP8 delayed scaling: the amax goes into the caller's `QuantState`.
    pub delayed_fp8: bool,
}

/// Device (or, in the emulation test, host) addresses of one output copy.
#[derive(Clone, Copy, Debug, Default)]
pub struct OutPtrs {
    /// Codes.
    pub codes: u64,
    /// Scales (0 for per-tensor formats).
    pub scales: u64,
}

fn tile_grid(rows: usize, cols: usize, align: usize) -> (u32, u32, u32) {
    let gx = cols.div_ceil(align) * align;
    let gy = rows.div_ceil(align) * align;
    (gx.div_ceil(64) as u32, gy.div_ceil(64) as u32, 1)
}

impl Plan {
    /// Writes the buffer addresses into the kernel arguments: the input, the 4-word amax
    /// buffer, the FP8 meta buffer (2 floats; ignored otherwise) and each output copy.
    pub fn set_pointers(&mut self, x: u64, amax: u64, meta: u64, row: OutPtrs, col: OutPtrs) {
        match &mut self.args {
            Args::Nvfp4(a) => {
                a.x = x;
                a.amax = amax;
                (a.row_codes, a.row_scales, a.col_codes, a.col_scales) =
                    (row.codes, row.scales, col.codes, col.scales);
            }
            Args::Mx(a) => {
                a.x = x;
                a.amax = amax;
                (a.row_codes, a.row_scales, a.col_codes, a.col_scales) =
                    (row.codes, row.scales, col.codes, col.scales);
            }
            Args::Fp8(a) => {
                a.x = x;
                a.amax = amax;
                a.meta = meta;
                (a.row_codes, a.col_codes) = (row.codes, col.codes);
            }
        }
    }

    /// `(amax, tensor_scale_inv)` of the rowwise and columnwise copies from what the kernels
    /// left in the amax buffer (and, for FP8, the meta buffer `[scale, scale_inv]`).
    ///
    /// # Errors
    /// [`KernelError::NonFinite`] when NVFP4 / MX input (or its Hadamard transform) holds NaN
    /// or ±Inf, as `quant` rejects it.
    #[allow(clippy::type_complexity)]
    pub fn results(
        &self,
        bits: &[u32],
        meta: &[f32],
    ) -> Result<(Option<(f32, f32)>, Option<(f32, f32)>)> {
        let finite = |amax_bits: u32, nan_flag: u32| -> Result<f32> {
            if nan_flag != 0 {
                Err(KernelError::NonFinite(0x7FC0_0000))
            } else if amax_bits >= 0x7F80_0000 {
                Err(KernelError::NonFinite(amax_bits))
            } else {
                Ok(f32::from_bits(amax_bits))
            }
        };
        match self.args {
            Args::Nvfp4(_) => {
                let plain = finite(bits[0], bits[1])?;
                let col = if self.amax_pass == AmaxPass::RhtCol {
                    finite(bits[2], bits[3])?
                } else {
                    plain
                };
                let with_scale = |a: f32| (a, GlobalScale::from_amax(a).s_dec);
                let col_amax = if self.col.is_some_and(|c| c.mask.is_some()) {
                    col
                } else {
                    plain
                };
                Ok((
                    self.row.map(|_| with_scale(plain)),
                    self.col.map(|_| with_scale(col_amax)),
                ))
            }
            Args::Mx(_) => {
                let f = |s: &Side| {
                    if s.prescale {
                        quant::mx::PRESCALE_INV
                    } else {
                        1.0
                    }
                };
                let row = match &self.row {
                    Some(s) => Some((finite(bits[0], bits[1])?, f(s))),
                    None => None,
                };
                let col = match &self.col {
                    Some(s) => Some((finite(bits[2], bits[3])?, f(s))),
                    None => None,
                };
                Ok((row, col))
            }
            Args::Fp8(_) => {
                let amax = f32::from_bits(bits[0]);
                Ok((
                    self.row.map(|_| (amax, meta[1])),
                    self.col.map(|_| (amax, meta[1])),
                ))
            }
        }
    }
}

/// Plans an NVFP4 quantization of the rowwise copy, the columnwise copy, or both (the fused
/// cast+transpose).
pub fn plan_nvfp4(dims: Dims, row: Option<&Quantizer>, col: Option<&Quantizer>) -> Result<Plan> {
    check_nonempty(dims)?;
    let row = row
        .map(|q| nvfp4_side(dims, Usage::Rowwise, q))
        .transpose()?;
    let col = col
        .map(|q| nvfp4_side(dims, Usage::Columnwise, q))
        .transpose()?;
    if row.is_none() && col.is_none() {
        return Err(invalid("nothing to quantize"));
    }
    let mut a = Nvfp4Args {
        rows: dims.rows as i32,
        cols: dims.cols as i32,
        flags: if dims.cols.is_multiple_of(4) { VEC4 } else { 0 },
        ..Default::default()
    };
    if let Some(s) = &row {
        a.flags |= ROW | if s.tile { ROW_TILE } else { 0 } | if s.sr { ROW_SR } else { 0 };
        (a.row_seed, a.row_stream) = (s.key.seed, s.key.stream);
    }
    let mut amax_pass = AmaxPass::Plain;
    if let Some(s) = &col {
        a.flags |= COL | if s.tile { COL_TILE } else { 0 } | if s.sr { COL_SR } else { 0 };
        if let Some(m) = s.mask {
            a.flags |= COL_RHT;
            a.rht_mask = m as u32;
            amax_pass = AmaxPass::RhtCol;
        }
        (a.col_seed, a.col_stream) = (s.key.seed, s.key.stream);
    }
    Ok(Plan {
        dims,
        args: Args::Nvfp4(a),
        amax_pass,
        amax_grid: (
            dims.cols.div_ceil(32) as u32,
            dims.rows.div_ceil(128) as u32,
            1,
        ),
        grid: tile_grid(dims.rows, dims.cols, 16),
        row,
        col,
        delayed_fp8: false,
    })
}

/// Plans an MX quantization (rowwise, columnwise or both; both copies must use the same
/// element format and scale rule).
pub fn plan_mx(dims: Dims, row: Option<&Quantizer>, col: Option<&Quantizer>) -> Result<Plan> {
    check_nonempty(dims)?;
    let row = row.map(|q| mx_side(dims, Usage::Rowwise, q)).transpose()?;
    let col = col
        .map(|q| mx_side(dims, Usage::Columnwise, q))
        .transpose()?;
    let (element, rule) = match (&row, &col) {
        (Some(r), Some(c)) if (r.1, r.2) != (c.1, c.2) => {
            return Err(KernelError::Unsupported(
                "a fused MX cast+transpose with different elements or scale rules".into(),
            ))
        }
        (Some(r), _) => (r.1, r.2),
        (None, Some(c)) => (c.1, c.2),
        (None, None) => return Err(invalid("nothing to quantize")),
    };
    let mut a = MxArgs {
        rows: dims.rows as i32,
        cols: dims.cols as i32,
        flags: if dims.cols.is_multiple_of(4) { VEC4 } else { 0 },
        elem: mx_elem(element)?,
        rule: match rule {
            ScaleRule::Floor => 0,
            ScaleRule::Rceil => 1,
            ScaleRule::Ceil => 2,
            ScaleRule::Even => 3,
        },
        ..Default::default()
    };
    if let Some((s, _, _)) = &row {
        a.flags |=
            ROW | if s.sr { ROW_SR } else { 0 } | if s.prescale { MX_ROW_PRESCALE } else { 0 };
        (a.row_seed, a.row_stream) = (s.key.seed, s.key.stream);
    }
    if let Some((s, _, _)) = &col {
        a.flags |=
            COL | if s.sr { COL_SR } else { 0 } | if s.prescale { MX_COL_PRESCALE } else { 0 };
        if let Some(m) = s.mask {
            a.flags |= COL_RHT;
            a.rht_mask = m as u32;
        }
        (a.col_seed, a.col_stream) = (s.key.seed, s.key.stream);
    }
    Ok(Plan {
        dims,
        args: Args::Mx(a),
        amax_pass: AmaxPass::None,
        amax_grid: (1, 1, 1),
        grid: tile_grid(dims.rows, dims.cols, 32),
        row: row.map(|r| r.0),
        col: col.map(|c| c.0),
        delayed_fp8: false,
    })
}

/// Plans a quantization of the rowwise copy (`row`, a rowwise [`Quantizer`]), the columnwise
/// copy (`col`) or both (the fused cast+transpose; both of one format family): the one
/// dispatch on the format. `state` is used by delayed FP8 scaling only.
pub fn plan(
    dims: Dims,
    row: Option<&Quantizer>,
    col: Option<&Quantizer>,
    state: &mut QuantState,
) -> Result<Plan> {
    let Some(first) = row.or(col) else {
        return Err(invalid("nothing to quantize"));
    };
    let family = |q: &Quantizer| std::mem::discriminant(&q.spec().format);
    if row.zip(col).is_some_and(|(r, c)| family(r) != family(c)) {
        return Err(KernelError::Unsupported(format!(
            "a fused cast+transpose of {:?} and {:?}",
            row.map(|q| q.spec().format),
            col.map(|q| q.spec().format)
        )));
    }
    match first.spec().format {
        QuantFormat::Nvfp4 { .. } => plan_nvfp4(dims, row, col),
        QuantFormat::Mx { .. } => plan_mx(dims, row, col),
        QuantFormat::Fp8 { .. } => plan_fp8(dims, row, col, state),
        f => Err(KernelError::Unsupported(format!(
            "{f:?} operands are not quantized on the GPU"
        ))),
    }
}

/// Plans a per-tensor FP8 cast (rowwise, columnwise or both; both copies share the tensor's
/// scale and must use the same format). Delayed scaling casts with `state.scale()`.
pub fn plan_fp8(
    dims: Dims,
    row: Option<&Quantizer>,
    col: Option<&Quantizer>,
    state: &mut QuantState,
) -> Result<Plan> {
    check_nonempty(dims)?;
    let row = row.map(|q| fp8_side(dims, Usage::Rowwise, q)).transpose()?;
    let col = col
        .map(|q| fp8_side(dims, Usage::Columnwise, q))
        .transpose()?;
    let (element, scaling) = match (&row, &col) {
        (Some(r), Some(c)) if r.0.format != c.0.format => {
            return Err(KernelError::Unsupported(
                "a fused FP8 cast+transpose with two formats".into(),
            ))
        }
        (Some(r), _) => (r.1, r.2),
        (None, Some(c)) => (c.1, c.2),
        (None, None) => return Err(invalid("nothing to quantize")),
    };
    let mut a = Fp8Args {
        rows: dims.rows as i32,
        cols: dims.cols as i32,
        flags: if dims.cols.is_multiple_of(4) { VEC4 } else { 0 },
        elem: fp8_elem(element),
        ..Default::default()
    };
    let delayed = match scaling {
        Fp8Scaling::Current { power_of_two } => {
            if power_of_two {
                a.flags |= FP8_SCALE_POW2;
            }
            false
        }
        Fp8Scaling::Delayed { history_len, .. } => {
            if history_len == 0 {
                return Err(invalid("delayed scaling needs history_len >= 1"));
            }
            let have = state.amax_history().len();
            if have == 0 {
                let scale = state.scale();
                *state = QuantState::with_history_len(history_len);
                state.set_scale(scale);
            } else if have != history_len {
                return Err(invalid(format!(
                    "QuantState holds an amax history of {have} slots but the operand asks for {history_len}"
                )));
            }
            a.flags |= FP8_SCALE_HOST;
            a.host_scale = state.scale();
            true
        }
    };
    if let Some((s, _, _)) = &row {
        a.flags |= ROW | if s.sr { ROW_SR } else { 0 };
        (a.row_seed, a.row_stream) = (s.key.seed, s.key.stream);
    }
    if let Some((s, _, _)) = &col {
        a.flags |= COL | if s.sr { COL_SR } else { 0 };
        (a.col_seed, a.col_stream) = (s.key.seed, s.key.stream);
    }
    Ok(Plan {
        dims,
        args: Args::Fp8(a),
        amax_pass: AmaxPass::Plain,
        amax_grid: (1, 1, 1),
        grid: tile_grid(dims.rows, dims.cols, 1),
        row: row.map(|r| r.0),
        col: col.map(|c| c.0),
        delayed_fp8: delayed,
    })
}

/// The kernels' code of an MX element format.
pub fn mx_elem(e: MxElement) -> Result<i32> {
    match e {
        MxElement::E4M3 => Ok(0),
        MxElement::E5M2 => Ok(1),
        MxElement::E2M1 => Ok(2),
        _ => Err(KernelError::Unsupported("MXFP6 elements".into())),
    }
}

/// The kernels' code of an FP8 element format.
pub fn fp8_elem(e: Fp8Element) -> i32 {
    match e {
        Fp8Element::E4M3 => 0,
        Fp8Element::E5M2 => 1,
    }
}
