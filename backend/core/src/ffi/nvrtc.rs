//! NVRTC through our own function table (like cuDNN in [`super::api`]): a missing library or
//! symbol is an [`Error`], never a panic, and status codes are read as plain integers, so codes
//! newer than any bindings are reported rather than misread.

use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

use crate::error::{Error, Result};

type Status = c_int;
type Program = *mut c_void;

/// The NVRTC entry points the crate calls (all present since CUDA 11.2).
struct NvrtcApi {
    _lib: libloading::Library,
    version: unsafe extern "C" fn(*mut c_int, *mut c_int) -> Status,
    get_error_string: unsafe extern "C" fn(Status) -> *const c_char,
    num_supported_archs: unsafe extern "C" fn(*mut c_int) -> Status,
    supported_archs: unsafe extern "C" fn(*mut c_int) -> Status,
    #[allow(clippy::type_complexity)]
    create_program: unsafe extern "C" fn(
        *mut Program,
        *const c_char,
        *const c_char,
        c_int,
        *const *const c_char,
        *const *const c_char,
    ) -> Status,
    destroy_program: unsafe extern "C" fn(*mut Program) -> Status,
    add_name_expression: unsafe extern "C" fn(Program, *const c_char) -> Status,
    compile_program: unsafe extern "C" fn(Program, c_int, *const *const c_char) -> Status,
    get_lowered_name: unsafe extern "C" fn(Program, *const c_char, *mut *const c_char) -> Status,
    get_program_log_size: unsafe extern "C" fn(Program, *mut usize) -> Status,
    get_program_log: unsafe extern "C" fn(Program, *mut c_char) -> Status,
    get_cubin_size: unsafe extern "C" fn(Program, *mut usize) -> Status,
    get_cubin: unsafe extern "C" fn(Program, *mut c_char) -> Status,
    get_ptx_size: unsafe extern "C" fn(Program, *mut usize) -> Status,
    get_ptx: unsafe extern "C" fn(Program, *mut c_char) -> Status,
}

// SAFETY: the table holds plain function pointers into a library that stays loaded for the
// life of the process; NVRTC's API is thread safe for distinct programs, and a program is
// only ever used by the one thread that created it.
unsafe impl Send for NvrtcApi {}
// SAFETY: as above; the table is never mutated after loading.
unsafe impl Sync for NvrtcApi {}

static API: OnceLock<std::result::Result<NvrtcApi, &'static str>> = OnceLock::new();

macro_rules! sym {
    ($lib:expr, $name:literal) => {{
        // SAFETY: the symbol's Rust type matches the C prototype in nvrtc.h (nvrtcResult is a
        // C enum, i.e. an `int`; nvrtcProgram is a pointer).
        match unsafe { $lib.get(concat!($name, "\0").as_bytes()) } {
            Ok(s) => *s,
            Err(_) => return Err($name),
        }
    }};
}

/// The compiles in flight (their labels), and whether the process has begun to exit (then no
/// compile starts).
struct InFlight {
    labels: Vec<&'static str>,
    exiting: bool,
}

static COMPILES: Mutex<InFlight> = Mutex::new(InFlight {
    labels: Vec::new(),
    exiting: false,
});
static COMPILE_DONE: Condvar = Condvar::new();
/// The longest the process waits at exit for compiles in flight, over all the registrations
/// of the exit hook together.
const EXIT_WAIT: Duration = Duration::from_secs(30);
/// A wait at exit longer than this names what it waits for on stderr.
const EXIT_WAIT_NAMED_AFTER: Duration = Duration::from_secs(2);
/// When the first run of the exit hook began waiting.
static EXIT_STARTED: OnceLock<Instant> = OnceLock::new();

extern "C" {
    /// C's `atexit` (libc).
    fn atexit(callback: extern "C" fn()) -> std::ffi::c_int;
}

