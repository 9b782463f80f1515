//! NCCL through our own function table (like cuDNN in [`super::api`]): loaded at run time on
//! first use, a missing library or symbol is an [`Error`] naming what was searched, and status
//! codes are read as plain integers so that codes newer than any bindings are still reported.
//! Enum values are `nccl.h`'s (see [`nccl_dtype`]); every call goes through this table.

use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::{Mutex, OnceLock};

use cudarc::driver::{CudaContext, CudaStream};

use crate::error::{Error, Result};
use crate::types::{row_major_strides, DataType, TensorMut, TensorRef};

type Status = c_int;
/// An opaque NCCL communicator (`ncclComm_t`).
pub(crate) type RawComm = *mut c_void;

pub use crate::config::NCCL_LIB_ENV;
/// File names tried after [`NCCL_LIB_ENV`], in order.
pub const NCCL_LIB_NAMES: &[&str] = &["libnccl.so.2", "libnccl.so"];

/// `ncclSuccess`.
pub(crate) const SUCCESS: Status = 0;
/// `ncclInProgress`: a non-blocking call has not finished yet.
pub(crate) const IN_PROGRESS: Status = 7;

/// The 128 opaque bytes of an `ncclUniqueId`.
pub(crate) const UNIQUE_ID_BYTES: usize = 128;

/// `ncclConfig_t` as NCCL 2.17 defines it. NCCL reads a config by its `size` and `version`
/// fields, so this oldest layout with the settings we use is accepted by every later release.
#[repr(C)]
struct ConfigV21700 {
    size: usize,
    magic: u32,
    version: u32,
    blocking: c_int,
    cga_cluster_size: c_int,
    min_ctas: c_int,
    max_ctas: c_int,
    net_name: *const c_char,
    split_share: c_int,
}

/// `NCCL_CONFIG_UNDEF_INT`: leave the setting to NCCL.
const CONFIG_UNDEF: c_int = c_int::MIN;

impl ConfigV21700 {
    /// `NCCL_CONFIG_INITIALIZER` with `blocking` set.
    fn new(blocking: bool) -> Self {
        Self {
            size: std::mem::size_of::<Self>(),
            magic: 0xcafe_beef,
            version: 21700,
            blocking: c_int::from(blocking),
            cga_cluster_size: CONFIG_UNDEF,
            min_ctas: CONFIG_UNDEF,
            max_ctas: CONFIG_UNDEF,
            net_name: std::ptr::null(),
            split_share: CONFIG_UNDEF,
        }
    }
}

/// `ncclUniqueId`: a C struct of 128 bytes, passed by value to `ncclCommInitRankConfig`.
#[repr(C)]
#[derive(Clone, Copy)]
struct UniqueIdRaw {
    internal: [u8; UNIQUE_ID_BYTES],
}

/// The NCCL entry points the crate calls (all present since NCCL 2.17).
struct NcclApi {
    path: String,
    version: c_int,
    _lib: libloading::Library,
    get_error_string: unsafe extern "C" fn(Status) -> *const c_char,
    get_last_error: unsafe extern "C" fn(RawComm) -> *const c_char,
    get_unique_id: unsafe extern "C" fn(*mut UniqueIdRaw) -> Status,
    comm_init_rank_config: unsafe extern "C" fn(*mut RawComm, c_int, UniqueIdRaw, c_int, *mut ConfigV21700) -> Status,
    comm_init_all: unsafe extern "C" fn(*mut RawComm, c_int, *const c_int) -> Status,
    comm_destroy: unsafe extern "C" fn(RawComm) -> Status,
    comm_abort: unsafe extern "C" fn(RawComm) -> Status,
    comm_get_async_error: unsafe extern "C" fn(RawComm, *mut Status) -> Status,
    group_start: unsafe extern "C" fn() -> Status,
    group_end: unsafe extern "C" fn() -> Status,
    #[allow(clippy::type_complexity)]
    all_reduce: unsafe extern "C" fn(*const c_void, *mut c_void, usize, c_int, c_int, RawComm, *mut c_void) -> Status,
    #[allow(clippy::type_complexity)]
    broadcast: unsafe extern "C" fn(*const c_void, *mut c_void, usize, c_int, c_int, RawComm, *mut c_void) -> Status,
    all_gather: unsafe extern "C" fn(*const c_void, *mut c_void, usize, c_int, RawComm, *mut c_void) -> Status,
}

