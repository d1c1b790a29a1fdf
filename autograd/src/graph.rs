//! The per-step graph: an arena of tensors in creation order (the tape) and the reverse pass.
//!
//! Every op appends its output node and, when gradients are wanted, a backward closure that
//! captures what it needs (input handles, small saved statistics). Creation order is a
//! topological order, so `backward` simply runs the closures from the loss down to the first
//! node (micrograd's topological sort comes for free). Each closure receives its output
//! gradient and *accumulates* into its inputs' gradients; parameter gradients go straight into
//! the [`ParamStore`].

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Instant;

use crate::backend::{Backend, DeviceBackend, DeviceBuf};
use crate::ops::device::{DevBackwardFn, DevCtx};
use crate::quant_state::LinearQuantState;
use crate::storage::{BufferPool, CpuBuf, Device, Storage};
use crate::{Error, ParamId, ParamStore, Result, Shape};

static NEXT_GRAPH: AtomicU32 = AtomicU32::new(1);

/// One line of an [`OpProfile`].
#[derive(Clone, Debug, PartialEq)]
pub struct OpTiming {
    /// Op kind (`"linear"`, `"rmsnorm"`, …; `"input"` / `"param"` for leaves).
    pub op: &'static str,
    /// Forward (true) or backward (false).
    pub forward: bool,
    /// Number of calls.
    pub calls: usize,
    /// Total seconds.
    pub seconds: f64,
}

/// Wall time per op kind, forward and backward (see [`Graph::enable_profiling`]).
#[derive(Clone, Debug)]
pub struct OpProfile {
    last: Instant,
    entries: Vec<OpTiming>,
}

impl OpProfile {
    fn new() -> Self {
        OpProfile {
            last: Instant::now(),
            entries: Vec::new(),
        }
    }

    fn record_forward(&mut self, op: &'static str) {
        let now = Instant::now();
        let dt = (now - self.last).as_secs_f64();
        self.last = now;
        self.add(op, true, dt);
    }

    fn add(&mut self, op: &'static str, forward: bool, seconds: f64) {
        self.absorb(OpTiming {
            op,
            forward,
            calls: 1,
            seconds,
        });
    }

    /// Adds `t`'s calls and seconds to the entry of its op and direction (a new one if none).
    fn absorb(&mut self, t: OpTiming) {
        match self
            .entries
            .iter_mut()
            .find(|e| e.op == t.op && e.forward == t.forward)
        {
            Some(e) => {
                e.calls += t.calls;
                e.seconds += t.seconds;
            }
            None => self.entries.push(t),
        }
    }

    /// All timings, in first-seen order (within one graph: forward entries, then backward).
    pub fn entries(&self) -> &[OpTiming] {
        &self.entries
    }

    /// Adds `other`'s calls and seconds to this profile's (entries it lacks are appended):
    /// the profile of several graphs, such as the micro-batches of one optimizer step.
    ///
    /// ```
    /// use autograd::{Graph, ParamStore};
    /// let mut ps = ParamStore::new();
    /// let mut total = None;
    /// for _ in 0..2 {
    ///     let mut g = Graph::new(&mut ps);
    ///     g.enable_profiling();
    ///     let x = g.input(&[1.0, -2.0], &[2])?;
    ///     g.silu(x)?;
    ///     let p = g.profile().expect("profiling is on");
    ///     match total.as_mut() {
    ///         None => total = Some(p.clone()),
    ///         Some(t) => autograd::OpProfile::merge(t, p),
    ///     }
    /// }
    /// let total = total.unwrap();
    /// let silu = total.entries().iter().find(|e| e.op == "silu").unwrap();
    /// assert_eq!((silu.calls, silu.forward), (2, true));
    /// # Ok::<(), autograd::Error>(())
    /// ```
    pub fn merge(&mut self, other: &OpProfile) {
        for e in &other.entries {
            self.absorb(e.clone());
        }
    }
}

impl fmt::Display for OpProfile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut e = self.entries.clone();
        e.sort_by(|a, b| b.seconds.total_cmp(&a.seconds));
        writeln!(f, "{:<18} {:>4} {:>7} {:>10}", "op", "dir", "calls", "ms")?;
        for t in e {
            let dir = if t.forward { "fwd" } else { "bwd" };
            writeln!(
                f,
                "{:<18} {:>4} {:>7} {:>10.2}",
                t.op,
                dir,
                t.calls,
                1e3 * t.seconds
            )?;
        }
        Ok(())
    }
}

/// A handle to a tensor in a [`Graph`]: cheap to copy, valid only in the graph that made it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Tensor {
    pub(crate) id: u32,
    graph: u32,
}

