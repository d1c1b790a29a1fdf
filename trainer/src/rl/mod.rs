//! Reinforcement learning after pretraining: the RL sampler and RL trainer stages, each at
//! its own precision ([`plan`]), on tasks with verifiable rewards ([`tasks`]), with the
//! sampler/trainer mismatch measured and optionally corrected ([`correction`]).
//!
//! * [`plan`]: the stage plan as data (built-ins, TOML with `base =`);
//! * [`kv_cache`], [`frozen`], [`sampler`]: batched generation with a KV cache, weights
//!   quantized once per weight sync, static or dynamic activation scales;
//! * [`tasks`]: seeded tasks, rewards, held-out sets, pretraining mixes;
//! * [`codec`]: task text through the model's tokenizer (byte-level or BPE); [`mix`]: the
//!   pretraining mix, byte-level or through a BPE;
//! * [`correction`]: importance-sampling corrections and mismatch metrics;
//! * [`grpo`]: advantages and the clipped policy-gradient loss;
//! * [`guard`]: the divergence guard (mismatch spikes, pass-rate collapses);
//! * [`config`], [`run`], [`checkpoint`], [`metrics`]: the RL loop, its settings, checkpoints
//!   with bitwise resume, metrics;
//! * [`compare`]: the report of a grid of plans x corrections x seeds.

pub mod checkpoint;
pub mod codec;
pub mod compare;
pub mod config;
pub mod correction;
pub mod frozen;
pub mod grpo;
pub mod guard;
pub mod kv_cache;
pub mod metrics;
pub mod mix;
pub mod plan;
pub mod run;
pub mod sampler;
pub mod tasks;