/// Runs at process exit, before the teardown of the libraries that background builds use:
/// kernel builds may still be compiling (NVRTC) and cuDNN plan builds may still be running
/// cuDNN's runtime compilation (its runtime-compiled engine library, NVRTC, the driver's PTX
/// JIT), and any of them torn down under a build crashes the process. Stops new compiles and
/// waits for those in flight. Exit handlers run newest first, and those libraries register
/// their teardown when they are loaded or first used (during a build), so the hook is
/// registered again after every build ([`CompileSlot`]'s drop): it is then newer than the
/// teardown of everything a finished build loaded.
extern "C" fn wait_for_compiles_at_exit() {
    // Nothing may unwind out of a C callback.
    let _ = std::panic::catch_unwind(|| {
        // One deadline for every registration: a build that never ends delays the exit by
        // EXIT_WAIT once, not once per registered hook.
        let started = *EXIT_STARTED.get_or_init(Instant::now);
        let mut state = COMPILES.lock().unwrap_or_else(|e| e.into_inner());
        state.exiting = true;
        // Each message once, whichever registration of the hook reaches it.
        static NAMED: AtomicBool = AtomicBool::new(false);
        static GAVE_UP: AtomicBool = AtomicBool::new(false);
        while !state.labels.is_empty() {
            let waited = started.elapsed();
            if waited >= EXIT_WAIT {
                if !GAVE_UP.swap(true, Ordering::Relaxed) {
                    eprintln!(
                        "cudnn-backend: exiting after {}s with builds still in flight: {}",
                        EXIT_WAIT.as_secs(),
                        state.labels.join(", ")
                    );
                }
                break;
            }
            let named = waited >= EXIT_WAIT_NAMED_AFTER;
            if named && !NAMED.swap(true, Ordering::Relaxed) {
                eprintln!(
                    "cudnn-backend: the process waits (up to {}s) at exit for builds in flight: {}",
                    EXIT_WAIT.as_secs(),
                    state.labels.join(", ")
                );
            }
            let step = if named { EXIT_WAIT } else { EXIT_WAIT_NAMED_AFTER };
            let left = step.saturating_sub(waited).max(Duration::from_millis(1));
            state = COMPILE_DONE
                .wait_timeout(state, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    });
}

/// One compile in flight (counted for the exit hook) while it lives: an NVRTC compile, a
/// background kernel load (compile and module load), or a cuDNN plan build on a background
/// thread (cuDNN's runtime compilation runs NVRTC too).
pub(crate) struct CompileSlot {
    label: &'static str,
}

impl CompileSlot {
    /// Counts a compile in flight; an error once the process has begun to exit.
    pub(crate) fn enter(label: &'static str) -> Result<Self> {
        let mut state = COMPILES.lock().unwrap_or_else(|e| e.into_inner());
        if state.exiting {
            return Err(Error::Cuda {
                op: "compiling a kernel",
                message: format!("{label}: the process is exiting"),
            });
        }
        state.labels.push(label);
        Ok(Self { label })
    }
}

/// Runs [`wait_for_compiles_at_exit`] from a thread-local destructor of the process's main
/// thread. The C library runs the exiting thread's thread-local destructors first when the
/// process exits (`main` returning, or `exit`), before every `atexit` handler, so this wait
/// also precedes the teardown of a library that a build still in flight loaded after the
/// last registration of the `atexit` hook (a cuDNN sub-library or the driver's JIT compiler
/// loaded during a background plan build: its teardown registers when it loads, and the hook
/// registers again only after that build).
struct MainThreadExitWait;

impl Drop for MainThreadExitWait {
    fn drop(&mut self) {
        wait_for_compiles_at_exit();
    }
}

thread_local! {
    static MAIN_THREAD_EXIT_WAIT: MainThreadExitWait = const { MainThreadExitWait };
}

/// Arms [`MainThreadExitWait`] when called on the main thread (the thread Rust names
/// `main`); on any other thread its destructor would run when that thread ends, not at exit.
pub(crate) fn arm_main_thread_exit_wait() {
    if std::thread::current().name() == Some("main") {
        let _ = MAIN_THREAD_EXIT_WAIT.try_with(|_| {});
    }
}

/// Registers [`wait_for_compiles_at_exit`] (again). Each registration is one more exit
/// handler; every one but the first to run finds nothing in flight and returns at once.
/// Also called by a build right after a library call that may have loaded a library.
pub(crate) fn register_exit_hook() {
    arm_main_thread_exit_wait();
    // SAFETY: `atexit` stores a pointer to a plain `extern "C"` function that lives for the
    // whole process and catches every panic.
    if unsafe { atexit(wait_for_compiles_at_exit) } != 0 {
        tracing::debug!("could not register the NVRTC exit hook; a build in flight at exit may crash");
    }
}

/// Compiles a trivial program once, before the process's first real compile, then registers
/// the exit hook: NVRTC registers the teardown of the state it builds lazily during its first
/// compile, so after this the hook runs before that teardown, even when the process exits
/// while its first real (background) compiles are still running.
fn prime(api: &NvrtcApi) {
    static PRIMED: OnceLock<()> = OnceLock::new();
    PRIMED.get_or_init(|| {
        const SRC: &str = "extern \"C\" __global__ void cudnn_backend_prime() {}";
        if let Err(e) = compile_with(api, SRC, "nvrtc warm-up", &[], &[], Output::Ptx) {
            tracing::debug!(reason = %e, "the NVRTC warm-up compile failed");
        }
        register_exit_hook();
    });
}

impl Drop for CompileSlot {
    fn drop(&mut self) {
        register_exit_hook();
        let mut state = COMPILES.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(i) = state.labels.iter().position(|&l| l == self.label) {
            state.labels.swap_remove(i);
        }
        COMPILE_DONE.notify_all();
    }
}

fn load(name: &str) -> std::result::Result<NvrtcApi, &'static str> {
    // SAFETY: loading libnvrtc runs its initialisers, which have no preconditions.
    let lib = unsafe { libloading::Library::new(name) }.map_err(|_| "the library itself")?;
    Ok(NvrtcApi {
        version: sym!(lib, "nvrtcVersion"),
        get_error_string: sym!(lib, "nvrtcGetErrorString"),
        num_supported_archs: sym!(lib, "nvrtcGetNumSupportedArchs"),
        supported_archs: sym!(lib, "nvrtcGetSupportedArchs"),
        create_program: sym!(lib, "nvrtcCreateProgram"),
        destroy_program: sym!(lib, "nvrtcDestroyProgram"),
        add_name_expression: sym!(lib, "nvrtcAddNameExpression"),
        compile_program: sym!(lib, "nvrtcCompileProgram"),
        get_lowered_name: sym!(lib, "nvrtcGetLoweredName"),
        get_program_log_size: sym!(lib, "nvrtcGetProgramLogSize"),
        get_program_log: sym!(lib, "nvrtcGetProgramLog"),
        get_cubin_size: sym!(lib, "nvrtcGetCUBINSize"),
        get_cubin: sym!(lib, "nvrtcGetCUBIN"),
        get_ptx_size: sym!(lib, "nvrtcGetPTXSize"),
        get_ptx: sym!(lib, "nvrtcGetPTX"),
        _lib: lib,
    })
}

fn api() -> Result<&'static NvrtcApi> {
    let name = super::check_nvrtc()?;
    match API.get_or_init(|| load(&name)) {
        Ok(api) => Ok(api),
        Err(symbol) => Err(Error::MissingSymbol {
            library: "libnvrtc",
            symbol,
            hint: "the loaded libnvrtc is older than CUDA 11.2 or incomplete; install a CUDA 12/13 NVRTC",
        }),
    }
}

