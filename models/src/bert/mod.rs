//! BERT as a stack of PipeTransformer partition units.

mod activation;
mod config;
mod model;
mod pooling;
mod units;

pub use activation::{BertHidden, BertInput};
pub use config::BertConfig;
pub use model::{Bert, BertBlock, BertTypes};
pub use pooling::{BertPooling, l2_normalize};
pub use units::{BertEmbeddings, BertHead, BertUnit, PostNormAttention, PostNormFeedForward};
