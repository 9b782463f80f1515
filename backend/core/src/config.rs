//! The crate's configuration: every environment variable it reads, in one [`Config`].
//!
//! [`config()`] reads the process environment once, at the crate's first use of a setting,
//! and every other module takes its settings from there, so a process sees one consistent
//! configuration. A program that configures the crate in code builds a [`Config`] (from
//! [`Config::from_env`] or [`Config::default`], then its public fields) and installs it with
//! [`init`] before that first use. The engine policy can also change later, through
//! [`plan::set_policy`](crate::plan::set_policy).
//!
//! Unset variables take the defaults documented on each field; a value that cannot be parsed
//! falls back to the default (with a `tracing` warning for [`MODE_ENV`], [`MAX_WORKSPACE_ENV`],
//! [`SM_COUNT_TARGET_ENV`] and [`CONV_LAYOUT_ENV`]).

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// `CUDNN_BACKEND_MODE`: `heuristic` (default), `benchmark`, `deterministic`, or
/// `benchmark,deterministic` (see [`Config::mode`]).
pub const MODE_ENV: &str = "CUDNN_BACKEND_MODE";
/// `CUDNN_BACKEND_ALLOW_TF32`: `1` to allow TF32 for f32 data (see [`Config::allow_tf32`]).
pub const TF32_ENV: &str = "CUDNN_BACKEND_ALLOW_TF32";
/// `CUDNN_BACKEND_MAX_WORKSPACE`: workspace cap in bytes (see [`Config::max_workspace`]).
pub const MAX_WORKSPACE_ENV: &str = "CUDNN_BACKEND_MAX_WORKSPACE";
/// `CUDNN_BACKEND_GRAPH_REPLAY`: `0` to never replay repeated executions as CUDA graphs.
pub const GRAPH_REPLAY_ENV: &str = "CUDNN_BACKEND_GRAPH_REPLAY";
/// `CUDNN_BACKEND_HEURISTIC`: `a` (default) or `b` (see [`Config::heuristic`]).
pub const HEURISTIC_ENV: &str = "CUDNN_BACKEND_HEURISTIC";
/// `CUDNN_BACKEND_SM_COUNT_TARGET`: an SM count (see [`Config::sm_count_target`]).
pub const SM_COUNT_TARGET_ENV: &str = "CUDNN_BACKEND_SM_COUNT_TARGET";
/// `CUDNN_BACKEND_DYNAMIC_SHAPES`: `1` for dynamic-shape graphs sharing kernel caches (see
/// [`Config::dynamic_shapes`]).
pub const DYNAMIC_SHAPES_ENV: &str = "CUDNN_BACKEND_DYNAMIC_SHAPES";
/// `CUDNN_BACKEND_CONV_LAYOUT`: `nchw` (default) or `nhwc` (see [`ConvLayout`]).
pub const CONV_LAYOUT_ENV: &str = "CUDNN_BACKEND_CONV_LAYOUT";
/// `CUDNN_LIB_CONFIG`: the cuDNN library configuration cuDNN itself reads (`FULL`, the
/// default, or `GRAPH_JIT_ONLY`: the graph API with runtime-compiled engines only).
pub const LIB_CONFIG_ENV: &str = "CUDNN_LIB_CONFIG";
/// `CUDNN_BACKEND_KERNEL_CACHE`: moves the kernel and plan cache (a directory) or turns it off
/// (`0`, `off`, `false`, `no`, `none`). Unset or empty: the default directory.
pub const KERNEL_CACHE_ENV: &str = "CUDNN_BACKEND_KERNEL_CACHE";
/// `CUDNN_BACKEND_TUNING_DIR`: the directory for tuning files (see [`Config::tuning_dir`]).
pub const TUNING_DIR_ENV: &str = "CUDNN_BACKEND_TUNING_DIR";
/// `CUDNN_BACKEND_PLAN_CACHE_CAPACITY`: plans kept per cuDNN handle (default
/// [`DEFAULT_PLAN_CACHE_CAPACITY`](crate::plan::cache::DEFAULT_PLAN_CACHE_CAPACITY)).
pub const PLAN_CACHE_CAPACITY_ENV: &str = "CUDNN_BACKEND_PLAN_CACHE_CAPACITY";
/// `CUDNN_BACKEND_WARM_UP`: `0`, `false`, `off` or `no` turns the Burn backend's background
/// warm-up off.
pub const WARM_UP_ENV: &str = "CUDNN_BACKEND_WARM_UP";
/// `CUDNN_BACKEND_FUSION`: `0`, `false`, `off` or `no` turns lazy fusion's fusers off.
pub const FUSION_ENV: &str = "CUDNN_BACKEND_FUSION";
/// `CUDNN_BACKEND_FUSION_FLUSH_US`: lazy fusion's queue flusher quiet time in microseconds
/// (`0` turns the flusher off).
pub const FUSION_FLUSH_US_ENV: &str = "CUDNN_BACKEND_FUSION_FLUSH_US";
/// `CUDNN_BACKEND_BUFFER_CACHE_MIB`: caps the Burn backend's cached tensor buffers per device,
/// in MiB (`0` turns the cache off).
pub const BUFFER_CACHE_ENV: &str = "CUDNN_BACKEND_BUFFER_CACHE_MIB";
/// `CUDNN_BACKEND_CANDLE_FUSED_GRADS`: `0`, `false`, `off` or `no` runs the Candle gradients'
/// elementwise and reduction steps as Candle ops instead of fused kernels.
pub const CANDLE_FUSED_GRADS_ENV: &str = "CUDNN_BACKEND_CANDLE_FUSED_GRADS";
/// `CUDNN_BACKEND_DDP_BUCKET_MB`: the data-parallel gradient bucket size in MiB (default 25,
/// as PyTorch's `DistributedDataParallel`).
pub const BUCKET_MB_ENV: &str = "CUDNN_BACKEND_DDP_BUCKET_MB";
/// `CUDNN_BACKEND_CUDNN_LIB`: an explicit path to libcudnn (checked before the defaults).
pub const CUDNN_LIB_ENV: &str = "CUDNN_BACKEND_CUDNN_LIB";
/// `CUDNN_BACKEND_NCCL_LIB`: the NCCL library to load (a path or a file name).
pub const NCCL_LIB_ENV: &str = "CUDNN_BACKEND_NCCL_LIB";
/// `CUDNN_BACKEND_NCCL_ID`: a communicator's NCCL unique id as 256 hex digits.
pub const NCCL_ID_ENV: &str = "CUDNN_BACKEND_NCCL_ID";
/// `CUDNN_BACKEND_NCCL_ID_FILE`: a file through which rank 0 hands the unique id to the others.
pub const NCCL_ID_FILE_ENV: &str = "CUDNN_BACKEND_NCCL_ID_FILE";
/// `CUDNN_BACKEND_NCCL_TIMEOUT_S`: the collective timeout in seconds (default 600).
pub const NCCL_TIMEOUT_ENV: &str = "CUDNN_BACKEND_NCCL_TIMEOUT_S";
/// `RANK`: this process's rank in a multi-process job (set by launchers such as `torchrun`).
pub const RANK_ENV: &str = "RANK";
/// `WORLD_SIZE`: the processes in a multi-process job.
pub const WORLD_SIZE_ENV: &str = "WORLD_SIZE";
/// `LOCAL_RANK`: this process's rank on its node.
pub const LOCAL_RANK_ENV: &str = "LOCAL_RANK";
/// `MASTER_ADDR`: rank 0's host, where the other ranks fetch the NCCL unique id over TCP (as
/// `torchrun` sets it).
pub const MASTER_ADDR_ENV: &str = "MASTER_ADDR";
/// `MASTER_PORT`: the TCP port rank 0 serves the NCCL unique id on.
pub const MASTER_PORT_ENV: &str = "MASTER_PORT";
/// `TORCHELASTIC_USE_AGENT_STORE`: `True` when `torchrun`'s agent on rank 0's host already
/// listens on `MASTER_PORT` (its key-value store), so the rendezvous takes the port above.
pub const TORCHELASTIC_USE_AGENT_STORE_ENV: &str = "TORCHELASTIC_USE_AGENT_STORE";

