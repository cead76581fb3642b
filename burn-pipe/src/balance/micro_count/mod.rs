//! The micro-batch count M: the paper's per pipeline length, or the fastest
//! predicted from unit times measured at several micro-batch sizes.

pub(crate) mod count;
pub(crate) mod error;
pub(crate) mod times;