impl Tensor {
    #[inline]
    pub(crate) fn idx(self) -> usize {
        self.id as usize
    }
}

pub(crate) enum Value {
    /// Data owned by the graph.
    Owned(Storage),
    /// A parameter's value in the store (no copy).
    Param(usize),
    /// Shares the data of another node (a reshape); always points at an `Owned` or `Param`.
    Alias(usize),
}

pub(crate) struct Node {
    pub(crate) value: Value,
    pub(crate) shape: Shape,
    pub(crate) requires_grad: bool,
    /// The op that made it (for profiles and debugging).
    pub(crate) op: &'static str,
}

/// A backward closure: receives the context and the gradient of its node's output.
pub(crate) type BackwardFn = Box<dyn FnOnce(&mut BackwardCtx<'_>, &[f32]) -> Result<()>>;

/// A node's backward closure: the CPU one (host gradients) or the device one.
pub(crate) enum Backward {
    Cpu(BackwardFn),
    Dev(DevBackwardFn),
}

/// Boxes a backward closure (keeps call sites short).
#[inline]
pub(crate) fn backward_fn(
    f: impl FnOnce(&mut BackwardCtx<'_>, &[f32]) -> Result<()> + 'static,
) -> BackwardFn {
    Box::new(f)
}

/// Read access to every node value (graph-owned or parameter) during forward and backward.
#[derive(Clone, Copy)]
pub(crate) struct Values<'a> {
    pub(crate) nodes: &'a [Node],
    pub(crate) params: &'a [Vec<f32>],
    pub(crate) dev_params: &'a [DeviceBuf<f32>],
}

impl<'a> Values<'a> {
    #[inline]
    pub(crate) fn get(&self, t: Tensor) -> &'a [f32] {
        self.get_idx(t.idx())
    }

    fn get_idx(&self, i: usize) -> &'a [f32] {
        match &self.nodes[i].value {
            Value::Owned(s) => s.cpu(),
            Value::Param(p) => &self.params[*p],
            Value::Alias(root) => self.get_idx(*root),
        }
    }

    /// The device buffer of `t` (a device graph's node).
    pub(crate) fn dev(&self, t: Tensor) -> Result<&'a DeviceBuf<f32>> {
        self.dev_idx(t.idx())
    }

    fn dev_idx(&self, i: usize) -> Result<&'a DeviceBuf<f32>> {
        match &self.nodes[i].value {
            Value::Owned(s) => s.cuda().ok_or(Error::WrongDevice {
                what: "device op input",
                device: Device::Cpu,
                hint: "build every input of a device graph through the graph",
            }),
            Value::Param(p) => self.dev_params.get(*p).ok_or(Error::WrongDevice {
                what: "device op parameter",
                device: Device::Cpu,
                hint: "move the store with ParamStore::to_device first",
            }),
            Value::Alias(root) => self.dev_idx(*root),
        }
    }
}

/// The device parameter values of a store (empty on the CPU).
fn dev_values(store: &crate::ParamStore) -> &[DeviceBuf<f32>] {
    store.dev.as_ref().map_or(&[], |d| &d.values)
}

/// A gradient buffer taken out of the store for a kernel to write.
///
/// `fresh` means the buffer was just drawn from the pool: its contents are stale and the
/// kernel must overwrite every element (or call [`Grad::zeroed`] and accumulate). Otherwise
/// the kernel must add to it.
pub(crate) struct Grad {
    pub(crate) buf: CpuBuf,
    pub(crate) fresh: bool,
}

impl Grad {
    /// The buffer with accumulate semantics (zero-filled first if fresh).
    pub(crate) fn zeroed(&mut self) -> &mut [f32] {
        if self.fresh {
            self.buf.as_mut_slice().fill(0.0);
            self.fresh = false;
        }
        self.buf.as_mut_slice()
    }

    /// True when the kernel must add (false: overwrite).
    #[inline]
    pub(crate) fn acc(&self) -> bool {
        !self.fresh
    }

    /// GEMM `beta`: 0 overwrites a fresh buffer, 1 accumulates.
    #[inline]
    pub(crate) fn beta(&self) -> f32 {
        if self.fresh {
            0.0
        } else {
            1.0
        }
    }

    /// The raw buffer (see the type docs for the contract).
    #[inline]
    pub(crate) fn slice(&mut self) -> &mut [f32] {
        self.buf.as_mut_slice()
    }

