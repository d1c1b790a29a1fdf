//! The quantizer kernels as a GEMM operand former on any [`Launcher`] (the GPU or the
//! emulator): [`QuantOps::fake_quantize`] quantizes a device tensor with a validated
//! [`quant::Quantizer`] (planned by [`abi::plan`], the same launches as
//! [`QuantizerBackend`](quant::QuantizerBackend) for [`GpuContext`](crate::GpuContext)) and
//! dequantizes the copy without its per-tensor factor: the values of quant's
//! `Quantizer::fake_quantize_into` and its factor, bit for bit. autograd's device linear layer
//! multiplies these values with the f32 GEMM and applies the two factors as the GEMM's `alpha`,
//! as `quant::qgemm` does.
//!
//! ```no_run
//! # #[cfg(feature = "emu")] {
//! use kernels_cuda::emu::Emu;
//! use kernels_cuda::train::Launcher;
//! use kernels_cuda::train_quant::QuantOps;
//! use quant::{MatRef, OperandQuant, QuantState, Quantizer, Usage};
//! let emu = Emu::shared().expect("a C++20 compiler");
//! let host: Vec<f32> = (0..64).map(|i| i as f32 / 7.0).collect();
//! let x = emu.upload(&host).unwrap();
//! let mut v = emu.zeros::<f32>(64).unwrap();
//! let q = Quantizer::new(OperandQuant::nvfp4(), Usage::Rowwise).unwrap();
//! let f = emu.fake_quantize(&q, &x, (4, 16), &mut QuantState::new(), &mut v).unwrap();
//! let mut want = vec![0.0; 64];
//! let fw = q.fake_quantize_into(MatRef::new(&host, 4, 16).unwrap(), &mut QuantState::new(), &mut want).unwrap();
//! assert_eq!((v.to_vec(), f), (want, fw));
//! # }
//! ```

use quant::{QuantState, Quantizer, Usage};

use crate::abi::{self, AmaxPass, Args, Dims, OutPtrs};
use crate::train::{Arg, Launcher};
use crate::{KernelError, Result};

/// Quantization of GEMM operands on a [`Launcher`].
pub trait QuantOps: Launcher {
    /// Quantizes the row-major `[rows, cols]` tensor `x` with `q` (its usage picks the rowwise
    /// or the columnwise copy; its key the random bits) and writes the copy's values without
    /// the per-tensor factor to `out`, in the stored layout (rowwise `[rows, cols]`,
    /// columnwise `[cols, rows]`); returns the factor (NVFP4 `S_dec`, MX 1 or 4/3, FP8
    /// `1 / scale`). `state`: FP8's, as quant's quantizer keeps it (delayed scaling casts with
    /// its scale and records the amax; every FP8 cast sets its last amax and scale).
    ///
    /// # Errors
    /// [`KernelError::InvalidArgument`] for lengths that do not match the shape;
    /// [`KernelError::Unsupported`] for what the GPU quantizers do not run (F32 / BF16
    /// "quantizers", Four Over Six, MXFP6, empty tensors); [`KernelError::NonFinite`] for NaN or
    /// ±Inf input to NVFP4 / MX (as quant rejects it); the device's allocation errors.
    fn fake_quantize(
        &self,
        q: &Quantizer,
        x: &Self::Buf<f32>,
        dims: (usize, usize),
        state: &mut QuantState,
        out: &mut Self::Buf<f32>,
    ) -> Result<f32>;

    /// Quantizes `x` as [`Self::fake_quantize`] does and returns the copy's values without
    /// the per-tensor factor as BF16 bits (exact: at most 8 significant bits above 2⁻¹³³),
    /// stored `[outer, padded K]` with the row length (leading dimension) alongside, and the
    /// factor: the tensor-core GEMM's operand. NVFP4 and MX decode straight to BF16
    /// (`nb_nvfp4_to_bf16`, `nb_mx_to_bf16`: the bits of [`Self::fake_quantize`]'s values
    /// rounded to BF16); FP8 dequantizes, then converts (`nb_f32_to_bf16`).
    ///
    /// # Errors
    /// As [`Self::fake_quantize`].
    fn quantize_bf16(
        &self,
        q: &Quantizer,
        x: &Self::Buf<f32>,
        dims: (usize, usize),
        state: &mut QuantState,
    ) -> Result<(Self::Buf<u16>, usize, f32)> {
        let p = self.quantize_bf16_start(q, x, dims, state)?;
        self.quantize_bf16_finish(p, state)
    }