// SAFETY: the table holds plain function pointers into a library that stays loaded for the
// life of the process; NCCL's API may be called from any thread (a communicator is used by
// one thread at a time, which `crate::collective` guarantees with a lock).
unsafe impl Send for NcclApi {}
// SAFETY: as above; the table is never mutated after loading.
unsafe impl Sync for NcclApi {}

enum LoadFailure {
    NotFound(Vec<String>),
    Symbol(&'static str),
    TooOld(c_int),
}

static API: OnceLock<std::result::Result<NcclApi, LoadFailure>> = OnceLock::new();

/// The library names tried, in order, given [`NCCL_LIB_ENV`]'s value `named`: only that
/// when it is set (a library the user names is never silently replaced by another), else
/// [`NCCL_LIB_NAMES`].
fn candidates(named: Option<&str>) -> Vec<String> {
    match named {
        Some(path) => vec![path.to_string()],
        None => NCCL_LIB_NAMES.iter().map(|s| s.to_string()).collect(),
    }
}

macro_rules! sym {
    ($lib:expr, $name:literal) => {{
        // SAFETY: the symbol's Rust type matches the C prototype in nccl.h (ncclResult_t,
        // ncclDataType_t and ncclRedOp_t are C enums, i.e. `int`; ncclComm_t and cudaStream_t
        // are pointers; ncclUniqueId is a 128-byte struct passed by value).
        match unsafe { $lib.get(concat!($name, "\0").as_bytes()) } {
            Ok(s) => *s,
            Err(_) => return Err(LoadFailure::Symbol($name)),
        }
    }};
}

/// NCCL 2.17: the first release with `ncclConfig_t` and `ncclGetLastError`.
const MIN_VERSION: c_int = 21700;

fn load() -> std::result::Result<NcclApi, LoadFailure> {
    let names = candidates(crate::config::config().nccl_lib.as_deref());
    let Some((lib, path)) = super::open_first(&names) else {
        return Err(LoadFailure::NotFound(names));
    };
    let get_version: unsafe extern "C" fn(*mut c_int) -> Status = sym!(lib, "ncclGetVersion");
    let mut version: c_int = 0;
    // SAFETY: `version` is valid for one `int` write.
    if unsafe { get_version(&mut version) } != SUCCESS || version < MIN_VERSION {
        return Err(LoadFailure::TooOld(version));
    }
    Ok(NcclApi {
        path,
        version,
        get_error_string: sym!(lib, "ncclGetErrorString"),
        get_last_error: sym!(lib, "ncclGetLastError"),
        get_unique_id: sym!(lib, "ncclGetUniqueId"),
        comm_init_rank_config: sym!(lib, "ncclCommInitRankConfig"),
        comm_init_all: sym!(lib, "ncclCommInitAll"),
        comm_destroy: sym!(lib, "ncclCommDestroy"),
        comm_abort: sym!(lib, "ncclCommAbort"),
        comm_get_async_error: sym!(lib, "ncclCommGetAsyncError"),
        group_start: sym!(lib, "ncclGroupStart"),
        group_end: sym!(lib, "ncclGroupEnd"),
        all_reduce: sym!(lib, "ncclAllReduce"),
        broadcast: sym!(lib, "ncclBroadcast"),
        all_gather: sym!(lib, "ncclAllGather"),
        _lib: lib,
    })
}

fn api() -> Result<&'static NcclApi> {
    match API.get_or_init(load) {
        Ok(api) => Ok(api),
        Err(LoadFailure::NotFound(searched)) => Err(Error::LibraryNotFound {
            library: "libnccl (NCCL 2)",
            searched: searched.clone(),
            hint: "install NCCL 2.17 or newer (the libnccl2 package, or pip's nvidia-nccl-cu12/cu13 with its lib \
                   folder on LD_LIBRARY_PATH) or set CUDNN_BACKEND_NCCL_LIB to the library's path",
        }),
        Err(LoadFailure::Symbol(symbol)) => Err(Error::MissingSymbol {
            library: "libnccl",
            symbol,
            hint: "the loaded libnccl is incomplete or older than NCCL 2.17; install NCCL 2.17 or newer",
        }),
        Err(LoadFailure::TooOld(v)) => Err(Error::MissingSymbol {
            library: "libnccl",
            symbol: "ncclConfig_t (NCCL 2.17)",
            hint: if *v == 0 {
                "ncclGetVersion failed; the library is not a working NCCL 2"
            } else {
                "the loaded libnccl is older than NCCL 2.17; install NCCL 2.17 or newer"
            },
        }),
    }
}

