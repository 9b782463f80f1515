//! Ordering the engine's CUDA stream with CubeCL's, GPU-side (stream memory operations).
//!
//! CubeCL keeps its `CUstream` private, so claimed operations run on the engine's own stream
//! (`cudnn_backend_core::Device::stream`) and are ordered with CubeCL's stream through two
//! device words per CubeCL stream:
//!
//! 1. a one-thread *signal* kernel, launched through the CubeCL client (CUDA C++ text as a
//!    `PrecompiledSource`), increments word `issued` after CubeCL's earlier work on that
//!    stream; the engine's stream waits for the new value with `cuStreamWaitValue32` (GEQ);
//! 2. the engine runs the operation on its stream, then writes the same value into word
//!    `done` with `cuStreamWriteValue32` (default flags: a memory barrier orders the
//!    operation's writes before it);
//! 3. a one-thread *wait* kernel launched through the client spins until `done` reaches
//!    `issued`, so CubeCL's later work (readers of the output, reuse of freed buffers)
//!    follows the operation.
//!
//! No host round trip is involved. The kernels take no arguments: the words' addresses are
//! literals in their text, so the kernel id (which keys CubeCL's compile caches) is the text.
//!
//! Forward progress: the wait kernel holds one block slot of one SM until the engine's work
//! is done, so that work must not need every SM resident at once (cooperative kernels); the
//! ordinary cuDNN and NVRTC kernels make progress with one slot taken.
//!
//! Each CubeCL stream gets its own words (a word shared by two streams could let one
//! stream's signal release the other's wait). The words are 16 bytes of device memory per
//! (GPU, CubeCL stream) that claimed an operation, kept for the process: a wait kernel of
//! that stream may still read them at any later time.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use burn_cubecl::cubecl::client::Client;
use burn_cubecl::cubecl::ir::metadata::Info;
use burn_cubecl::cubecl::ir::settings::Dim3;
use burn_cubecl::cubecl::ir::UIntKind;
use burn_cubecl::cubecl::prelude::{
    AddressType, CubeKernel, ElemType, ExecutionMode, KernelDefinition, KernelId, KernelMetadata, KernelSettings,
    PrecompiledSource, Scope,
};
use burn_cubecl::cubecl::server::{CubeCount, KernelArguments};
use cubecl_environment::stream::StreamId;
use cudnn_backend_core::cudarc::driver::sys::{self, CUstreamWaitValue_flags, CUstreamWriteValue_flags};
use cudnn_backend_core::cudarc::driver::{result, CudaStream};

use crate::error::{Error, Result};

/// How long the first use of a CubeCL stream waits for its signal kernel to run before it
/// concludes that CubeCL refused the kernel.
const SELF_TEST_TIMEOUT: Duration = Duration::from_secs(20);

/// The ordering state of every (GPU, CubeCL stream) that claimed an operation.
#[derive(Default)]
pub struct Orderings {
    /// Per (CUDA ordinal, CubeCL stream id): the stream's words, or why they could not be
    /// set up (then that stream's claimed operations run Burn's).
    streams: Mutex<HashMap<(usize, u64), StreamSlot>>,
}

type StreamSlot = std::result::Result<Arc<Mutex<StreamOrdering>>, String>;

impl Orderings {
    /// The ordering of the calling thread's current CubeCL stream on GPU `ordinal`, set up and
    /// self-tested on first use (`on_set_up` runs when that succeeds). That is the stream
    /// `client` launches on: the clients of Burn's tensor handles carry no fixed stream, so
    /// they launch on the current one.
    pub fn for_current_stream(
        &self,
        ordinal: usize,
        client: &Client,
        on_set_up: impl FnOnce(),
    ) -> Result<Arc<Mutex<StreamOrdering>>> {
        let key = (ordinal, StreamId::current().value);
        let mut streams = self.streams.lock().unwrap_or_else(|e| e.into_inner());
        let slot = streams.entry(key).or_insert_with(|| {
            let made = StreamOrdering::new(ordinal, client);
            if made.is_ok() {
                on_set_up();
            }
            made.map(|o| Arc::new(Mutex::new(o))).map_err(|e| e.to_string())
        });
        slot.clone().map_err(Error::Ordering)
    }
}

/// The engine's stream and one CubeCL stream's words.
pub struct StreamOrdering {
    /// The engine's stream of this GPU, where claimed operations run.
    pub stream: Arc<CudaStream>,
    /// Word `issued` (+0), written by the signal kernel.
    issued: u64,
    /// Word `done` (+4), written by the engine's stream.
    done: u64,
    /// The value the last signal kernel wrote (the ordering is used under its mutex).
    last: u32,
    signal: CudaText,
    wait: CudaText,
}