/// The user's cache directory (the kernel cache's default parent, when absolute).
const XDG_CACHE_HOME_ENV: &str = "XDG_CACHE_HOME";
/// The user's home directory (the kernel cache's default is under `.cache` there).
const HOME_ENV: &str = "HOME";

/// Default of [`Config::fusion_flush`] in microseconds.
const DEFAULT_FUSION_FLUSH_US: u64 = 200;
/// Default of [`Config::ddp_bucket_bytes`] in MiB.
const DEFAULT_BUCKET_MB: f64 = 25.0;
/// Default of [`Config::nccl_timeout`] (PyTorch's NCCL default, 10 minutes).
pub(crate) const DEFAULT_NCCL_TIMEOUT: Duration = Duration::from_secs(600);

/// Which heuristic cuDNN is asked for first (the fallback list is always appended; see
/// [`EnginePolicy`](crate::plan::EnginePolicy)).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum HeuristicMode {
    /// Mode A: fast, ranks most graph patterns well (default).
    A,
    /// Mode B: more accurate, more CPU time per query.
    B,
}

/// The memory format of 2-D and 3-D convolution operands (and of the activations the
/// backends derive from them; see [`EnginePolicy`](crate::plan::EnginePolicy)).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum ConvLayout {
    /// Channels-first (`NCHW`, `NCDHW`) as the frameworks hand tensors over; cuDNN transforms
    /// half-precision operands around each convolution.
    #[default]
    ChannelsFirst,
    /// Channels-last (`NHWC`, `NDHWC`, filters `KRSC`) for ungrouped float convolutions, as
    /// PyTorch's `channels_last`: cuDNN's tensor-core engines read it directly, and results
    /// keep the format.
    ChannelsLast,
}

/// The plan-selection modes [`MODE_ENV`] turns on (both off by default: heuristics only).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct EngineMode {
    /// `benchmark` (or `autotune`): time the top candidates and keep the fastest.
    pub benchmark: bool,
    /// `deterministic`: exclude engines whose results may differ between runs.
    pub deterministic: bool,
}

