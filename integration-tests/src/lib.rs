//! Helpers shared by the integration tests: device buffers filled from float64 data in
//! any dtype and layout, poisoned outputs, and read-back to float64.

use std::sync::Arc;

use cudnn_backend::cudarc::driver::{CudaSlice, CudaStream, DevicePtr};
use cudnn_backend::graph::DataType;
use cudnn_backend::types::{channels_last_strides, row_major_strides, TensorMut, TensorRef};
use cudnn_backend_reference::{gather_from_strided, scatter_to_strided, strided_len, SplitMix64};
use half::{bf16, f16};

pub mod burn_ref;
pub mod ctc;
pub mod jobs;
mod report;
pub mod sources;

pub use report::KernelReport;

/// Points this process's persistent kernel and plan cache at a new empty directory (once per
/// process, before the first GPU work of the test that calls it first), for tests that must
/// see cuDNN plans built rather than restored from a cache an earlier run filled. Every test
/// of a binary that uses it calls it first: the crate's configuration is installed before
/// anything reads it.
pub fn fresh_kernel_cache() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let dir = std::env::temp_dir().join(format!("cudnn-backend-test-cache-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let config = cudnn_backend::config::Config {
            kernel_cache: Some(dir),
            ..cudnn_backend::config::Config::from_env()
        };
        assert!(
            cudnn_backend::config::init(config),
            "fresh_kernel_cache must run before the crate reads its configuration"
        );
    });
}

/// The dtype and layout of a convolution that must run on a cuDNN engine (to build a plan,
/// take a workspace): f32 NCHW, or under `CUDNN_LIB_CONFIG=GRAPH_JIT_ONLY` f16 NHWC, since
/// there cuDNN's runtime-compiled engines take no exact f32 convolution and the backend runs
/// those in its direct kernels instead.
pub fn cudnn_conv_dtype() -> (DataType, Layout) {
    if cudnn_backend::plan::policy::graph_jit_only() {
        (DataType::F16, Layout::Nhwc)
    } else {
        (DataType::F32, Layout::Nchw)
    }
}

/// The float64 reference's description of a convolution of geometry `p`.
pub fn reference_geometry(p: &cudnn_backend::ops::ConvParams) -> cudnn_backend_reference::ConvGeometry {
    cudnn_backend_reference::ConvGeometry::from_i64(&p.pre_padding, &p.post_padding, &p.stride, &p.dilation, p.groups)
}

/// Memory layout of an activation tensor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layout {
    /// N, C, spatial... packed row-major.
    Nchw,
    /// N, spatial..., C packed (channels last).
    Nhwc,
}

/// Strides (elements) of `dims` in `layout`.
pub fn strides(dims: &[i64], layout: Layout) -> Vec<i64> {
    match layout {
        Layout::Nchw => row_major_strides(dims).to_vec(),
        Layout::Nhwc => channels_last_strides(dims).to_vec(),
    }
}

/// Rounds `v` to the nearest value representable in `dtype`.
pub fn round_to(dtype: DataType, v: f64) -> f64 {
    match dtype {
        DataType::F32 => v as f32 as f64,
        DataType::F16 => f16::from_f64(v).to_f64(),
        DataType::BF16 => bf16::from_f64(v).to_f64(),
        _ => v,
    }
}

fn encode(dtype: DataType, v: &[f64]) -> Vec<u8> {
    match dtype {
        DataType::F32 => v.iter().flat_map(|&x| (x as f32).to_le_bytes()).collect(),
        DataType::F16 => v.iter().flat_map(|&x| f16::from_f64(x).to_le_bytes()).collect(),
        DataType::BF16 => v.iter().flat_map(|&x| bf16::from_f64(x).to_le_bytes()).collect(),
        DataType::F64 => v.iter().flat_map(|&x| x.to_le_bytes()).collect(),
        DataType::I32 => v.iter().flat_map(|&x| (x as i32).to_le_bytes()).collect(),
        DataType::I64 => v.iter().flat_map(|&x| (x as i64).to_le_bytes()).collect(),
        DataType::I8 => v.iter().map(|&x| (x as i8) as u8).collect(),
        DataType::U8 | DataType::Bool => v.iter().map(|&x| x as u8).collect(),
    }
}