/// What [`StreamOrdering::before`] did, for [`StreamOrdering::after`].
pub struct Ticket {
    value: u32,
}

impl StreamOrdering {
    /// Allocates the words on GPU `ordinal` and checks once that CubeCL runs the kernels.
    fn new(ordinal: usize, client: &Client) -> Result<Self> {
        let device = cudnn_backend_core::Device::new(ordinal)?;
        let stream = device.stream().clone();
        let ctx = stream.context();
        ctx.bind_to_thread().map_err(|e| Error::cuda("cuCtxSetCurrent", e))?;
        // SAFETY: a plain device allocation on the current (primary) context; it is zeroed
        // right below before any use and kept for the process (module docs).
        let base = unsafe { result::malloc_sync(16) }.map_err(|e| Error::cuda("cuMemAlloc", e))?;
        // SAFETY: `base` is the 16-byte allocation just made.
        unsafe { result::memset_d8_sync(base, 0, 16) }.map_err(|e| Error::cuda("cuMemsetD8", e))?;
        let (issued, done) = (base, base + 4);
        let mut this = Self {
            stream,
            issued,
            done,
            last: 0,
            signal: CudaText::signal(issued),
            wait: CudaText::wait(issued, done),
        };
        this.self_test(client)?;
        Ok(this)
    }

    /// Runs each kernel once through `client` and checks that the words moved: CubeCL only
    /// logs a `PrecompiledSource` it refuses, so without this check the first claimed
    /// operation would wait forever.
    fn self_test(&mut self, client: &Client) -> Result<()> {
        let value = self.next_value();
        client.launch(Box::new(self.signal.clone()), one_cube(), KernelArguments::new());
        client.flush().map_err(|e| Error::cubecl("client.flush", e))?;
        let t0 = Instant::now();
        loop {
            let seen = read_word(&self.stream, self.issued)?;
            if seen == value {
                break;
            }
            if t0.elapsed() > SELF_TEST_TIMEOUT {
                return Err(Error::Ordering(format!(
                    "the signal kernel launched through CubeCL's client did not run within {SELF_TEST_TIMEOUT:?} \
                     (word {seen}, expected {value}): CubeCL refused the CUDA C++ kernel (see its log; the CUDA \
                     server needs cubecl-cuda's `cpp` compiler)"
                )));
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        self.stream_wait(value)?;
        self.stream_write(value)?;
        self.stream
            .synchronize()
            .map_err(|e| Error::cuda("cuStreamSynchronize", e))?;
        client.launch(Box::new(self.wait.clone()), one_cube(), KernelArguments::new());
        burn_cubecl::cubecl::future::block_on(client.sync()).map_err(|e| Error::cubecl("client.sync", e))
    }

    /// Orders the engine's stream after every launch CubeCL made so far on `client`'s stream.
    pub fn before(&mut self, client: &Client) -> Result<Ticket> {
        let value = self.next_value();
        client.launch(Box::new(self.signal.clone()), one_cube(), KernelArguments::new());
        // The launch is a submission to CubeCL's device thread; the flush hands it to the
        // driver before the engine's stream waits for it, so no host wait inside the engine
        // can wait on a kernel still queued behind it.
        client.flush().map_err(|e| Error::cubecl("client.flush", e))?;
        self.stream_wait(value)?;
        Ok(Ticket { value })
    }

    /// Orders CubeCL's later launches on `client`'s stream after the engine stream's work so
    /// far (`ran`: whether work was enqueued; the wait kernel is launched only then).
    pub fn after(&self, client: &Client, ticket: Ticket, ran: bool) -> Result<()> {
        // Written even when nothing ran, so `done` keeps up with `issued`.
        self.stream_write(ticket.value)?;
        if ran {
            client.launch(Box::new(self.wait.clone()), one_cube(), KernelArguments::new());
        }
        Ok(())
    }

    /// The value the next signal kernel writes.
    fn next_value(&mut self) -> u32 {
        self.last = self.last.wrapping_add(1);
        self.last
    }

    fn stream_wait(&self, value: u32) -> Result<()> {
        self.stream
            .context()
            .bind_to_thread()
            .map_err(|e| Error::cuda("cuCtxSetCurrent", e))?;
        // SAFETY: `self.issued` is a live 4-byte-aligned word of this context's allocation
        // (made in `new`, never freed), and `self.stream` is a live stream of that context.
        let status = unsafe {
            sys::cuStreamWaitValue32_v2(
                self.stream.cu_stream(),
                self.issued,
                value,
                CUstreamWaitValue_flags::CU_STREAM_WAIT_VALUE_GEQ as u32,
            )
        };
        status.result().map_err(|e| Error::cuda("cuStreamWaitValue32", e))
    }

    fn stream_write(&self, value: u32) -> Result<()> {
        self.stream
            .context()
            .bind_to_thread()
            .map_err(|e| Error::cuda("cuCtxSetCurrent", e))?;
        // SAFETY: as in `stream_wait`, for word `done`.
        let status = unsafe {
            sys::cuStreamWriteValue32_v2(
                self.stream.cu_stream(),
                self.done,
                value,
                CUstreamWriteValue_flags::CU_STREAM_WRITE_VALUE_DEFAULT as u32,
            )
        };
        status.result().map_err(|e| Error::cuda("cuStreamWriteValue32", e))
    }
}

/// Reads one device word (a synchronous copy on the legacy stream, which waits for nothing
/// here: the streams involved are non-blocking).
fn read_word(stream: &Arc<CudaStream>, addr: u64) -> Result<u32> {
    stream
        .context()
        .bind_to_thread()
        .map_err(|e| Error::cuda("cuCtxSetCurrent", e))?;
    let mut v = [0u32; 1];
    // SAFETY: `addr` is a word of a live allocation made in `StreamOrdering::new`, holding a u32.
    unsafe { result::memcpy_dtoh_sync(&mut v, addr) }.map_err(|e| Error::cuda("cuMemcpyDtoH", e))?;
    Ok(v[0])
}

fn one_cube() -> CubeCount {
    CubeCount::Static(1, 1, 1)
}

/// A one-thread kernel given as CUDA C++ text, run through CubeCL's client on its stream.
#[derive(Clone, Debug)]
pub(crate) struct CudaText {
    name: &'static str,
    entry: &'static str,
    source: String,
}

impl CudaText {
    /// Increments `issued` (one thread, in stream order: no other signal of this stream runs
    /// concurrently).
    pub(crate) fn signal(issued: u64) -> Self {
        let entry = "cudnn_burn_signal";
        let source = format!(
            r#"extern "C" __global__ void {entry}() {{
    volatile unsigned int* issued = (volatile unsigned int*){issued:#x}ull;
    *issued = *issued + 1u;
    __threadfence_system();
}}
"#
        );
        Self {
            name: entry,
            entry,
            source,
        }
    }

    /// Spins until `done` reaches the `issued` its signal wrote (the signal ran right before
    /// it on the same stream, and the next one runs after it, so `issued` is stable).
    pub(crate) fn wait(issued: u64, done: u64) -> Self {
        let entry = "cudnn_burn_wait";
        let source = format!(
            r#"extern "C" __global__ void {entry}() {{
    volatile unsigned int* issued = (volatile unsigned int*){issued:#x}ull;
    volatile unsigned int* done = (volatile unsigned int*){done:#x}ull;
    unsigned int target = *issued;
    while ((int)(*done - target) < 0) {{
        asm volatile("nanosleep.u32 256;");
    }}
    __threadfence();
}}
"#
        );
        Self {
            name: entry,
            entry,
            source,
        }
    }
}

impl KernelMetadata for CudaText {
    fn name(&self) -> &'static str {
        self.name
    }

