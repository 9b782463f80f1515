//! CUDA-graph replay of a repeated plan execution: captured once on a stream private to
//! the pooled handle (so no other thread's work can enter the capture), then launched on
//! whatever stream the caller passes.

use std::ffi::c_void;
use std::sync::Arc;

use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
use cudarc::driver::{CudaGraph, CudaStream};

use super::{CudnnHandle, Descriptor};
use crate::error::{Error, Result};

/// One captured `cudnnBackendExecute` (plan + variant pack).
pub(crate) struct Replay(CudaGraph);

// SAFETY: CUDA graph objects may be used from any thread if calls on them are serialized; a
// `Replay` lives in a plan owned by one pooled handle, which one thread uses at a time.
unsafe impl Send for Replay {}

impl Replay {
    /// Captures `plan` run with `pack` on `private` (a stream only this handle uses), then
    /// re-binds the handle to `caller`. The stream state is restored on every path.
    pub(crate) fn capture(
        private: &Arc<CudaStream>,
        caller: &CudaStream,
        handle: &CudnnHandle,
        plan: &Descriptor,
        pack: &Descriptor,
    ) -> Result<Self> {
        handle.set_stream(private.cu_stream() as *mut c_void)?;
        let begun = private.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL);
        let outcome = match begun {
            Ok(()) => {
                let executed = plan.execute(handle, pack);
                let ended = private.end_capture(CUgraphInstantiate_flags(0));
                executed.and(ended.map_err(Error::from))
            }
            Err(e) => Err(Error::from(e)),
        };
        handle.set_stream(caller.cu_stream() as *mut c_void)?;
        match outcome? {
            Some(graph) => Ok(Self(graph)),
            None => Err(Error::Cuda {
                op: "graph capture",
                message: "the capture recorded nothing".into(),
            }),
        }
    }

    /// Enqueues the captured work on `stream`.
    pub(crate) fn launch(&self, stream: &CudaStream) -> Result<()> {
        stream.context().bind_to_thread()?;
        // SAFETY: the executable graph is alive (owned by `self.0`) and was instantiated in the
        // same context as `stream`; launching it only enqueues work on `stream`.
        unsafe { cudarc::driver::result::graph::launch(self.0.cu_graph_exec(), stream.cu_stream()) }?;
        Ok(())
    }
}
