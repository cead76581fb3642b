//! Running per-parameter sums of the gradients an optimizer sees: the epoch's
//! accumulated gradient behind [`ArgminStatistic::AccumulatedGradient`](crate::ArgminStatistic).

use std::collections::HashMap;
use std::fmt;

use burn::module::{Module, ModuleVisitor, Param, ParamId};
use burn::optim::GradientsParams;
use burn::prelude::*;
use burn::tensor::backend::AutodiffBackend;

/// One running sum per parameter: each parameter's gradients added up over
/// the steps since the last [`clear`](Self::clear), flattened, on the inner
/// backend of the autodiff backend that trains, on the parameter's device.
///
/// Its memory is one tensor per parameter that got a gradient (as much as
/// the trainable weights); a step costs one add per parameter tensor and
/// reads nothing back from the device. [`FreezableStack`](crate::FreezableStack)
/// keeps one when a policy asks for it
/// ([`FreezeFront::set_gradient_sums`](crate::FreezeFront::set_gradient_sums)),
/// as can any other freeze front (a pipeline, each stage its own units on
/// its own thread).
///
/// ```
/// use burn::backend::{Autodiff, Flex};
/// use burn::module::Module;
/// use burn::nn::{Linear, LinearConfig};
/// use burn::optim::GradientsParams;
/// use burn::prelude::*;
/// use burn_freeze::plumbing::GradientSums;
///
/// type B = Autodiff<Flex>;
/// let device = Default::default();
/// let linear: Linear<B> = LinearConfig::new(2, 1).with_bias(false).init(&device);
/// let mut sums = GradientSums::<Flex>::new();
/// for sign in [1.0, -1.0] {
///     // The loss sign * sum(W x): the two steps' gradients cancel.
///     let x = Tensor::<B, 2>::ones([1, 2], &device);
///     let loss = linear.forward(x).sum().mul_scalar(sign);
///     let grads = GradientsParams::from_grads(loss.backward(), &linear);
///     sums.add(&linear, &grads);
/// }
/// let weight = sums.get(linear.weight.id).unwrap();
/// let total: f32 = weight.clone().abs().sum().into_scalar();
/// assert!(total.abs() < 1e-6);
/// ```
pub struct GradientSums<B: Backend> {
    sums: HashMap<ParamId, Tensor<B, 1>>,
}

impl<B: Backend> GradientSums<B> {
    /// No sum yet.
    pub fn new() -> Self {
        Self {
            sums: HashMap::new(),
        }
    }

    /// Parameters with a sum.
    pub fn len(&self) -> usize {
        self.sums.len()
    }

    /// Whether no parameter has a sum.
    pub fn is_empty(&self) -> bool {
        self.sums.is_empty()
    }

    /// Adds the gradient in `grads` of each of `module`'s parameters to the
    /// parameter's sum (the first starts it): one add per parameter tensor.
    pub fn add<AB, M>(&mut self, module: &M, grads: &GradientsParams)
    where
        AB: AutodiffBackend<InnerBackend = B>,
        M: Module<AB>,
    {
        module.visit(&mut AddVisitor::<AB> {
            sums: &mut self.sums,
            grads,
        });
    }

    /// The sum of parameter `id`'s gradients, flattened.
    pub fn get(&self, id: ParamId) -> Option<&Tensor<B, 1>> {
        self.sums.get(&id)
    }

    /// Keeps only the sums of `module`'s parameters (those of units that
    /// froze are dropped).
    pub fn retain<AB, M>(&mut self, module: &M)
    where
        AB: Backend,
        M: Module<AB>,
    {
        let ids = param_ids(module);
        self.sums.retain(|id, _| ids.contains(id));
    }

    /// Takes out the sums of `module`'s parameters, moved to `device`.
    pub fn take_for<AB, M>(&mut self, module: &M, device: &B::Device) -> Self
    where
        AB: Backend,
        M: Module<AB>,
    {
        let sums = param_ids(module)
            .into_iter()
            .filter_map(|id| self.sums.remove(&id).map(|s| (id, s.to_device(device))))
            .collect();
        Self { sums }
    }

    /// Adds `other`'s sums to these (they cover other parameters, as when
    /// the stages of a pipeline pool theirs before a repartition).
    pub fn merge(&mut self, other: Self) {
        for (id, sum) in other.sums {
            let merged = match self.sums.remove(&id) {
                Some(mine) => mine + sum,
                None => sum,
            };
            self.sums.insert(id, merged);
        }
    }

    /// A copy on `device` (a new replica's).
    pub fn to_device(&self, device: &B::Device) -> Self {
        Self {
            sums: self
                .sums
                .iter()
                .map(|(id, s)| (*id, s.clone().to_device(device)))
                .collect(),
        }
    }

    /// Drops every sum: the next step starts a new accumulation.
    pub fn clear(&mut self) {
        self.sums.clear();
    }
}

impl<B: Backend> Default for GradientSums<B> {
    fn default() -> Self {
        Self::new()
    }
}

impl<B: Backend> Clone for GradientSums<B> {
    fn clone(&self) -> Self {
        Self {
            sums: self.sums.clone(),
        }
    }
}

impl<B: Backend> fmt::Debug for GradientSums<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GradientSums")
            .field("params", &self.sums.len())
            .finish()
    }
}

struct AddVisitor<'a, AB: AutodiffBackend> {
    sums: &'a mut HashMap<ParamId, Tensor<AB::InnerBackend, 1>>,
    grads: &'a GradientsParams,
}

impl<AB: AutodiffBackend> ModuleVisitor<AB> for AddVisitor<'_, AB> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<AB, D>>) {
        let Some(grad) = self.grads.get::<AB::InnerBackend, D>(param.id) else {
            return;
        };
        let grad = flatten(grad);
        let sum = match self.sums.remove(&param.id) {
            Some(sum) => sum + grad,
            None => grad,
        };
        self.sums.insert(param.id, sum);
    }
}

/// A tensor as one dimension (a view: no copy).
pub(crate) fn flatten<B: Backend, const D: usize>(tensor: Tensor<B, D>) -> Tensor<B, 1> {
    let n = tensor.shape().num_elements();
    tensor.reshape([n])
}

struct IdVisitor(Vec<ParamId>);

impl<B: Backend> ModuleVisitor<B> for IdVisitor {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        self.0.push(param.id);
    }
}

fn param_ids<B: Backend, M: Module<B>>(module: &M) -> std::collections::HashSet<ParamId> {
    let mut visitor = IdVisitor(Vec::new());
    module.visit(&mut visitor);
    visitor.0.into_iter().collect()
}
