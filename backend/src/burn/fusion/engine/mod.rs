//! What every fuser shares: the run bookkeeping (operands, scalars, releasing consumed
//! tensors, memory-order walks: `run`), the staged matcher the fixed-pattern fusers are built
//! on (`staged`), the activation tails Burn composes after a matmul or convolution
//! (`act_tail`), the per-optimization cache of checked launches (`launch_cache`), and the
//! background thread that flushes burn-fusion's channel when launches stall (`flusher`).

pub(crate) mod act_tail;
pub(crate) mod flusher;
pub(crate) mod launch_cache;
pub(crate) mod run;
pub(crate) mod staged;
