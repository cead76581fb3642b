//! Errors of the layer-stack contract.

/// A stack of units that does not form the model asked for.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum StackError {
    /// A unit of the wrong kind at a position.
    #[error("unit {index} is a {found} unit, expected a {expected} unit")]
    UnexpectedUnit {
        /// Position of the unit in the stack (the first unit is 0).
        index: usize,
        /// What the model needs there.
        expected: &'static str,
        /// What the stack holds there.
        found: &'static str,
    },
    /// The stack has the wrong number of units.
    #[error("the stack has {found} units, the model needs {expected_description}")]
    WrongLength {
        /// Units found.
        found: usize,
        /// What the model needs, in words.
        expected_description: String,
    },
    /// Units per range that do not cover the stack (an empty range, or the
    /// wrong total).
    #[error("balance {balance:?} does not cut {units} units into non-empty ranges")]
    BadBalance {
        /// Units per range.
        balance: Vec<usize>,
        /// Units in the stack.
        units: usize,
    },
    /// Ranges to join that do not follow one another.
    #[error(
        "ranges to join do not follow one another: expected one starting at unit {expected}, found {found:?}"
    )]
    NotContiguous {
        /// Where the next range should start.
        expected: usize,
        /// The range found.
        found: std::ops::Range<usize>,
    },
}

/// A freeze-front request that does not fit the stack.
///
/// Nothing changes when one of these is returned: the stack keeps its front.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum FreezeError {
    /// The front asked for lies beyond the last unit.
    #[error("cannot freeze {requested} units: the stack has only {len}")]
    BeyondStack {
        /// Units asked to be frozen.
        requested: usize,
        /// Units in the stack.
        len: usize,
    },
    /// [`freeze_to`](crate::FreezableStack::freeze_to) was asked to move the
    /// front down; only [`unfreeze_to`](crate::FreezeFront::unfreeze_to) does that.
    #[error(
        "the freeze front only moves up: {frozen} units are frozen, asked for {requested}; \
         call unfreeze_to to move it down"
    )]
    WouldUnfreeze {
        /// Units frozen now.
        frozen: usize,
        /// Units asked to be frozen.
        requested: usize,
    },
    /// [`unfreeze_to`](crate::FreezeFront::unfreeze_to) was asked to move the front up.
    #[error(
        "unfreeze_to({requested}) would freeze more units ({frozen} are frozen); call freeze_to"
    )]
    WouldFreeze {
        /// Units frozen now.
        frozen: usize,
        /// Units asked to stay frozen.
        requested: usize,
    },
    /// A layer number beyond the [`LayerMap`](crate::LayerMap).
    #[error("layer front {requested} is beyond the {layers} layers of the layer map")]
    LayerBeyondMap {
        /// Layers asked to be frozen.
        requested: usize,
        /// Layers in the map.
        layers: usize,
    },
    /// A [`LayerMap`](crate::LayerMap) that names units the stack does not have.
    #[error("the layer map covers units up to {map_end}, the stack has {len}")]
    MapBeyondStack {
        /// One past the last unit the map names.
        map_end: usize,
        /// Units in the stack.
        len: usize,
    },
}

/// An AutoCache request that cannot be served.
#[derive(Debug, thiserror::Error)]
pub enum CacheError {
    /// A fault injected by a reliability test.
    #[error("{0}")]
    Injected(String),
    /// The spill directory cannot be created or written.
    #[error("the cache directory {path} is not writable: {source}")]
    UnwritableDirectory {
        /// The directory given.
        path: std::path::PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A sample id came back with an activation of another shape than the one cached for it.
    #[error(
        "sample {sample} was cached with shapes {cached:?} but now has shapes {found:?}; \
         sample ids must name the same sample every time"
    )]
    ShapeMismatch {
        /// The sample id.
        sample: u64,
        /// Shapes of the tensors cached for it.
        cached: Vec<Vec<usize>>,
        /// Shapes seen now.
        found: Vec<Vec<usize>>,
    },
    /// The batch and its sample ids differ in length.
    #[error("the batch holds {batch} samples but {ids} sample ids were given")]
    IdCount {
        /// Samples in the batch.
        batch: usize,
        /// Ids given.
        ids: usize,
    },
    /// The same sample id appears twice in one batch.
    #[error("sample id {0} appears twice in one batch")]
    DuplicateId(u64),
}

/// A freeze rule's setting outside the range the rule accepts: the field,
/// the value given and the accepted range. Each rule's config checks its
/// own settings and returns this ([`EvidenceConfig::validate`](crate::EvidenceConfig::validate),
/// [`ChangeRateConfig::validate`](crate::ChangeRateConfig::validate),
/// [`AlphaArgminConfig::validate`](crate::AlphaArgminConfig::validate),
/// [`FixedSchedule::validate`](crate::FixedSchedule::validate)).
///
/// ```
/// use burn_freeze::EvidenceConfig;
///
/// let error = EvidenceConfig::new().with_patience(0).validate().unwrap_err();
/// assert_eq!(error.field, "patience");
/// assert_eq!(error.to_string(), "patience = 0 is not accepted: expected at least 1");
/// ```
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
#[error("{field} = {value} is not accepted: expected {accepted}")]
pub struct PolicyConfigError {
    /// The field of the rule's config.
    pub field: &'static str,
    /// The value given.
    pub value: String,
    /// The accepted range.
    pub accepted: &'static str,
}

impl PolicyConfigError {
    /// `field`'s `value` is outside `accepted`.
    pub fn new(field: &'static str, value: impl ToString, accepted: &'static str) -> Self {
        Self {
            field,
            value: value.to_string(),
            accepted,
        }
    }
}