    /// Runs a kernel that can only overwrite its output (`write` fills every element):
    /// straight into a fresh buffer, otherwise into scratch from `pool` that is then added.
    pub(crate) fn write_with(
        &mut self,
        pool: &mut BufferPool,
        write: impl FnOnce(&mut [f32]) -> Result<()>,
    ) -> Result<()> {
        if self.fresh {
            write(self.slice())?;
            self.fresh = false;
            return Ok(());
        }
        let mut tmp = pool.take(self.buf.len());
        let res = write(tmp.as_mut_slice());
        if res.is_ok() {
            crate::cpu::add_assign(self.slice(), tmp.as_slice());
        }
        pool.give(tmp);
        res
    }
}

/// Everything a backward closure may touch.
pub(crate) struct BackwardCtx<'a> {
    pub(crate) vals: Values<'a>,
    nodes: &'a [Node],
    node_grads: &'a mut [Option<CpuBuf>],
    param_grads: &'a mut [Vec<f32>],
    pub(crate) states: &'a mut [Option<Box<LinearQuantState>>],
    pub(crate) pool: &'a mut BufferPool,
    pub(crate) seed: u64,
    pub(crate) step: u64,
}

impl BackwardCtx<'_> {
    /// Takes the gradient buffer of `t` out for writing; `None` when `t` needs no gradient.
    /// Every `take` must be followed by a [`BackwardCtx::put`] of the same tensor.
    pub(crate) fn take(&mut self, t: Tensor) -> Option<Grad> {
        let node = &self.nodes[t.idx()];
        if !node.requires_grad {
            return None;
        }
        let n = node.shape.numel();
        match node.value {
            Value::Param(p) if self.param_grads[p].len() == n => Some(Grad {
                buf: CpuBuf::from_vec(std::mem::take(&mut self.param_grads[p])),
                fresh: false,
            }),
            _ => match self.node_grads[t.idx()].take() {
                Some(buf) => Some(Grad { buf, fresh: false }),
                // also the second take of a tensor that appears twice among an op's inputs
                None => Some(Grad {
                    buf: self.pool.take(n),
                    fresh: true,
                }),
            },
        }
    }

    /// Returns a gradient buffer taken with [`BackwardCtx::take`]; if the slot was refilled
    /// meanwhile (the same tensor was an input twice), the two are added.
    pub(crate) fn put(&mut self, t: Tensor, g: Grad) {
        let node = &self.nodes[t.idx()];
        let slot_param;
        let slot: &mut [f32] = match node.value {
            Value::Param(p) => {
                if self.param_grads[p].len() != node.shape.numel() {
                    self.param_grads[p] = g.buf.into_vec();
                    return;
                }
                slot_param = &mut self.param_grads[p];
                slot_param
            }
            _ => match &mut self.node_grads[t.idx()] {
                slot @ None => {
                    *slot = Some(g.buf);
                    return;
                }
                Some(b) => b.as_mut_slice(),
            },
        };
        for (s, v) in slot.iter_mut().zip(g.buf.as_slice()) {
            *s += v;
        }
        self.pool.give(g.buf);
    }

    /// Adds `src` to the gradient of `t` (copies into a fresh buffer).
    pub(crate) fn accumulate(&mut self, t: Tensor, src: &[f32]) {
        if let Some(mut g) = self.take(t) {
            if g.fresh {
                g.slice().copy_from_slice(src);
                g.fresh = false;
            } else {
                crate::cpu::add_assign(g.slice(), src);
            }
            self.put(t, g);
        }
    }
}

/// One step's computation graph: tensors, the tape of backward closures, and the reverse pass.
///
/// A graph borrows the [`ParamStore`] mutably for its lifetime: forward ops read parameter
/// values in place, `backward` accumulates into the store's gradients, and dropping the graph
/// returns every activation buffer to the store's pool for the next step.
///
/// ```
/// use autograd::{Graph, ParamStore};
/// let mut ps = ParamStore::new();
/// let w = ps.add("w", &[3], vec![1.0, 2.0, 3.0])?;
/// {
///     let mut g = Graph::new(&mut ps);
///     let x = g.input(&[0.5, -1.0, 2.0], &[3])?;
///     let wt = g.param(w)?;
///     let y = g.mul(x, wt)?;       // [0.5, -2, 6]
///     let loss = g.sum(y)?;        // 4.5
///     assert_eq!(g.item(loss)?, 4.5);
///     g.backward(loss)?;
/// } // the graph is dropped: buffers go back to the pool
/// assert_eq!(ps.grad(w)?, &[0.5, -1.0, 2.0]);
/// # Ok::<(), autograd::Error>(())
/// ```
pub struct Graph<'s> {
    pub(crate) store: &'s mut ParamStore,
    pub(crate) nodes: Vec<Node>,
    backward_fns: Vec<Option<Backward>>,
    grads: Vec<Option<CpuBuf>>,
    dev_grads: Vec<Option<DeviceBuf<f32>>>,
    /// The store's device backend (`None` on the CPU).
    pub(crate) dev: Option<std::sync::Arc<DeviceBackend>>,
    param_nodes: HashMap<usize, Tensor>,
    /// RoPE cos/sin tables by (T, D, base bits, offset), shared by the q and k rotations.
    pub(crate) rope_cache: HashMap<(usize, usize, u32, usize), std::rc::Rc<[f32]>>,
    /// The same tables on the device (a device graph's), uploaded once per graph.
    pub(crate) dev_rope_cache:
        HashMap<(usize, usize, u32, usize), std::rc::Rc<crate::backend::DeviceBuf<f32>>>,
    serial: u32,
    grad_enabled: bool,
    pub(crate) seed: u64,
    pub(crate) step: u64,
    backward_done: bool,
    profile: Option<OpProfile>,
}