/// Every setting the crate reads from the environment, one field per variable. Build one with
/// [`Config::from_env`], [`Config::default`] or [`Config::from_vars`] and change its fields;
/// [`init`] makes it the process's configuration.
#[derive(Clone, PartialEq, Eq)]
pub struct Config {
    /// [`MODE_ENV`]: `heuristic` or empty (no change), `benchmark` / `autotune`,
    /// `deterministic`, combined with `,` or `+` (any case); unknown words are ignored with a
    /// warning. Default: neither mode.
    pub mode: EngineMode,
    /// [`TF32_ENV`]: `1`, `true` or `yes` allows TF32 tensor cores for f32 data; anything
    /// else forbids them. Default: `false`.
    pub allow_tf32: bool,
    /// [`MAX_WORKSPACE_ENV`]: the workspace cap per plan in bytes; a value that is not a byte
    /// count is ignored with a warning. Default: `None` (unlimited).
    pub max_workspace: Option<u64>,
    /// [`GRAPH_REPLAY_ENV`]: `0`, `false` or `no` turns CUDA-graph replay off; anything else
    /// leaves it on. Default: `true`.
    pub graph_replay: bool,
    /// [`HEURISTIC_ENV`]: `b` (any case) for mode B; anything else is mode A. Default:
    /// [`HeuristicMode::A`].
    pub heuristic: HeuristicMode,
    /// [`SM_COUNT_TARGET_ENV`]: a positive SM count for the SM carveout; empty, `0`, `off` or
    /// `none` for the whole GPU; anything else is ignored with a warning. Default: `None`.
    pub sm_count_target: Option<u32>,
    /// [`DYNAMIC_SHAPES_ENV`]: `1`, `true` or `yes` builds dynamic-shape graphs. Default:
    /// `false`.
    pub dynamic_shapes: bool,
    /// [`CONV_LAYOUT_ENV`]: `nchw` / `channels_first` / `channels-first` or empty,
    /// `nhwc` / `channels_last` / `channels-last` (any case); anything else is ignored with a
    /// warning. Default: [`ConvLayout::ChannelsFirst`].
    pub conv_layout: ConvLayout,
    /// [`LIB_CONFIG_ENV`]: whether cuDNN runs in its `GRAPH_JIT_ONLY` configuration (the value
    /// `GRAPH_JIT_ONLY`, any case); cuDNN reads the variable itself, so a [`Config`] installed
    /// in code must agree with the environment. Default: `false` (`FULL`).
    pub graph_jit_only: bool,
    /// [`KERNEL_CACHE_ENV`], with `XDG_CACHE_HOME` and `HOME` for the default: the kernel and
    /// plan cache directory, `None` when the cache is off (see [`resolve_dir`]). Default:
    /// `$XDG_CACHE_HOME/cudnn-backend/kernels`, else `~/.cache/cudnn-backend/kernels`.
    pub kernel_cache: Option<PathBuf>,
    /// [`TUNING_DIR_ENV`]: the directory for tuning files when set and not empty. Default:
    /// `None` (engine choices are not saved).
    pub tuning_dir: Option<PathBuf>,
    /// [`PLAN_CACHE_CAPACITY_ENV`]: plans kept per cuDNN handle; a value that is not a count
    /// is ignored. Default: `None`
    /// ([`DEFAULT_PLAN_CACHE_CAPACITY`](crate::plan::cache::DEFAULT_PLAN_CACHE_CAPACITY)).
    pub plan_cache_capacity: Option<usize>,
    /// [`WARM_UP_ENV`]: whether the Burn backend starts its background kernel and cuDNN
    /// warm-up (`0`, `false`, `off`, `no`, any case, turn it off). Default: `true`.
    pub warm_up: bool,
    /// [`FUSION_ENV`]: whether lazy fusion's fusers run (`0`, `false`, `off`, `no`, any case,
    /// turn them off). Default: `true`.
    pub fusion: bool,
    /// [`FUSION_FLUSH_US_ENV`]: the quiet time before lazy fusion's flusher pushes a partial
    /// batch, `None` for `0` (no flusher); a value that is not a count keeps the default.
    /// Default: 200 µs.
    pub fusion_flush: Option<Duration>,
    /// [`BUFFER_CACHE_ENV`]: the cap on cached tensor buffers per device in MiB (`Some(0)`
    /// turns the cache off); a value that is not a count is ignored. Default: `None` (a
    /// quarter of the device's memory).
    pub buffer_cache_mib: Option<usize>,
    /// [`CANDLE_FUSED_GRADS_ENV`]: whether Candle gradients run the fused kernels (`0`,
    /// `false`, `off`, `no`, any case, switch to Candle ops). Default: `true`.
    pub candle_fused_grads: bool,
    /// [`BUCKET_MB_ENV`]: the data-parallel gradient bucket in bytes, from a non-negative
    /// number of MiB (fractions allowed; `0` launches every parameter on its own); other
    /// values keep the default. Default: 25 MiB.
    pub ddp_bucket_bytes: usize,
    /// [`CUDNN_LIB_ENV`]: the libcudnn path tried first, when set and not empty. Default:
    /// `None` (only the standard names).
    pub cudnn_lib: Option<String>,
    /// [`NCCL_LIB_ENV`]: the only NCCL library tried, when set and not empty. Default: `None`
    /// (the standard names).
    pub nccl_lib: Option<String>,
    /// [`NCCL_ID_ENV`]: the unique id's hex text as given (parsed, with an error for bad
    /// text, when a communicator is joined). Default: `None`.
    pub nccl_id: Option<String>,
    /// [`NCCL_ID_FILE_ENV`]: the file for handing over the unique id. Default: `None`.
    pub nccl_id_file: Option<PathBuf>,
    /// [`NCCL_TIMEOUT_ENV`]: how long a collective may take, from a positive number of
    /// seconds; other values keep the default. Default: 600 s.
    pub nccl_timeout: Duration,
    /// [`RANK_ENV`] as given (parsed by [`Bootstrap`](crate::collective::Bootstrap)).
    /// Default: `None`.
    pub rank: Option<String>,
    /// [`WORLD_SIZE_ENV`] as given (parsed by [`Bootstrap`](crate::collective::Bootstrap)).
    /// Default: `None`.
    pub world_size: Option<String>,
    /// [`LOCAL_RANK_ENV`] as given (parsed by [`Bootstrap`](crate::collective::Bootstrap)).
    /// Default: `None`.
    pub local_rank: Option<String>,
    /// [`MASTER_ADDR_ENV`]: rank 0's host name or IP address for the TCP rendezvous, when set
    /// and not empty. Default: `None`.
    pub master_addr: Option<String>,
    /// [`MASTER_PORT_ENV`] as given, when not empty (parsed, with an error for a bad port, by
    /// [`Rendezvous`](crate::collective::Rendezvous)). Default: `None`.
    pub master_port: Option<String>,
    /// [`TORCHELASTIC_USE_AGENT_STORE_ENV`]: `True` (as `torchrun` writes it; also `true`
    /// or `1`) when `torchrun`'s agent holds `MASTER_PORT`, so the rendezvous listens on
    /// `MASTER_PORT + 1`. Default: `false`.
    pub torchelastic_agent_store: bool,
}

