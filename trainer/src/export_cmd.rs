//! `trainer export`: a checkpoint as a Hugging Face Llama folder (see [`trainer::hf`]).

use std::path::PathBuf;

use anyhow::Result;
use clap::{Args, ValueEnum};
use fp_formats::checkpoint::{Layout, Scheme};
use trainer::hf::{self, ExportOptions};

/// Quantized export formats.
#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum QuantizeArg {
    /// E2M1 weights, E4M3 scales per 16, an FP32 tensor scale.
    Nvfp4,
    /// E4M3 weights, E8M0 scales per 32 (needs `--layout compressed-tensors`).
    Mxfp8,
}

/// Tensor names and config of a quantized export.
#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum LayoutArg {
    /// TensorRT Model Optimizer (`hf_quant_config.json`; NVFP4 only).
    Modelopt,
    /// compressed-tensors (vLLM, llm-compressor).
    CompressedTensors,
}

/// Arguments of `trainer export`.
#[derive(Args, Debug)]
pub struct ExportArgs {
    /// A run directory (its latest checkpoint) or a checkpoint directory.
    pub checkpoint: PathBuf,
    /// Output folder (must not exist, or be empty).
    #[arg(long)]
    pub out: PathBuf,
    /// Quantize the linear layers (embedding, LM head and norms stay F32).
    #[arg(long, value_enum)]
    pub quantize: Option<QuantizeArg>,
    /// Layout of a quantized export.
    #[arg(long, value_enum, default_value = "modelopt")]
    pub layout: LayoutArg,
    /// NVFP4: calibrate static activation scales (ModelOpt `input_scale`, compressed-tensors
    /// `input_global_scale`) on the first N batches of the run's validation data (FP32
    /// forward).
    #[arg(long, value_name = "N", requires = "quantize")]
    pub calibrate: Option<usize>,
}

/// Runs `trainer export`.
pub fn run_export(args: ExportArgs) -> Result<()> {
    let layout = match args.layout {
        LayoutArg::Modelopt => Layout::ModelOpt,
        LayoutArg::CompressedTensors => Layout::CompressedTensors,
    };
    let opts = ExportOptions {
        quantize: args.quantize.map(|q| {
            let scheme = match q {
                QuantizeArg::Nvfp4 => Scheme::Nvfp4,
                QuantizeArg::Mxfp8 => Scheme::Mxfp8,
            };
            (scheme, layout)
        }),
        calibrate: args.calibrate,
        ..Default::default()
    };
    let r = hf::export(&args.checkpoint, &args.out, &opts)?;
    println!(
        "exported {} tensors{} to {}: {}",
        r.tensors,
        if r.quantized > 0 {
            format!(" ({} linear weights quantized)", r.quantized)
        } else {
            String::new()
        },
        args.out.display(),
        r.files.join(", ")
    );
    if let Some(n) = args.calibrate {
        println!("activation scales calibrated on {n} batches of the run's validation data");
    }
    if let Some(note) = r.tokenizer_note {
        println!("note: {note}");
    }
    Ok(())
}
