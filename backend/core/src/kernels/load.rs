//! In-process kernel loading: a map of loaded functions in front of the disk cache and NVRTC.
//!
//! The hot path is one read-locked map lookup. A miss takes the kernel's own slot lock (so
//! concurrent requests for one kernel compile it once, while different kernels compile in
//! parallel), looks the image up in the disk cache ([`crate::runtime::disk_cache`]), compiles it with NVRTC
//! when absent ([`super::compile`]), and loads it with `cuModuleLoadData`. A kernel that had
//! to be compiled also compiles, on other threads and at the same time, up to one less than
//! the number of CPU cores of the kernels that usually run beside it ([`super::warm`]), so
//! a first training step pays about one compile per group instead of one per kernel.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock};
use std::time::Instant;

use cudarc::driver::{CudaFunction, CudaModule};
use cudarc::nvrtc::Ptx;

use super::compile::{self, Target};
use super::KernelSource;
use crate::error::{Error, Result};
use crate::ffi::nvrtc::Output;
use crate::runtime::disk_cache::{self as cache, CacheKey, CachedImage, DiskCache, ImageKind, KeyParts};
use crate::runtime::Device;

/// The unit name of a source compiled whole (one that still uses `extern "C"`).
const WHOLE: &str = "*";

/// (device ordinal, source name, kernel name or [`WHOLE`]).
type Key = (usize, &'static str, &'static str);

/// A loaded module and the symbol of the unit's kernel in it (empty for a whole source).
type Slot = Arc<Mutex<Option<(Arc<CudaModule>, String)>>>;

#[derive(Default)]
struct Loaded {
    functions: RwLock<HashMap<Key, CudaFunction>>,
    slots: Mutex<HashMap<Key, Slot>>,
}

/// The loader's part of the [`Engine`](crate::Engine): loaded kernels per device, the
/// disk cache, the per-architecture builds, source hashes, background jobs and counters.
pub(crate) struct Loader {
    loaded: OnceLock<Loaded>,
    compiled: AtomicU64,
    disk_hits: AtomicU64,
    disk_misses: AtomicU64,
    compile_us: AtomicU64,
    load_us: AtomicU64,
    prefetched: AtomicU64,
    ptx_fallbacks: AtomicU64,
    disk_cache: OnceLock<Option<DiskCache>>,
    builds: OnceLock<Mutex<HashMap<(u32, u32), Build>>>,
    hashes: OnceLock<Mutex<HashMap<&'static str, u128>>>,
    parallelism: OnceLock<usize>,
    jobs: OnceLock<(Mutex<usize>, std::sync::Condvar)>,
    permits: OnceLock<(Mutex<Permits>, std::sync::Condvar)>,
}

impl Loader {
    pub(crate) const fn new() -> Self {
        Loader {
            loaded: OnceLock::new(),
            compiled: AtomicU64::new(0),
            disk_hits: AtomicU64::new(0),
            disk_misses: AtomicU64::new(0),
            compile_us: AtomicU64::new(0),
            load_us: AtomicU64::new(0),
            prefetched: AtomicU64::new(0),
            ptx_fallbacks: AtomicU64::new(0),
            disk_cache: OnceLock::new(),
            builds: OnceLock::new(),
            hashes: OnceLock::new(),
            parallelism: OnceLock::new(),
            jobs: OnceLock::new(),
            permits: OnceLock::new(),
        }
    }
}

fn state() -> &'static Loader {
    &super::state().loader
}

fn loaded() -> &'static Loaded {
    state().loaded.get_or_init(Default::default)
}

/// Counters of the kernel loader since the process started (see [`compile_stats`]).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct CompileStats {
    /// Kernels compiled by NVRTC (a source compiled whole counts once).
    pub compiled: u64,
    /// Kernels loaded from the disk cache.
    pub disk_hits: u64,
    /// Disk cache look-ups that found no usable entry (with the cache on).
    pub disk_misses: u64,
    /// NVRTC time, summed over threads (compiles run in parallel), in milliseconds.
    pub compile_ms: f64,
    /// Time reading the disk cache and loading modules, summed over threads, in milliseconds.
    pub load_ms: f64,
    /// Kernels compiled alongside another one that missed (groups of kernels that usually run
    /// together, see the module docs of [`crate::kernels`]).
    pub prefetched: u64,
    /// Modules loaded as PTX (the GPU is newer than NVRTC, so the driver JIT-compiles).
    pub ptx_fallbacks: u64,
}

