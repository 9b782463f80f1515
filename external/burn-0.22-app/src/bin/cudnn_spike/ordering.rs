//! How a claimed convolution is ordered with CubeCL's CUDA stream (`--order`).
//!
//! CubeCL keeps its `CUstream` private, so our cuDNN work runs on the engine's own stream
//! (`cudnn_backend_core::Device::stream`) and is ordered with CubeCL's in one of two ways:
//!
//! - **host-wait**: `client.sync()` (every launch CubeCL made on the client's stream has
//!   finished) before our work, and a synchronize of our stream after it;
//! - **stream-memory**: GPU-side, with two device words. A one-thread *signal* kernel, launched
//!   through the CubeCL client (CUDA C++ text as a `PrecompiledSource`), increments word
//!   `issued` after CubeCL's earlier work on that stream; our stream waits for it with
//!   `cuStreamWaitValue32` (GEQ, a cyclic comparison), runs the convolution, then writes the same
//!   value into word `done` with `cuStreamWriteValue32` (default flags: a memory barrier orders the
//!   convolution's writes before it). A one-thread *wait* kernel launched through the client
//!   next spins until `done` reaches `issued`, so CubeCL's later work follows the convolution.
//!   The kernels take no arguments: the words' addresses are literals in their text (so the
//!   kernel id, which keys CubeCL's compile caches, is the text itself).
//!
//! Forward progress (stream-memory): the wait kernel holds one block slot of one SM until our
//! stream's convolution is done. cuDNN's kernels must therefore not need every SM at once: a
//! cooperative or persistent kernel that waits for all its blocks to be resident could wait
//! for the slot the spinning block holds, and the spinning block waits for it. The ordinary
//! convolution kernels make progress with one slot taken; a hang here is the symptom of the
//! other kind. The same holds for anything else sharing the GPU (MPS, green contexts).
//! The words serve one CubeCL stream at a time (the spike's single Burn stream); two CubeCL
//! streams claiming convolutions concurrently would need a pair of words each.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering as AtomicOrdering};
use std::sync::Arc;
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
use cudnn_backend_core::cudarc::driver::sys::{CUstreamWaitValue_flags, CUstreamWriteValue_flags};
use cudnn_backend_core::cudarc::driver::{result, sys, CudaFunction, CudaStream, LaunchConfig, PushKernelArg};

use crate::error::{Result, SpikeError};

/// `--order`: how our stream is ordered with CubeCL's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Order {
    /// `client.sync()` before, our stream's synchronize after.
    HostWait,
    /// Device words, `cuStreamWaitValue32`/`cuStreamWriteValue32` and two kernels on CubeCL's stream.
    StreamMemory,
}

impl Order {
    /// The `--order` value.
    pub fn name(self) -> &'static str {
        match self {
            Order::HostWait => "host-wait",
            Order::StreamMemory => "stream-memory",
        }
    }

    /// Parses an `--order` value.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "host-wait" => Some(Order::HostWait),
            "stream-memory" => Some(Order::StreamMemory),
            _ => None,
        }
    }
}

/// The ordering of every claimed convolution of the process, with the engine's stream.
pub struct Ordering {
    /// The engine's stream (the device's own non-blocking stream) where the convolutions run.
    pub stream: Arc<CudaStream>,
    words: Option<Words>,
}

/// The state of the stream-memory mode.
struct Words {
    /// Word `issued` (+0), written by the signal kernel.
    issued: u64,
    /// Word `done` (+4), written by our stream.
    done: u64,
    /// Word `violations` (+8): probes that found `issued` short of their value.
    violations: u64,
    /// Word `waits` (+12): wait kernels that ran to their end.
    waits: u64,
    /// The value the last signal kernel writes (host copy of `issued`'s target).
    next: AtomicU32,
    /// Race amplifier (0: off): nanoseconds of delay on both streams around each claimed
    /// convolution, and the probe that counts violations.
    amplify_ns: AtomicU64,
    signal: CudaText,
    wait: CudaText,
    /// The probe kernel on our stream (compiled with NVRTC through cudarc).
    probe: CudaFunction,
}

/// The stream-memory words: what ran on the GPU (the self-test included).
pub struct WordCounts {
    /// Signal kernels run (word `issued`).
    pub signals: u32,
    /// The last value our stream wrote (word `done`).
    pub writes: u32,
    /// Probes that found the wait passed before its signal.
    pub violations: u32,
    /// Wait kernels run to their end.
    pub waits: u32,
}

