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

use std::sync::{Arc, OnceLock, RwLock};

pub use crate::config::PLAN_CACHE_CAPACITY_ENV;
pub use background::wait_for_background_builds;
pub use dynamic_shapes::dynamic_shape_kernel_caches;
pub use executor::{execute_graph, execute_graph_on, Binding};
pub(crate) use executor::{execute_keyed, execute_keyed_when_built, prefetch_keyed, with_cudnn_handle};
pub use handles::{cudnn_pool, CudnnKind, PooledCudnn};
pub use policy::{policy, set_policy, ConvLayout, EnginePolicy, HeuristicMode};
pub use serialized::{serialized_plan_counts, SerializedPlanCounts};

use cache::{CacheStats, ChoiceCache, StatsSnapshot};

/// The plan layer's part of the [`Engine`](crate::Engine): the caches of engine
/// choices, the handle pool (whose handles carry the plan LRUs), the policy, the background
/// builds, the dynamic-shape kernel caches and what is known unsupported or stored.
pub(crate) struct PlanState {
    stats: OnceLock<Arc<CacheStats>>,
    choices: OnceLock<ChoiceCache>,
    handles: OnceLock<crate::handle::DeviceThreadHandlePool<CudnnKind>>,
    policy: RwLock<Option<EnginePolicy>>,
    background: OnceLock<background::Table>,
    serialized: serialized::Serialized,
    dynamic: OnceLock<dynamic_shapes::Registry>,
    static_only: OnceLock<dynamic_shapes::StaticOnly>,
    unsupported: OnceLock<executor::UnsupportedMap>,
}

impl PlanState {
    pub(crate) const fn new() -> Self {
        PlanState {
            stats: OnceLock::new(),
            choices: OnceLock::new(),
            handles: OnceLock::new(),
            policy: RwLock::new(None),
            background: OnceLock::new(),
            serialized: serialized::Serialized::new(),
            dynamic: OnceLock::new(),
            static_only: OnceLock::new(),
            unsupported: OnceLock::new(),
        }
    }
}

/// The plan layer's state in the process's engine.
fn state() -> &'static PlanState {
    &crate::engine().plans
}

/// Counters shared by every plan LRU and the choice cache.
pub(crate) fn cache_stats() -> &'static Arc<CacheStats> {
    state().stats.get_or_init(CacheStats::new)
}

/// The engine-choice cache.
pub(crate) fn choice_cache() -> &'static ChoiceCache {
    state()
        .choices
        .get_or_init(|| ChoiceCache::with_default_capacity(cache_stats().clone()))
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
