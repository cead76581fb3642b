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
}