impl<'s> Graph<'s> {
    /// A new graph over `store`, recording gradients, with random seed 0 and step 0. It
    /// computes on the store's device ([`ParamStore::to_device`]).
    pub fn new(store: &'s mut ParamStore) -> Self {
        let dev = store.backend().cloned();
        Graph {
            dev,
            dev_grads: Vec::new(),
            store,
            nodes: Vec::with_capacity(256),
            backward_fns: Vec::with_capacity(256),
            grads: Vec::new(),
            param_nodes: HashMap::new(),
            rope_cache: HashMap::new(),
            dev_rope_cache: HashMap::new(),
            serial: NEXT_GRAPH.fetch_add(1, Ordering::Relaxed),
            grad_enabled: true,
            seed: 0,
            step: 0,
            backward_done: false,
            profile: None,
        }
    }

    /// Sets the run seed and the training step that key the random streams of quantized
    /// GEMMs (stochastic rounding, random Hadamard signs); see
    /// [`gemm_stream`](crate::gemm_stream). A training loop passes its step counter here.
    pub fn with_rng(mut self, seed: u64, step: u64) -> Self {
        self.seed = seed;
        self.step = step;
        self
    }

    /// The run seed and step set by [`Graph::with_rng`].
    pub fn rng(&self) -> (u64, u64) {
        (self.seed, self.step)
    }

    /// The device this graph computes on.
    pub fn device(&self) -> Device {
        if self.dev.is_some() {
            Device::Cuda
        } else {
            Device::Cpu
        }
    }

    /// Turns gradient recording on or off. With it off, ops record nothing and save no
    /// statistics for backward (evaluation, sampling).
    pub fn set_grad_enabled(&mut self, enabled: bool) {
        self.grad_enabled = enabled;
    }

    /// Whether ops record gradients.
    pub fn grad_enabled(&self) -> bool {
        self.grad_enabled
    }

    /// Runs `f` with gradient recording off, then restores the previous mode.
    ///
    /// ```
    /// use autograd::{Graph, ParamStore};
    /// let mut ps = ParamStore::new();
    /// let w = ps.add("w", &[2], vec![1.0, 2.0])?;
    /// let mut g = Graph::new(&mut ps);
    /// let y = g.no_grad(|g| {
    ///     let w = g.param(w)?;
    ///     g.scale(w, 2.0)
    /// })?;
    /// assert!(!g.requires_grad(y)?);
    /// assert_eq!(g.value(y)?, &[2.0, 4.0]);
    /// # Ok::<(), autograd::Error>(())
    /// ```
    pub fn no_grad<R>(&mut self, f: impl FnOnce(&mut Self) -> R) -> R {
        let prev = std::mem::replace(&mut self.grad_enabled, false);
        let r = f(self);
        self.grad_enabled = prev;
        r
    }

    /// The parameter store this graph works on.
    pub fn params(&self) -> &ParamStore {
        self.store
    }

    /// Number of tensors recorded so far.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// True when no tensor has been recorded.
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    // ---- leaves ---------------------------------------------------------------------------

    /// A constant input (no gradient), copied into a pooled buffer.
    pub fn input(&mut self, data: &[f32], shape: &[usize]) -> Result<Tensor> {
        let shape = Shape::new(shape)?;
        if data.len() != shape.numel() {
            return Err(Error::DataLength {
                what: "input",
                len: data.len(),
                shape,
            });
        }
        if let Some(be) = &self.dev {
            let buf = be.upload(data)?;
            return Ok(self.push_dev("input", buf, shape, None));
        }
        let buf = self.store.pool.take_copy(data);
        Ok(self.push("input", buf, shape, None))
    }