/// The loaded NCCL's version code (`major * 10000 + minor * 100 + patch`) and path.
pub(crate) fn version() -> Result<(i32, String)> {
    let api = api()?;
    Ok((api.version, api.path.clone()))
}

/// NCCL's name for a status code.
fn status_name(api: &NcclApi, status: Status) -> String {
    // SAFETY: ncclGetErrorString returns a static NUL-terminated string (or null) for any code.
    let p = unsafe { (api.get_error_string)(status) };
    if p.is_null() {
        return format!("NCCL status {status}");
    }
    // SAFETY: non-null pointer to a static C string owned by NCCL.
    format!("{} ({status})", unsafe { CStr::from_ptr(p) }.to_string_lossy())
}

/// NCCL's last error message (for `comm`, or the thread's last one when `comm` is null).
fn last_error(api: &NcclApi, comm: RawComm) -> String {
    // SAFETY: `comm` is null or a live communicator; the result is a NUL-terminated string NCCL
    // owns (or null).
    let p = unsafe { (api.get_last_error)(comm) };
    if p.is_null() {
        return String::new();
    }
    // SAFETY: non-null pointer to a C string owned by NCCL, read before any further NCCL call.
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

/// `Ok(status)` for success or `ncclInProgress`; an [`Error::Nccl`] otherwise.
fn check(api: &NcclApi, status: Status, call: &'static str, comm: RawComm) -> Result<Status> {
    match status {
        SUCCESS | IN_PROGRESS => Ok(status),
        _ => Err(Error::Nccl {
            call,
            status: status_name(api, status),
            message: last_error(api, comm),
        }),
    }
}

/// A new `ncclUniqueId` (rank 0 makes it; every rank of the communicator gets a copy).
pub(crate) fn unique_id() -> Result<[u8; UNIQUE_ID_BYTES]> {
    let api = api()?;
    let mut id = UniqueIdRaw {
        internal: [0; UNIQUE_ID_BYTES],
    };
    // SAFETY: `id` is valid for the 128-byte write of an ncclUniqueId.
    let status = unsafe { (api.get_unique_id)(&mut id) };
    check(api, status, "ncclGetUniqueId", std::ptr::null_mut())?;
    Ok(id.internal)
}

/// `ncclGroupStart`: the collectives that follow, up to [`group_end`], launch together.
pub(crate) fn group_start() -> Result<()> {
    let api = api()?;
    // SAFETY: no arguments; NCCL tracks group depth per thread.
    let status = unsafe { (api.group_start)() };
    check(api, status, "ncclGroupStart", std::ptr::null_mut()).map(drop)
}

/// `ncclGroupEnd`: launches the collectives issued since [`group_start`]; `Ok(IN_PROGRESS)`
/// while a non-blocking communicator is still enqueueing them.
pub(crate) fn group_end() -> Result<Status> {
    let api = api()?;
    // SAFETY: no arguments; pairs with the thread's earlier ncclGroupStart (an unpaired end is
    // reported by NCCL as an invalid usage).
    let status = unsafe { (api.group_end)() };
    check(api, status, "ncclGroupEnd", std::ptr::null_mut())
}

/// An NCCL communicator owned by this process: destroyed on drop, or aborted (pending work
/// stopped, kernels waiting on a dead peer released). Calls are serialised by a lock; once
/// aborted every call fails.
pub(crate) struct Comm {
    raw: Mutex<Option<RawComm>>,
}

// SAFETY: the raw communicator is only touched under the lock, and NCCL allows a
// communicator to be used from any thread one call at a time.
unsafe impl Send for Comm {}
// SAFETY: as above.
unsafe impl Sync for Comm {}

/// The reductions NCCL offers (`ncclRedOp_t` values).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RedOp {
    Sum = 0,
    Prod = 1,
    Max = 2,
    Min = 3,
    Avg = 4,
}

