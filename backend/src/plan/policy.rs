//! Engine selection policy: heuristic vs benchmark (autotune), determinism, TF32, workspace
//! cap, SM carveout.

use std::sync::{OnceLock, RwLock};

/// Which heuristic cuDNN is asked for first (the fallback list is always appended).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum HeuristicMode {
    /// Mode A: fast, ranks most graph patterns well (default).
    A,
    /// Mode B: more accurate, more CPU time per query.
    B,
}

/// The memory format of 2-D and 3-D convolution operands (and of the activations the
/// backends derive from them).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum ConvLayout {
    /// Channels-first (`NCHW`, `NCDHW`) as the frameworks hand tensors over; cuDNN transforms
    /// half-precision operands around each convolution.
    #[default]
    ChannelsFirst,
    /// Channels-last (`NHWC`, `NDHWC`, filters `KRSC`) for ungrouped float convolutions, as
    /// PyTorch's `channels_last`: cuDNN's tensor-core engines read it directly, and results
    /// keep the format (see `burn::layout`).
    ChannelsLast,
}

/// How plans are chosen. Environment variables set the initial value (see [`EnginePolicy::from_env`]);
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

/// `CUDNN_BACKEND_MODE`: `heuristic` (default), `benchmark`, `deterministic`, or
/// `benchmark,deterministic`.
pub const MODE_ENV: &str = "CUDNN_BACKEND_MODE";
/// `CUDNN_BACKEND_ALLOW_TF32`: `1` to allow TF32 for f32 data.
pub const TF32_ENV: &str = "CUDNN_BACKEND_ALLOW_TF32";
/// `CUDNN_BACKEND_MAX_WORKSPACE`: workspace cap in bytes.
pub const MAX_WORKSPACE_ENV: &str = "CUDNN_BACKEND_MAX_WORKSPACE";
/// `CUDNN_BACKEND_GRAPH_REPLAY`: `0` to never replay repeated executions as CUDA graphs.
pub const GRAPH_REPLAY_ENV: &str = "CUDNN_BACKEND_GRAPH_REPLAY";
/// `CUDNN_BACKEND_HEURISTIC`: `a` (default) or `b`.
pub const HEURISTIC_ENV: &str = "CUDNN_BACKEND_HEURISTIC";
/// `CUDNN_BACKEND_SM_COUNT_TARGET`: an SM count (see [`EnginePolicy::sm_count_target`]).
pub const SM_COUNT_TARGET_ENV: &str = "CUDNN_BACKEND_SM_COUNT_TARGET";
/// `CUDNN_BACKEND_DYNAMIC_SHAPES`: `1` for dynamic-shape graphs sharing kernel caches (see
/// [`EnginePolicy::dynamic_shapes`]).
pub const DYNAMIC_SHAPES_ENV: &str = "CUDNN_BACKEND_DYNAMIC_SHAPES";
/// `CUDNN_BACKEND_CONV_LAYOUT`: `nchw` (default) or `nhwc` (see [`ConvLayout`]).
pub const CONV_LAYOUT_ENV: &str = "CUDNN_BACKEND_CONV_LAYOUT";

