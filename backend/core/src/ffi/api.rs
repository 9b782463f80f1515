//! Loads libcudnn and resolves the entry points the crate uses.

use std::ffi::{c_char, c_void, CStr};
use std::sync::OnceLock;

use crate::error::{CudnnStatus, Error, Result};

pub use crate::config::CUDNN_LIB_ENV;

/// File names handed to the dynamic loader, in order, when [`CUDNN_LIB_ENV`] is unset.
pub const CUDNN_LIB_NAMES: &[&str] = &["libcudnn.so.9", "libcudnn.so", "cudnn64_9.dll"];

type Status = u32;
type Raw = *mut c_void;

/// The cuDNN entry points the crate calls. Enum arguments are passed as `u32`
/// (cuDNN's enums are C `int`-sized).
pub(crate) struct CudnnApi {
    _lib: libloading::Library,
    pub path: String,
    pub version: usize,
    pub get_error_string: unsafe extern "C" fn(Status) -> *const c_char,
    pub get_last_error_string: Option<unsafe extern "C" fn(*mut c_char, usize)>,
    pub create: unsafe extern "C" fn(*mut Raw) -> Status,
    pub set_stream: unsafe extern "C" fn(Raw, Raw) -> Status,
    pub backend_create: unsafe extern "C" fn(u32, *mut Raw) -> Status,
    pub backend_destroy: unsafe extern "C" fn(Raw) -> Status,
    pub backend_set: unsafe extern "C" fn(Raw, u32, u32, i64, *const c_void) -> Status,
    pub backend_get: unsafe extern "C" fn(Raw, u32, u32, i64, *mut i64, *mut c_void) -> Status,
    pub backend_finalize: unsafe extern "C" fn(Raw) -> Status,
    pub backend_execute: unsafe extern "C" fn(Raw, Raw, Raw) -> Status,
    pub create_tensor_desc: unsafe extern "C" fn(*mut Raw) -> Status,
    pub set_tensor_nd: unsafe extern "C" fn(Raw, u32, i32, *const i32, *const i32) -> Status,
    pub destroy_tensor_desc: unsafe extern "C" fn(Raw) -> Status,
    pub create_pooling_desc: unsafe extern "C" fn(*mut Raw) -> Status,
    pub set_pooling_nd: unsafe extern "C" fn(Raw, u32, u32, i32, *const i32, *const i32, *const i32) -> Status,
    pub destroy_pooling_desc: unsafe extern "C" fn(Raw) -> Status,
    #[allow(clippy::type_complexity)]
    pub pooling_forward:
        unsafe extern "C" fn(Raw, Raw, *const c_void, Raw, *const c_void, *const c_void, Raw, *mut c_void) -> Status,
    #[allow(clippy::type_complexity)]
    pub pooling_backward: unsafe extern "C" fn(
        Raw,
        Raw,
        *const c_void,
        Raw,
        *const c_void,
        Raw,
        *const c_void,
        Raw,
        *const c_void,
        *const c_void,
        Raw,
        *mut c_void,
    ) -> Status,
}

// SAFETY: the table holds plain function pointers into a library that stays loaded for
// the life of the process; calling them from any thread is allowed by cuDNN.
unsafe impl Send for CudnnApi {}
// SAFETY: as above; the table is never mutated after loading.
unsafe impl Sync for CudnnApi {}

