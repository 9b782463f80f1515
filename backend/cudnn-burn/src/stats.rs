//! What the registered provider did: counters kept by the provider, read with
//! [`crate::stats`].

use std::sync::atomic::{AtomicU64, Ordering};

/// Live counters (one set per registered provider).
#[derive(Default)]
pub(crate) struct Counters {
    offered: AtomicU64,
    claimed: AtomicU64,
    engine_runs: AtomicU64,
    fallbacks: AtomicU64,
    conv_forward: AtomicU64,
    conv_backward_data: AtomicU64,
    conv_backward_filter: AtomicU64,
    conv_transpose_forward: AtomicU64,
    index_add: AtomicU64,
    pool_forward: AtomicU64,
    pool_backward: AtomicU64,
    stream_orderings: AtomicU64,
}

/// A copy of the provider's counters at one moment (all counts since [`crate::register`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Blocks of Burn's fusion stream whose first operation the provider would run.
    pub offered: u64,
    /// Blocks the provider won (Burn's fusion search chose its optimization).
    pub claimed: u64,
    /// Claimed operations the engine ran.
    pub engine_runs: u64,
    /// Claimed operations that ran Burn's own implementation instead (an error on the
    /// engine's path: shape, layout, cuDNN support, ordering).
    pub fallbacks: u64,
    /// Engine runs of convolution forward (1-3-D, with or without bias).
    pub conv_forward: u64,
    /// Engine runs of convolution backward data.
    pub conv_backward_data: u64,
    /// Engine runs of convolution backward filter.
    pub conv_backward_filter: u64,
    /// Engine runs of transposed convolutions.
    pub conv_transpose_forward: u64,
    /// Engine runs of row adds (`select_assign` with addition: embedding gradients).
    pub index_add: u64,
    /// Engine runs of pooling forward.
    pub pool_forward: u64,
    /// Engine runs of pooling backward.
    pub pool_backward: u64,
    /// CubeCL streams whose ordering with the engine's stream was set up (once per GPU and
    /// CubeCL stream; each set-up compiles two small kernels through CubeCL and waits for a
    /// self-test). A count that grows with the training steps means new streams per step.
    pub stream_orderings: u64,
}

impl Stats {
    /// What happened between `earlier` and `self`.
    pub fn since(self, earlier: Stats) -> Stats {
        Stats {
            offered: self.offered - earlier.offered,
            claimed: self.claimed - earlier.claimed,
            engine_runs: self.engine_runs - earlier.engine_runs,
            fallbacks: self.fallbacks - earlier.fallbacks,
            conv_forward: self.conv_forward - earlier.conv_forward,
            conv_backward_data: self.conv_backward_data - earlier.conv_backward_data,
            conv_backward_filter: self.conv_backward_filter - earlier.conv_backward_filter,
            conv_transpose_forward: self.conv_transpose_forward - earlier.conv_transpose_forward,
            index_add: self.index_add - earlier.index_add,
            pool_forward: self.pool_forward - earlier.pool_forward,
            pool_backward: self.pool_backward - earlier.pool_backward,
            stream_orderings: self.stream_orderings - earlier.stream_orderings,
        }
    }
}

/// Which counter an event bumps.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Event {
    Offered,
    Claimed,
    Fallback,
    /// A CubeCL stream's ordering was set up.
    StreamOrdering,
    /// An engine run of the named operation (`Claim::name`).
    Ran(&'static str),
}

impl Counters {
    pub(crate) fn bump(&self, event: Event) {
        let add = |c: &AtomicU64| {
            c.fetch_add(1, Ordering::Relaxed);
        };
        match event {
            Event::Offered => add(&self.offered),
            Event::Claimed => add(&self.claimed),
            Event::Fallback => add(&self.fallbacks),
            Event::StreamOrdering => add(&self.stream_orderings),
            Event::Ran(op) => {
                add(&self.engine_runs);
                match op {
                    "conv_forward" => add(&self.conv_forward),
                    "conv_backward_data" => add(&self.conv_backward_data),
                    "conv_backward_filter" => add(&self.conv_backward_filter),
                    "conv_transpose_forward" => add(&self.conv_transpose_forward),
                    "index_add" => add(&self.index_add),
                    "pool_forward" => add(&self.pool_forward),
                    "pool_backward" => add(&self.pool_backward),
                    _ => {}
                }
            }
        }
    }

    pub(crate) fn snapshot(&self) -> Stats {
        let l = |c: &AtomicU64| c.load(Ordering::Relaxed);
        Stats {
            offered: l(&self.offered),
            claimed: l(&self.claimed),
            engine_runs: l(&self.engine_runs),
            fallbacks: l(&self.fallbacks),
            conv_forward: l(&self.conv_forward),
            conv_backward_data: l(&self.conv_backward_data),
            conv_backward_filter: l(&self.conv_backward_filter),
            conv_transpose_forward: l(&self.conv_transpose_forward),
            index_add: l(&self.index_add),
            pool_forward: l(&self.pool_forward),
            pool_backward: l(&self.pool_backward),
            stream_orderings: l(&self.stream_orderings),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_count_per_operation() {
        let c = Counters::default();
        let before = c.snapshot();
        c.bump(Event::Offered);
        c.bump(Event::Claimed);
        c.bump(Event::Ran("conv_backward_filter"));
        c.bump(Event::Ran("pool_backward"));
        c.bump(Event::Fallback);
        c.bump(Event::StreamOrdering);
        let d = c.snapshot().since(before);
        assert_eq!((d.offered, d.claimed, d.engine_runs, d.fallbacks), (1, 1, 2, 1));
        assert_eq!(d.stream_orderings, 1);
        assert_eq!((d.conv_backward_filter, d.pool_backward, d.conv_forward), (1, 1, 0));
    }
}