/// The loader's counters: kernels compiled, disk cache hits and misses, NVRTC and load time.
pub fn compile_stats() -> CompileStats {
    let ms = |a: &AtomicU64| a.load(Ordering::Relaxed) as f64 / 1000.0;
    CompileStats {
        compiled: state().compiled.load(Ordering::Relaxed),
        disk_hits: state().disk_hits.load(Ordering::Relaxed),
        disk_misses: state().disk_misses.load(Ordering::Relaxed),
        compile_ms: ms(&state().compile_us),
        load_ms: ms(&state().load_us),
        prefetched: state().prefetched.load(Ordering::Relaxed),
        ptx_fallbacks: state().ptx_fallbacks.load(Ordering::Relaxed),
    }
}

fn add_us(counter: &AtomicU64, since: Instant) {
    counter.fetch_add(since.elapsed().as_micros() as u64, Ordering::Relaxed);
}

/// The disk cache this process uses (resolved from the environment once).
fn disk_cache() -> Option<&'static DiskCache> {
    state()
        .disk_cache
        .get_or_init(|| {
            let c = DiskCache::from_env();
            match &c {
                Some(c) => tracing::debug!(dir = %c.dir().display(), "kernel cache"),
                None => tracing::debug!("kernel cache off"),
            }
            c
        })
        .as_ref()
}

/// What every compile for one compute capability shares: the target and the key parts that
/// do not depend on the kernel.
#[derive(Clone, Debug)]
pub(crate) struct Build {
    target: Target,
    options: Vec<String>,
    arch: String,
    nvrtc: (i32, i32),
    driver: i32,
}

impl Build {
    /// The build for `target` with NVRTC `nvrtc` and CUDA driver version `driver`.
    pub(crate) fn new(target: Target, nvrtc: (i32, i32), driver: i32) -> Build {
        Build {
            target,
            options: target.options(),
            arch: target.label(),
            nvrtc,
            driver,
        }
    }
}

fn build_for(dev: &Device) -> Result<Build> {
    let cc = dev.info().compute_capability;
    let map = state().builds.get_or_init(Default::default);
    if let Some(b) = map.lock().unwrap_or_else(|e| e.into_inner()).get(&cc) {
        return Ok(b.clone());
    }
    let (nvrtc, archs) = compile::nvrtc_info()?;
    let target = Target::for_device(cc, archs);
    if target.output == Output::Ptx {
        tracing::warn!(
            "compute capability {}.{} is newer than NVRTC {}.{} supports ({archs:?}): kernels are \
             compiled to PTX for {} and JIT-compiled by the driver; install a newer NVRTC",
            cc.0,
            cc.1,
            nvrtc.0,
            nvrtc.1,
            target.label()
        );
    }
    let b = Build::new(target, nvrtc, crate::ffi::driver::driver_version()?);
    map.lock().unwrap_or_else(|e| e.into_inner()).insert(cc, b.clone());
    Ok(b)
}

/// The hash of `source`'s full text (once per source and process).
fn source_hash(source: KernelSource) -> u128 {
    let map = state().hashes.get_or_init(Default::default);
    if let Some(h) = map.lock().unwrap_or_else(|e| e.into_inner()).get(source.name) {
        return *h;
    }
    let h = cache::source_hash(&compile::full_source(source));
    map.lock().unwrap_or_else(|e| e.into_inner()).insert(source.name, h);
    h
}

fn load_image(dev: &Device, kind: ImageKind, bytes: Vec<u8>) -> Result<Arc<CudaModule>> {
    let image = match kind {
        ImageKind::Cubin => Ptx::from_binary(bytes),
        ImageKind::Ptx => {
            state().ptx_fallbacks.fetch_add(1, Ordering::Relaxed);
            // cudarc turns PTX text into a C string (and would panic on a NUL byte).
            let text = String::from_utf8(bytes)
                .ok()
                .filter(|t| !t.contains('\0'))
                .ok_or_else(|| Error::Cuda {
                    op: "loading a PTX kernel image",
                    message: "the PTX is not NUL-free UTF-8 text".into(),
                })?;
            Ptx::from_src(text)
        }
        ImageKind::CudnnPlan => {
            return Err(Error::Cuda {
                op: "loading a kernel image",
                message: "the cache entry holds a cuDNN plan, not a kernel".into(),
            })
        }
    };
    dev.context().load_module(image).map_err(|e| Error::Cuda {
        op: "cuModuleLoadData (kernel image)",
        message: e.to_string(),
    })
}