    /// A leaf that receives a gradient (read it with [`Graph::grad`] after `backward`).
    pub fn variable(&mut self, data: &[f32], shape: &[usize]) -> Result<Tensor> {
        let t = self.input(data, shape)?;
        self.nodes[t.idx()].requires_grad = self.grad_enabled;
        Ok(t)
    }

    /// A tensor of zeros (no gradient).
    pub fn zeros(&mut self, shape: &[usize]) -> Result<Tensor> {
        let shape = Shape::new(shape)?;
        if let Some(be) = &self.dev {
            let buf = be.zeros(shape.numel())?;
            return Ok(self.push_dev("zeros", buf, shape, None));
        }
        let buf = self.store.pool.take_zeroed(shape.numel());
        Ok(self.push("zeros", buf, shape, None))
    }

    /// The parameter `id` as a tensor (its value is read in place; its gradient accumulates
    /// into the store). Repeated calls return the same handle.
    pub fn param(&mut self, id: ParamId) -> Result<Tensor> {
        let p = self.store.check(id)?;
        if let Some(&t) = self.param_nodes.get(&p) {
            if self.nodes[t.idx()].requires_grad || !self.grad_enabled {
                return Ok(t);
            }
        }
        let t = self.push_value(
            "param",
            Value::Param(p),
            self.store.shapes[p],
            self.grad_enabled,
            None,
        );
        self.param_nodes.insert(p, t);
        Ok(t)
    }

    // ---- inspection -----------------------------------------------------------------------

    pub(crate) fn check(&self, t: Tensor) -> Result<()> {
        if t.graph == self.serial && t.idx() < self.nodes.len() {
            Ok(())
        } else {
            Err(Error::ForeignTensor)
        }
    }

    /// The shape of `t`.
    pub fn shape(&self, t: Tensor) -> Result<Shape> {
        self.check(t)?;
        Ok(self.nodes[t.idx()].shape)
    }

    /// The values of `t` (row-major), on a CPU graph; a device graph's tensor reports
    /// [`Error::WrongDevice`] (use [`Graph::to_vec`]).
    pub fn value(&self, t: Tensor) -> Result<&[f32]> {
        self.check(t)?;
        if self.dev.is_some() {
            return Err(Error::WrongDevice {
                what: "Graph::value",
                device: Device::Cuda,
                hint: "use Graph::to_vec, which downloads",
            });
        }
        Ok(self.values().get(t))
    }

    /// The values of `t`, copied to the host (downloaded from a device).
    pub fn to_vec(&self, t: Tensor) -> Result<Vec<f32>> {
        match &self.dev {
            None => Ok(self.value(t)?.to_vec()),
            Some(be) => {
                self.check(t)?;
                Ok(be.download(self.values().dev(t)?)?)
            }
        }
    }

    /// The single value of a one-element tensor (e.g. a loss).
    pub fn item(&self, t: Tensor) -> Result<f32> {
        let s = self.shape(t)?;
        if s.numel() != 1 {
            return Err(Error::NotScalar(s));
        }
        Ok(self.to_vec(t)?[0])
    }

    /// Whether gradients flow to `t`.
    pub fn requires_grad(&self, t: Tensor) -> Result<bool> {
        self.check(t)?;
        Ok(self.nodes[t.idx()].requires_grad)
    }

    /// After `backward`: the gradient of a leaf [`variable`](Graph::variable) or parameter
    /// (for a parameter, the store's accumulated gradient). Intermediate gradients are
    /// released during the pass and read as `None`.
    pub fn grad(&self, t: Tensor) -> Result<Option<&[f32]>> {
        self.check(t)?;
        if self.dev.is_some() {
            return Err(Error::WrongDevice {
                what: "Graph::grad",
                device: Device::Cuda,
                hint: "use Graph::grad_vec, which downloads",
            });
        }
        if let Value::Param(p) = self.nodes[t.idx()].value {
            return Ok(Some(&self.store.grads[p]));
        }
        Ok(self
            .grads
            .get(t.idx())
            .and_then(|g| g.as_ref())
            .map(CpuBuf::as_slice))
    }

    /// [`Graph::grad`], copied to the host on either device.
    pub fn grad_vec(&self, t: Tensor) -> Result<Option<Vec<f32>>> {
        let Some(be) = &self.dev else {
            return Ok(self.grad(t)?.map(<[f32]>::to_vec));
        };
        self.check(t)?;
        if let Value::Param(p) = self.nodes[t.idx()].value {
            return self.store.download_grad(crate::ParamId(p as u32)).map(Some);
        }
        match self.dev_grads.get(t.idx()).and_then(|g| g.as_ref()) {
            Some(g) => Ok(Some(be.download(g)?)),
            None => Ok(None),
        }
    }

    // ---- recording (crate-internal) -------------------------------------------------------