impl NvrtcApi {
    fn status_name(&self, status: Status) -> String {
        // SAFETY: nvrtcGetErrorString returns a static NUL-terminated string (or null) for any code.
        let p = unsafe { (self.get_error_string)(status) };
        if p.is_null() {
            return format!("NVRTC status {status}");
        }
        // SAFETY: non-null pointer to a static C string owned by NVRTC.
        let name = unsafe { CStr::from_ptr(p) }.to_string_lossy();
        format!("{name} ({status})")
    }

    fn check(&self, status: Status, call: &str, label: &'static str) -> Result<()> {
        if status == 0 {
            return Ok(());
        }
        Err(Error::Nvrtc {
            kernel: label,
            log: format!("{call} returned {}", self.status_name(status)),
        })
    }
}

/// The loaded NVRTC's version `(major, minor)`.
pub(crate) fn version() -> Result<(i32, i32)> {
    let api = api()?;
    let (mut major, mut minor) = (0, 0);
    // SAFETY: both pointers are valid for one `int` write each.
    let status = unsafe { (api.version)(&mut major, &mut minor) };
    api.check(status, "nvrtcVersion", "libnvrtc")?;
    Ok((major, minor))
}

/// The real architectures the loaded NVRTC can compile for, as `10 * major + minor`
/// (e.g. `[75, 80, ..., 120]`).
pub(crate) fn supported_archs() -> Result<Vec<i32>> {
    let api = api()?;
    let mut n: c_int = 0;
    // SAFETY: `n` is valid for one `int` write.
    let status = unsafe { (api.num_supported_archs)(&mut n) };
    api.check(status, "nvrtcGetNumSupportedArchs", "libnvrtc")?;
    let mut archs = vec![0 as c_int; n.max(0) as usize];
    if !archs.is_empty() {
        // SAFETY: the buffer holds exactly the `n` ints NVRTC reported it will write.
        let status = unsafe { (api.supported_archs)(archs.as_mut_ptr()) };
        api.check(status, "nvrtcGetSupportedArchs", "libnvrtc")?;
    }
    Ok(archs)
}

