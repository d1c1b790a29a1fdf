//! The checks of `cuda_emulated.rs` on a real GPU through [`CudaBackend`] (the PTX JIT-loaded
//! by the driver), plus training-sized shapes. Cross-entropy is compared within CUDA `logf`'s
//! 1-ulp bound instead of bit for bit (see `kernel_checks`). Without a CUDA driver and a
//! compute capability 9.0+ GPU each test prints `SKIP` and returns; `kernels-cuda/gpu-check.sh`
//! treats a skip on a GPU machine as a failure.

mod kernel_checks;

use std::sync::OnceLock;

use autograd::backend::{BackendError, CudaBackend};
use kernel_checks as k;

fn gpu(test: &str) -> Option<&'static CudaBackend> {
    static GPU: OnceLock<Result<CudaBackend, String>> = OnceLock::new();
    match GPU.get_or_init(|| match CudaBackend::new() {
        Ok(b) => Ok(b),
        Err(e @ BackendError::NoDevice { .. }) => Err(e.to_string()),
        Err(e) => panic!("opening the CUDA backend: {e}"),
    }) {
        Ok(b) => {
            eprintln!("GPU: {}", b.gpu().name());
            Some(b)
        }
        Err(why) => {
            eprintln!("SKIP {test}: {why}");
            None
        }
    }
}

macro_rules! on_gpu {
    ($name:ident, $check:expr) => {
        #[test]
        fn $name() {
            if let Some(g) = gpu(stringify!($name)) {
                $check(g);
            }
        }
    };
}

on_gpu!(elementwise_and_reductions_are_bit_exact, |g| {
    k::elementwise_and_reductions_are_bit_exact(g, &[(3, 20), (7, 48), (300, 128), (4096, 768)])
});
on_gpu!(activations_are_bit_exact, k::activations_are_bit_exact);
on_gpu!(norms_are_bit_exact, |g| k::norms_are_bit_exact(
    g,
    &[(3, 20), (300, 128), (5, 33), (4096, 768)]
));
on_gpu!(rope_embedding_cross_entropy_within_logf_bound, |g| {
    k::rope_embedding_cross_entropy_are_bit_exact(g, false, &[(6, 37), (40, 1000), (512, 32768)])
});
on_gpu!(
    grad_norm_and_adamw_match_optim_bit_for_bit,
    k::grad_norm_and_adamw_match_optim_bit_for_bit
);
on_gpu!(
    gemm_within_accumulation_bound,
    k::gemm_within_accumulation_bound
);
on_gpu!(
    attention_within_derived_bounds,
    k::attention_within_derived_bounds
);
// BF16 attention runs on the tensor cores: a test shape and a training one (the `large`
// preset's head size and sequence length)
on_gpu!(bf16_attention_matches_cpu, |g| {
    k::bf16_attention_matches_cpu(g, &[(2, 70, 40), (4, 1024, 64)])
});
on_gpu!(bad_input_is_a_typed_error, k::bad_input_is_a_typed_error);
on_gpu!(tiny_model_graph_step_on_device_matches_cpu, |_| {
    k::tiny_model_graph_step_on_device_matches_cpu(&device())
});
on_gpu!(device_graph_boundary, |_| k::device_graph_boundary(
    &device()
));
on_gpu!(device_op_profile_records_each_op, |_| {
    k::device_op_profile_records_each_op(&device())
});
on_gpu!(pool_reuses_device_buffers, |_| {
    k::pool::pool_reuses_device_buffers(&device())
});
on_gpu!(cached_attention_within_reference_bound, |_| {
    k::cached_attention::cached_attention_within_reference_bound(&device())
});
on_gpu!(matmul_matches_cpu_within_bound, |_| {
    k::matmul::matmul_matches_cpu_within_bound(&device())
});
on_gpu!(device_optimizer_step_matches_optim, |_| {
    k::optimizer::device_optimizer_step_matches_optim(&device())
});
on_gpu!(quantized_linear_matches_cpu_layer, |_| {
    k::quant_linear::quantized_linear_matches_cpu_layer(&device())
});

/// The GPU as a `Device::Cuda` backend (one per process).
fn device() -> std::sync::Arc<autograd::backend::DeviceBackend> {
    static DEV: OnceLock<std::sync::Arc<autograd::backend::DeviceBackend>> = OnceLock::new();
    DEV.get_or_init(|| autograd::backend::DeviceBackend::cuda().expect("the GPU opened above"))
        .clone()
}