    pub(crate) fn values(&self) -> Values<'_> {
        Values {
            nodes: &self.nodes,
            params: &self.store.values,
            dev_params: dev_values(self.store),
        }
    }

    /// Split borrows for ops that need the values, the linear states and the pool at once.
    pub(crate) fn parts(
        &mut self,
    ) -> (
        Values<'_>,
        &mut [Option<Box<LinearQuantState>>],
        &mut BufferPool,
    ) {
        let store = &mut *self.store;
        (
            Values {
                nodes: &self.nodes,
                params: &store.values,
                dev_params: store.dev.as_ref().map_or(&[], |d| &d.values),
            },
            &mut store.states,
            &mut store.pool,
        )
    }

    /// A pooled output buffer of `n` values (stale contents: the op overwrites all of them).
    #[inline]
    pub(crate) fn alloc(&mut self, n: usize) -> CpuBuf {
        self.store.pool.take(n)
    }

    /// The store index of `t` when it is a parameter (or a reshape of one).
    pub(crate) fn param_index(&self, t: Tensor) -> Option<usize> {
        match self.nodes[t.idx()].value {
            Value::Param(p) => Some(p),
            _ => None,
        }
    }

    /// The handle the next pushed node will get (for closures that read their own output).
    pub(crate) fn next_tensor(&self) -> Tensor {
        Tensor {
            id: self.nodes.len() as u32,
            graph: self.serial,
        }
    }

    /// True when an op over `inputs` must record a backward closure.
    pub(crate) fn needs_grad(&self, inputs: &[Tensor]) -> bool {
        self.grad_enabled && inputs.iter().any(|t| self.nodes[t.idx()].requires_grad)
    }

    /// Appends an op output; it requires a gradient iff a backward closure is given.
    pub(crate) fn push(
        &mut self,
        op: &'static str,
        buf: CpuBuf,
        shape: Shape,
        bw: Option<BackwardFn>,
    ) -> Tensor {
        debug_assert_eq!(buf.len(), shape.numel());
        let rg = bw.is_some();
        let bw = bw.map(Backward::Cpu);
        self.push_value(op, Value::Owned(Storage::Cpu(buf)), shape, rg, bw)
    }

    /// [`Graph::push`] for a device graph's output and backward closure.
    pub(crate) fn push_dev(
        &mut self,
        op: &'static str,
        buf: DeviceBuf<f32>,
        shape: Shape,
        bw: Option<DevBackwardFn>,
    ) -> Tensor {
        let rg = bw.is_some();
        let bw = bw.map(Backward::Dev);
        self.push_value(op, Value::Owned(Storage::Cuda(buf)), shape, rg, bw)
    }

    /// Appends a node sharing the data of `of` (same element count).
    pub(crate) fn push_alias(
        &mut self,
        op: &'static str,
        of: Tensor,
        shape: Shape,
        bw: Option<BackwardFn>,
    ) -> Tensor {
        self.push_alias_any(op, of, shape, bw.map(Backward::Cpu))
    }

    /// [`Graph::push_alias`] with a device backward closure.
    pub(crate) fn push_alias_dev(
        &mut self,
        op: &'static str,
        of: Tensor,
        shape: Shape,
        bw: Option<DevBackwardFn>,
    ) -> Tensor {
        self.push_alias_any(op, of, shape, bw.map(Backward::Dev))
    }

    fn push_alias_any(
        &mut self,
        op: &'static str,
        of: Tensor,
        shape: Shape,
        bw: Option<Backward>,
    ) -> Tensor {
        let root = match self.nodes[of.idx()].value {
            Value::Alias(r) => r,
            _ => of.idx(),
        };
        let rg = bw.is_some();
        match self.nodes[root].value {
            Value::Param(p) => self.push_value(op, Value::Param(p), shape, rg, bw),
            _ => self.push_value(op, Value::Alias(root), shape, rg, bw),
        }
    }

    fn push_value(
        &mut self,
        op: &'static str,
        value: Value,
        shape: Shape,
        requires_grad: bool,
        bw: Option<Backward>,
    ) -> Tensor {
        if let Some(p) = &mut self.profile {
            if let Some(dev) = &self.dev {
                // device ops only queue kernels: time their work, not their launches (an
                // error of that work resurfaces at the next launch or download)
                let _ = dev.launcher().synchronize();
            }
            p.record_forward(op);
        }
        let id = self.nodes.len() as u32;
        self.nodes.push(Node {
            value,
            shape,
            requires_grad,
            op,
        });
        self.backward_fns.push(bw);
        Tensor {
            id,
            graph: self.serial,
        }
    }

    // ---- profiling ------------------------------------------------------------------------

    /// Starts timing ops: forward time per op kind (measured from the previous recorded
    /// tensor to this one, so it includes any caller code in between) and backward time per
    /// op kind. Read the result with [`Graph::profile`].
    ///
    /// ```
    /// use autograd::{Graph, ParamStore};
    /// let mut ps = ParamStore::new();
    /// let mut g = Graph::new(&mut ps);
    /// g.enable_profiling();
    /// let x = g.variable(&[1.0, 2.0], &[2])?;
    /// let y = g.gelu(x)?;
    /// let l = g.sum(y)?;
    /// g.backward(l)?;
    /// let p = g.profile().unwrap();
    /// assert_eq!(p.entries().iter().filter(|e| e.op == "gelu").count(), 2); // fwd + bwd
    /// println!("{p}");
    /// # Ok::<(), autograd::Error>(())
    /// ```
    pub fn enable_profiling(&mut self) {
        self.profile = Some(OpProfile::new());
    }

    /// The op timings collected since [`Graph::enable_profiling`].
    pub fn profile(&self) -> Option<&OpProfile> {
        self.profile.as_ref()
    }

    // ---- backward -------------------------------------------------------------------------

    /// Backpropagates from a scalar `loss`: parameter gradients accumulate into the store,
    /// leaf variables' gradients become readable with [`Graph::grad`]. Runs once per graph.
    pub fn backward(&mut self, loss: Tensor) -> Result<()> {
        let s = self.shape(loss)?;
        if s.numel() != 1 {
            return Err(Error::NotScalar(s));
        }
        self.backward_with(loss, &[1.0])
    }

    /// Backpropagates from any tensor `t`, seeding its gradient with `grad` (same element
    /// count): computes the vector-Jacobian product `gradᵀ · ∂t/∂(leaves)`.
    pub fn backward_with(&mut self, t: Tensor, grad: &[f32]) -> Result<()> {
        let shape = self.shape(t)?;
        if grad.len() != shape.numel() {
            return Err(Error::DataLength {
                what: "backward seed",
                len: grad.len(),
                shape,
            });
        }
        if std::mem::replace(&mut self.backward_done, true) {
            return Err(Error::BackwardTwice);
        }
        if !self.nodes[t.idx()].requires_grad {
            return Ok(());
        }
        if self.dev.is_some() {
            return self.backward_dev(t, grad);
        }
        self.grads.resize_with(self.nodes.len(), || None);
        let store = &mut *self.store;
        let mut ctx = BackwardCtx {
            vals: Values {
                nodes: &self.nodes,
                params: &store.values,
                dev_params: &[],
            },
            nodes: &self.nodes,
            node_grads: &mut self.grads,
            param_grads: &mut store.grads,
            states: &mut store.states,
            pool: &mut store.pool,
            seed: self.seed,
            step: self.step,
        };
        ctx.accumulate(t, grad);
        for id in (0..=t.idx()).rev() {
            let Some(f) = self.backward_fns[id].take() else {
                continue;
            };
            let Some(dy) = ctx.node_grads[id].take() else {
                continue;
            };
            let Backward::Cpu(f) = f else {
                return Err(Error::WrongDevice {
                    what: "backward",
                    device: Device::Cuda,
                    hint: "a device op in a CPU graph",
                });
            };
            let t0 = self.profile.as_ref().map(|_| Instant::now());
            f(&mut ctx, dy.as_slice())?;
            ctx.pool.give(dy);
            if let (Some(p), Some(t0)) = (&mut self.profile, t0) {
                p.add(self.nodes[id].op, false, t0.elapsed().as_secs_f64());
            }
        }
        Ok(())
    }

    /// The reverse pass of a device graph: the device closures, gradients in device buffers.
    fn backward_dev(&mut self, t: Tensor, grad: &[f32]) -> Result<()> {
        self.dev_grads.resize_with(self.nodes.len(), || None);
        let store = &mut *self.store;
        let Some(d) = store.dev.as_mut() else {
            return Err(Error::WrongDevice {
                what: "backward",
                device: Device::Cpu,
                hint: "the store left the device while the graph was alive",
            });
        };
        let be = std::sync::Arc::clone(&d.be);
        let mut ctx = DevCtx {
            be: &be,
            vals: Values {
                nodes: &self.nodes,
                params: &store.values,
                dev_params: &d.values,
            },
            node_grads: &mut self.dev_grads,
            param_grads: &mut d.grads,
            states: &mut store.states,
        };
        let seed = be.upload(grad)?;
        ctx.accumulate(t, &seed)?;
        for id in (0..=t.idx()).rev() {
            let Some(f) = self.backward_fns[id].take() else {
                continue;
            };
            let Some(dy) = ctx.node_grads[id].take() else {
                continue;
            };
            let Backward::Dev(f) = f else {
                return Err(Error::NoDeviceKernel {
                    op: self.nodes[id].op,
                });
            };
            let t0 = self.profile.as_ref().map(|_| Instant::now());
            f(&mut ctx, &dy)?;
            if let (Some(p), Some(t0)) = (&mut self.profile, t0) {
                if let Some(dev) = &self.dev {
                    dev.launcher()
                        .synchronize()
                        .map_err(crate::backend::BackendError::from)?;
                }
                p.add(self.nodes[id].op, false, t0.elapsed().as_secs_f64());
            }
        }
        Ok(())
    }
}

