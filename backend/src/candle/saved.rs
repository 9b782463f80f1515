//! What a forward op keeps for its backward pass (batch and row statistics, attention's
//! log-sum-exp), stored in the op value that Candle's autograd graph holds.

use std::sync::{Mutex, MutexGuard};

use candle_core::Tensor;

/// The tensors one forward pass of an op kept. An op value applied more than once (through
/// `apply_op*_arc` or the `_no_bwd` variants) cannot tell which forward a backward pass
/// belongs to: it then keeps nothing, and the backward pass recomputes what it needs.
#[derive(Debug, Default)]
pub(crate) struct Saved(Mutex<State>);

#[derive(Clone, Debug, Default)]
enum State {
    #[default]
    Empty,
    Once(Vec<Tensor>),
    Reused,
}

impl Saved {
    fn state(&self) -> MutexGuard<'_, State> {
        // The state is replaced whole, so a panic elsewhere cannot leave it half written.
        self.0.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Records the tensors of a forward pass.
    pub(crate) fn keep(&self, tensors: Vec<Tensor>) {
        let mut s = self.state();
        *s = match *s {
            State::Empty => State::Once(tensors),
            _ => State::Reused,
        };
    }

    /// The tensors of the one forward pass this op value ran, if it ran exactly once.
    pub(crate) fn get(&self) -> Option<Vec<Tensor>> {
        match &*self.state() {
            State::Once(t) => Some(t.clone()),
            _ => None,
        }
    }
}

impl Clone for Saved {
    fn clone(&self) -> Self {
        Saved(Mutex::new(self.state().clone()))
    }
}