/// What [`compile`] produces.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Output {
    /// Device code for one real architecture (`--gpu-architecture=sm_XY`).
    Cubin,
    /// PTX (`--gpu-architecture=compute_XY`), JIT-compiled by the driver at load.
    Ptx,
}

/// A compiled program.
#[derive(Debug)]
pub(crate) struct Compiled {
    /// The CUBIN, or the PTX text without its trailing NUL.
    pub image: Vec<u8>,
    /// The lowered (mangled) symbol of each name expression, in order.
    pub lowered: Vec<String>,
}

/// An NVRTC program, destroyed on drop.
struct ProgramGuard<'a> {
    api: &'a NvrtcApi,
    prog: Program,
}

impl Drop for ProgramGuard<'_> {
    fn drop(&mut self) {
        // SAFETY: `prog` was created by nvrtcCreateProgram and is destroyed exactly once, here;
        // a failure (which NVRTC reports only for an invalid program) is ignored.
        let _ = unsafe { (self.api.destroy_program)(&mut self.prog) };
    }
}

impl ProgramGuard<'_> {
    fn log(&self) -> String {
        let mut size = 0usize;
        // SAFETY: `prog` is live; `size` is valid for one write.
        if unsafe { (self.api.get_program_log_size)(self.prog, &mut size) } != 0 || size == 0 {
            return String::new();
        }
        let mut buf = vec![0 as c_char; size];
        // SAFETY: the buffer holds the `size` bytes NVRTC reported (log plus its NUL).
        if unsafe { (self.api.get_program_log)(self.prog, buf.as_mut_ptr()) } != 0 {
            return String::new();
        }
        let bytes: Vec<u8> = buf.iter().take_while(|&&c| c != 0).map(|&c| c as u8).collect();
        String::from_utf8_lossy(&bytes).trim_end().to_string()
    }
}

fn cstring(s: &str, what: &str, label: &'static str) -> Result<CString> {
    CString::new(s).map_err(|_| Error::Nvrtc {
        kernel: label,
        log: format!("{what} contains a NUL byte"),
    })
}

/// Compiles `src` (one self-contained CUDA C++ translation unit) with `options`, after
/// registering each of `name_expressions` (e.g. `"binary_f32<0>"`) so that only those
/// templates are instantiated and their lowered names can be read back. `label` names the
/// source in errors (and the program in NVRTC's messages).
pub(crate) fn compile(
    src: &str,
    label: &'static str,
    name_expressions: &[String],
    options: &[String],
    output: Output,
) -> Result<Compiled> {
    let api = api()?;
    prime(api);
    let _slot = CompileSlot::enter(label)?;
    compile_with(api, src, label, name_expressions, options, output)
}

