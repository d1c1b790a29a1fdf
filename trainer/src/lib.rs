//! # trainer
//!
//! GPT training on Nibble:
//!
//! * [`data`]: training data without downloads (an embedded, seeded corpus generator, UTF-8
//!   text files, llm.c / nanoGPT token shards), train/validation split, resumable batching
//!   and entropy baselines;
//! * [`recipe`]: precision recipes as data (built-in and TOML), resolved per layer and per
//!   point of training into `quant::GemmPolicy`s;
//! * [`rng`]: small portable generators (SplitMix64, xoshiro256**) for reproducible streams;
//! * [`model`]: the GPT (RoPE, pre-norm RMSNorm, causal attention, SwiGLU/GELU MLP), every
//!   linear layer under its recipe policy;
//! * [`config`]: the run's configuration (model, training settings, data) and its validation;
//! * [`train`]: the training loop, metrics, divergence guard;
//! * [`checkpoint`]: safetensors + JSON state, atomic writes, exact resume;
//! * [`any_checkpoint`]: the model of a pretraining or an RL checkpoint, for sample/export;
//! * [`compare`]: multi-recipe, multi-seed comparisons (the runs, reuse, resumption);
//! * [`report`]: the comparison's report (markdown tables, SVG loss curves);
//! * [`sample`]: text generation from a checkpoint at a chosen precision;
//! * [`rl`]: the RL sampler and RL trainer stages (stage plans, KV-cache sampling, tasks, GRPO);
//! * [`rundir`]: run-directory lock, refusal of existing runs, leftovers, atomic writes;
//! * [`interrupt`]: graceful stops on SIGINT/SIGTERM and the crash-test hooks;
//! * [`memory`]: memory estimates checked before allocating;
//! * [`calibrate`]: per-linear input amax over calibration batches (static activation scales);
//! * [`hf`]: Hugging Face Llama export (optionally NVFP4/MXFP8 through `fp-formats`) and import.
#![warn(missing_docs)]

pub mod any_checkpoint;
pub mod calibrate;
pub mod checkpoint;
pub mod compare;
pub mod config;
pub mod data;
pub mod hf;
pub mod interrupt;
pub mod memory;
pub mod model;
pub mod recipe;
pub mod report;
pub mod rl;
pub mod rng;
pub mod rundir;
pub mod sample;
pub mod train;