impl Default for Config {
    /// Every default, as with an empty environment (so no kernel cache: no home directory
    /// is known).
    fn default() -> Self {
        Self::from_vars(|_| None::<OsString>)
    }
}

impl Config {
    /// The configuration the process environment sets (read now; [`config()`] is the
    /// process's copy, read once).
    pub fn from_env() -> Self {
        // With `config()`'s first call, the one place the crate reads the environment (only
        // `test_vars` reads it too, for the crate's own tests).
        Self::from_vars(|name: &str| std::env::var_os(name))
    }

    /// The configuration the variables that `var` returns set (`None`: unset). A value that
    /// is not UTF-8 counts as unset, except for the path variables.
    pub fn from_vars<S: Into<OsString>>(var: impl Fn(&str) -> Option<S>) -> Self {
        let os = |name: &str| var(name).map(Into::into);
        let text = |name: &str| os(name).and_then(|v| v.into_string().ok());
        let non_empty = |name: &str| text(name).filter(|v| !v.is_empty());
        let parsed = |name: &str| text(name).and_then(|v| v.trim().parse::<u64>().ok());

        let mut mode = EngineMode::default();
        for m in text(MODE_ENV).iter().flat_map(|v| v.split([',', '+'])) {
            match m.trim().to_ascii_lowercase().as_str() {
                "benchmark" | "autotune" => mode.benchmark = true,
                "deterministic" => mode.deterministic = true,
                "heuristic" | "" => {}
                other => tracing::warn!("{MODE_ENV}: unknown mode `{other}` ignored"),
            }
        }
        let max_workspace = text(MAX_WORKSPACE_ENV).and_then(|v| match v.trim().parse::<u64>() {
            Ok(n) => Some(n),
            Err(_) => {
                tracing::warn!("{MAX_WORKSPACE_ENV}: `{v}` is not a byte count; ignored");
                None
            }
        });
        let conv_layout = text(CONV_LAYOUT_ENV).map_or(ConvLayout::ChannelsFirst, |v| {
            parse_conv_layout(&v).unwrap_or_else(|| {
                tracing::warn!("{CONV_LAYOUT_ENV}: `{v}` is not nchw or nhwc; ignored");
                ConvLayout::ChannelsFirst
            })
        });
        let finite = |name: &str| {
            text(name)
                .and_then(|v| v.trim().parse::<f64>().ok())
                .filter(|v| v.is_finite())
        };
        let flush_us = parsed(FUSION_FLUSH_US_ENV).unwrap_or(DEFAULT_FUSION_FLUSH_US);
        let bucket_mb = finite(BUCKET_MB_ENV)
            .filter(|mb| *mb >= 0.0)
            .unwrap_or(DEFAULT_BUCKET_MB);
        Self {
            mode,
            allow_tf32: text(TF32_ENV).is_some_and(|v| names_yes(&v)),
            max_workspace,
            graph_replay: !text(GRAPH_REPLAY_ENV).is_some_and(|v| matches!(v.trim(), "0" | "false" | "no")),
            heuristic: match text(HEURISTIC_ENV) {
                Some(v) if v.trim().eq_ignore_ascii_case("b") => HeuristicMode::B,
                _ => HeuristicMode::A,
            },
            sm_count_target: text(SM_COUNT_TARGET_ENV).and_then(|v| parse_sm_count(&v)),
            dynamic_shapes: text(DYNAMIC_SHAPES_ENV).is_some_and(|v| names_yes(&v)),
            conv_layout,
            graph_jit_only: names_graph_jit_only(text(LIB_CONFIG_ENV).as_deref()),
            kernel_cache: resolve_dir(os(KERNEL_CACHE_ENV), os(XDG_CACHE_HOME_ENV), os(HOME_ENV)),
            tuning_dir: os(TUNING_DIR_ENV).filter(|v| !v.is_empty()).map(PathBuf::from),
            plan_cache_capacity: text(PLAN_CACHE_CAPACITY_ENV).and_then(|v| v.trim().parse().ok()),
            warm_up: !switched_off(text(WARM_UP_ENV).as_deref()),
            fusion: !switched_off(text(FUSION_ENV).as_deref()),
            fusion_flush: (flush_us > 0).then(|| Duration::from_micros(flush_us)),
            buffer_cache_mib: text(BUFFER_CACHE_ENV).and_then(|v| v.trim().parse().ok()),
            candle_fused_grads: !switched_off(text(CANDLE_FUSED_GRADS_ENV).as_deref()),
            ddp_bucket_bytes: (bucket_mb * 1024.0 * 1024.0) as usize,
            cudnn_lib: non_empty(CUDNN_LIB_ENV),
            nccl_lib: non_empty(NCCL_LIB_ENV),
            nccl_id: text(NCCL_ID_ENV),
            nccl_id_file: os(NCCL_ID_FILE_ENV).map(PathBuf::from),
            nccl_timeout: finite(NCCL_TIMEOUT_ENV)
                .filter(|s| *s > 0.0)
                .and_then(|s| Duration::try_from_secs_f64(s).ok())
                .unwrap_or(DEFAULT_NCCL_TIMEOUT),
            rank: text(RANK_ENV),
            world_size: text(WORLD_SIZE_ENV),
            local_rank: text(LOCAL_RANK_ENV),
            master_addr: non_empty(MASTER_ADDR_ENV),
            master_port: non_empty(MASTER_PORT_ENV),
            torchelastic_agent_store: text(TORCHELASTIC_USE_AGENT_STORE_ENV)
                .is_some_and(|v| v.trim().eq_ignore_ascii_case("true") || v.trim() == "1"),
        }
    }
}