impl Comm {
    /// Joins rank `rank` of an `nranks` communicator with a non-blocking config: returns at
    /// once, with initialisation possibly still in progress ([`state`](Self::state) says
    /// when it is done). Binds `context` to the calling thread (NCCL uses the current device).
    pub(crate) fn init_rank(
        context: &CudaContext,
        nranks: usize,
        id: &[u8; UNIQUE_ID_BYTES],
        rank: usize,
    ) -> Result<Self> {
        let api = api()?;
        context.bind_to_thread().map_err(|e| Error::Cuda {
            op: "binding the device before ncclCommInitRankConfig",
            message: e.to_string(),
        })?;
        let mut comm: RawComm = std::ptr::null_mut();
        let mut config = ConfigV21700::new(false);
        let id = UniqueIdRaw { internal: *id };
        // SAFETY: `comm` and `config` are valid for the call; the id is passed by value; the
        // device's context is current on this thread.
        let status = unsafe { (api.comm_init_rank_config)(&mut comm, nranks as c_int, id, rank as c_int, &mut config) };
        if let Err(e) = check(api, status, "ncclCommInitRankConfig", comm) {
            if !comm.is_null() {
                // SAFETY: NCCL returned a communicator handle; abort frees it.
                unsafe { (api.comm_abort)(comm) };
            }
            return Err(e);
        }
        Ok(Self {
            raw: Mutex::new(Some(comm)),
        })
    }