/// The image of one unit (`kernel` of `source`, or all of `source` when `None`) for `b`: from
/// `disk` when it holds an intact entry and `skip_disk` is false, else compiled by NVRTC (and
/// stored in `disk`). `before_compile` runs just before NVRTC is called. The `bool` says
/// whether NVRTC ran. Needs no GPU.
pub(crate) fn image_for(
    b: &Build,
    disk: Option<&DiskCache>,
    source: KernelSource,
    kernel: Option<&'static str>,
    skip_disk: bool,
    before_compile: &mut dyn FnMut(),
) -> Result<(CachedImage, bool)> {
    let label = kernel.unwrap_or(source.name);
    let key = CacheKey::new(&KeyParts {
        source_hash: source_hash(source),
        kernel: kernel.unwrap_or(WHOLE),
        options: &b.options,
        arch: &b.arch,
        nvrtc: b.nvrtc,
        driver: b.driver,
        crate_version: env!("CARGO_PKG_VERSION"),
    });
    let kind = match b.target.output {
        Output::Cubin => ImageKind::Cubin,
        Output::Ptx => ImageKind::Ptx,
    };
    if let Some(cache) = disk.filter(|_| !skip_disk) {
        let t = Instant::now();
        match cache.load(key, label) {
            Some(entry) if entry.kind == kind => {
                add_us(&state().load_us, t);
                state().disk_hits.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(kernel = label, source = source.name, "kernel read from the disk cache");
                return Ok((entry, false));
            }
            _ => {
                state().disk_misses.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
    before_compile();
    let t = Instant::now();
    let image = compile::compile(source, kernel, b.target)?;
    let ms = t.elapsed().as_secs_f64() * 1e3;
    crate::runtime::record_build(crate::runtime::BuildKind::KernelCompile, label, t);
    add_us(&state().compile_us, t);
    state().compiled.fetch_add(1, Ordering::Relaxed);
    let entry = CachedImage {
        kind,
        symbol: image.symbol,
        image: image.bytes,
    };
    if let Some(cache) = disk {
        if let Err(e) = cache.store(key, label, &entry) {
            if !crate::engine().first_warning("kernel cache not writable") {
                tracing::debug!(dir = %cache.dir().display(), reason = %e, "could not write the kernel cache");
            } else {
                tracing::warn!(
                    dir = %cache.dir().display(),
                    reason = %e,
                    "could not write the kernel cache (kernels still load; set {} to move or disable it)",
                    cache::KERNEL_CACHE_ENV
                );
            }
        }
    }
    let s = compile_stats();
    tracing::debug!(
        kernel = label,
        source = source.name,
        arch = %b.arch,
        ms = format_args!("{ms:.1}"),
        compiled = s.compiled,
        disk_hits = s.disk_hits,
        compile_ms_total = format_args!("{:.1}", s.compile_ms),
        "compiled kernel"
    );
    Ok((entry, true))
}

/// Compiles (or reads from the disk cache) and loads one unit; returns the module, the
/// symbol of the unit's kernel and whether NVRTC ran (see [`image_for`]). A cached image the
/// driver rejects is compiled again.
fn build_module(
    dev: &Device,
    source: KernelSource,
    kernel: Option<&'static str>,
    before_compile: &mut dyn FnMut(),
) -> Result<(Arc<CudaModule>, String, bool)> {
    let b = build_for(dev)?;
    let disk = disk_cache();
    let (entry, compiled) = image_for(&b, disk, source, kernel, false, before_compile)?;
    let t = Instant::now();
    match load_image(dev, entry.kind, entry.image) {
        Ok(module) => {
            add_us(&state().load_us, t);
            Ok((module, entry.symbol, compiled))
        }
        Err(e) if !compiled => {
            tracing::warn!(
                kernel = kernel.unwrap_or(source.name),
                reason = %e,
                "the driver rejected a cached kernel image; compiling it again"
            );
            let (entry, _) = image_for(&b, disk, source, kernel, true, before_compile)?;
            let module = load_image(dev, entry.kind, entry.image)?;
            Ok((module, entry.symbol, true))
        }
        Err(e) => Err(e),
    }
}

fn slot(key: Key) -> Slot {
    loaded()
        .slots
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .entry(key)
        .or_default()
        .clone()
}

/// The kernel `name` of `source` on device `dev` when it is already loaded (no build).
pub(crate) fn ready(dev: usize, source: KernelSource, name: &'static str) -> Option<CudaFunction> {
    loaded()
        .functions
        .read()
        .unwrap_or_else(|e| e.into_inner())
        .get(&(dev, source.name, name))
        .cloned()
}

/// Loads `name` from an already loaded unit, or builds the unit (holding its slot lock, see
/// [`build_module`] for `before_compile`); `Ok(None)` when `wait` is false and another thread
/// holds the slot. The `bool` says whether NVRTC ran.
fn load_locked(
    dev: &Device,
    source: KernelSource,
    name: &'static str,
    wait: bool,
    before_compile: &mut dyn FnMut(),
) -> Result<Option<(CudaFunction, bool)>> {
    let per_kernel = compile::per_kernel(source);
    let unit = if per_kernel { name } else { WHOLE };
    let slot = slot((dev.ordinal(), source.name, unit));
    let mut guard = if wait {
        slot.lock().unwrap_or_else(|e| e.into_inner())
    } else {
        match slot.try_lock() {
            Ok(g) => g,
            Err(std::sync::TryLockError::Poisoned(e)) => e.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => return Ok(None),
        }
    };
    let mut compiled = false;
    if guard.is_none() {
        let (module, symbol, c) = build_module(dev, source, per_kernel.then_some(name), before_compile)?;
        *guard = Some((module, symbol));
        compiled = c;
    }
    let Some((module, symbol)) = guard.as_ref() else {
        return Err(Error::Cuda {
            op: "loading a kernel",
            message: format!("{name} of {} has no module", source.name),
        });
    };
    let symbol = if per_kernel { symbol.as_str() } else { name };
    let f = module.load_function(symbol).map_err(|e| Error::Cuda {
        op: "cuModuleGetFunction (kernel)",
        message: format!("{name} ({symbol}) of {}: {e}", source.name),
    })?;
    drop(guard);
    loaded()
        .functions
        .write()
        .unwrap_or_else(|e| e.into_inner())
        .insert((dev.ordinal(), source.name, name), f.clone());
    Ok(Some((f, compiled)))
}

/// Threads for parallel compiles: the CPU cores, at most 16.
pub(crate) fn parallelism() -> usize {
    *state()
        .parallelism
        .get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get()).clamp(1, 16))
}

/// Loads `function` from `source` on `dev`: from memory, else the disk cache, else NVRTC.
pub(crate) fn function(dev: &Device, source: KernelSource, function: &'static str) -> Result<CudaFunction> {
    if let Some(f) = ready(dev.ordinal(), source, function) {
        return Ok(f);
    }
    // A miss: build this kernel. If that means compiling, the kernels that usually run beside
    // it start compiling at the same time on the other cores, on detached threads: the caller
    // waits for its own kernel only. Those threads never wait for a kernel another thread is
    // building, so no two builders can wait on each other.
    let waited = Instant::now();
    let ordinal = dev.ordinal();
    let mut spawn_siblings = || {
        let todo: Arc<Vec<(KernelSource, &'static str)>> = Arc::new(
            super::warm::siblings(source, function)
                .filter(|(s2, n2)| ready(ordinal, *s2, n2).is_none())
                .collect(),
        );
        let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        for _ in 0..todo.len().min(parallelism() - 1) {
            let (todo, next) = (todo.clone(), next.clone());
            let job = BackgroundJob::start();
            let spawned = std::thread::Builder::new()
                .name("cudnn-backend-sibling".into())
                .spawn(move || {
                    let _job = job;
                    let Ok(dev) = Device::new(ordinal) else { return };
                    while let Some(&(s2, n2)) = todo.get(next.fetch_add(1, Ordering::Relaxed)) {
                        let _permit = BackgroundPermit::acquire(true);
                        let Some(_slot) = background_slot() else { return };
                        match load_locked(&dev, s2, n2, false, &mut || {}) {
                            Ok(Some((_, true))) => {
                                state().prefetched.fetch_add(1, Ordering::Relaxed);
                            }
                            Ok(_) => {}
                            Err(e) => tracing::debug!(kernel = n2, reason = %e, "prefetching a kernel failed"),
                        }
                    }
                });
            if spawned.is_err() {
                break; // no more threads: the remaining siblings load when asked for
            }
        }
    };
    let built = load_locked(dev, source, function, true, &mut spawn_siblings);
    crate::runtime::record_build(crate::runtime::BuildKind::KernelWait, function, waited);
    match built {
        Ok(Some((f, _))) => Ok(f),
        Err(e) => Err(e),
        Ok(None) => Err(Error::Cuda {
            op: "loading a kernel",
            message: format!("{function} of {} was not built", source.name),
        }),
    }
}

/// A background kernel load (NVRTC compile, module load, disk-cache write) counted as a
/// compile in flight for its whole duration, so a process that begins to exit waits for it
/// instead of tearing NVRTC and the CUDA driver down under its module load; `None` once the
/// process is exiting (the background work then stops).
fn background_slot() -> Option<crate::ffi::nvrtc::CompileSlot> {
    crate::ffi::nvrtc::CompileSlot::enter("a background kernel load").ok()
}

/// Kernels compiling at once on behalf of no waiting caller (warm-up, a group's siblings):
/// all cores but two, so the compile a caller waits for runs on a free core.
fn background_limit() -> usize {
    parallelism().saturating_sub(2).max(1)
}

/// Background kernel jobs (warm-up and sibling threads) not yet finished, and their signal.
fn background_jobs() -> &'static (Mutex<usize>, std::sync::Condvar) {
    state().jobs.get_or_init(Default::default)
}