impl std::fmt::Debug for Config {
    /// Every field, except the NCCL unique id's text (it holds rank 0's bootstrap address:
    /// a secret of the job), which shows as `Some(..)`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Destructured so that a new field cannot be left out.
        let Self {
            mode,
            allow_tf32,
            max_workspace,
            graph_replay,
            heuristic,
            sm_count_target,
            dynamic_shapes,
            conv_layout,
            graph_jit_only,
            kernel_cache,
            tuning_dir,
            plan_cache_capacity,
            warm_up,
            fusion,
            fusion_flush,
            buffer_cache_mib,
            candle_fused_grads,
            ddp_bucket_bytes,
            cudnn_lib,
            nccl_lib,
            nccl_id,
            nccl_id_file,
            nccl_timeout,
            rank,
            world_size,
            local_rank,
            master_addr,
            master_port,
            torchelastic_agent_store,
        } = self;
        f.debug_struct("Config")
            .field("mode", mode)
            .field("allow_tf32", allow_tf32)
            .field("max_workspace", max_workspace)
            .field("graph_replay", graph_replay)
            .field("heuristic", heuristic)
            .field("sm_count_target", sm_count_target)
            .field("dynamic_shapes", dynamic_shapes)
            .field("conv_layout", conv_layout)
            .field("graph_jit_only", graph_jit_only)
            .field("kernel_cache", kernel_cache)
            .field("tuning_dir", tuning_dir)
            .field("plan_cache_capacity", plan_cache_capacity)
            .field("warm_up", warm_up)
            .field("fusion", fusion)
            .field("fusion_flush", fusion_flush)
            .field("buffer_cache_mib", buffer_cache_mib)
            .field("candle_fused_grads", candle_fused_grads)
            .field("ddp_bucket_bytes", ddp_bucket_bytes)
            .field("cudnn_lib", cudnn_lib)
            .field("nccl_lib", nccl_lib)
            .field(
                "nccl_id",
                &format_args!("{}", if nccl_id.is_some() { "Some(..)" } else { "None" }),
            )
            .field("nccl_id_file", nccl_id_file)
            .field("nccl_timeout", nccl_timeout)
            .field("rank", rank)
            .field("world_size", world_size)
            .field("local_rank", local_rank)
            .field("master_addr", master_addr)
            .field("master_port", master_port)
            .field("torchelastic_agent_store", torchelastic_agent_store)
            .finish()
    }
}

/// The process's configuration: the one installed with [`init`], else the environment's,
/// read once at the first call ([`Config::from_env`]). Every module takes its settings from
/// here; nothing else in the crate reads environment variables.
pub fn config() -> &'static Config {
    crate::engine().config.get_or_init(Config::from_env)
}

/// Makes `config` the process's configuration, so that the crate never reads the environment.
/// Returns `false`, changing nothing, when [`config()`] has already been read or set: call it
/// before the crate's first use.
#[must_use = "the configuration is not installed when the crate has already read one"]
pub fn init(config: Config) -> bool {
    crate::engine().config.set(config).is_ok()
}

/// The cache directory for the given values of [`KERNEL_CACHE_ENV`], `XDG_CACHE_HOME` and
/// `HOME`: the variable's path when set; `None` (off) for `0`, `off`, `false`, `no`, `none`;
/// otherwise `$XDG_CACHE_HOME/cudnn-backend/kernels` (when absolute), else
/// `$HOME/.cache/cudnn-backend/kernels`; `None` when neither is known.
pub fn resolve_dir(var: Option<OsString>, xdg_cache_home: Option<OsString>, home: Option<OsString>) -> Option<PathBuf> {
    if let Some(v) = var.filter(|v| !v.is_empty()) {
        let off = v
            .to_str()
            .map(|s| {
                matches!(
                    s.trim().to_ascii_lowercase().as_str(),
                    "0" | "off" | "false" | "no" | "none"
                )
            })
            .unwrap_or(false);
        return if off { None } else { Some(PathBuf::from(v)) };
    }
    let sub = Path::new("cudnn-backend").join("kernels");
    if let Some(x) = xdg_cache_home.map(PathBuf::from).filter(|p| p.is_absolute()) {
        return Some(x.join(sub));
    }
    home.filter(|h| !h.is_empty())
        .map(|h| PathBuf::from(h).join(".cache").join(sub))
}