/// [`compile`] without the exit-hook bookkeeping.
fn compile_with(
    api: &NvrtcApi,
    src: &str,
    label: &'static str,
    name_expressions: &[String],
    options: &[String],
    output: Output,
) -> Result<Compiled> {
    let c_src = cstring(src, "the source", label)?;
    let c_name = cstring(label, "the program name", label)?;
    let c_exprs = name_expressions
        .iter()
        .map(|e| cstring(e, "a name expression", label))
        .collect::<Result<Vec<_>>>()?;
    let c_opts = options
        .iter()
        .map(|o| cstring(o, "an option", label))
        .collect::<Result<Vec<_>>>()?;
    let opt_ptrs: Vec<*const c_char> = c_opts.iter().map(|o| o.as_ptr()).collect();

    let mut prog: Program = std::ptr::null_mut();
    // SAFETY: `prog` is valid for one write; source and name are NUL-terminated and outlive
    // the program (they live until this function returns, after the guard destroys it); no
    // headers are passed (count 0, null arrays).
    let status = unsafe {
        (api.create_program)(
            &mut prog,
            c_src.as_ptr(),
            c_name.as_ptr(),
            0,
            std::ptr::null(),
            std::ptr::null(),
        )
    };
    api.check(status, "nvrtcCreateProgram", label)?;
    let guard = ProgramGuard { api, prog };
    for e in &c_exprs {
        // SAFETY: the program is live and `e` is a NUL-terminated string NVRTC copies.
        let status = unsafe { (api.add_name_expression)(guard.prog, e.as_ptr()) };
        api.check(status, "nvrtcAddNameExpression", label)?;
    }
    // SAFETY: the program is live; `opt_ptrs` holds `len` pointers to NUL-terminated strings
    // that outlive the call.
    let status = unsafe { (api.compile_program)(guard.prog, opt_ptrs.len() as c_int, opt_ptrs.as_ptr()) };
    if status != 0 {
        return Err(Error::Nvrtc {
            kernel: label,
            log: format!(
                "nvrtcCompileProgram returned {} for {:?} with options {:?}:\n{}",
                api.status_name(status),
                name_expressions,
                options,
                guard.log()
            ),
        });
    }

    let mut lowered = Vec::with_capacity(c_exprs.len());
    for e in &c_exprs {
        let mut p: *const c_char = std::ptr::null();
        // SAFETY: the program is live and compiled, `e` was registered before compiling, and
        // `p` is valid for one pointer write.
        let status = unsafe { (api.get_lowered_name)(guard.prog, e.as_ptr(), &mut p) };
        api.check(status, "nvrtcGetLoweredName", label)?;
        if p.is_null() {
            return Err(Error::Nvrtc {
                kernel: label,
                log: format!("nvrtcGetLoweredName gave no name for {e:?}"),
            });
        }
        // SAFETY: NVRTC returns a NUL-terminated string owned by the (still live) program;
        // it is copied before the program is destroyed.
        lowered.push(unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned());
    }

    let (get_size, get, call) = match output {
        Output::Cubin => (api.get_cubin_size, api.get_cubin, "nvrtcGetCUBIN"),
        Output::Ptx => (api.get_ptx_size, api.get_ptx, "nvrtcGetPTX"),
    };
    let mut size = 0usize;
    // SAFETY: the program is live and compiled; `size` is valid for one write.
    let status = unsafe { get_size(guard.prog, &mut size) };
    api.check(status, call, label)?;
    let mut image = vec![0u8; size];
    if size > 0 {
        // SAFETY: the buffer holds the `size` bytes NVRTC reported it will write.
        let status = unsafe { get(guard.prog, image.as_mut_ptr().cast()) };
        api.check(status, call, label)?;
    }
    if output == Output::Ptx {
        while image.last() == Some(&0) {
            image.pop();
        }
    }
    if image.is_empty() {
        return Err(Error::Nvrtc {
            kernel: label,
            log: format!("{call} returned an empty image (options {options:?})"),
        });
    }
    drop(guard);
    Ok(Compiled { image, lowered })
}

#[cfg(test)]
mod exit_tests {
    use super::*;

    /// The child half of [`the_main_threads_exit_waits_for_a_build_in_flight`]: a thread named
    /// `main` arms the wait, a build holds a slot for 300 ms and then writes the marker file,
    /// and the `main` thread exits the process at once.
    fn exit_during_a_build(marker: std::path::PathBuf) -> ! {
        let main = std::thread::Builder::new().name("main".into()).spawn(move || {
            arm_main_thread_exit_wait();
            let (entered, wait) = std::sync::mpsc::channel();
            std::thread::spawn(move || {
                let _slot = CompileSlot::enter("a test build").expect("not exiting yet");
                entered.send(()).expect("the main thread waits");
                std::thread::sleep(Duration::from_millis(300));
                std::fs::write(&marker, b"done").expect("writing the marker");
            });
            wait.recv().expect("the build started");
            std::process::exit(0)
        });
        let _ = main.expect("a thread").join();
        std::process::exit(3)
    }

    #[test]
    fn the_main_threads_exit_waits_for_a_build_in_flight() {
        use crate::config::test_vars::{var_os, EXIT_MARKER_ENV as CHILD};
        if let Some(marker) = var_os(CHILD) {
            exit_during_a_build(marker.into());
        }
        let marker = std::env::temp_dir().join(format!("cudnn-backend-exit-{}", std::process::id()));
        let _ = std::fs::remove_file(&marker);
        let status = std::process::Command::new(std::env::current_exe().expect("the test binary"))
            .args([
                "--exact",
                "ffi::nvrtc::exit_tests::the_main_threads_exit_waits_for_a_build_in_flight",
            ])
            .env(CHILD, &marker)
            .stdout(std::process::Stdio::null())
            .status()
            .expect("running the child");
        let written = std::fs::read(&marker).ok();
        let _ = std::fs::remove_file(&marker);
        assert_eq!(status.code(), Some(0));
        assert_eq!(
            written.as_deref(),
            Some(&b"done"[..]),
            "the process exited before the build ended"
        );
    }
}