impl Drop for Graph<'_> {
    fn drop(&mut self) {
        let pool = &mut self.store.pool;
        for n in self.nodes.drain(..) {
            if let Value::Owned(s) = n.value {
                pool.give_storage(s);
            }
        }
        for g in self.grads.drain(..).flatten() {
            pool.give(g);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn foreign_handles_and_double_backward_are_errors() {
        let mut ps = ParamStore::new();
        let t_other = {
            let mut g = Graph::new(&mut ps);
            g.input(&[1.0], &[1]).unwrap()
        };
        let mut g = Graph::new(&mut ps);
        assert!(matches!(g.value(t_other), Err(Error::ForeignTensor)));
        let x = g.variable(&[1.0, 2.0], &[2]).unwrap();
        assert!(matches!(g.backward(x), Err(Error::NotScalar(_))));
        let s = g.sum(x).unwrap();
        g.backward(s).unwrap();
        assert!(matches!(g.backward(s), Err(Error::BackwardTwice)));
        assert_eq!(g.grad(x).unwrap(), Some(&[1.0, 1.0][..]));
        assert!(matches!(
            g.input(&[1.0], &[2]),
            Err(Error::DataLength { .. })
        ));
    }

    #[test]
    fn same_tensor_twice_accumulates() {
        let mut ps = ParamStore::new();
        let w = ps.add("w", &[2], vec![3.0, -1.0]).unwrap();
        let mut g = Graph::new(&mut ps);
        let x = g.variable(&[1.0, 2.0], &[2]).unwrap();
        let wt = g.param(w).unwrap();
        let xx = g.mul(x, x).unwrap(); // x^2
        let ww = g.mul(wt, wt).unwrap(); // w^2
        let s = g.add(xx, ww).unwrap();
        let l = g.sum(s).unwrap();
        g.backward(l).unwrap();
        assert_eq!(g.grad(x).unwrap().unwrap(), &[2.0, 4.0]);
        drop(g);
        assert_eq!(ps.grad(w).unwrap(), &[6.0, -2.0]);
    }

    #[test]
    fn gradients_accumulate_across_graphs_and_no_grad_records_nothing() {
        let mut ps = ParamStore::new();
        let w = ps.add("w", &[1], vec![2.0]).unwrap();
        for _ in 0..2 {
            let mut g = Graph::new(&mut ps);
            let wt = g.param(w).unwrap();
            let y = g.scale(wt, 3.0).unwrap();
            let l = g.sum(y).unwrap();
            g.backward(l).unwrap();
        }
        assert_eq!(ps.grad(w).unwrap(), &[6.0]);
        ps.zero_grad();
        let mut g = Graph::new(&mut ps);
        g.set_grad_enabled(false);
        let wt = g.param(w).unwrap();
        let y = g.scale(wt, 3.0).unwrap();
        assert!(!g.requires_grad(y).unwrap());
        g.backward(y).unwrap(); // nothing to do
        drop(g);
        assert_eq!(ps.grad(w).unwrap(), &[0.0]);
    }

    #[test]
    fn activation_buffers_return_to_the_pool_for_the_next_step() {
        let mut ps = ParamStore::new();
        let w = ps.add("w", &[4096], vec![1.0; 4096]).unwrap();
        let step = |ps: &mut ParamStore| {
            let mut g = Graph::new(ps);
            let wt = g.param(w).unwrap();
            let y = g.scale(wt, 3.0).unwrap();
            let l = g.sum(y).unwrap();
            g.backward(l).unwrap();
        };
        step(&mut ps);
        // at least the 4096 values of the scaled activation (small buffers are not kept)
        let pooled = ps.pool_bytes();
        assert!(pooled >= 4096 * 4, "{pooled} bytes pooled");
        // the next step draws its buffers from the pool instead of growing it
        step(&mut ps);
        assert_eq!(ps.pool_bytes(), pooled);
        ps.release_pool();
        assert_eq!(ps.pool_bytes(), 0);
    }
}
