//! Finite-difference gradient checks of a whole transformer block and of a tiny GPT built
//! from it (embedding, two blocks, final norm, LM head, cross-entropy), and a check that the
//! same model trains.

#[path = "../examples/gpt/mod.rs"]
mod gpt;

use autograd::gradcheck::{check_gradients, GradCheck};
use autograd::{init, Graph, ParamStore};
use gpt::{Block, Config, Gpt};
use quant::GemmPolicy;

fn cfg(layers: usize) -> Config {
    Config {
        vocab: 11,
        d_model: 16,
        n_heads: 2,
        n_layers: layers,
        hidden: 24,
        rope_base: 10000.0,
        eps: 1e-5,
    }
}

#[test]
fn gradcheck_transformer_block() {
    let cfg = cfg(1);
    let mut ps = ParamStore::new();
    let (b, t) = (2, 5);
    let x = ps
        .add(
            "x",
            &[b, t, cfg.d_model],
            init::normal(b * t * cfg.d_model, 1.0, 3),
        )
        .unwrap();
    let block = Block::new(&mut ps, &cfg, "block", 4).unwrap();
    // perturb the norm gains away from 1 so their gradients are generic
    for id in [block.attn_norm, block.mlp_norm] {
        let noise = init::normal(cfg.d_model, 0.2, id.index() as u64);
        ps.value_mut(id)
            .unwrap()
            .iter_mut()
            .zip(noise)
            .for_each(|(v, n)| *v += n);
    }
    let rep = check_gradients(
        &mut ps,
        |g| {
            let x = g.param(x)?;
            block.forward(g, &cfg, x, 0, &GemmPolicy::FP32)
        },
        &GradCheck::default(),
    )
    .unwrap();
    assert!(rep.passed(), "{rep}");
    assert!(rep.checked > 2000);
}

#[test]
fn gradcheck_tiny_gpt_loss() {
    let cfg = cfg(2);
    let mut ps = ParamStore::new();
    let model = Gpt::new(&mut ps, cfg, 5).unwrap();
    let (batch, t) = (2, 4);
    let tokens: Vec<u32> = (0..batch * t).map(|i| (i * 7 % cfg.vocab) as u32).collect();
    let targets: Vec<u32> = (0..batch * t).map(|i| (i * 3 % cfg.vocab) as u32).collect();
    let rep = check_gradients(
        &mut ps,
        |g| {
            model.loss(
                g,
                &tokens,
                &targets,
                batch,
                &GemmPolicy::FP32,
                &GemmPolicy::FP32,
            )
        },
        &GradCheck {
            atol: 2e-4,
            ..GradCheck::default()
        },
    )
    .unwrap();
    assert!(rep.passed(), "{rep}");
}

#[test]
fn tiny_gpt_overfits_one_batch_in_every_precision() {
    for policy in [
        GemmPolicy::FP32,
        GemmPolicy::BF16,
        GemmPolicy::nvfp4_paper(),
    ] {
        let cfg = Config {
            vocab: 16,
            d_model: 32,
            n_heads: 2,
            n_layers: 1,
            hidden: 64,
            rope_base: 10000.0,
            eps: 1e-5,
        };
        let mut ps = ParamStore::new();
        let model = Gpt::new(&mut ps, cfg, 9).unwrap();
        let (batch, t) = (2, 16);
        let tokens: Vec<u32> = (0..batch * t)
            .map(|i| ((i * 5 + i / 3) % 16) as u32)
            .collect();
        let targets: Vec<u32> = tokens.iter().map(|&x| (x + 1) % 16).collect();
        let mut losses = vec![];
        for step in 0..30 {
            let mut g = Graph::new(&mut ps).with_rng(1, step);
            let loss = model
                .loss(&mut g, &tokens, &targets, batch, &policy, &GemmPolicy::BF16)
                .unwrap();
            losses.push(g.item(loss).unwrap());
            g.backward(loss).unwrap();
            drop(g);
            let (values, grads) = ps.params_and_grads();
            for (v, g) in values.into_iter().zip(grads) {
                v.iter_mut().zip(g).for_each(|(v, g)| *v -= 0.05 * g);
            }
            ps.zero_grad();
        }
        assert!(losses[29] < 0.5 * losses[0], "{policy:?}: {losses:?}");
    }
}

#[test]
fn gradients_are_bit_identical_on_any_thread_count() {
    // activations of 4 x 128 x 64 = 32k elements take the parallel paths of every kernel
    let cfg = Config {
        vocab: 32,
        d_model: 64,
        n_heads: 2,
        n_layers: 1,
        hidden: 128,
        rope_base: 10000.0,
        eps: 1e-5,
    };
    let (batch, t) = (4, 128);
    let tokens: Vec<u32> = (0..batch * t)
        .map(|i| ((i * 7 + i / 5) % 32) as u32)
        .collect();
    let targets: Vec<u32> = tokens.iter().map(|&x| (x * 3 + 1) % 32).collect();
    let run = |threads: usize, policy: GemmPolicy| {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap();
        pool.install(|| {
            let mut ps = ParamStore::new();
            let model = Gpt::new(&mut ps, cfg, 3).unwrap();
            let mut g = Graph::new(&mut ps).with_rng(5, 1);
            let loss = model
                .loss(&mut g, &tokens, &targets, batch, &policy, &GemmPolicy::BF16)
                .unwrap();
            let l = g.item(loss).unwrap();
            g.backward(loss).unwrap();
            drop(g);
            (
                l,
                ps.export(),
                ps.grads().iter().map(|g| g.to_vec()).collect::<Vec<_>>(),
            )
        })
    };
    for policy in [GemmPolicy::FP32, GemmPolicy::nvfp4_paper()] {
        let (l1, _, g1) = run(1, policy);
        let (l3, _, g3) = run(3, policy);
        assert_eq!(l1, l3);
        assert_eq!(g1, g3, "{policy:?}");
    }
}
