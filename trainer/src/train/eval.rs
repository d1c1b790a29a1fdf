//! Evaluation: the validation loss over fixed windows and the per-layer quantization error
//! of the Fprop operands.

use autograd::{gemm_stream, Graph, OperandRole};
use quant::{MatRef, QuantState, Quantizer, RngKey, Usage};

use super::metrics::error_of;
use super::{LayerError, TrainError, Trainer};
use crate::data::{Batcher, BatcherConfig, Sampling};
use crate::model::{LinearProbe, ModelError, Precision};

/// The result of [`Trainer::evaluate`].
#[derive(Clone, Debug, PartialEq)]
pub struct Evaluation {
    /// Mean validation loss over `train.eval_batches` batches.
    pub val_loss: f32,
    /// Per-layer quantization error of the first batch's Fprop operands.
    pub layers: Vec<LayerError>,
}

impl Trainer {
    /// Validation loss over `eval_batches` sequential batches (the same windows every time),
    /// and the per-layer quantization error of the first batch's Fprop operands. Like
    /// [`Trainer::train_step`], it runs with the pool's other threads polling for work.
    pub fn evaluate(&mut self) -> Result<Evaluation, TrainError> {
        autograd::with_polling_workers(|| self.compute_evaluation())
    }

    /// [`Trainer::evaluate`]'s work.
    fn compute_evaluation(&mut self) -> Result<Evaluation, TrainError> {
        let mut vb = Batcher::new(
            self.val.clone(),
            BatcherConfig {
                batch: self.cfg.train.batch,
                seq: self.cfg.model.seq,
                sampling: Sampling::Sequential,
                seed: 0,
            },
        )?;
        let prec_progress = self.progress();
        let mut total = 0.0f64;
        let mut probes: Vec<LinearProbe> = Vec::new();
        let n = self.cfg.train.eval_batches;
        // the first batch reads host values (a device store comes back; AdamW's moments stay)
        self.sync_host(false)?;
        for i in 0..n {
            // the first batch probes the Fprop operands on the host; the rest run on the
            // training device (if any)
            if let (1, Some(dev)) = (i, &self.device) {
                self.ps.to_device(&dev.dev)?;
            }
            let b = vb.next_batch();
            let mut g = Graph::new(&mut self.ps).with_rng(self.cfg.train.seed, self.step);
            g.set_grad_enabled(false);
            let prec = Precision {
                recipe: &self.recipe,
                progress: prec_progress,
            };
            let probe = (i == 0).then_some(&mut probes);
            let loss = self
                .model
                .loss(&mut g, &b.inputs, &b.targets, b.batch, &prec, probe)?;
            total += g.item(loss)? as f64;
        }
        self.ps.to_host()?;
        let layers = self.layer_errors(&probes)?;
        Ok(Evaluation {
            val_loss: (total / n as f64) as f32,
            layers,
        })
    }

    fn layer_errors(&self, probes: &[LinearProbe]) -> Result<Vec<LayerError>, TrainError> {
        let seed = self.cfg.train.seed;
        let mut out = Vec::with_capacity(probes.len());
        for p in probes {
            let st = self.ps.linear_state(p.weight)?;
            let state_of = |role: OperandRole| {
                st.map(|s| s.operand(role).clone())
                    .unwrap_or_else(QuantState::new)
            };
            let key = |role| -> Result<RngKey, TrainError> {
                Ok(RngKey {
                    seed,
                    stream: gemm_stream(p.stream, role, self.step)?,
                })
            };
            let qerr = |e: quant::QuantError| TrainError::Model(ModelError::Autograd(e.into()));
            let quantizer = |q, role| -> Result<Quantizer, TrainError> {
                Ok(Quantizer::new(q, Usage::Rowwise)
                    .map_err(qerr)?
                    .with_key(key(role)?))
            };
            let x = quant::stats::operand_error(
                &quantizer(p.policy.fprop.a, OperandRole::FpropX)?,
                MatRef::new(&p.x, p.rows, p.cols).map_err(qerr)?,
                &mut state_of(OperandRole::FpropX),
            )
            .map_err(qerr)?;
            let w = self.ps.value(p.weight)?;
            let rows = w.len() / p.cols;
            let w = quant::stats::operand_error(
                &quantizer(p.policy.fprop.b, OperandRole::FpropW)?,
                MatRef::new(w, rows, p.cols).map_err(qerr)?,
                &mut state_of(OperandRole::FpropW),
            )
            .map_err(qerr)?;
            out.push(LayerError {
                layer: p.name.clone(),
                kind: p.kind,
                policy: p.policy.to_string(),
                quantized: Some(p.policy.quantizes()),
                x: error_of(&x),
                w: error_of(&w),
            });
        }
        Ok(out)
    }
}
