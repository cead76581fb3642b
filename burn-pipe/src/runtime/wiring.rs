//! The channels of one pass: between each pair of neighbouring stages, one
//! carrying activations forward and one carrying gradients back.

use std::ops::Range;

use burn_freeze::{InnerHidden, StackTypes};
use crossbeam_channel::{Receiver, Sender, unbounded};

/// A message between neighbouring stages: a micro-batch number and a hidden
/// activation (forward) or its gradient (backward), on the inner backend.
pub(crate) type Message<S> = (usize, InnerHidden<S>);

/// The channel ends one stage uses. Stage 0 has no `from_previous` and the
/// last stage no `to_next`; gradient links exist only where the unit before
/// the boundary trains.
pub(crate) struct Links<S: StackTypes> {
    pub from_previous: Option<Receiver<Message<S>>>,
    pub to_next: Option<Sender<Message<S>>>,
    pub grads_from_next: Option<Receiver<Message<S>>>,
    pub grads_to_previous: Option<Sender<Message<S>>>,
}

impl<S: StackTypes> Links<S> {
    /// Whether the stage's input needs a gradient to send back: the unit
    /// before it trains.
    pub fn grads_upstream(&self) -> bool {
        self.grads_to_previous.is_some()
    }
}

/// The links of every stage, for stages holding `ranges` with units
/// `0..front` frozen. Frozen units form a prefix, so a gradient crosses the
/// boundary before stage `s` exactly when that stage's first unit is above
/// the front.
pub(crate) fn wire<S: StackTypes>(ranges: &[Range<usize>], front: usize) -> Vec<Links<S>> {
    let stages = ranges.len();
    let mut links: Vec<Links<S>> = (0..stages)
        .map(|_| Links {
            from_previous: None,
            to_next: None,
            grads_from_next: None,
            grads_to_previous: None,
        })
        .collect();
    for s in 1..stages {
        let (tx, rx) = unbounded();
        links[s - 1].to_next = Some(tx);
        links[s].from_previous = Some(rx);
        if ranges[s].start > front {
            let (tx, rx) = unbounded();
            links[s].grads_to_previous = Some(tx);
            links[s - 1].grads_from_next = Some(rx);
        }
    }
    links
}
