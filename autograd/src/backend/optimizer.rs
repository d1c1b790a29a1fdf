//! The optimizer step of a device [`ParamStore`] without a host round trip: the gradient norm
//! (`kernels-cuda`'s chunk sums in optim's eight-lane f64 tree, finished in order: bit for
//! bit `optim::grad_norm`) and AdamW on the FP32 master weights (`nb_adamw`, optim's f32
//! arithmetic: bit for bit `optim::AdamW::step_scaled` with the same coefficients), with the
//! moments in [`DeviceMoments`]. Only the norm (one float) comes back to the host.
//!
//! ```no_run
//! use autograd::backend::{AdamWCoeffs, DeviceBackend, DeviceMoments};
//! use autograd::ParamStore;
//! # fn main() -> autograd::Result<()> {
//! let dev = DeviceBackend::cuda()?;
//! let mut ps = ParamStore::new();
//! let w = ps.add("w", &[2], vec![1.0, 2.0])?;
//! ps.to_device(&dev)?;
//! // ... a Graph's forward and backward fill the gradients ...
//! let norm = ps.device_grad_norm()?;
//! let mut mom = DeviceMoments::zeros(&ps)?;
//! let clip = if norm > 1.0 { 1.0 / norm } else { 1.0 };
//! let c = AdamWCoeffs::new(1e-3, 0.1, 0.9, 0.95, 1e-8, 1, clip);
//! ps.device_adamw(&mut mom, &[c])?;
//! # let _ = w; Ok(()) }
//! ```

use super::{AdamWCoeffs, Backend, DeviceBackend, DeviceBuf};
use crate::{Error, ParamStore, Result};

/// AdamW's first and second moments of a device store's parameters, in device memory (one
/// pair per parameter, store order).
#[derive(Debug)]
pub struct DeviceMoments {
    m: Vec<DeviceBuf<f32>>,
    v: Vec<DeviceBuf<f32>>,
}

fn not_on_device<T>(what: &'static str) -> Result<T> {
    Err(Error::WrongDevice {
        what,
        device: crate::Device::Cpu,
        hint: "move the store to the device with ParamStore::to_device first",
    })
}

impl DeviceMoments {
    /// Zero moments for every parameter of the device store `ps`.
    pub fn zeros(ps: &ParamStore) -> Result<DeviceMoments> {
        let Some(d) = &ps.dev else {
            return not_on_device("DeviceMoments::zeros");
        };
        let n = |i: usize| ps.shapes[i].numel();
        let z = |i| d.be.zeros(n(i));
        Ok(DeviceMoments {
            m: (0..ps.len())
                .map(z)
                .collect::<std::result::Result<_, _>>()?,
            v: (0..ps.len())
                .map(z)
                .collect::<std::result::Result<_, _>>()?,
        })
    }

    /// Uploads host moments `(m, v)` to `be`, one pair per parameter in store order (e.g.
    /// `optim::AdamW::exp_avg` / `exp_avg_sq`); [`ParamStore::device_adamw`] checks them
    /// against the store.
    pub fn upload(be: &DeviceBackend, moments: &[(&[f32], &[f32])]) -> Result<DeviceMoments> {
        let (mut m, mut v) = (Vec::new(), Vec::new());
        for (a, b) in moments {
            m.push(be.upload(a)?);
            v.push(be.upload(b)?);
        }
        Ok(DeviceMoments { m, v })
    }

    /// Host copies `(m, v)` of every parameter's moments (`be`: where they live).
    pub fn download(&self, be: &DeviceBackend) -> Result<Vec<(Vec<f32>, Vec<f32>)>> {
        self.m
            .iter()
            .zip(&self.v)
            .map(|(m, v)| Ok((be.download(m)?, be.download(v)?)))
            .collect()
    }
}

impl ParamStore {
    /// `optim::grad_norm` of all gradients of the device store, computed on the device (a
    /// parameter without a gradient counts as zeros, as on the host), bit for bit.
    ///
    /// # Errors
    /// [`Error::WrongDevice`] on a CPU store; device errors.
    pub fn device_grad_norm(&self) -> Result<f32> {
        let Some(d) = &self.dev else {
            return not_on_device("device_grad_norm");
        };
        let zeros: Vec<Option<DeviceBuf<f32>>> = d
            .grads
            .iter()
            .enumerate()
            .map(|(i, g)| match g {
                Some(_) => Ok(None),
                None => d.be.zeros(self.shapes[i].numel()).map(Some),
            })
            .collect::<std::result::Result<_, _>>()?;
        let grads: Vec<&DeviceBuf<f32>> = d
            .grads
            .iter()
            .zip(&zeros)
            .map(|(g, z)| g.as_ref().or(z.as_ref()).expect("a gradient or zeros"))
            .collect();
        Ok(d.be.grad_norm(&grads)?)
    }

    /// One AdamW step of every parameter on the device: `coeffs[i]` (from
    /// [`AdamWCoeffs::new`] with the parameter's group learning rate and weight decay, the
    /// step number and the clip coefficient) updates value `i` and its moments in `moments`
    /// with optim's arithmetic (a parameter without a gradient steps with zeros, as on the
    /// host).
    ///
    /// # Errors
    /// [`Error::WrongDevice`] on a CPU store; [`Error::InvalidArgument`] when `coeffs` or the
    /// moments do not match the store; device errors.
    pub fn device_adamw(
        &mut self,
        moments: &mut DeviceMoments,
        coeffs: &[AdamWCoeffs],
    ) -> Result<()> {
        let n = self.len();
        let Some(d) = &mut self.dev else {
            return not_on_device("device_adamw");
        };
        if coeffs.len() != n || moments.m.len() != n || moments.v.len() != n {
            return crate::error::arg_err(
                "device_adamw",
                format!(
                    "{} coefficients and {} moments for {n} parameters",
                    coeffs.len(),
                    moments.m.len()
                ),
            );
        }
        // every length first: on error nothing is updated
        for (i, (m, v)) in moments.m.iter().zip(&moments.v).enumerate() {
            let len = self.shapes[i].numel();
            let (lm, lv) = (d.be.len(m), d.be.len(v));
            if lm != len || lv != len {
                return crate::error::arg_err(
                    "device_adamw",
                    format!("parameter {i} has {len} elements, its moments {lm} and {lv}"),
                );
            }
        }
        let parts = d.values.iter_mut().zip(&d.grads).zip(&self.shapes);
        let moms = moments.m.iter_mut().zip(moments.v.iter_mut());
        for (((p, g), shape), ((m, v), c)) in parts.zip(moms.zip(coeffs)) {
            let zeros;
            let g = match g {
                Some(g) => g,
                None => {
                    zeros = d.be.zeros(shape.numel())?;
                    &zeros
                }
            };
            d.be.adamw(p, g, m, v, c)?;
        }
        Ok(())
    }
}
