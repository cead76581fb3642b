//! What a pass may do besides the plain forward and backward: hand each
//! stage's gradients to a hook.

use std::fmt;

use crate::runtime::hook::StageGradients;

/// The options of one pass of [`Pipeline::forward_backward`](crate::Pipeline::forward_backward)
/// (and [`train_step`](crate::Pipeline::train_step)): none by default.
///
/// - [`with_hook`](Self::with_hook): each stage hands its gradients of the
///   pass to a [`StageGradients`] hook on its own thread as soon as it has
///   finished the backward of its last micro-batch (the last stage first),
///   and keeps what the hook returns: a data-parallel group all-reduces them
///   there while the earlier stages still compute.
///
/// A cached pass needs no option: its batch is where the cache's service
/// starts it ([`Pipeline::serve_prefix`](crate::Pipeline::serve_prefix)).
///
/// ```
/// use burn::optim::GradientsParams;
/// use burn_pipe::{StageGradients, StepOptions};
///
/// struct Keep;
/// impl StageGradients for Keep {
///     fn stage_done(&self, _stage: usize, grads: GradientsParams) -> Result<GradientsParams, String> {
///         Ok(grads)
///     }
/// }
///
/// assert!(!StepOptions::new().has_hook());
/// assert!(StepOptions::new().with_hook(&Keep).has_hook());
/// ```
#[derive(Clone, Copy, Default)]
pub struct StepOptions<'a> {
    pub(crate) hook: Option<&'a dyn StageGradients>,
}

impl<'a> StepOptions<'a> {
    /// No hook: a plain pass.
    pub fn new() -> Self {
        Self::default()
    }

    /// Each stage's gradients of the pass go through `hook` (see
    /// [`StageGradients`]). A hook that fails fails the pass
    /// ([`PipeError::GradientHook`](crate::PipeError::GradientHook); no
    /// gradient kept). Refused, before any work, while gradients of an
    /// earlier pass are pending: the hook would see this pass's gradients
    /// only.
    pub fn with_hook(self, hook: &'a dyn StageGradients) -> Self {
        Self {
            hook: Some(hook),
            ..self
        }
    }

    /// Whether a gradient hook is set.
    pub fn has_hook(&self) -> bool {
        self.hook.is_some()
    }
}

impl fmt::Debug for StepOptions<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StepOptions")
            .field("hook", &self.has_hook())
            .finish()
    }
}
