//! Engine selection policy: heuristic vs benchmark (autotune), determinism, TF32, workspace
//! cap, SM carveout.

use crate::config::{config, Config};
pub use crate::config::{
    ConvLayout, HeuristicMode, CONV_LAYOUT_ENV, DYNAMIC_SHAPES_ENV, GRAPH_REPLAY_ENV, HEURISTIC_ENV, LIB_CONFIG_ENV,
    MAX_WORKSPACE_ENV, MODE_ENV, SM_COUNT_TARGET_ENV, TF32_ENV,
};

/// How plans are chosen. The configuration sets the initial value (see [`EnginePolicy::from_env`]);
/// [`set_policy`] changes it at run time (new signatures only: cached plans stay).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct EnginePolicy {
    /// Autotune: time the top candidates on the real buffers and keep the fastest
    /// (like PyTorch's `torch.backends.cudnn.benchmark = True`).
    pub benchmark: bool,
    /// Exclude engines whose results may differ between runs.
    pub deterministic: bool,
    /// Allow TF32 tensor cores for f32 data (PyTorch's `allow_tf32`); off by default so
    /// f32 results match f32 arithmetic.
    pub allow_tf32: bool,
    /// Exclude engines that down-convert inputs to a lower precision.
    pub forbid_down_convert: bool,
    /// Largest workspace a plan may use, in bytes (None: unlimited).
    pub max_workspace: Option<u64>,
    /// Heuristic queried first.
    pub heuristic: HeuristicMode,
    /// Candidates timed per signature in benchmark mode.
    pub autotune_top_k: u32,
    /// Replay an execution repeated with identical pointers from a CUDA graph captured on a
    /// stream private to the handle (one graph launch instead of cuDNN's launch sequence).
    pub graph_replay: bool,
    /// SM carveout: ask cuDNN for engine configs that run on at most this many SMs, leaving
    /// the rest free for work on other streams (communication, a second model). cuDNN
    /// honours it for convolutions (fprop, dgrad, wgrad) and their bias/activation fusions
    /// on Hopper and newer; other graphs ignore it. `None`: the whole GPU.
    pub sm_count_target: Option<u32>,
    /// Build graphs as cuDNN dynamic-shape graphs and give every graph of one topology (the
    /// same ops, dtypes, layouts and ranks; any sizes) one cuDNN kernel cache, so a
    /// runtime-compiled engine can reuse the kernel it compiled for another size instead of
    /// compiling again (cuDNN 9.5 or newer; older versions ignore it). Off by default:
    /// dynamic-shape kernels may run slower than kernels compiled for one shape.
    pub dynamic_shapes: bool,
    /// Memory format of convolution operands (see [`ConvLayout`]); results keep it, so a
    /// network's activations, gradients and filters stay in one format.
    pub conv_layout: ConvLayout,
}

impl Default for EnginePolicy {
    fn default() -> Self {
        Self {
            benchmark: false,
            deterministic: false,
            allow_tf32: false,
            forbid_down_convert: true,
            max_workspace: None,
            heuristic: HeuristicMode::A,
            autotune_top_k: 8,
            graph_replay: true,
            sm_count_target: None,
            dynamic_shapes: false,
            conv_layout: ConvLayout::ChannelsFirst,
        }
    }
}

impl EnginePolicy {
    /// The default policy with the process's `CUDNN_BACKEND_*` settings applied (those of
    /// [`config()`](crate::config::config): the environment, read once).
    pub fn from_env() -> Self {
        Self::from_config(config())
    }

    /// The default policy with the settings of `config` applied.
    pub fn from_config(config: &Config) -> Self {
        Self {
            benchmark: config.mode.benchmark,
            deterministic: config.mode.deterministic,
            allow_tf32: config.allow_tf32,
            max_workspace: config.max_workspace,
            heuristic: config.heuristic,
            graph_replay: config.graph_replay,
            sm_count_target: config.sm_count_target,
            dynamic_shapes: config.dynamic_shapes,
            conv_layout: config.conv_layout,
            ..Self::default()
        }
    }

    /// Bits folded into graph signatures: plans chosen under different policies never mix.
    /// An FNV-1a hash of every field that affects the choice of plan (not `graph_replay`,
    /// which only changes how a plan is launched).
    pub fn signature_bits(&self) -> u64 {
        let mut fields = vec![
            self.benchmark as u64,
            self.deterministic as u64,
            self.allow_tf32 as u64,
            self.forbid_down_convert as u64,
            (self.heuristic == HeuristicMode::B) as u64,
            self.max_workspace.is_some() as u64,
            self.max_workspace.unwrap_or(0),
            self.autotune_top_k as u64,
            self.sm_count_target.map_or(0, |n| n as u64 + 1),
        ];
        // Folded in only when set, so the keys of the default policy (and the tuning files
        // and stored plans made under it) stay as they were before the field existed.
        if self.dynamic_shapes {
            fields.push(1);
        }
        fields
            .iter()
            .flat_map(|f| f.to_le_bytes())
            .fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
                (h ^ b as u64).wrapping_mul(0x0100_0000_01b3)
            })
    }
}

/// Whether cuDNN runs in its `GRAPH_JIT_ONLY` configuration ([`LIB_CONFIG_ENV`], read once
/// per process, as cuDNN does). There, cuDNN's pooling API is absent (pooling runs in our
/// kernels) and some f32 convolutions have only TF32 engines (used, with a warning, when
/// nothing else runs).
pub fn graph_jit_only() -> bool {
    config().graph_jit_only
}

/// Bits folded into signatures for the library configuration, so that plans chosen under
/// `GRAPH_JIT_ONLY` (where an f32 convolution may fall back to TF32) never serve `FULL`.
pub(crate) fn lib_config_bits() -> u64 {
    if graph_jit_only() {
        0x6a17_0000_0000_0001
    } else {
        0
    }
}

/// The engine's current policy.
pub fn policy() -> EnginePolicy {
    let slot = &super::state().policy;
    if let Some(p) = *slot.read().unwrap_or_else(|e| e.into_inner()) {
        return p;
    }
    let mut w = slot.write().unwrap_or_else(|e| e.into_inner());
    *w.get_or_insert_with(EnginePolicy::from_env)
}

/// Replaces the engine's policy.
pub fn set_policy(p: EnginePolicy) {
    *super::state().policy.write().unwrap_or_else(|e| e.into_inner()) = Some(p);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sm_carveout_is_part_of_the_signature() {
        let full = EnginePolicy::default();
        let half = EnginePolicy {
            sm_count_target: Some(66),
            ..full
        };
        let other = EnginePolicy {
            sm_count_target: Some(33),
            ..full
        };
        assert_ne!(full.signature_bits(), half.signature_bits());
        assert_ne!(half.signature_bits(), other.signature_bits());
        // `Some(0)` is not the whole GPU either.
        let zero = EnginePolicy {
            sm_count_target: Some(0),
            ..full
        };
        assert_ne!(full.signature_bits(), zero.signature_bits());
    }
}