fn decode(dtype: DataType, b: &[u8]) -> Vec<f64> {
    match dtype {
        DataType::F32 => b
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]) as f64)
            .collect(),
        DataType::F16 => b
            .chunks_exact(2)
            .map(|c| f16::from_le_bytes([c[0], c[1]]).to_f64())
            .collect(),
        DataType::BF16 => b
            .chunks_exact(2)
            .map(|c| bf16::from_le_bytes([c[0], c[1]]).to_f64())
            .collect(),
        DataType::F64 => b
            .chunks_exact(8)
            .map(|c| f64::from_le_bytes(c.try_into().unwrap()))
            .collect(),
        DataType::I32 => b
            .chunks_exact(4)
            .map(|c| i32::from_le_bytes(c.try_into().unwrap()) as f64)
            .collect(),
        DataType::I64 => b
            .chunks_exact(8)
            .map(|c| i64::from_le_bytes(c.try_into().unwrap()) as f64)
            .collect(),
        DataType::I8 => b.iter().map(|&x| x as i8 as f64).collect(),
        DataType::U8 | DataType::Bool => b.iter().map(|&x| x as f64).collect(),
    }
}

/// A device buffer viewed as a strided tensor.
///
/// The views are made from the buffer's raw address (so the tests can pass them around like
/// the plain values they were): they are fields dropped before the buffer, and every test
/// uses them on the stream the buffer was allocated on. Library users make views with the
/// safe `TensorRef::from_slice` / `TensorMut::from_slice` instead.
pub struct DevTensor {
    /// The view ops read.
    pub t: TensorRef<'static>,
    /// The same view, for ops that write it.
    pub m: TensorMut<'static>,
    /// The memory (kept alive for the views).
    pub buf: CudaSlice<u8>,
    /// The logical values (rounded to the dtype) that were uploaded.
    pub values: Vec<f64>,
}

impl DevTensor {
    /// Views `buf` (on `stream`) with `dims`, `strides` and `dtype`.
    fn new(stream: &Arc<CudaStream>, buf: CudaSlice<u8>, dims: &[i64], strides: &[i64], dtype: DataType) -> Self {
        // SAFETY: the views are fields of the struct that owns the buffer, dropped before it.
        let (t, m) = unsafe { views_of(stream, &buf, 0, dims, strides, dtype) };
        DevTensor {
            t,
            m,
            buf,
            values: Vec::new(),
        }
    }
}

/// The read and write views the tests pass to ops: `dims` / `strides` of `dtype` with
/// element `(0, …, 0)` at byte `offset` of `buf`, which was allocated on `stream`.
///
/// # Safety
///
/// `buf` outlives the views (and every op enqueued with them, which the tests order by
/// synchronizing `stream` before they read or free it), and the views are used with ops on
/// `stream` only.
///
/// # Panics
///
/// When an element of the view lies outside `buf`.
pub unsafe fn views_of(
    stream: &Arc<CudaStream>,
    buf: &CudaSlice<u8>,
    offset: usize,
    dims: &[i64],
    strides: &[i64],
    dtype: DataType,
) -> (TensorRef<'static>, TensorMut<'static>) {
    let span = strided_len(&to_usize(dims), &to_usize(strides)) * dtype.size();
    assert!(
        dims.contains(&0) || offset + span <= buf.len(),
        "views_of: {dims:?} / {strides:?} of {dtype:?} at byte {offset} outgrow the {}-byte buffer",
        buf.len()
    );
    let ptr = buf.device_ptr(stream).0 + offset as u64;
    // SAFETY: every element lies in `buf` (asserted above), which the caller keeps alive and
    // uses on `stream` only.
    unsafe {
        (
            TensorRef::from_raw(dims, strides, dtype, ptr),
            TensorMut::from_raw(dims, strides, dtype, ptr),
        )
    }
}

fn to_usize(v: &[i64]) -> Vec<usize> {
    v.iter().map(|&x| x as usize).collect()
}