/// One background kernel job, counted from before its thread is spawned until it ends (so a
/// waiter never misses a job whose thread has not started yet).
pub(crate) struct BackgroundJob(());

impl BackgroundJob {
    pub(crate) fn start() -> Self {
        *background_jobs().0.lock().unwrap_or_else(|e| e.into_inner()) += 1;
        Self(())
    }
}

impl Drop for BackgroundJob {
    fn drop(&mut self) {
        let (jobs, done) = background_jobs();
        *jobs.lock().unwrap_or_else(|e| e.into_inner()) -= 1;
        done.notify_all();
    }
}

/// Blocks until every background kernel compile (the warm-up, the siblings of a requested
/// kernel) has finished, so [`compile_stats`] and the disk cache hold all of them.
pub fn wait_for_background_compiles() {
    let (jobs, done) = background_jobs();
    let mut n = jobs.lock().unwrap_or_else(|e| e.into_inner());
    while *n > 0 {
        n = done.wait(n).unwrap_or_else(|e| e.into_inner());
    }
}

/// One background compile slot (see [`background_limit`]), held while it lives.
struct BackgroundPermit;

/// Background compile slots in use, and the siblings waiting for one.
#[derive(Default)]
struct Permits {
    in_use: usize,
    siblings_waiting: usize,
}