    /// One blocking communicator per device ordinal, every rank in this process
    /// (`ncclCommInitAll`), in the order given.
    pub(crate) fn init_all(ordinals: &[usize]) -> Result<Vec<Self>> {
        let api = api()?;
        let devices: Vec<c_int> = ordinals.iter().map(|&o| o as c_int).collect();
        let mut comms: Vec<RawComm> = vec![std::ptr::null_mut(); devices.len()];
        // SAFETY: `comms` has room for one communicator per listed device; `devices` outlives the call.
        let status = unsafe { (api.comm_init_all)(comms.as_mut_ptr(), devices.len() as c_int, devices.as_ptr()) };
        check(api, status, "ncclCommInitAll", std::ptr::null_mut())?;
        Ok(comms
            .into_iter()
            .map(|raw| Self {
                raw: Mutex::new(Some(raw)),
            })
            .collect())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<RawComm>> {
        self.raw.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Runs `f` on the live communicator; an error once it was aborted.
    fn with_live<T>(&self, call: &'static str, f: impl FnOnce(&NcclApi, RawComm) -> Result<T>) -> Result<T> {
        let api = api()?;
        match *self.lock() {
            Some(raw) => f(api, raw),
            None => Err(Error::Nccl {
                call,
                status: "the communicator was aborted".into(),
                message: String::new(),
            }),
        }
    }

    /// The communicator's asynchronous state: `Ok(SUCCESS)`, `Ok(IN_PROGRESS)` (a
    /// non-blocking call still running) or the error a collective or peer raised.
    pub(crate) fn state(&self) -> Result<Status> {
        self.with_live("ncclCommGetAsyncError", |api, raw| {
            let mut state: Status = SUCCESS;
            // SAFETY: `raw` is live (held under the lock); `state` is valid for one write.
            let status = unsafe { (api.comm_get_async_error)(raw, &mut state) };
            check(api, status, "ncclCommGetAsyncError", raw)?;
            check(api, state, "a collective (asynchronous error)", raw)
        })
    }

    /// Aborts the communicator (`ncclCommAbort`); `false` when it already was.
    pub(crate) fn abort(&self) -> bool {
        let Ok(api) = api() else { return false };
        let Some(raw) = self.lock().take() else {
            return false;
        };
        // SAFETY: `raw` was live and is no longer reachable through `self`.
        let status = unsafe { (api.comm_abort)(raw) };
        if status != SUCCESS {
            tracing::warn!("ncclCommAbort returned {}", status_name(api, status));
        }
        true
    }

    /// Enqueues `ncclAllReduce` of `input` into `output` (packed, same dtype and count; the
    /// same memory for an in-place reduction) on `stream`.
    pub(crate) fn all_reduce(
        &self,
        input: &TensorRef<'_>,
        output: &TensorMut<'_>,
        op: RedOp,
        stream: &CudaStream,
    ) -> Result<Status> {
        let (count, dtype) = packed_count(input, output, 1, "all_reduce")?;
        self.with_live("ncclAllReduce", |api, raw| {
            // SAFETY: `raw` is live; both views are packed with `count` elements of one dtype
            // (checked above) in memory their constructors keep valid for work on `stream`.
            let status = unsafe {
                (api.all_reduce)(
                    input.ptr as *const c_void,
                    output.ptr as *mut c_void,
                    count,
                    dtype,
                    op as c_int,
                    raw,
                    stream.cu_stream() as *mut c_void,
                )
            };
            check(api, status, "ncclAllReduce", raw)
        })
    }

    /// Enqueues an in-place `ncclBroadcast` of `buffer` from rank `root` on `stream`.
    pub(crate) fn broadcast(&self, buffer: &TensorMut<'_>, root: usize, stream: &CudaStream) -> Result<Status> {
        let (count, dtype) = packed_count(buffer, buffer, 1, "broadcast")?;
        self.with_live("ncclBroadcast", |api, raw| {
            // SAFETY: `raw` is live; `buffer` is packed with `count` elements in memory its
            // constructor keeps valid for work on `stream`.
            let status = unsafe {
                (api.broadcast)(
                    buffer.ptr as *const c_void,
                    buffer.ptr as *mut c_void,
                    count,
                    dtype,
                    root as c_int,
                    raw,
                    stream.cu_stream() as *mut c_void,
                )
            };
            check(api, status, "ncclBroadcast", raw)
        })
    }

    /// Enqueues `ncclAllGather`: `output` holds `nranks` times `input`'s elements.
    pub(crate) fn all_gather(
        &self,
        input: &TensorRef<'_>,
        output: &TensorMut<'_>,
        nranks: usize,
        stream: &CudaStream,
    ) -> Result<Status> {
        let (count, dtype) = packed_count(input, output, nranks, "all_gather")?;
        self.with_live("ncclAllGather", |api, raw| {
            // SAFETY: `raw` is live; `input` holds `count` and `output` `count * nranks`
            // packed elements of one dtype (checked above), valid for work on `stream`.
            let status = unsafe {
                (api.all_gather)(
                    input.ptr as *const c_void,
                    output.ptr as *mut c_void,
                    count,
                    dtype,
                    raw,
                    stream.cu_stream() as *mut c_void,
                )
            };
            check(api, status, "ncclAllGather", raw)
        })
    }
}

impl Drop for Comm {
    fn drop(&mut self) {
        let (Ok(api), Some(raw)) = (api(), self.lock().take()) else {
            return;
        };
        // SAFETY: `raw` is live and no longer reachable through `self`.
        let status = unsafe { (api.comm_destroy)(raw) };
        if status != SUCCESS {
            tracing::warn!("ncclCommDestroy returned {}", status_name(api, status));
        }
    }
}

/// The NCCL data type of a dtype (bool as bytes): `ncclDataType_t` values from `nccl.h`
/// (stable since NCCL 2.10, which added bfloat16). cudarc's NCCL bindings are not used for
/// them: turning on its `nccl` feature makes a build with cudarc's dynamic linking (Candle's
/// CUDA build) link against libnccl.
pub(crate) fn nccl_dtype(dtype: DataType) -> c_int {
    match dtype {
        DataType::I8 => 0,
        DataType::U8 | DataType::Bool => 1,
        DataType::I32 => 2,
        DataType::I64 => 4,
        DataType::F16 => 6,
        DataType::F32 => 7,
        DataType::F64 => 8,
        DataType::BF16 => 9,
    }
}

/// The element count of a collective's input and its NCCL dtype, after checking the views:
/// for `factor == 1` (all-reduce, broadcast) packed with the same dims and strides (so
/// elements correspond by address); otherwise (all-gather) both row-major packed with
/// `output` holding `factor` times `input`'s elements.
fn packed_count(
    input: &TensorRef<'_>,
    output: &TensorRef<'_>,
    factor: usize,
    op: &'static str,
) -> Result<(usize, c_int)> {
    for (arg, t) in [("input", input), ("output", output)] {
        let ok = if factor == 1 {
            t.is_packed()
        } else {
            t.strides[..] == row_major_strides(&t.dims)[..] || t.numel() <= 1
        };
        if !ok {
            let want = if factor == 1 {
                "packed (no gaps)"
            } else {
                "row-major packed"
            };
            return Err(Error::invalid_arg(
                op,
                arg,
                format!("must be {want}; got strides {:?} for dims {:?}", t.strides, t.dims),
            ));
        }
    }
    if input.dtype != output.dtype {
        return Err(Error::invalid_arg(
            op,
            "output",
            format!("dtype {:?} differs from the input's {:?}", output.dtype, input.dtype),
        ));
    }
    if factor == 1 && (input.dims != output.dims || input.strides != output.strides) {
        return Err(Error::invalid_arg(
            op,
            "output",
            format!(
                "dims {:?} / strides {:?} differ from the input's {:?} / {:?}",
                output.dims, output.strides, input.dims, input.strides
            ),
        ));
    }
    let count = input.numel().max(0) as usize;
    if output.numel().max(0) as usize != count * factor {
        return Err(Error::invalid_arg(
            op,
            "output",
            format!(
                "holds {} elements; {} expected ({count} x {factor} ranks)",
                output.numel(),
                count * factor
            ),
        ));
    }
    Ok((count, nccl_dtype(input.dtype)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_layout_is_nccl_2_17s() {
        // size_t, 2 x unsigned, 4 x int, a pointer, int (+ padding) on a 64-bit target.
        assert_eq!(std::mem::size_of::<ConfigV21700>(), 48);
        assert_eq!(std::mem::offset_of!(ConfigV21700, net_name), 32);
        assert_eq!(ConfigV21700::new(false).blocking, 0);
    }

    #[test]
    fn views_are_checked_before_any_call() {
        let f32_2x3 = TensorRef::fake_packed(&[2, 3], DataType::F32, 256);
        assert_eq!(packed_count(&f32_2x3, &f32_2x3, 1, "all_reduce").unwrap(), (6, 7));
        // Channels-last is packed too, when both sides share it.
        let nhwc = TensorRef::fake_channels_last(&[2, 3, 4, 5], DataType::BF16, 256);
        assert_eq!(packed_count(&nhwc, &nhwc, 1, "all_reduce").unwrap(), (120, 9));
        let nchw = TensorRef::fake_packed(&[2, 3, 4, 5], DataType::BF16, 512);
        let err = packed_count(&nhwc, &nchw, 1, "all_reduce").unwrap_err().to_string();
        assert!(err.contains("differ from the input's"), "{err}");
        let gappy = TensorRef::fake(&[2, 3], &[4, 1], DataType::F32, 256);
        let err = packed_count(&gappy, &gappy, 1, "broadcast").unwrap_err().to_string();
        assert!(err.contains("must be packed"), "{err}");
        let gathered = TensorRef::fake_packed(&[4, 3], DataType::F32, 1024);
        assert_eq!(packed_count(&f32_2x3, &gathered, 2, "all_gather").unwrap(), (6, 7));
        let err = packed_count(&f32_2x3, &gathered, 3, "all_gather")
            .unwrap_err()
            .to_string();
        assert!(err.contains("holds 12 elements; 18 expected"), "{err}");
        let err = packed_count(&nhwc, &nhwc, 2, "all_gather").unwrap_err().to_string();
        assert!(err.contains("row-major packed"), "{err}");
        let half = TensorRef::fake_packed(&[2, 3], DataType::F16, 256);
        let err = packed_count(&f32_2x3, &half, 1, "all_reduce").unwrap_err().to_string();
        assert!(err.contains("dtype F16 differs"), "{err}");
    }

    #[test]
    fn dtypes_map_to_nccl_codes() {
        let codes: Vec<c_int> = [
            DataType::I8,
            DataType::U8,
            DataType::Bool,
            DataType::I32,
            DataType::I64,
            DataType::F16,
            DataType::F32,
            DataType::F64,
            DataType::BF16,
        ]
        .into_iter()
        .map(nccl_dtype)
        .collect();
        assert_eq!(codes, [0, 1, 1, 2, 4, 6, 7, 8, 9]);
    }

    #[test]
    fn default_candidates_are_the_sonames() {
        assert_eq!(candidates(None), ["libnccl.so.2", "libnccl.so"]);
        assert_eq!(candidates(Some("/opt/libnccl.so.2")), ["/opt/libnccl.so.2"]);
    }
}