    /// The first half of [`Self::quantize_bf16`]: plans and launches every kernel (the amax
    /// pass, the quantization, the BF16 decode) without waiting for the device;
    /// [`Self::quantize_bf16_finish`] then copies the amax back (one synchronisation) for the
    /// factor, the non-finite check and FP8's state. Operands started together and finished
    /// after the last start synchronise once between them (the later copies find the queue
    /// empty). `state` must not change in between.
    ///
    /// # Errors
    /// As [`Self::fake_quantize`], except the non-finite check, which
    /// [`Self::quantize_bf16_finish`] reports.
    fn quantize_bf16_start(
        &self,
        q: &Quantizer,
        x: &Self::Buf<f32>,
        dims: (usize, usize),
        state: &mut QuantState,
    ) -> Result<PendingBf16<Self>>;

    /// The second half of [`Self::quantize_bf16`] (see [`Self::quantize_bf16_start`]).
    ///
    /// # Errors
    /// [`KernelError::NonFinite`] for NaN or ±Inf input to NVFP4 / MX; copy failures.
    fn quantize_bf16_finish(
        &self,
        p: PendingBf16<Self>,
        state: &mut QuantState,
    ) -> Result<(Self::Buf<u16>, usize, f32)>;

    /// Quantizes `x` as [`Self::fake_quantize`] does and returns the quantized copy in the
    /// launcher's buffers (codes and scales laid out as [`quant::QuantizedTensor`]'s), with its
    /// plan side and per-tensor results; `state` as there. The emulator's
    /// [`QuantizerBackend`](quant::QuantizerBackend) downloads it with
    /// [`abi::Side::host_tensor`].
    ///
    /// # Errors
    /// As [`Self::fake_quantize`].
    fn quantize_to_bufs(
        &self,
        q: &Quantizer,
        x: &Self::Buf<f32>,
        dims: (usize, usize),
        state: &mut QuantState,
    ) -> Result<QuantBufs<Self>>;
}

/// A quantized copy in a [`Launcher`]'s buffers ([`QuantOps::quantize_to_bufs`]).
pub struct QuantBufs<L: Launcher + ?Sized> {
    /// Packed codes (`side.codes_len` bytes).
    pub codes: L::Buf<u8>,
    /// Block scales (`side.scale_len` bytes; empty for per-tensor formats).
    pub scales: L::Buf<u8>,
    /// The planned side: shape, padding and format of the copy.
    pub side: abi::Side,
    /// The kernel arguments it was quantized with.
    pub args: Args,
    /// `(amax, tensor_scale_inv)`: the per-tensor results.
    pub results: (f32, f32),
}

/// A quantization launched but not read back ([`QuantOps::quantize_bf16_start`]).
pub struct PendingBf16<L: Launcher + ?Sized> {
    quant: Launched<L>,
    out: L::Buf<u16>,
    ld: usize,
}

/// A quantization whose kernels are launched: its buffers (results not known yet), the amax
/// and FP8 meta buffers the kernels write, and the plan.
struct Launched<L: Launcher + ?Sized> {
    bufs: QuantBufs<L>,
    amax: L::Buf<u32>,
    meta: L::Buf<f32>,
    plan: abi::Plan,
}

fn check_len(what: &str, got: usize, want: usize) -> Result<()> {
    if got != want {
        return Err(KernelError::InvalidArgument(format!(
            "fake_quantize: {what} has {got} elements, expected {want}"
        )));
    }
    Ok(())
}

/// `rows · cols`, checked against overflow.
fn elements(rows: usize, cols: usize) -> Result<usize> {
    rows.checked_mul(cols)
        .ok_or_else(|| KernelError::InvalidArgument(format!("{rows} x {cols} overflows")))
}

impl<L: Launcher + ?Sized> QuantOps for L {
    fn quantize_to_bufs(
        &self,
        q: &Quantizer,
        x: &Self::Buf<f32>,
        dims: (usize, usize),
        state: &mut QuantState,
    ) -> Result<QuantBufs<Self>> {
        let l = launch_quant(self, q, x, dims, state)?;
        finish_quant(self, l, state)
    }

    fn fake_quantize(
        &self,
        q: &Quantizer,
        x: &Self::Buf<f32>,
        (rows, cols): (usize, usize),
        state: &mut QuantState,
        out: &mut Self::Buf<f32>,
    ) -> Result<f32> {
        let n = elements(rows, cols)?;
        check_len("x", self.len(x), n)?;
        check_len("out", self.len(out), n)?;
        let bufs = self.quantize_to_bufs(q, x, (rows, cols), state)?;
        dequantize_f32(self, &bufs, out)?;
        Ok(bufs.results.1)
    }