enum LoadFailure {
    NotFound(Vec<String>),
    Symbol(&'static str),
    TooOld(usize),
}

static API: OnceLock<std::result::Result<CudnnApi, LoadFailure>> = OnceLock::new();

/// The library names tried, in order: [`CUDNN_LIB_ENV`]'s path when set, then
/// [`CUDNN_LIB_NAMES`].
fn candidates() -> Vec<String> {
    let named = crate::config::config().cudnn_lib.iter().cloned();
    named.chain(CUDNN_LIB_NAMES.iter().map(|s| s.to_string())).collect()
}

macro_rules! sym {
    ($lib:expr, $name:literal) => {{
        // SAFETY: the symbol's Rust type matches the C prototype in cudnn.h (enums as u32).
        match unsafe { $lib.get(concat!($name, "\0").as_bytes()) } {
            Ok(s) => *s,
            Err(_) => return Err(LoadFailure::Symbol($name)),
        }
    }};
}

fn load() -> std::result::Result<CudnnApi, LoadFailure> {
    let names = candidates();
    let Some((lib, path)) = super::open_first(&names) else {
        return Err(LoadFailure::NotFound(names));
    };
    let get_version: unsafe extern "C" fn() -> usize = sym!(lib, "cudnnGetVersion");
    // SAFETY: cudnnGetVersion takes no arguments and only returns a number.
    let version = unsafe { get_version() };
    if version < 90000 {
        return Err(LoadFailure::TooOld(version));
    }
    // SAFETY: an optional symbol, typed as in cudnn_graph.h (cuDNN >= 9.0).
    let get_last_error_string = unsafe { lib.get(b"cudnnGetLastErrorString\0") }
        .ok()
        .map(|s: libloading::Symbol<unsafe extern "C" fn(*mut c_char, usize)>| *s);
    Ok(CudnnApi {
        path,
        version,
        get_error_string: sym!(lib, "cudnnGetErrorString"),
        get_last_error_string,
        create: sym!(lib, "cudnnCreate"),
        set_stream: sym!(lib, "cudnnSetStream"),
        backend_create: sym!(lib, "cudnnBackendCreateDescriptor"),
        backend_destroy: sym!(lib, "cudnnBackendDestroyDescriptor"),
        backend_set: sym!(lib, "cudnnBackendSetAttribute"),
        backend_get: sym!(lib, "cudnnBackendGetAttribute"),
        backend_finalize: sym!(lib, "cudnnBackendFinalize"),
        backend_execute: sym!(lib, "cudnnBackendExecute"),
        create_tensor_desc: sym!(lib, "cudnnCreateTensorDescriptor"),
        set_tensor_nd: sym!(lib, "cudnnSetTensorNdDescriptor"),
        destroy_tensor_desc: sym!(lib, "cudnnDestroyTensorDescriptor"),
        create_pooling_desc: sym!(lib, "cudnnCreatePoolingDescriptor"),
        set_pooling_nd: sym!(lib, "cudnnSetPoolingNdDescriptor"),
        destroy_pooling_desc: sym!(lib, "cudnnDestroyPoolingDescriptor"),
        pooling_forward: sym!(lib, "cudnnPoolingForward"),
        pooling_backward: sym!(lib, "cudnnPoolingBackward"),
        _lib: lib,
    })
}

/// The loaded cuDNN, or an error saying what was searched and what to do.
pub(crate) fn api() -> Result<&'static CudnnApi> {
    match API.get_or_init(load) {
        Ok(api) => Ok(api),
        Err(LoadFailure::NotFound(searched)) => Err(Error::LibraryNotFound {
            library: "libcudnn (cuDNN 9)",
            searched: searched.clone(),
            hint: "install cuDNN 9 (e.g. the Debian/Ubuntu package libcudnn9-cuda-13 or the \
                   PyPI wheel nvidia-cudnn-cu13) and add its lib directory to LD_LIBRARY_PATH, \
                   or set CUDNN_BACKEND_CUDNN_LIB to the full path of libcudnn.so.9",
        }),
        Err(LoadFailure::Symbol(symbol)) => Err(Error::MissingSymbol {
            library: "libcudnn",
            symbol,
            hint: "the loaded libcudnn is not a complete cuDNN 9 install; reinstall cuDNN 9",
        }),
        Err(LoadFailure::TooOld(v)) => Err(Error::LibraryNotFound {
            library: "libcudnn (cuDNN 9)",
            searched: vec![format!("found version {v}, need >= 90000")],
            hint: "upgrade to cuDNN 9.x",
        }),
    }
}

/// The loaded cuDNN's version number (e.g. 91400 for 9.14.0).
pub(crate) fn cudnn_version() -> Result<usize> {
    api().map(|a| a.version)
}

impl CudnnApi {
    /// Turns a status into a `Result`, attaching cuDNN's own last error message.
    pub(crate) fn check(&self, status: Status, call: &'static str) -> Result<()> {
        if status == 0 {
            return Ok(());
        }
        Err(Error::Cudnn {
            call,
            status: CudnnStatus(status),
            message: self.last_error(status),
            context: String::new(),
        })
    }

    fn last_error(&self, status: Status) -> String {
        let mut buf = [0 as c_char; 512];
        if let Some(f) = self.get_last_error_string {
            // SAFETY: the buffer is writable for its full length, which we pass.
            unsafe { f(buf.as_mut_ptr(), buf.len()) };
            // SAFETY: cuDNN writes a NUL-terminated string within the buffer; the last byte
            // is forced to NUL in case it truncated without terminating.
            buf[buf.len() - 1] = 0;
            let msg = unsafe { CStr::from_ptr(buf.as_ptr()) }.to_string_lossy().into_owned();
            if !msg.is_empty() {
                return msg;
            }
        }
        // SAFETY: cudnnGetErrorString returns a static NUL-terminated string for any code.
        let p = unsafe { (self.get_error_string)(status) };
        if p.is_null() {
            return String::new();
        }
        // SAFETY: non-null pointer to a static C string owned by cuDNN.
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }
}

/// Whether the dynamic loader can load `name` (the library is unloaded again at once;
/// cudarc keeps its own handle when it loads the library later).
pub(crate) fn can_load(name: &str) -> bool {
    // SAFETY: loading a system library only runs its initialisers, which have no
    // preconditions; the handle is dropped immediately.
    unsafe { libloading::Library::new(name) }.is_ok()
}