/// `1`, `true` or `yes` (surrounding spaces ignored, case kept).
fn names_yes(v: &str) -> bool {
    matches!(v.trim(), "1" | "true" | "yes")
}

/// Whether a switch's value turns its feature off: `0`, `false`, `off` or `no` (any case,
/// surrounding spaces ignored); unset or anything else leaves it on.
fn switched_off(v: Option<&str>) -> bool {
    v.is_some_and(|v| matches!(v.trim().to_ascii_lowercase().as_str(), "0" | "false" | "off" | "no"))
}

/// Whether a [`LIB_CONFIG_ENV`] value names `GRAPH_JIT_ONLY`.
fn names_graph_jit_only(config: Option<&str>) -> bool {
    config.is_some_and(|c| c.trim().eq_ignore_ascii_case("GRAPH_JIT_ONLY"))
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

/// Variables only the crate's own tests read (kept here so that this module stays the only
/// reader of the environment).
#[cfg(test)]
pub(crate) mod test_vars {
    use std::ffi::OsString;

    /// Set in the child process of `ffi::nvrtc`'s exit test: the file it writes when done.
    pub(crate) const EXIT_MARKER_ENV: &str = "CUDNN_BACKEND_TEST_EXIT_MARKER";
    /// `1` runs `kernels`' slow compile-timing measurements.
    pub(crate) const COMPILE_TIMINGS_ENV: &str = "CUDNN_BACKEND_COMPILE_TIMINGS";
    /// Set in the child processes of `collective::rendezvous`'s multi-process test: the id
    /// (hex) the child must fetch from the parent.
    pub(crate) const RENDEZVOUS_CHILD_ENV: &str = "CUDNN_BACKEND_TEST_RENDEZVOUS_CHILD";

    /// The value of a test variable.
    pub(crate) fn var_os(name: &str) -> Option<OsString> {
        std::env::var_os(name)
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    /// A configuration from `pairs` only.
    fn with(pairs: &[(&str, &str)]) -> Config {
        Config::from_vars(|k| pairs.iter().find(|(n, _)| *n == k).map(|(_, v)| v.to_string()))
    }

    #[test]
    fn defaults_match_the_engine_policy() {
        let c = Config::default();
        assert_eq!(c, with(&[]));
        let p = crate::plan::EnginePolicy::from_config(&c);
        assert_eq!(p, crate::plan::EnginePolicy::default());
        assert_eq!(c.kernel_cache, None, "no home directory, no cache");
        assert_eq!(c.plan_cache_capacity, None);
        assert!(c.warm_up && c.fusion && c.candle_fused_grads);
        assert_eq!(c.fusion_flush, Some(Duration::from_micros(200)));
        assert_eq!(c.buffer_cache_mib, None);
        assert_eq!(c.ddp_bucket_bytes, 25 << 20);
        assert_eq!(c.nccl_timeout, Duration::from_secs(600));
        assert_eq!(c.nccl_timeout, crate::collective::DEFAULT_TIMEOUT);
    }

    #[test]
    fn policy_variables() {
        let c = with(&[
            (MODE_ENV, "Benchmark + deterministic"),
            (TF32_ENV, " 1 "),
            (MAX_WORKSPACE_ENV, " 1024 "),
            (GRAPH_REPLAY_ENV, "no"),
            (HEURISTIC_ENV, "B"),
            (SM_COUNT_TARGET_ENV, "66"),
            (DYNAMIC_SHAPES_ENV, "yes"),
            (CONV_LAYOUT_ENV, "nchw"),
        ]);
        let p = crate::plan::EnginePolicy::from_config(&c);
        assert!(p.benchmark && p.deterministic && p.allow_tf32 && p.dynamic_shapes);
        assert!(!p.graph_replay);
        assert_eq!(p.max_workspace, Some(1024));
        assert_eq!(p.heuristic, HeuristicMode::B);
        assert_eq!(p.sm_count_target, Some(66));
        assert_eq!(p.conv_layout, ConvLayout::ChannelsFirst);
        // Case-sensitive yes-values, unknown modes and bad numbers keep the defaults.
        let c = with(&[
            (MODE_ENV, "autotune,fast"),
            (TF32_ENV, "TRUE"),
            (MAX_WORKSPACE_ENV, "1 GB"),
            (GRAPH_REPLAY_ENV, "off"),
            (HEURISTIC_ENV, "c"),
            (CONV_LAYOUT_ENV, "ncwh"),
        ]);
        assert_eq!(
            c.mode,
            EngineMode {
                benchmark: true,
                deterministic: false
            }
        );
        assert!(!c.allow_tf32 && c.graph_replay);
        assert_eq!(c.max_workspace, None);
        assert_eq!(c.heuristic, HeuristicMode::A);
        assert_eq!(c.conv_layout, ConvLayout::ChannelsFirst);
    }

    #[test]
    fn conv_layout_spellings() {
        assert_eq!(parse_conv_layout(" NHWC "), Some(ConvLayout::ChannelsLast));
        assert_eq!(parse_conv_layout("nchw"), Some(ConvLayout::ChannelsFirst));
        assert_eq!(parse_conv_layout("ncwh"), None);
    }

    #[test]
    fn graph_jit_only_configuration() {
        assert!(names_graph_jit_only(Some("GRAPH_JIT_ONLY")));
        assert!(names_graph_jit_only(Some(" graph_jit_only ")));
        assert!(!names_graph_jit_only(Some("FULL")));
        assert!(!names_graph_jit_only(None));
        assert!(with(&[(LIB_CONFIG_ENV, "GRAPH_JIT_ONLY")]).graph_jit_only);
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

    #[test]
    fn switches_read_off_values_only() {
        for (value, off) in [
            ("0", true),
            (" Off ", true),
            ("FALSE", true),
            ("no", true),
            ("1", false),
            ("on", false),
        ] {
            assert_eq!(switched_off(Some(value)), off, "{value:?}");
            for (var, on) in [
                (WARM_UP_ENV, with(&[(WARM_UP_ENV, value)]).warm_up),
                (FUSION_ENV, with(&[(FUSION_ENV, value)]).fusion),
                (
                    CANDLE_FUSED_GRADS_ENV,
                    with(&[(CANDLE_FUSED_GRADS_ENV, value)]).candle_fused_grads,
                ),
            ] {
                assert_eq!(on, !off, "{var}={value:?}");
            }
        }
        assert!(!switched_off(None));
    }

    #[test]
    fn kernel_cache_and_tuning_directories() {
        assert_eq!(with(&[(KERNEL_CACHE_ENV, "off")]).kernel_cache, None);
        assert_eq!(
            with(&[(KERNEL_CACHE_ENV, "/tmp/kc"), (HOME_ENV, "/home/u")]).kernel_cache,
            Some(PathBuf::from("/tmp/kc"))
        );
        assert_eq!(
            with(&[(HOME_ENV, "/home/u")]).kernel_cache,
            Some(PathBuf::from("/home/u/.cache/cudnn-backend/kernels"))
        );
        assert_eq!(
            with(&[(XDG_CACHE_HOME_ENV, "/x"), (HOME_ENV, "/home/u")]).kernel_cache,
            Some(PathBuf::from("/x/cudnn-backend/kernels"))
        );
        assert_eq!(
            with(&[(TUNING_DIR_ENV, "/some/dir")]).tuning_dir.as_deref(),
            Some(Path::new("/some/dir"))
        );
        assert_eq!(with(&[(TUNING_DIR_ENV, "")]).tuning_dir, None);
    }

    #[test]
    fn counts_and_durations() {
        let c = with(&[
            (PLAN_CACHE_CAPACITY_ENV, " 16 "),
            (FUSION_FLUSH_US_ENV, "0"),
            (BUFFER_CACHE_ENV, "512"),
            (BUCKET_MB_ENV, "0.5"),
            (NCCL_TIMEOUT_ENV, "1.5"),
        ]);
        assert_eq!(c.plan_cache_capacity, Some(16));
        assert_eq!(c.fusion_flush, None);
        assert_eq!(c.buffer_cache_mib, Some(512));
        assert_eq!(c.ddp_bucket_bytes, 512 << 10);
        assert_eq!(c.nccl_timeout, Duration::from_millis(1500));
        assert_eq!(
            with(&[(FUSION_FLUSH_US_ENV, "50")]).fusion_flush,
            Some(Duration::from_micros(50))
        );
        assert_eq!(with(&[(BUCKET_MB_ENV, "0")]).ddp_bucket_bytes, 0);
        let bad = with(&[
            (PLAN_CACHE_CAPACITY_ENV, "many"),
            (FUSION_FLUSH_US_ENV, "-1"),
            (BUFFER_CACHE_ENV, "1 GiB"),
            (BUCKET_MB_ENV, "-1"),
            (NCCL_TIMEOUT_ENV, "0"),
        ]);
        assert_eq!(bad.plan_cache_capacity, None);
        assert_eq!(bad.fusion_flush, Some(Duration::from_micros(200)));
        assert_eq!(bad.buffer_cache_mib, None);
        assert_eq!(bad.ddp_bucket_bytes, 25 << 20);
        assert_eq!(bad.nccl_timeout, DEFAULT_NCCL_TIMEOUT);
        for t in ["inf", "NaN", "-3", "1e300"] {
            assert_eq!(with(&[(NCCL_TIMEOUT_ENV, t)]).nccl_timeout, DEFAULT_NCCL_TIMEOUT, "{t}");
        }
    }

    #[test]
    fn libraries_and_job_variables() {
        let c = with(&[(CUDNN_LIB_ENV, ""), (NCCL_LIB_ENV, "/opt/libnccl.so.2")]);
        assert_eq!(c.cudnn_lib, None, "empty means unset");
        assert_eq!(c.nccl_lib.as_deref(), Some("/opt/libnccl.so.2"));
        let c = with(&[
            (NCCL_ID_ENV, "abc"),
            (NCCL_ID_FILE_ENV, "/shared/id"),
            (RANK_ENV, "1"),
            (WORLD_SIZE_ENV, "2"),
        ]);
        assert_eq!(c.nccl_id.as_deref(), Some("abc"));
        assert_eq!(c.nccl_id_file.as_deref(), Some(Path::new("/shared/id")));
        assert_eq!((c.rank.as_deref(), c.world_size.as_deref()), (Some("1"), Some("2")));
        assert_eq!(c.local_rank, None);
        assert_eq!((c.master_addr.as_deref(), c.master_port.as_deref()), (None, None));
        let c = with(&[(MASTER_ADDR_ENV, "node-0.cluster"), (MASTER_PORT_ENV, " 29500 ")]);
        assert_eq!(c.master_addr.as_deref(), Some("node-0.cluster"));
        assert_eq!(c.master_port.as_deref(), Some(" 29500 "), "parsed by the rendezvous");
        let c = with(&[(MASTER_ADDR_ENV, ""), (MASTER_PORT_ENV, "")]);
        assert_eq!((c.master_addr, c.master_port), (None, None), "empty means unset");
        assert!(!c.torchelastic_agent_store);
        for (value, on) in [("True", true), ("1", true), ("False", false), ("", false)] {
            let c = with(&[(TORCHELASTIC_USE_AGENT_STORE_ENV, value)]);
            assert_eq!(c.torchelastic_agent_store, on, "{value:?}");
        }
        let c = with(&[(NCCL_ID_ENV, "abc")]);
        let shown = format!("{c:?}");
        assert!(!shown.contains("abc") && shown.contains("nccl_id: Some(..)"), "{shown}");
    }

    #[cfg(unix)]
    #[test]
    fn non_utf8_text_is_unset_but_paths_are_kept() {
        use std::os::unix::ffi::OsStringExt;
        let bad = || Some(OsString::from_vec(vec![b'/', 0xff]));
        let c = Config::from_vars(|k| match k {
            MODE_ENV | CUDNN_LIB_ENV | TUNING_DIR_ENV | NCCL_ID_FILE_ENV => bad(),
            _ => None,
        });
        assert_eq!(c.mode, EngineMode::default());
        assert_eq!(c.cudnn_lib, None);
        assert_eq!(c.tuning_dir, bad().map(PathBuf::from));
        assert_eq!(c.nccl_id_file, bad().map(PathBuf::from));
    }

    /// Every `.rs` file under `dir`.
    fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                sources(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }

    /// The string literals of `line` that start with `CUDNN_BACKEND_` (without quotes).
    fn backend_literals(line: &str) -> impl Iterator<Item = &str> {
        line.match_indices("\"CUDNN_BACKEND_")
            .filter_map(|(i, _)| line[i + 1..].split('"').next())
    }

    /// Whether `line` is code (not a comment line).
    fn is_code(line: &str) -> bool {
        !line.trim_start().starts_with("//")
    }

    /// Violations of "only `config.rs` reads the environment and names the crate's variables"
    /// in `text` (the file `name`), given the variable names `config.rs` defines.
    fn violations(name: &str, text: &str, names: &[&str]) -> Vec<String> {
        let mut found = Vec::new();
        for (n, line) in text.lines().enumerate().filter(|(_, l)| is_code(l)) {
            let at = format!("{name}:{}: {}", n + 1, line.trim());
            // `env::var`, `env::var_os`, `env::vars`, `env::vars_os`, and imports of them.
            if line.contains("env::var") || (line.contains("env::{") && line.contains("var")) {
                found.push(format!("{at} (reads the environment)"));
            }
            let declares = line.contains("const ") || line.contains("static ");
            for lit in backend_literals(line) {
                if declares || names.contains(&lit) {
                    found.push(format!(
                        "{at} (names the variable {lit}: use the constant in config.rs)"
                    ));
                }
            }
        }
        found
    }

    #[test]
    fn only_this_module_reads_the_environment() {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let this = src.join("config.rs");
        let own = std::fs::read_to_string(&this).unwrap();
        // The variable names this module defines: the string of every `*_ENV` constant.
        let names: Vec<&str> = own
            .lines()
            .filter(|l| l.contains("_ENV: &str = "))
            .flat_map(backend_literals)
            .collect();
        assert!(names.len() >= 24, "{names:?}");
        assert!(names.contains(&MODE_ENV) && names.contains(&test_vars::EXIT_MARKER_ENV));
        let mut files = Vec::new();
        sources(&src, &mut files);
        assert!(files.len() > 50, "found the crate's sources ({})", files.len());
        let mut found = Vec::new();
        for file in files.iter().filter(|f| **f != this) {
            let name = file.strip_prefix(&src).unwrap().display().to_string();
            found.extend(violations(&name, &std::fs::read_to_string(file).unwrap(), &names));
        }
        assert!(
            found.is_empty(),
            "only config.rs may read environment variables or name the crate's; found:\n{}",
            found.join("\n")
        );
    }

    #[test]
    fn the_source_check_catches_each_kind_of_violation() {
        let names = [MODE_ENV];
        for bad in [
            "let v = std::env::var(X);",
            "    if let Some(p) = std::env::var_os(\"HOME\") {",
            "use std::env::{var, var_os};",
            "for (k, v) in std::env::vars() {}",
            "pub const NEW_ENV: &str = \"CUDNN_BACKEND_NEW\";",
            "static NAME: &str = \"CUDNN_BACKEND_X\";",
            "let on = switched_off(\"CUDNN_BACKEND_MODE\");",
        ] {
            assert_eq!(violations("x.rs", bad, &names).len(), 1, "{bad}");
        }
        for fine in [
            "/// Reads `std::env::var(k)` in the docs.",
            "// \"CUDNN_BACKEND_MODE\" in a comment",
            "let dir = std::env::temp_dir();",
            "Cmd::new(exe).env(crate::config::MODE_ENV, \"1\")",
            "let d = CUDNN_BACKEND_TENSOR_DESCRIPTOR;",
            "format!(\"{MODE_ENV}=deterministic\")",
        ] {
            assert_eq!(violations("x.rs", fine, &names), Vec::<String>::new(), "{fine}");
        }
    }
}