    fn quantize_bf16_start(
        &self,
        q: &Quantizer,
        x: &Self::Buf<f32>,
        (rows, cols): (usize, usize),
        state: &mut QuantState,
    ) -> Result<PendingBf16<Self>> {
        let n = elements(rows, cols)?;
        let quant = launch_quant(self, q, x, (rows, cols), state)?;
        let side = quant.bufs.side;
        let (sr, spc) = (side.rows, side.padded_cols);
        let (pc, ps) = (self.ptr(&quant.bufs.codes), self.ptr(&quant.bufs.scales));
        let padded = elements(sr, spc)?;
        let (out, ld) = match quant.bufs.args {
            Args::Nvfp4(_) | Args::Mx(_) => {
                let out = self.zeros::<u16>(padded)?;
                let (r, c) = (i32_of(sr)?, i32_of(spc)?);
                let po = self.ptr(&out);
                // SAFETY: the kernels read the `sr x spc` codes and scales the quantization
                // writes (sizes from the plan) and write `sr * spc` BF16 values to `out`.
                unsafe {
                    match quant.bufs.args {
                        Args::Mx(a) => self.launch(
                            "nb_mx_to_bf16",
                            (self.grid_stride_blocks(padded), 1),
                            &[
                                Arg::Ptr(pc),
                                Arg::Ptr(ps),
                                Arg::I32(r),
                                Arg::I32(c),
                                Arg::I32(a.elem),
                                Arg::Ptr(po),
                            ],
                        )?,
                        _ => self.launch(
                            "nb_nvfp4_to_bf16",
                            (self.grid_stride_blocks(padded / 2), 1),
                            &[
                                Arg::Ptr(pc),
                                Arg::Ptr(ps),
                                Arg::I32(r),
                                Arg::I32(c),
                                Arg::Ptr(po),
                            ],
                        )?,
                    }
                }
                (out, spc)
            }
            Args::Fp8(_) => {
                // the codes with factor 1 (no per-tensor result needed), then to BF16
                let mut vals = self.zeros::<f32>(n)?;
                dequantize_f32(self, &quant.bufs, &mut vals)?;
                let out = self.zeros::<u16>(n)?;
                let args = [
                    Arg::Ptr(self.ptr(&vals)),
                    Arg::U64(n as u64),
                    Arg::Ptr(self.ptr(&out)),
                ];
                // SAFETY: reads and writes n elements.
                unsafe { self.launch("nb_f32_to_bf16", (self.grid_stride_blocks(n), 1), &args)? };
                (out, side.cols)
            }
        };
        Ok(PendingBf16 { quant, out, ld })
    }

    fn quantize_bf16_finish(
        &self,
        p: PendingBf16<Self>,
        state: &mut QuantState,
    ) -> Result<(Self::Buf<u16>, usize, f32)> {
        let bufs = finish_quant(self, p.quant, state)?;
        Ok((p.out, p.ld, bufs.results.1))
    }
}

fn i32_of(v: usize) -> Result<i32> {
    i32::try_from(v).map_err(|_| KernelError::InvalidArgument(format!("{v} > i32")))
}

/// Dequantizes a quantized copy without its per-tensor factor into `out` (`rows · cols`
/// floats in the copy's stored layout, padding dropped).
fn dequantize_f32<L: Launcher + ?Sized>(
    l: &L,
    bufs: &QuantBufs<L>,
    out: &mut L::Buf<f32>,
) -> Result<()> {
    let side = &bufs.side;
    let (sr, sc, spc) = (side.rows, side.cols, side.padded_cols);
    let n = elements(sr, sc)?;
    check_len("out", l.len(out), n)?;
    let i = i32_of;
    let (pc, ps, po) = (l.ptr(&bufs.codes), l.ptr(&bufs.scales), l.ptr(out));
    // SAFETY: the dequantization kernels read the codes and scales the quantization wrote
    // (sizes from the plan) and write `rows * cols` floats to `out` (checked above).
    unsafe {
        match bufs.args {
            Args::Nvfp4(_) => l.launch(
                "nb_nvfp4_dequantize",
                (l.grid_stride_blocks(sr * spc / 2), 1),
                &[
                    Arg::Ptr(pc),
                    Arg::Ptr(ps),
                    Arg::I32(i(sr)?),
                    Arg::I32(i(sc)?),
                    Arg::I32(i(spc)?),
                    Arg::F32(1.0),
                    Arg::Ptr(po),
                ],
            ),
            Args::Mx(a) => l.launch(
                "nb_mx_dequantize",
                (l.grid_stride_blocks(n), 1),
                &[
                    Arg::Ptr(pc),
                    Arg::Ptr(ps),
                    Arg::I32(i(sr)?),
                    Arg::I32(i(sc)?),
                    Arg::I32(i(spc)?),
                    Arg::I32(a.elem),
                    Arg::F32(1.0),
                    Arg::Ptr(po),
                ],
            ),
            Args::Fp8(a) => l.launch(
                "nb_fp8_dequantize",
                (l.grid_stride_blocks(n), 1),
                &[
                    Arg::Ptr(pc),
                    Arg::U64(n as u64),
                    Arg::I32(a.elem),
                    Arg::F32(1.0),
                    Arg::Ptr(po),
                ],
            ),
        }
    }
}

