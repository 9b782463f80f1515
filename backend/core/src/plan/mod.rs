//! Plans: engine heuristics and filtering, autotuning, the plan cache (per-handle LRU of
//! built plans + a shared single-flight map of engine choices + an optional tuning file),
//! the pooled cuDNN handles that carry those LRUs ([`cudnn_pool`]), and graph execution.

mod background;
pub mod cache;
pub(crate) mod engine;
mod executor;
/// Fault injection for tests ([`crate::runtime::fault`]).
#[doc(hidden)]
pub use crate::runtime::fault;
mod dynamic_shapes;
mod handles;
pub mod persist;
pub mod policy;
mod serialized;

use std::sync::{Arc, OnceLock};

pub use crate::config::PLAN_CACHE_CAPACITY_ENV;
pub use background::wait_for_background_builds;
pub use dynamic_shapes::dynamic_shape_kernel_caches;
pub use executor::{execute_graph, execute_graph_on, Binding};
pub(crate) use executor::{execute_keyed, execute_keyed_when_built, prefetch_keyed, with_cudnn_handle};
pub use handles::{cudnn_pool, CudnnKind, PooledCudnn};
pub use policy::{policy, set_policy, ConvLayout, EnginePolicy, HeuristicMode};
pub use serialized::{serialized_plan_counts, SerializedPlanCounts};

use cache::{CacheStats, ChoiceCache, StatsSnapshot};

/// Counters shared by every plan LRU and the choice cache.
pub(crate) fn cache_stats() -> &'static Arc<CacheStats> {
    static STATS: OnceLock<Arc<CacheStats>> = OnceLock::new();
    STATS.get_or_init(CacheStats::new)
}

/// The process-wide engine-choice cache.
pub(crate) fn choice_cache() -> &'static ChoiceCache {
    static CHOICES: OnceLock<ChoiceCache> = OnceLock::new();
    CHOICES.get_or_init(|| ChoiceCache::with_default_capacity(cache_stats().clone()))
}

/// Hit / miss / build-time / eviction counters of the plan cache and the choice cache.
pub fn stats() -> StatsSnapshot {
    cache_stats().snapshot()
}

/// Resets the counters returned by [`stats`].
pub fn reset_stats() {
    cache_stats().reset()
}

/// Forgets every engine choice (built plans stay in their handles' LRUs).
pub fn clear_choices() {
    choice_cache().clear()
}
