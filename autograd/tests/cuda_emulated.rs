//! The CUDA training kernels (`kernels-cuda/cuda/*.cu`), run on the CPU through
//! `kernels_cuda::emu` and driven through autograd's [`Backend`] trait exactly as on a GPU,
//! compared with autograd's CPU ops (through the public `Graph` API) on the same inputs.
//!
//! Bit for bit: every op whose CPU order of operations the kernels mirror (elementwise,
//! column sums, f64 sums, BF16 rounding, GELU / SiLU / SwiGLU with the Cephes exp, RMSNorm /
//! LayerNorm with their 16-lane reductions and row chunking, RoPE, embedding, cross-entropy,
//! gradient norm, AdamW), on sizes that take both the CPU's single-task and parallel paths.
//! Within a bound: attention and the f32 GEMM, whose CPU versions use quant's blocked sgemm
//! (bounds derived in `kernel_checks`), and a tiny model's whole training step.
//! `cuda_gpu.rs` runs the same checks on a GPU.
//!
//! Without a C++20 compiler the tests print `SKIP` and return.

mod kernel_checks;

use autograd::backend::{Backend, DeviceBackend, KernelBackend};
use kernel_checks as k;
use kernels_cuda::emu::{Emu, EmuError};
use quant::{OperandQuant, QuantizerBackend, RngKey, Usage};

fn emu(test: &str) -> Option<KernelBackend<&'static Emu>> {
    match Emu::shared() {
        Ok(e) => Some(KernelBackend::with_launcher(e, "cuda-emulated")),
        Err(e @ (EmuError::NoCompiler(_) | EmuError::NoCxx20(..))) => {
            eprintln!("SKIP {test}: {e}");
            None
        }
        Err(e) => panic!("{test}: {e}"),
    }
}

macro_rules! on_emu {
    ($name:ident, $check:expr) => {
        #[test]
        fn $name() {
            if let Some(e) = emu(stringify!($name)) {
                assert_eq!(e.name(), "cuda-emulated");
                $check(&e);
            }
        }
    };
}

on_emu!(elementwise_and_reductions_are_bit_exact, |e| {
    k::elementwise_and_reductions_are_bit_exact(e, &k::SHAPES)
});
on_emu!(activations_are_bit_exact, k::activations_are_bit_exact);
on_emu!(norms_are_bit_exact, |e| k::norms_are_bit_exact(
    e,
    &[(3, 20), (7, 48), (300, 128), (5, 33)]
));
on_emu!(rope_embedding_cross_entropy_are_bit_exact, |e| {
    k::rope_embedding_cross_entropy_are_bit_exact(e, true, &[(6, 37), (40, 1000)]);
    // the GPU's relaxed (logf within 1 ulp) comparison accepts exact results too
    k::rope_embedding_cross_entropy_are_bit_exact(e, false, &[(6, 37)]);
});
on_emu!(
    grad_norm_and_adamw_match_optim_bit_for_bit,
    k::grad_norm_and_adamw_match_optim_bit_for_bit
);
on_emu!(
    gemm_within_accumulation_bound,
    k::gemm_within_accumulation_bound
);
on_emu!(
    attention_within_derived_bounds,
    k::attention_within_derived_bounds
);
on_emu!(bf16_attention_matches_cpu, |e| {
    k::bf16_attention_matches_cpu(e, &[(2, 70, 40)])
});
on_emu!(bad_input_is_a_typed_error, k::bad_input_is_a_typed_error);
/// The emulated CUDA device as a `Device::Cuda` backend for `ParamStore::to_device`.
fn emu_device(test: &str) -> Option<std::sync::Arc<DeviceBackend>> {
    emu(test)?;
    Some(DeviceBackend::emulated(Emu::shared().unwrap()).unwrap())
}

#[test]
fn tiny_model_graph_step_on_device_matches_cpu() {
    if let Some(d) = emu_device("tiny_model_graph_step_on_device_matches_cpu") {
        k::tiny_model_graph_step_on_device_matches_cpu(&d);
    }
}

#[test]
fn quantized_linear_matches_cpu_layer() {
    if let Some(d) = emu_device("quantized_linear_matches_cpu_layer") {
        k::quant_linear::quantized_linear_matches_cpu_layer(&d);
    }
}

#[test]
fn device_optimizer_step_matches_optim() {
    if let Some(d) = emu_device("device_optimizer_step_matches_optim") {
        k::optimizer::device_optimizer_step_matches_optim(&d);
    }
}

#[test]
fn matmul_matches_cpu_within_bound() {
    if let Some(d) = emu_device("matmul_matches_cpu_within_bound") {
        k::matmul::matmul_matches_cpu_within_bound(&d);
    }
}

#[test]
fn pool_reuses_device_buffers() {
    if let Some(d) = emu_device("pool_reuses_device_buffers") {
        k::pool::pool_reuses_device_buffers(&d);
    }
}

#[test]
fn cached_attention_within_reference_bound() {
    if let Some(d) = emu_device("cached_attention_within_reference_bound") {
        k::cached_attention::cached_attention_within_reference_bound(&d);
    }
}

#[test]
fn layout_ops_are_bit_exact() {
    if let Some(d) = emu_device("layout_ops_are_bit_exact") {
        k::layout_ops_are_bit_exact(&d);
    }
}

#[test]
fn device_op_profile_records_each_op() {
    if let Some(d) = emu_device("device_op_profile_records_each_op") {
        k::device_op_profile_records_each_op(&d);
    }
}

#[test]
fn device_graph_boundary() {
    if let Some(d) = emu_device("device_graph_boundary") {
        k::device_graph_boundary(&d);
    }
}

/// The NVFP4 quantizer kernels (`nb_amax` / `nb_amax_rht_col`, `nb_nvfp4_quantize`,
/// `nb_nvfp4_dequantize`) as the emulated linear layer's quantizer; every operand's codes,
/// scales, amax and factor are asserted equal to quant's (the CPU linear's) on the same input,
/// and its dequantized values to quant's.
fn emu_nvfp4(
    x: &[f32],
    rows: usize,
    cols: usize,
    usage: Usage,
    q: &OperandQuant,
    key: RngKey,
) -> Vec<f32> {
    let e = Emu::shared().unwrap();
    let qz = quant::Quantizer::new(*q, usage).unwrap().with_key(key);
    let m = quant::MatRef::new(x, rows, cols).unwrap();
    let t = e.quantize(&qz, m, &mut quant::QuantState::new()).unwrap();
    let cpu = k::cpu_quantizer(x, rows, cols, usage, q, key);
    assert_eq!(
        t, cpu,
        "NVFP4 operand {rows}x{cols} {usage:?} {key:?}: emulated kernels vs quant"
    );
    let deq = e.dequantize(&t).unwrap();
    k::same_bits("dequantized NVFP4 operand", &deq, &cpu.dequantize());
    deq
}

on_emu!(tiny_model_nvfp4_step_matches_the_graph_step, |e| {
    k::tiny_model_nvfp4_step_matches_the_graph_step(e, &emu_nvfp4)
});
