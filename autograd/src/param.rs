//! Trainable parameters: values, accumulated gradients, per-linear quantizer state, and
//! export / import for checkpoints.

use std::collections::HashMap;
use std::sync::Arc;

use crate::backend::{Backend, DeviceBackend, DeviceBuf};
use crate::quant_state::LinearQuantState;
use crate::storage::BufferPool;
use crate::{Device, Error, Result, Shape};

/// A handle to a parameter in a [`ParamStore`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ParamId(pub(crate) u32);

impl ParamId {
    /// Position in the store (insertion order), the index optimizers use.
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

/// One parameter as plain data: what checkpoints store.
#[derive(Clone, Debug, PartialEq)]
pub struct NamedTensor {
    /// Unique name (e.g. `"blocks.0.attn.qkv.weight"`).
    pub name: String,
    /// Dimensions.
    pub shape: Vec<usize>,
    /// Row-major values.
    pub data: Vec<f32>,
}

/// All trainable parameters of a model, in insertion order.
///
/// Each parameter has a unique name, a shape, an f32 value and an f32 gradient. Gradients
/// *accumulate* across backward passes (micro-batches) until [`ParamStore::zero_grad`]. A
/// parameter used as the weight of a quantized [`linear`](crate::Graph::linear) also keeps
/// that layer's quantizer state (FP8 delayed-scaling histories), so it persists across steps.
///
/// The store also keeps the buffer pool that per-step [`Graph`](crate::Graph)s draw their
/// activations from and return them to, so steady-state steps do not allocate.
///
/// ```
/// use autograd::{init, ParamStore};
/// let mut ps = ParamStore::new();
/// let w = ps.add("w", &[2, 3], init::normal(6, 0.02, 1))?;
/// let b = ps.add_zeros("b", &[3])?;
/// assert_eq!(ps.id("w")?, w);
/// assert_eq!((ps.len(), ps.num_elements()), (2, 9));
/// assert_eq!(ps.grad(b)?, &[0.0; 3]);
///
/// // checkpoint round trip
/// let saved = ps.export();
/// ps.value_mut(b)?.fill(1.0);
/// ps.import(&saved)?;
/// assert_eq!(ps.value(b)?, &[0.0; 3]);
/// # Ok::<(), autograd::Error>(())
/// ```
#[derive(Debug, Default)]
pub struct ParamStore {
    pub(crate) names: Vec<String>,
    pub(crate) shapes: Vec<Shape>,
    pub(crate) values: Vec<Vec<f32>>,
    pub(crate) grads: Vec<Vec<f32>>,
    pub(crate) states: Vec<Option<Box<LinearQuantState>>>,
    index: HashMap<String, ParamId>,
    pub(crate) pool: BufferPool,
    /// The device copies when the store lives on a device ([`ParamStore::to_device`]).
    pub(crate) dev: Option<DevParams>,
}

/// Parameter values and gradients on a device. A gradient of `None` is zero (`zero_grad`
/// drops the buffers; the next backward writes a fresh one).
#[derive(Debug)]
pub(crate) struct DevParams {
    pub(crate) be: Arc<DeviceBackend>,
    pub(crate) values: Vec<DeviceBuf<f32>>,
    pub(crate) grads: Vec<Option<DeviceBuf<f32>>>,
}

fn on_device<T>(what: &'static str) -> Result<T> {
    Err(Error::WrongDevice {
        what,
        device: Device::Cuda,
        hint: "read it with download_value / download_grad, or call to_host first",
    })
}

impl ParamStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a parameter with the given initial value (row-major, `shape`'s element count).
    pub fn add(&mut self, name: &str, shape: &[usize], value: Vec<f32>) -> Result<ParamId> {
        let shape = Shape::new(shape)?;
        if value.len() != shape.numel() {
            return Err(Error::DataLength {
                what: "parameter",
                len: value.len(),
                shape,
            });
        }
        if self.index.contains_key(name) {
            return Err(Error::DuplicateParam(name.to_string()));
        }
        if let Some(d) = &mut self.dev {
            let buf = d.be.upload(&value)?;
            d.values.push(buf);
            d.grads.push(None);
        }
        let id = ParamId(self.names.len() as u32);
        self.index.insert(name.to_string(), id);
        self.names.push(name.to_string());
        self.shapes.push(shape);
        self.grads.push(vec![0.0; value.len()]);
        self.values.push(value);
        self.states.push(None);
        Ok(id)
    }

    /// Adds a zero-initialised parameter.
    pub fn add_zeros(&mut self, name: &str, shape: &[usize]) -> Result<ParamId> {
        let n = Shape::new(shape)?.numel();
        self.add(name, shape, vec![0.0; n])
    }

    /// Adds a parameter filled with `v` (e.g. ones for a norm gain).
    pub fn add_filled(&mut self, name: &str, shape: &[usize], v: f32) -> Result<ParamId> {
        let n = Shape::new(shape)?.numel();
        self.add(name, shape, vec![v; n])
    }

    pub(crate) fn check(&self, id: ParamId) -> Result<usize> {
        let i = id.index();
        if i < self.names.len() {
            Ok(i)
        } else {
            Err(Error::UnknownParam(i))
        }
    }

    /// The id of a named parameter.
    pub fn id(&self, name: &str) -> Result<ParamId> {
        self.index
            .get(name)
            .copied()
            .ok_or_else(|| Error::UnknownParamName(name.to_string()))
    }

    /// All ids, in insertion order.
    pub fn ids(&self) -> impl Iterator<Item = ParamId> {
        (0..self.names.len() as u32).map(ParamId)
    }

    /// Number of parameters.
    pub fn len(&self) -> usize {
        self.names.len()
    }

    /// True when the store has no parameters.
    pub fn is_empty(&self) -> bool {
        self.names.is_empty()
    }

    /// Total number of scalar values over all parameters.
    pub fn num_elements(&self) -> usize {
        self.values.iter().map(Vec::len).sum()
    }

    /// The parameter's name.
    pub fn name(&self, id: ParamId) -> Result<&str> {
        Ok(&self.names[self.check(id)?])
    }

    /// The parameter's shape.
    pub fn shape(&self, id: ParamId) -> Result<Shape> {
        Ok(self.shapes[self.check(id)?])
    }

    /// The parameter's value.
    pub fn value(&self, id: ParamId) -> Result<&[f32]> {
        if self.dev.is_some() {
            return on_device("value");
        }
        Ok(&self.values[self.check(id)?])
    }

    /// The parameter's value, mutably.
    pub fn value_mut(&mut self, id: ParamId) -> Result<&mut [f32]> {
        if self.dev.is_some() {
            return on_device("value_mut");
        }
        let i = self.check(id)?;
        Ok(&mut self.values[i])
    }

    /// The accumulated gradient.
    pub fn grad(&self, id: ParamId) -> Result<&[f32]> {
        if self.dev.is_some() {
            return on_device("grad");
        }
        Ok(&self.grads[self.check(id)?])
    }

    /// The accumulated gradient, mutably (e.g. to scale it).
    pub fn grad_mut(&mut self, id: ParamId) -> Result<&mut [f32]> {
        if self.dev.is_some() {
            return on_device("grad_mut");
        }
        let i = self.check(id)?;
        Ok(&mut self.grads[i])
    }

    /// The quantizer state of the linear layer that uses this parameter as its weight, once it
    /// has run.
    pub fn linear_state(&self, id: ParamId) -> Result<Option<&LinearQuantState>> {
        Ok(self.states[self.check(id)?].as_deref())
    }

    /// Replaces the quantizer state of the linear layer whose weight is `id` (`None` clears
    /// it, as for a layer that has not run yet). Used to resume training exactly.
    ///
    /// ```
    /// use autograd::{LinearQuantState, ParamStore};
    /// let mut ps = ParamStore::new();
    /// let w = ps.add_zeros("w", &[2, 2])?;
    /// ps.set_linear_state(w, Some(LinearQuantState::default()))?;
    /// assert!(ps.linear_state(w)?.is_some());
    /// ps.set_linear_state(w, None)?;
    /// assert!(ps.linear_state(w)?.is_none());
    /// # Ok::<(), autograd::Error>(())
    /// ```
    pub fn set_linear_state(&mut self, id: ParamId, state: Option<LinearQuantState>) -> Result<()> {
        let i = self.check(id)?;
        self.states[i] = state.map(Box::new);
        Ok(())
    }

    /// Ends a training step for every linear layer's quantizer state (rolls FP8
    /// delayed-scaling amax histories; nothing else changes).
    pub fn end_quant_step(&mut self) -> Result<()> {
        for s in self.states.iter_mut().flatten() {
            s.end_step()?;
        }
        Ok(())
    }

    /// Sets every gradient to zero.
    pub fn zero_grad(&mut self) {
        for g in &mut self.grads {
            g.fill(0.0);
        }
        if let Some(d) = &mut self.dev {
            d.grads.iter_mut().for_each(|g| *g = None);
        }
    }

    /// Where the values and gradients live.
    pub fn device(&self) -> Device {
        if self.dev.is_some() {
            Device::Cuda
        } else {
            Device::Cpu
        }
    }

    /// The device backend, when the store lives on a device.
    pub fn backend(&self) -> Option<&Arc<DeviceBackend>> {
        self.dev.as_ref().map(|d| &d.be)
    }

    /// Moves the store onto a device: uploads every value and gradient. From then on graphs
    /// over this store compute on the device; [`ParamStore::value`] and friends report
    /// [`Error::WrongDevice`] (use [`ParamStore::download_value`] /
    /// [`ParamStore::download_grad`], or [`ParamStore::to_host`]). A no-op on a store already
    /// on a device.
    ///
    /// ```no_run
    /// use autograd::backend::DeviceBackend;
    /// use autograd::ParamStore;
    /// let dev = DeviceBackend::cuda()?; // NoDevice without a driver
    /// let mut ps = ParamStore::new();
    /// let w = ps.add("w", &[2], vec![1.0, 2.0])?;
    /// ps.to_device(&dev)?;
    /// assert_eq!(ps.download_value(w)?, vec![1.0, 2.0]);
    /// ps.to_host()?;
    /// assert_eq!(ps.value(w)?, &[1.0, 2.0]);
    /// # Ok::<(), autograd::Error>(())
    /// ```
    pub fn to_device(&mut self, be: &Arc<DeviceBackend>) -> Result<()> {
        if self.dev.is_some() {
            return Ok(());
        }
        let values = self
            .values
            .iter()
            .map(|v| be.upload(v))
            .collect::<std::result::Result<Vec<_>, _>>()?;
        let grads = self
            .grads
            .iter()
            .map(|g| {
                g.iter()
                    .any(|&x| x != 0.0)
                    .then(|| be.upload(g))
                    .transpose()
            })
            .collect::<std::result::Result<Vec<_>, _>>()?;
        self.dev = Some(DevParams {
            be: Arc::clone(be),
            values,
            grads,
        });
        Ok(())
    }

    /// Downloads every value and gradient and leaves the device (the store is a CPU store
    /// again; nothing changes if it already is). On error the store stays on the device.
    pub fn to_host(&mut self) -> Result<()> {
        let Some(d) = &self.dev else {
            return Ok(());
        };
        let mut values = Vec::with_capacity(self.len());
        let mut grads = Vec::with_capacity(self.len());
        for (v, g) in d.values.iter().zip(&d.grads) {
            values.push(d.be.download(v)?);
            grads.push(match g {
                Some(g) => d.be.download(g)?,
                None => vec![0.0; d.be.len(v)],
            });
        }
        self.values = values;
        self.grads = grads;
        self.dev = None;
        Ok(())
    }

    /// A copy of the parameter's value on the host, wherever it lives.
    pub fn download_value(&self, id: ParamId) -> Result<Vec<f32>> {
        let i = self.check(id)?;
        match &self.dev {
            None => Ok(self.values[i].clone()),
            Some(d) => Ok(d.be.download(&d.values[i])?),
        }
    }

    /// A copy of the accumulated gradient on the host, wherever it lives.
    pub fn download_grad(&self, id: ParamId) -> Result<Vec<f32>> {
        let i = self.check(id)?;
        match &self.dev {
            None => Ok(self.grads[i].clone()),
            Some(d) => match &d.grads[i] {
                Some(g) => Ok(d.be.download(g)?),
                None => Ok(vec![0.0; self.shapes[i].numel()]),
            },
        }
    }

    /// Values (mutable) and gradients side by side in insertion order: the argument pair of
    /// `optim::AdamW::step`. Host data: on a device store, the values and gradients as of
    /// [`ParamStore::to_device`] (call [`ParamStore::to_host`] first).
    pub fn params_and_grads(&mut self) -> (Vec<&mut [f32]>, Vec<&[f32]>) {
        let values = self.values.iter_mut().map(|v| &mut v[..]).collect();
        let grads = self.grads.iter().map(|g| &g[..]).collect();
        (values, grads)
    }

    /// All gradients in insertion order (e.g. for `optim::grad_norm`).
    pub fn grads(&self) -> Vec<&[f32]> {
        self.grads.iter().map(|g| &g[..]).collect()
    }

    /// Every parameter's name, shape and value, in insertion order. Host data: on a device
    /// store use [`ParamStore::export_any`].
    pub fn export(&self) -> Vec<NamedTensor> {
        (0..self.len())
            .map(|i| NamedTensor {
                name: self.names[i].clone(),
                shape: self.shapes[i].dims().to_vec(),
                data: self.values[i].clone(),
            })
            .collect()
    }

    /// [`ParamStore::export`] on either device (downloads a device store's values).
    pub fn export_any(&self) -> Result<Vec<NamedTensor>> {
        (0..self.len())
            .map(|i| {
                Ok(NamedTensor {
                    name: self.names[i].clone(),
                    shape: self.shapes[i].dims().to_vec(),
                    data: self.download_value(ParamId(i as u32))?,
                })
            })
            .collect()
    }

    /// Loads values by name (uploading them on a device store). Every parameter of the store must be present with the same shape
    /// and no unknown names may appear; on error nothing is changed.
    pub fn import(&mut self, tensors: &[NamedTensor]) -> Result<()> {
        let mut seen = vec![false; self.len()];
        for t in tensors {
            let i = self.id(&t.name)?.index();
            let shape = self.shapes[i];
            if t.shape != shape.dims() || t.data.len() != shape.numel() {
                return Err(Error::Shape {
                    op: "import",
                    msg: format!(
                        "{:?}: stored shape {:?} ({} values), parameter shape {shape}",
                        t.name,
                        t.shape,
                        t.data.len()
                    ),
                });
            }
            if std::mem::replace(&mut seen[i], true) {
                return Err(Error::DuplicateParam(t.name.clone()));
            }
        }
        if let Some(i) = seen.iter().position(|s| !s) {
            return Err(Error::UnknownParamName(format!(
                "{} (missing from import)",
                self.names[i]
            )));
        }
        if let Some(d) = &mut self.dev {
            let mut up = Vec::with_capacity(tensors.len());
            for t in tensors {
                up.push((self.index[&t.name].index(), d.be.upload(&t.data)?));
            }
            for (i, b) in up {
                d.values[i] = b;
            }
        }
        for t in tensors {
            let i = self.id(&t.name)?.index();
            self.values[i].copy_from_slice(&t.data);
        }
        Ok(())
    }

    /// Bytes held in the activation buffer pool.
    pub fn pool_bytes(&self) -> usize {
        self.pool.bytes()
    }

    /// Frees the activation buffer pool (e.g. before a long evaluation-free phase).
    pub fn release_pool(&mut self) {
        self.pool.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn import_rejects_bad_checkpoints() {
        let mut ps = ParamStore::new();
        ps.add("a", &[2], vec![1.0, 2.0]).unwrap();
        ps.add("b", &[1], vec![3.0]).unwrap();
        assert!(matches!(
            ps.add("a", &[1], vec![0.0]),
            Err(Error::DuplicateParam(_))
        ));
        assert!(matches!(
            ps.add("c", &[2], vec![0.0]),
            Err(Error::DataLength { .. })
        ));
        let mut saved = ps.export();
        saved[0].data = vec![5.0, 6.0];
        // missing "b"
        assert!(ps.import(&saved[..1]).is_err());
        // wrong shape
        let mut bad = saved.clone();
        bad[1].shape = vec![2];
        bad[1].data = vec![0.0; 2];
        assert!(matches!(ps.import(&bad), Err(Error::Shape { .. })));
        // unknown name
        let mut bad = saved.clone();
        bad[1].name = "z".into();
        assert!(ps.import(&bad).is_err());
        assert_eq!(ps.value(ParamId(0)).unwrap(), &[1.0, 2.0]);
        ps.import(&saved).unwrap();
        assert_eq!(ps.value(ParamId(0)).unwrap(), &[5.0, 6.0]);
        assert!(matches!(ps.value(ParamId(7)), Err(Error::UnknownParam(7))));
        let (v, g) = ps.params_and_grads();
        assert_eq!((v.len(), g.len()), (2, 2));
    }
}