/// Plans `q` on `x` and launches its amax pass and quantization kernel.
fn launch_quant<L: Launcher + ?Sized>(
    l: &L,
    q: &Quantizer,
    x: &L::Buf<f32>,
    (rows, cols): (usize, usize),
    state: &mut QuantState,
) -> Result<Launched<L>> {
    let n = elements(rows, cols)?;
    check_len("x", l.len(x), n)?;
    let (row, col) = match q.usage() {
        Usage::Rowwise => (Some(q), None),
        Usage::Columnwise => (None, Some(q)),
    };
    let mut plan = abi::plan(Dims { rows, cols }, row, col, state)?;
    let side = plan.row.or(plan.col).expect("one side planned");
    let codes = l.zeros::<u8>(side.codes_len)?;
    let scales = l.zeros::<u8>(side.scale_len)?;
    let amax = l.zeros::<u32>(4)?;
    let meta = l.zeros::<f32>(2)?;
    let o = OutPtrs {
        codes: l.ptr(&codes),
        scales: if side.scale_len > 0 {
            l.ptr(&scales)
        } else {
            0
        },
    };
    let (rp, cp) = match q.usage() {
        Usage::Rowwise => (o, OutPtrs::default()),
        Usage::Columnwise => (OutPtrs::default(), o),
    };
    let (px, pa) = (l.ptr(x), l.ptr(&amax));
    plan.set_pointers(px, pa, l.ptr(&meta), rp, cp);
    let kernel = match plan.args {
        Args::Nvfp4(_) => "nb_nvfp4_quantize",
        Args::Mx(_) => "nb_mx_quantize",
        Args::Fp8(_) => "nb_fp8_quantize",
    };
    // SAFETY: every pointer refers to a live buffer of the length the plan asks for (the
    // plan's sides size the outputs; amax has 4 words, meta 2 floats), and the argument
    // lists are the kernels' parameter lists (cuda/nvfp4.cu, mx.cu, fp8.cu).
    unsafe {
        match plan.amax_pass {
            AmaxPass::None => {}
            AmaxPass::Plain => l.launch(
                "nb_amax",
                (l.grid_stride_blocks(n.div_ceil(4)), 1),
                &[Arg::Ptr(px), Arg::U64(n as u64), Arg::Ptr(pa)],
            )?,
            AmaxPass::RhtCol => {
                let Args::Nvfp4(a) = plan.args else {
                    unreachable!("the RHT amax pass belongs to NVFP4 plans")
                };
                l.launch(
                    "nb_amax_rht_col",
                    (plan.amax_grid.0, plan.amax_grid.1),
                    &[
                        Arg::Ptr(px),
                        Arg::I32(a.rows),
                        Arg::I32(a.cols),
                        Arg::U64(a.rht_mask as u64),
                        Arg::Ptr(pa),
                    ],
                )?
            }
        }
        l.launch(kernel, (plan.grid.0, plan.grid.1), &[Arg::Quant(plan.args)])?;
    }
    let args = plan.args;
    Ok(Launched {
        bufs: QuantBufs {
            codes,
            scales,
            side,
            args,
            results: (0.0, 0.0),
        },
        amax,
        meta,
        plan,
    })
}

/// Copies a launched quantization's amax back (FP8: and its meta): the per-tensor results,
/// the non-finite check, FP8's state.
fn finish_quant<L: Launcher + ?Sized>(
    l: &L,
    launched: Launched<L>,
    state: &mut QuantState,
) -> Result<QuantBufs<L>> {
    let Launched {
        mut bufs,
        amax,
        meta,
        plan,
    } = launched;
    let bits = l.download(&amax)?;
    // only FP8 writes `[scale, scale_inv]` (a second copy back: its queue is empty by now)
    let m = match plan.args {
        Args::Fp8(_) => l.download(&meta)?,
        _ => vec![0.0; 2],
    };
    let (rv, cv) = plan.results(&bits, &m)?;
    if let Args::Fp8(a) = plan.args {
        let amax = f32::from_bits(bits[0]);
        if plan.delayed_fp8 {
            state.record_amax(amax);
        }
        let scale = if plan.delayed_fp8 { a.host_scale } else { m[0] };
        *state = QuantState::restore(state.amax_history().to_vec(), state.scale(), amax, scale);
    }
    bufs.results = rv.or(cv).expect("one side planned");
    Ok(bufs)
}
