//! Fresh autodiff leaves for a module's parameters, without moving them.

use burn::module::{Module, ModuleMapper, Param};
use burn::prelude::*;

/// Detaches every float parameter and marks it as a new leaf that requires
/// a gradient (same id, same storage).
struct FreshLeaves;

impl<B: Backend> ModuleMapper<B> for FreshLeaves {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        let (id, tensor, mapper) = param.consume();
        let tracked = tensor.is_require_grad();
        let tensor = tensor.detach();
        let tensor = if tracked {
            tensor.require_grad()
        } else {
            tensor
        };
        Param::from_mapped_value(id, tensor, mapper)
    }
}

/// `module` with every trainable parameter a fresh autodiff leaf: the same
/// values and parameter ids, storage shared, no graph history. This is
/// [`Module::fork`] without its device move (which records a graph step per
/// parameter before detaching it), for parameters already on their device.
///
/// A pipeline stage runs each micro-batch on its own fresh leaves: two live
/// graphs that share parameter leaves break each other in Burn 0.21 (the
/// first backward pass frees what the second still needs), and a leaf that
/// an earlier backward pass consumed can lose its gradient while another
/// thread runs a backward pass (tracel-ai/burn#5573).
pub fn fresh_leaves<B: Backend, M: Module<B>>(module: M) -> M {
    module.map(&mut FreshLeaves)
}
