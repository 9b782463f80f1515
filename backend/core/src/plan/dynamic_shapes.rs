//! Dynamic-shape graphs and their kernel caches ([`EnginePolicy::dynamic_shapes`]): one cuDNN
//! kernel cache per device and graph topology (the graph without its sizes), handed to every
//! plan built for a graph of that topology, so a runtime-compiled engine can reuse a kernel
//! it compiled for another size instead of compiling again.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use super::policy::EnginePolicy;
use crate::error::Result;
use crate::ffi::CudnnHandle;
use crate::graph::lower::{lower, DynamicKernelCache, LoweredGraph};
use crate::graph::{Graph, SignatureContext};

/// The first cuDNN version with dynamic-shape kernel caches bound to an operation graph.
const MIN_CUDNN: usize = 90500;

/// A device ordinal and a graph topology ([`Graph::topology_bytes`]).
pub(super) type TopologyKey = (usize, Vec<u8>);

pub(super) type Registry = Mutex<HashMap<TopologyKey, Arc<DynamicKernelCache>>>;
pub(super) type StaticOnly = Mutex<HashSet<TopologyKey>>;

fn registry() -> &'static Registry {
    super::state().dynamic.get_or_init(Default::default)
}

/// Topologies (per device) for which cuDNN offered no engine as a dynamic-shape graph: they
/// are lowered static from then on.
fn static_only() -> &'static StaticOnly {
    super::state().static_only.get_or_init(Default::default)
}

/// The registry key of `graph` on GPU `ordinal`: the topology alone tells graphs apart, as
/// the registry is per process and device.
fn topology_key(graph: &Graph, ordinal: usize) -> TopologyKey {
    let ctx = SignatureContext {
        compute_capability: (0, 0),
        cudnn_version: 0,
        policy: 0,
    };
    (ordinal, graph.topology_bytes(&ctx))
}

/// Records that cuDNN has no engine for `graph`'s topology as a dynamic-shape graph on GPU
/// `ordinal` (cuDNN 9.14 offers none for the fused attention graphs, for example), so its
/// later lowerings are static.
pub(crate) fn mark_static_only(graph: &Graph, ordinal: usize) {
    static_only()
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(topology_key(graph, ordinal));
}

/// Lowers `graph` for a plan build on GPU `ordinal`: a static graph, or under
/// `policy.dynamic_shapes` (cuDNN 9.5 or newer) a dynamic-shape graph with its topology's
/// kernel cache. A graph cuDNN will not take as dynamic is lowered static (debug log).
pub(crate) fn lower_for_plan(
    graph: &Graph,
    handle: &CudnnHandle,
    policy: &EnginePolicy,
    ordinal: usize,
) -> Result<LoweredGraph> {
    if !policy.dynamic_shapes || crate::ffi::cudnn_version()? < MIN_CUDNN {
        return lower(graph, handle, false);
    }
    let key = topology_key(graph, ordinal);
    if static_only().lock().unwrap_or_else(|e| e.into_inner()).contains(&key) {
        return lower(graph, handle, false);
    }
    let mut lowered = match lower(graph, handle, true) {
        Ok(l) => l,
        Err(e) => {
            tracing::debug!(graph = %graph.describe(), reason = %e, "not a dynamic-shape graph; built for its shape");
            return lower(graph, handle, false);
        }
    };
    let mut caches = registry().lock().unwrap_or_else(|e| e.into_inner());
    let cache = match caches.get(&key) {
        Some(c) => c.clone(),
        None => match DynamicKernelCache::new(&lowered.op_graph) {
            Ok(c) => caches.entry(key).or_insert(Arc::new(c)).clone(),
            Err(e) => {
                tracing::debug!(graph = %graph.describe(), reason = %e, "no kernel cache for this graph");
                return Ok(lowered);
            }
        },
    };
    lowered.kernel_cache = Some(cache);
    Ok(lowered)
}

/// How many kernel caches of dynamic-shape graphs (one per device and graph topology) this
/// process has made under [`EnginePolicy::dynamic_shapes`].
pub fn dynamic_shape_kernel_caches() -> usize {
    registry().lock().unwrap_or_else(|e| e.into_inner()).len()
}