    /// The text itself: CubeCL keys its compile caches (memory and disk) by this id.
    fn id(&self) -> KernelId {
        KernelId::new::<Self>().info(self.source.clone())
    }

    fn address_type(&self) -> ElemType {
        ElemType::UInt(UIntKind::U32)
    }
}

impl CubeKernel for CudaText {
    /// Only the settings are read (one-thread cubes); the body is never compiled.
    fn define(&self) -> KernelDefinition {
        let settings = KernelSettings::new(Dim3::new_single(), ExecutionMode::Checked, AddressType::U32);
        KernelDefinition {
            body: Scope::root(settings.clone()),
            settings,
            info: Info::default(),
        }
    }

    fn source(&self) -> Option<PrecompiledSource> {
        Some(PrecompiledSource {
            source: self.source.clone(),
            entrypoint_name: self.entry.to_string(),
            // The tag of cubecl-cuda's C++ compiler (cubecl-cpp's `lang_tag` for CUDA).
            lang: "cuda",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernels_carry_the_word_addresses_and_their_entry_points() {
        let signal = CudaText::signal(0x7f00_0000_1000);
        assert!(signal.source.contains("0x7f0000001000ull"));
        assert!(signal.source.contains(&format!("void {}()", signal.entry)));
        let wait = CudaText::wait(0x1000, 0x1004);
        assert!(["0x1000ull", "0x1004ull"].iter().all(|a| wait.source.contains(a)));
        assert_eq!(signal.source().map(|s| s.lang), Some("cuda"));
    }

    #[test]
    fn kernel_ids_differ_per_stream() {
        assert_ne!(CudaText::signal(0x1000).id(), CudaText::signal(0x2000).id());
        assert_eq!(CudaText::wait(0x10, 0x14).id(), CudaText::wait(0x10, 0x14).id());
    }
}