impl EnginePolicy {
    /// The default policy with the `CUDNN_BACKEND_*` environment variables applied.
    pub fn from_env() -> Self {
        let mut p = Self::default();
        if let Ok(mode) = std::env::var(MODE_ENV) {
            for m in mode.split([',', '+']).map(|s| s.trim().to_ascii_lowercase()) {
                match m.as_str() {
                    "benchmark" | "autotune" => p.benchmark = true,
                    "deterministic" => p.deterministic = true,
                    "heuristic" | "" => {}
                    other => tracing::warn!("{MODE_ENV}: unknown mode `{other}` ignored"),
                }
            }
        }
        if let Ok(v) = std::env::var(TF32_ENV) {
            p.allow_tf32 = matches!(v.trim(), "1" | "true" | "yes");
        }
        if let Ok(v) = std::env::var(MAX_WORKSPACE_ENV) {
            match v.trim().parse::<u64>() {
                Ok(n) => p.max_workspace = Some(n),
                Err(_) => tracing::warn!("{MAX_WORKSPACE_ENV}: `{v}` is not a byte count; ignored"),
            }
        }
        if let Ok(v) = std::env::var(GRAPH_REPLAY_ENV) {
            p.graph_replay = !matches!(v.trim(), "0" | "false" | "no");
        }
        if let Ok(v) = std::env::var(HEURISTIC_ENV) {
            p.heuristic = if v.trim().eq_ignore_ascii_case("b") {
                HeuristicMode::B
            } else {
                HeuristicMode::A
            };
        }
        if let Ok(v) = std::env::var(SM_COUNT_TARGET_ENV) {
            p.sm_count_target = parse_sm_count(&v);
        }
        if let Ok(v) = std::env::var(DYNAMIC_SHAPES_ENV) {
            p.dynamic_shapes = matches!(v.trim(), "1" | "true" | "yes");
        }
        if let Ok(v) = std::env::var(CONV_LAYOUT_ENV) {
            match parse_conv_layout(&v) {
                Some(l) => p.conv_layout = l,
                None => tracing::warn!("{CONV_LAYOUT_ENV}: `{v}` is not nchw or nhwc; ignored"),
            }
        }
        p
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

/// `CUDNN_LIB_CONFIG`: the cuDNN library configuration cuDNN itself reads (`FULL`, the
/// default, or `GRAPH_JIT_ONLY`: the graph API with runtime-compiled engines only).
pub const LIB_CONFIG_ENV: &str = "CUDNN_LIB_CONFIG";

/// Whether cuDNN runs in its `GRAPH_JIT_ONLY` configuration (read once per process, as cuDNN
/// does). There, cuDNN's pooling API is absent (pooling runs in our kernels) and some f32
/// convolutions have only TF32 engines (used, with a warning, when nothing else runs).
pub fn graph_jit_only() -> bool {
    static CONFIG: OnceLock<bool> = OnceLock::new();
    *CONFIG.get_or_init(|| names_graph_jit_only(std::env::var(LIB_CONFIG_ENV).ok().as_deref()))
}

fn names_graph_jit_only(config: Option<&str>) -> bool {
    config.is_some_and(|c| c.trim().eq_ignore_ascii_case("GRAPH_JIT_ONLY"))
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

/// A [`ConvLayout`] from its [`CONV_LAYOUT_ENV`] spelling.
fn parse_conv_layout(v: &str) -> Option<ConvLayout> {
    match v.trim().to_ascii_lowercase().as_str() {
        "nchw" | "channels_first" | "channels-first" | "" => Some(ConvLayout::ChannelsFirst),
        "nhwc" | "channels_last" | "channels-last" => Some(ConvLayout::ChannelsLast),
        _ => None,
    }
}

/// An SM count from [`SM_COUNT_TARGET_ENV`]: a positive integer, or empty / `0` / `off` for
/// the whole GPU; anything else is ignored with a warning.
fn parse_sm_count(v: &str) -> Option<u32> {
    match v.trim() {
        "" | "0" | "off" | "none" => None,
        s => match s.parse::<u32>() {
            Ok(n) if n <= i32::MAX as u32 => Some(n),
            _ => {
                tracing::warn!("{SM_COUNT_TARGET_ENV}: `{v}` is not an SM count; ignored");
                None
            }
        },
    }
}

static POLICY: RwLock<Option<EnginePolicy>> = RwLock::new(None);

/// The current process-wide policy.
pub fn policy() -> EnginePolicy {
    if let Some(p) = *POLICY.read().unwrap_or_else(|e| e.into_inner()) {
        return p;
    }
    let mut w = POLICY.write().unwrap_or_else(|e| e.into_inner());
    *w.get_or_insert_with(EnginePolicy::from_env)
}

/// Replaces the process-wide policy.
pub fn set_policy(p: EnginePolicy) {
    *POLICY.write().unwrap_or_else(|e| e.into_inner()) = Some(p);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conv_layout_spellings() {
        assert_eq!(parse_conv_layout(" NHWC "), Some(ConvLayout::ChannelsLast));
        assert_eq!(parse_conv_layout("nchw"), Some(ConvLayout::ChannelsFirst));
        assert_eq!(parse_conv_layout("ncwh"), None);
    }

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

    #[test]
    fn graph_jit_only_configuration() {
        assert!(names_graph_jit_only(Some("GRAPH_JIT_ONLY")));
        assert!(names_graph_jit_only(Some(" graph_jit_only ")));
        assert!(!names_graph_jit_only(Some("FULL")));
        assert!(!names_graph_jit_only(None));
    }

    #[test]
    fn sm_count_parsing() {
        assert_eq!(parse_sm_count("66"), Some(66));
        assert_eq!(parse_sm_count(" 132 "), Some(132));
        for off in ["", "0", "off", "none"] {
            assert_eq!(parse_sm_count(off), None, "{off:?}");
        }
        assert_eq!(parse_sm_count("-3"), None);
        assert_eq!(parse_sm_count("half"), None);
        assert_eq!(parse_sm_count("4294967295"), None);
    }
}