/// What `before` did, for `after`.
pub struct Ticket {
    value: u32,
}

impl Ordering {
    /// Opens GPU 0 through the engine and, for stream-memory, allocates the words (once, for
    /// the process: never freed) and compiles the probe.
    pub fn new(order: Order) -> Result<Self> {
        let device = cudnn_backend_core::Device::new(0).map_err(|e| SpikeError::Setup(format!("{e}")))?;
        let stream = device.stream().clone();
        let words = match order {
            Order::HostWait => None,
            Order::StreamMemory => Some(Words::new(&stream)?),
        };
        Ok(Self { stream, words })
    }

    /// Runs each kind of kernel once through `client` and checks that the words moved: a
    /// `PrecompiledSource` the CUDA server refuses is only logged by CubeCL (its launch has no
    /// buffer to carry the error), so without this check the first claimed convolution would
    /// wait forever.
    pub fn self_test(&self, client: &Client) -> Result<String> {
        let Some(words) = &self.words else {
            return Ok("host-wait: nothing to test".into());
        };
        let value = words.next.fetch_add(1, AtomicOrdering::SeqCst).wrapping_add(1);
        client.launch(Box::new(words.signal.clone()), one_cube(), KernelArguments::new());
        client
            .flush()
            .map_err(|e| SpikeError::run("client.flush after the signal kernel", e))?;
        let t0 = Instant::now();
        loop {
            let seen = read_word(&self.stream, words.issued)?;
            if seen == value {
                break;
            }
            if t0.elapsed() > Duration::from_secs(20) {
                return Err(SpikeError::Run(format!(
                    "the signal kernel launched through CubeCL's client did not run within 20 s (word = {seen}, \
                     expected {value}): CubeCL refused the PrecompiledSource (see its log) or never launched it"
                )));
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        let signal_ms = t0.elapsed().as_secs_f64() * 1e3;
        self.stream_wait(words, value)?;
        self.stream_write(words, value)?;
        self.stream.synchronize()?;
        client.launch(Box::new(words.wait.clone()), one_cube(), KernelArguments::new());
        block_on_sync(client)?;
        let waits = read_word(&self.stream, words.waits)?;
        if waits != 1 {
            return Err(SpikeError::Run(format!(
                "the wait kernel launched through CubeCL's client did not run (word = {waits}, expected 1): CubeCL \
                 refused the PrecompiledSource (see its log)"
            )));
        }
        Ok(format!(
            "signal kernel ran through CubeCL's client ({signal_ms:.1} ms incl. NVRTC); our stream's \
             cuStreamWaitValue32/cuStreamWriteValue32 passed; wait kernel ran"
        ))
    }

    /// Turns the race amplifier on (`ns` > 0) or off: delays on CubeCL's stream before the
    /// signal and on ours before the convolution, and a probe that counts waits that let our
    /// stream through early. Stream-memory only.
    pub fn set_amplifier(&self, ns: u64) {
        if let Some(w) = &self.words {
            w.amplify_ns.store(ns, AtomicOrdering::SeqCst);
        }
    }

    /// The words (stream-memory; read after a sync of both streams).
    pub fn words(&self) -> Result<Option<WordCounts>> {
        let Some(w) = &self.words else {
            return Ok(None);
        };
        self.stream.synchronize()?;
        Ok(Some(WordCounts {
            signals: read_word(&self.stream, w.issued)?,
            writes: read_word(&self.stream, w.done)?,
            violations: read_word(&self.stream, w.violations)?,
            waits: read_word(&self.stream, w.waits)?,
        }))
    }

    /// Orders our stream after every launch CubeCL made so far on `client`'s stream.
    pub fn before(&self, client: &Client) -> Result<Ticket> {
        let Some(words) = &self.words else {
            block_on_sync(client)?;
            return Ok(Ticket { value: 0 });
        };
        let value = words.next.fetch_add(1, AtomicOrdering::SeqCst).wrapping_add(1);
        let amplify = words.amplify_ns.load(AtomicOrdering::SeqCst);
        if amplify > 0 {
            client.launch(Box::new(CudaText::delay(amplify)), one_cube(), KernelArguments::new());
        }
        client.launch(Box::new(words.signal.clone()), one_cube(), KernelArguments::new());
        // The launch is a non-blocking submission to CubeCL's device thread; the flush has the
        // server hand it to the driver before our stream starts waiting for it, so nothing on
        // this host thread (e.g. a synchronize inside the engine) can wait on a kernel that is
        // still queued behind it.
        client
            .flush()
            .map_err(|e| SpikeError::run("client.flush after the signal kernel", e))?;
        self.stream_wait(words, value)?;
        if amplify > 0 {
            self.probe(words, value, amplify)?;
        }
        Ok(Ticket { value })
    }

    /// Orders CubeCL's later launches on `client`'s stream after our stream's work so far
    /// (`ran`: whether our work was enqueued; the wait kernel is launched only then).
    pub fn after(&self, client: &Client, ticket: Ticket, ran: bool) -> Result<()> {
        let Some(words) = &self.words else {
            self.stream.synchronize()?;
            return Ok(());
        };
        // Written even when nothing ran, so `done` keeps up with `issued`.
        self.stream_write(words, ticket.value)?;
        if ran {
            client.launch(Box::new(words.wait.clone()), one_cube(), KernelArguments::new());
        }
        Ok(())
    }

    fn stream_wait(&self, words: &Words, value: u32) -> Result<()> {
        self.stream.context().bind_to_thread()?;
        // SAFETY: `words.issued` is a live 4-byte-aligned device allocation of this context
        // (allocated in `Words::new`, never freed), and `self.stream` is a live stream of it.
        let status = unsafe {
            sys::cuStreamWaitValue32_v2(
                self.stream.cu_stream(),
                words.issued,
                value,
                CUstreamWaitValue_flags::CU_STREAM_WAIT_VALUE_GEQ as u32,
            )
        };
        status.result().map_err(|e| SpikeError::run("cuStreamWaitValue32", e))
    }

    fn stream_write(&self, words: &Words, value: u32) -> Result<()> {
        self.stream.context().bind_to_thread()?;
        // SAFETY: as in `stream_wait`, for word `done`.
        let status = unsafe {
            sys::cuStreamWriteValue32_v2(
                self.stream.cu_stream(),
                words.done,
                value,
                CUstreamWriteValue_flags::CU_STREAM_WRITE_VALUE_DEFAULT as u32,
            )
        };
        status.result().map_err(|e| SpikeError::run("cuStreamWriteValue32", e))
    }

    fn probe(&self, words: &Words, value: u32, delay_ns: u64) -> Result<()> {
        let mut launch = self.stream.launch_builder(&words.probe);
        launch
            .arg(&words.issued)
            .arg(&value)
            .arg(&delay_ns)
            .arg(&words.violations);
        let cfg = LaunchConfig {
            grid_dim: (1, 1, 1),
            block_dim: (1, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: the probe's parameters are (const u32*, u32, u64, u32*), matching the four
        // arguments pushed; both pointers are words of the live allocation of `Words::new`.
        unsafe { launch.launch(cfg) }.map_err(|e| SpikeError::run("probe launch", e))?;
        Ok(())
    }
}

impl Words {
    fn new(stream: &Arc<CudaStream>) -> Result<Self> {
        let ctx = stream.context();
        ctx.bind_to_thread()?;
        // SAFETY: a plain device allocation on the current (primary) context; it is zeroed
        // right below before any use and lives for the process (never freed).
        let base = unsafe { result::malloc_sync(16) }?;
        // SAFETY: `base` is the 16-byte allocation just made.
        unsafe { result::memset_d8_sync(base, 0, 16) }?;
        let ptx = cudnn_backend_core::cudarc::nvrtc::compile_ptx(PROBE_SOURCE)
            .map_err(|e| SpikeError::run("NVRTC (probe kernel)", e))?;
        let probe = ctx.load_module(ptx)?.load_function("cudnn_spike_probe")?;
        let (issued, done, violations, waits) = (base, base + 4, base + 8, base + 12);
        Ok(Self {
            issued,
            done,
            violations,
            waits,
            next: AtomicU32::new(0),
            amplify_ns: AtomicU64::new(0),
            signal: CudaText::signal(issued),
            wait: CudaText::wait(issued, done, waits),
            probe,
        })
    }
}

/// Reads one device word (synchronous copy on the legacy stream, which waits for nothing:
/// the streams involved are non-blocking).
fn read_word(stream: &Arc<CudaStream>, addr: u64) -> Result<u32> {
    stream.context().bind_to_thread()?;
    let mut v = [0u32; 1];
    // SAFETY: `addr` is a word of the live allocation of `Words::new`, holding a u32.
    unsafe { result::memcpy_dtoh_sync(&mut v, addr) }?;
    Ok(v[0])
}

fn block_on_sync(client: &Client) -> Result<()> {
    burn_cubecl::cubecl::future::block_on(client.sync()).map_err(|e| SpikeError::run("CubeCL client.sync", e))
}

fn one_cube() -> CubeCount {
    CubeCount::Static(1, 1, 1)
}

/// The probe, on our stream right after the wait: counts a wait that let the stream through
/// before the signal kernel wrote `expected`, then spins `delay_ns` (so a consumer on CubeCL's
/// stream that does not wait for our convolution reads it unwritten).
const PROBE_SOURCE: &str = r#"
extern "C" __global__ void cudnn_spike_probe(const unsigned int* issued, unsigned int expected,
                                             unsigned long long delay_ns, unsigned int* violations) {
    unsigned int seen = *(volatile const unsigned int*)issued;
    if ((int)(seen - expected) < 0) atomicAdd(violations, 1u);
    unsigned long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); } while (t - t0 < delay_ns);
}
"#;

/// A one-thread kernel given as CUDA C++ text, run through CubeCL's client on its stream.
#[derive(Clone)]
struct CudaText {
    name: &'static str,
    entry: String,
    source: String,
}

impl CudaText {
    /// Increments `issued` (one thread, in stream order: no other signal runs concurrently).
    fn signal(issued: u64) -> Self {
        let entry = "cudnn_spike_signal".to_string();
        let source = format!(
            r#"extern "C" __global__ void {entry}() {{
    volatile unsigned int* issued = (volatile unsigned int*){issued:#x}ull;
    *issued = *issued + 1u;
    __threadfence_system();
}}
"#
        );
        Self {
            name: "cudnn_spike_signal",
            entry,
            source,
        }
    }

    /// Spins until `done` reaches the `issued` its signal wrote (the signal kernel ran right
    /// before it on the same stream, and the next one runs after it, so `issued` is stable),
    /// then counts itself in `waits`.
    fn wait(issued: u64, done: u64, waits: u64) -> Self {
        let entry = "cudnn_spike_wait".to_string();
        let source = format!(
            r#"extern "C" __global__ void {entry}() {{
    volatile unsigned int* issued = (volatile unsigned int*){issued:#x}ull;
    volatile unsigned int* done = (volatile unsigned int*){done:#x}ull;
    volatile unsigned int* waits = (volatile unsigned int*){waits:#x}ull;
    unsigned int target = *issued;
    while ((int)(*done - target) < 0) {{
        asm volatile("nanosleep.u32 256;");
    }}
    __threadfence();
    *waits = *waits + 1u;
}}
"#
        );
        Self {
            name: "cudnn_spike_wait",
            entry,
            source,
        }
    }

    /// Spins `ns` nanoseconds (the race amplifier on CubeCL's stream).
    fn delay(ns: u64) -> Self {
        let entry = format!("cudnn_spike_delay_{ns}");
        let source = format!(
            r#"extern "C" __global__ void {entry}() {{
    unsigned long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do {{
        asm volatile("nanosleep.u32 1000;");
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    }} while (t - t0 < {ns}ull);
}}
"#
        );
        Self {
            name: "cudnn_spike_delay",
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
            entrypoint_name: self.entry.clone(),
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
        let wait = CudaText::wait(0x1000, 0x1004, 0x100c);
        assert!(["0x1000ull", "0x1004ull", "0x100cull"]
            .iter()
            .all(|a| wait.source.contains(a)));
        let delay = CudaText::delay(200_000);
        assert!(delay.source.contains("200000ull") && delay.entry.ends_with("200000"));
        let source = signal.source().map(|s| s.lang);
        assert_eq!(source, Some("cuda"));
    }

    #[test]
    fn order_names_round_trip() {
        for o in [Order::HostWait, Order::StreamMemory] {
            assert_eq!(Order::parse(o.name()), Some(o));
        }
        assert_eq!(Order::parse("events"), None);
    }
}
