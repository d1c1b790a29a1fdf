//! `bench checkpoint`: whole-checkpoint quantization (`fp_formats::checkpoint`) in GB/s of
//! input, against a plain read and write of the same file in the same rounds.
//!
//! A synthetic Llama-shaped F32 checkpoint (one `model.safetensors`: per layer the seven
//! linear weights and two norms, plus embedding, final norm and LM head) is written once
//! into `--dir` and read once to put it in the page cache. Each round then runs, in this
//! order, a plain copy (`fs::read` of the file, `write_all` and `sync_all` of a new one) and
//! each quantization job (no error statistics) into a fresh output folder, which is deleted
//! afterwards. A job's ratio is the median over rounds of `copy time / job time` of the same
//! round (above 1: faster than copying the file), so a machine busy with other work moves
//! both sides alike. Reported, not gated (disk and page-cache behaviour vary by machine).

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{ensure, Context, Result};
use fp_formats::checkpoint::{
    quantize_checkpoint, write_f32_checkpoint, Layout, NoProgress, QuantizeOptions, Scheme,
};

/// Shape of the synthetic checkpoint.
#[derive(Clone, Copy, Debug)]
pub struct Shape {
    /// Transformer layers.
    pub layers: usize,
    /// Residual width.
    pub d: usize,
    /// MLP width.
    pub hidden: usize,
    /// Vocabulary (embedding and LM head rows).
    pub vocab: usize,
}

/// One measured job.
#[derive(Debug, serde::Serialize)]
pub struct JobResult {
    /// What ran.
    pub job: String,
    /// Median seconds over the rounds.
    pub seconds: f64,
    /// Input bytes per second (median time), in GB/s.
    pub gb_per_s: f64,
    /// Median over rounds of the copy's time / this job's time in the same round.
    pub vs_copy: f64,
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// Writes the synthetic checkpoint; returns its path.
fn make_input(dir: &Path, s: Shape) -> Result<PathBuf> {
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    let mut values = |n: usize| -> Vec<f32> {
        (0..n)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                ((state >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 0.04
            })
            .collect()
    };
    let (d, h) = (s.d, s.hidden);
    let mut t: Vec<(String, Vec<usize>, Vec<f32>)> = vec![(
        "model.embed_tokens.weight".into(),
        vec![s.vocab, d],
        values(s.vocab * d),
    )];
    for i in 0..s.layers {
        let p = format!("model.layers.{i}");
        for n in ["q_proj", "k_proj", "v_proj", "o_proj"] {
            t.push((
                format!("{p}.self_attn.{n}.weight"),
                vec![d, d],
                values(d * d),
            ));
        }
        for n in ["gate_proj", "up_proj"] {
            t.push((format!("{p}.mlp.{n}.weight"), vec![h, d], values(h * d)));
        }
        t.push((
            format!("{p}.mlp.down_proj.weight"),
            vec![d, h],
            values(d * h),
        ));
        for n in ["input_layernorm", "post_attention_layernorm"] {
            t.push((format!("{p}.{n}.weight"), vec![d], vec![1.0; d]));
        }
    }
    t.push(("model.norm.weight".into(), vec![d], vec![1.0; d]));
    t.push((
        "lm_head.weight".into(),
        vec![s.vocab, d],
        values(s.vocab * d),
    ));
    let refs: Vec<(&str, Vec<usize>, Vec<f32>)> = t
        .iter()
        .map(|(n, sh, v)| (n.as_str(), sh.clone(), v.clone()))
        .collect();
    let path = dir.join("model.safetensors");
    write_f32_checkpoint(&path, &refs)?;
    Ok(path)
}

fn copy(input: &Path, out: &Path) -> Result<()> {
    let data = std::fs::read(input).with_context(|| input.display().to_string())?;
    let mut f = std::fs::File::create(out).with_context(|| out.display().to_string())?;
    f.write_all(&data)?;
    f.sync_all()?;
    Ok(())
}

/// Runs the benchmark (see the module docs) in a new folder under `dir`, removed at the end.
pub fn suite(dir: &Path, shape: Shape, rounds: usize) -> Result<(u64, Vec<JobResult>)> {
    ensure!((1..=100).contains(&rounds), "--rounds must be in 1..=100");
    ensure!(
        shape.d.is_multiple_of(32)
            && shape.hidden.is_multiple_of(32)
            && shape.d > 0
            && shape.hidden > 0,
        "d and hidden must be positive multiples of 32"
    );
    ensure!(
        (1..=64).contains(&shape.layers) && shape.vocab <= 1 << 18 && shape.d <= 8192,
        "layers 1..=64, vocab at most 262144, d at most 8192"
    );
    let work = dir.join(format!("nibble-bench-checkpoint-{}", std::process::id()));
    std::fs::create_dir_all(&work).with_context(|| work.display().to_string())?;
    let result = (|| {
        let input = make_input(&work, shape)?;
        let bytes = std::fs::metadata(&input)?.len();
        std::hint::black_box(std::fs::read(&input)?); // into the page cache
        let jobs: [(&str, Scheme, Layout); 3] = [
            ("NVFP4 ModelOpt", Scheme::Nvfp4, Layout::ModelOpt),
            (
                "NVFP4 compressed-tensors",
                Scheme::Nvfp4,
                Layout::CompressedTensors,
            ),
            (
                "MXFP8 compressed-tensors",
                Scheme::Mxfp8,
                Layout::CompressedTensors,
            ),
        ];
        let mut copy_t = vec![];
        let mut job_t = vec![vec![]; jobs.len()];
        let mut ratio = vec![vec![]; jobs.len()];
        for r in 0..rounds {
            let out = work.join(format!("copy-{r}.safetensors"));
            let t0 = Instant::now();
            copy(&input, &out)?;
            let c = t0.elapsed().as_secs_f64();
            std::fs::remove_file(&out)?;
            copy_t.push(c);
            for (j, (_, scheme, layout)) in jobs.iter().enumerate() {
                let out = work.join(format!("q{j}-{r}"));
                let opts = QuantizeOptions {
                    scheme: *scheme,
                    layout: *layout,
                    no_stats: true,
                    ..Default::default()
                };
                let t0 = Instant::now();
                quantize_checkpoint(&input, &out, &opts, &NoProgress)?;
                let q = t0.elapsed().as_secs_f64();
                std::fs::remove_dir_all(&out)?;
                job_t[j].push(q);
                ratio[j].push(c / q);
            }
        }
        let gb = |s: f64| bytes as f64 / s / 1e9;
        let c = median(&mut copy_t);
        let mut out = vec![JobResult {
            job: "plain read + write (fs::read, write_all, sync_all)".into(),
            seconds: c,
            gb_per_s: gb(c),
            vs_copy: 1.0,
        }];
        for (j, (name, _, _)) in jobs.iter().enumerate() {
            let s = median(&mut job_t[j]);
            out.push(JobResult {
                job: format!("{name}, no statistics"),
                seconds: s,
                gb_per_s: gb(s),
                vs_copy: median(&mut ratio[j]),
            });
        }
        Ok((bytes, out))
    })();
    let _ = std::fs::remove_dir_all(&work);
    result
}
