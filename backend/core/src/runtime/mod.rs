//! Run-time discovery and device management: library probing (libcuda, libcudnn,
//! libnvrtc), devices with their context and default stream, and per-stream workspace.

pub(crate) mod build_trace;
mod device;
pub mod disk_cache;
#[doc(hidden)]
pub mod fault;
mod probe;
pub(crate) mod workspace;

pub use crate::ffi::counters::{launch_counts, thread_launch_counts, LaunchCounts};
pub(crate) use build_trace::record as record_build;
pub use build_trace::{build_events, dropped_build_events, thread_ms, BuildEvent, BuildKind, MAX_EVENTS};
pub use device::{Device, DeviceInfo, MAX_DEVICES};
pub use probe::{check_driver, check_nvrtc, cudnn_version, device_count, report, RuntimeReport};
#[doc(hidden)]
pub use workspace::release_cached_memory_on_shortage;
pub(crate) use workspace::with_workspace;
pub use workspace::{release_unused_workspaces, workspace_bytes};

/// The GPU whose device memory `ptr` (a `CUdeviceptr`) points into; `None` for host,
/// managed or unknown addresses. The engine [`ops`](crate::ops) reject operands for which
/// this names another GPU than their stream's.
pub fn pointer_device(ptr: u64) -> Option<usize> {
    crate::ffi::memory::device_memory_ordinal(ptr)
}

/// Starts (`true`) or stops (`false`) an attached profiler's collection on `device`: with
/// Nsight Compute's `--profile-from-start off`, only the kernels enqueued in between are
/// profiled (a training step chosen by the program). Without a profiler it does nothing.
pub fn profiler_collect(device: &Device, on: bool) -> crate::error::Result<()> {
    device
        .context()
        .bind_to_thread()
        .map_err(|e| crate::error::Error::Cuda {
            op: "cuCtxSetCurrent",
            message: e.to_string(),
        })?;
    crate::ffi::driver::profiler_collect(on)
}