/// Uploads `values` (logical row-major order) in `dtype` with the given strides; gaps in
/// the buffer are filled with NaN bit patterns.
pub fn upload(stream: &Arc<CudaStream>, values: &[f64], dims: &[i64], strides: &[i64], dtype: DataType) -> DevTensor {
    let (d, s) = (to_usize(dims), to_usize(strides));
    let len = strided_len(&d, &s).max(1);
    let rounded: Vec<f64> = values.iter().map(|&v| round_to(dtype, v)).collect();
    let mut host = vec![f64::NAN; len];
    scatter_to_strided(&rounded, &d, &s, &mut host);
    let bytes = encode(dtype, &host);
    let buf = stream.clone_htod(&bytes).expect("upload");
    DevTensor {
        values: rounded,
        ..DevTensor::new(stream, buf, dims, strides, dtype)
    }
}

/// Uploads fresh random values in [-1, 1).
pub fn random(
    stream: &Arc<CudaStream>,
    rng: &mut SplitMix64,
    dims: &[i64],
    strides: &[i64],
    dtype: DataType,
) -> DevTensor {
    let n: i64 = dims.iter().product();
    let v = rng.fill(n as usize);
    upload(stream, &v, dims, strides, dtype)
}

/// An output buffer poisoned with NaN (every byte 0xFF), so unwritten elements show.
pub fn poisoned(stream: &Arc<CudaStream>, dims: &[i64], strides: &[i64], dtype: DataType) -> DevTensor {
    let len = strided_len(&to_usize(dims), &to_usize(strides)).max(1);
    let buf = stream.clone_htod(&vec![0xFFu8; len * dtype.size()]).expect("alloc");
    DevTensor::new(stream, buf, dims, strides, dtype)
}

/// Reads a tensor back in logical row-major order (synchronizes the stream).
pub fn download(stream: &Arc<CudaStream>, t: &DevTensor) -> Vec<f64> {
    let bytes = stream.clone_dtoh(&t.buf).expect("download");
    let all = decode(t.t.dtype(), &bytes);
    gather_from_strided(&all, &to_usize(t.t.dims()), &to_usize(t.t.strides()))
}

/// Relative L2 error bound for results computed from `dtype` inputs
/// (f32 1e-5, f16/bf16 1e-2).
pub fn bound(dtype: DataType) -> f64 {
    match dtype {
        DataType::F32 => 1e-5,
        _ => 1e-2,
    }
}

/// The ops' dims as `usize` for the CPU reference.
pub fn udims(t: &DevTensor) -> Vec<usize> {
    to_usize(t.t.dims())
}

/// The part of a long test's cases one process runs: `TEST_SHARD=k/n` keeps every n-th
/// case starting at the k-th, so a suite can run as n parallel processes (under a
/// sanitizer, say). Unset, every case runs.
#[derive(Clone, Copy, Debug)]
pub struct Shard {
    k: usize,
    n: usize,
}

impl Shard {
    /// Reads `TEST_SHARD`; panics on a malformed value (it must be `k/n` with k < n).
    pub fn from_env() -> Self {
        let Ok(spec) = std::env::var("TEST_SHARD") else {
            return Self { k: 0, n: 1 };
        };
        let parsed = spec
            .split_once('/')
            .and_then(|(k, n)| Some((k.parse().ok()?, n.parse().ok()?)))
            .filter(|&(k, n)| k < n);
        let Some((k, n)) = parsed else {
            panic!("TEST_SHARD={spec:?}: expected k/n with k < n");
        };
        println!("running shard {k}/{n} of the cases only");
        Self { k, n }
    }

    /// Number of shards the cases are split into (1 when unset).
    pub fn parts(&self) -> usize {
        self.n
    }

    /// True when case number `i` belongs to this shard.
    pub fn has(&self, i: usize) -> bool {
        i % self.n == self.k
    }
}

/// The message of a panic payload (`panic!` with a literal or a formatted string; empty
/// for any other payload).
pub fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<String>()
        .cloned()
        .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_default()
}