fn background_permits() -> &'static (Mutex<Permits>, std::sync::Condvar) {
    state().permits.get_or_init(Default::default)
}

impl BackgroundPermit {
    /// Waits for a free slot. Siblings of a kernel a program asked for go first: the
    /// warm-up's guesses wait while a sibling waits.
    fn acquire(sibling: bool) -> Self {
        let (permits, freed) = background_permits();
        let mut p = permits.lock().unwrap_or_else(|e| e.into_inner());
        if sibling {
            p.siblings_waiting += 1;
        }
        while p.in_use >= background_limit() || (!sibling && p.siblings_waiting > 0) {
            p = freed.wait(p).unwrap_or_else(|e| e.into_inner());
        }
        if sibling {
            p.siblings_waiting -= 1;
        }
        p.in_use += 1;
        Self
    }
}

impl Drop for BackgroundPermit {
    fn drop(&mut self) {
        let (permits, freed) = background_permits();
        permits.lock().unwrap_or_else(|e| e.into_inner()).in_use -= 1;
        freed.notify_all();
    }
}

/// Makes every kernel of `kernels` ready on `dev`, building the missing ones in parallel (up
/// to [`parallelism`] threads); returns the first error after all have been tried.
pub(crate) fn prefetch(dev: &Device, kernels: &[(KernelSource, &'static str)]) -> Result<()> {
    prefetch_with(dev, kernels, false)
}

/// [`prefetch`] for kernels no caller waits for yet: their compiles take background slots.
pub(crate) fn prefetch_in_background(dev: &Device, kernels: &[(KernelSource, &'static str)]) -> Result<()> {
    prefetch_with(dev, kernels, true)
}

fn prefetch_with(dev: &Device, kernels: &[(KernelSource, &'static str)], background: bool) -> Result<()> {
    let todo: Vec<(KernelSource, &'static str)> = kernels
        .iter()
        .copied()
        .filter(|(s, n)| ready(dev.ordinal(), *s, n).is_none())
        .collect();
    match todo.len() {
        0 => return Ok(()),
        1 if !background => return function(dev, todo[0].0, todo[0].1).map(|_| ()),
        _ => {}
    }
    let next = std::sync::atomic::AtomicUsize::new(0);
    let first_error: Mutex<Option<Error>> = Mutex::new(None);
    let work = || loop {
        let i = next.fetch_add(1, Ordering::Relaxed);
        let Some(&(src, name)) = todo.get(i) else { break };
        let _permit = background.then(|| BackgroundPermit::acquire(false));
        let _slot = match background.then(background_slot) {
            Some(None) => break, // the process is exiting
            slot => slot,
        };
        if let Err(e) = load_locked(dev, src, name, true, &mut || {}) {
            first_error.lock().unwrap_or_else(|e| e.into_inner()).get_or_insert(e);
        }
    };
    std::thread::scope(|s| {
        for _ in 1..parallelism().min(todo.len()) {
            if std::thread::Builder::new().spawn_scoped(s, work).is_err() {
                break;
            }
        }
        work(); // this thread works too (and alone when no thread could be spawned)
    });
    match first_error.into_inner().unwrap_or_else(|e| e.into_inner()) {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// Starts loading the kernels of a float32 training step (the f32, i64 and mask groups) on
/// a background thread, so that their compiles (on a fresh machine) overlap the program's
/// own start-up instead of stalling its first step one kernel at a time. Kernels already in
/// the disk cache load in microseconds. The caller honours
/// [`Config::warm_up`](crate::config::Config::warm_up).
#[doc(hidden)]
pub fn warm_up_in_background(dev: Arc<Device>) {
    // The small integer and mask groups first: every program needs them early (labels,
    // indices, masks), whatever its float dtype; then the two-byte moves (the first kernels
    // of an f16/bf16 program), the bias + activation kernels (a network's first layers),
    // then the f32 training kernels.
    use super::warm::{GROUPS, TWO_BYTE_MOVES};
    let kernels: Vec<(KernelSource, &'static str)> = [GROUPS[2], GROUPS[3], TWO_BYTE_MOVES, GROUPS[1], GROUPS[0]]
        .iter()
        .flat_map(|g| g.iter().copied())
        .collect();
    let job = BackgroundJob::start();
    let spawned = std::thread::Builder::new()
        .name("cudnn-backend-warm-up".into())
        .spawn(move || {
            let _job = job;
            if let Err(e) = prefetch_in_background(&dev, &kernels) {
                tracing::debug!(reason = %e, "kernel warm-up stopped");
            }
        });
    if let Err(e) = spawned {
        tracing::debug!(reason = %e, "no thread for the kernel warm-up");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn siblings_take_a_freed_compile_slot_before_the_warm_up() {
        let mut held: Vec<BackgroundPermit> = (0..background_limit())
            .map(|_| BackgroundPermit::acquire(false))
            .collect();
        let order = Arc::new(Mutex::new(Vec::new()));
        let waiting = |n: usize| {
            let deadline = Instant::now() + std::time::Duration::from_secs(10);
            while background_permits().0.lock().unwrap().siblings_waiting < n && Instant::now() < deadline {
                std::thread::yield_now();
            }
        };
        let take = |sibling: bool, order: Arc<Mutex<Vec<bool>>>| {
            std::thread::spawn(move || {
                let _p = BackgroundPermit::acquire(sibling);
                order.lock().unwrap().push(sibling);
                std::thread::sleep(std::time::Duration::from_millis(5));
            })
        };
        let warm = take(false, order.clone());
        std::thread::sleep(std::time::Duration::from_millis(20));
        let sibling = take(true, order.clone());
        waiting(1);
        // One slot frees: the sibling takes it; the warm-up gets it only after the sibling.
        drop(held.pop());
        sibling.join().unwrap();
        warm.join().unwrap();
        drop(held);
        assert_eq!(*order.lock().unwrap(), vec![true, false], "the sibling must go first");
        assert_eq!(background_permits().0.lock().unwrap().in_use, 0);
    }
}
