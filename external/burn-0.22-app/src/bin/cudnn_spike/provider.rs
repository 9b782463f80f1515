//! The registered fusion provider: a fuser that claims single 2-D convolution forward nodes
//! (`ModuleOperationIr::Conv2d`, no bias, f32/f16/bf16) and an operation that runs them with
//! `cudnn_backend_core::ops::conv_forward` on the engine's stream, ordered with CubeCL's by
//! [`crate::ordering`].
//!
//! Counters (process-wide atomics, [`COUNTERS`]) record what the fusion search fed the fuser,
//! what it claimed and how each claimed convolution ran.

use std::sync::atomic::{AtomicU64, Ordering as AtomicOrdering};
use std::sync::OnceLock;

use burn::tensor::DType;
use burn_cubecl::cubecl::zspace::Strides;
use burn_cubecl::fusion::{
    CubeFuser, CubeFusionHandle, CubeOptimization, FallbackOperation, FusedOperation, OptimizationProvider,
};
use burn_cubecl::CubeDevice;
use burn_fusion::stream::Context;
use burn_fusion::{FuserProperties, FuserStatus, OperationFuser};
use burn_ir::{Conv2dOpIr, ModuleOperationIr, OperationIr, TensorIr};
use cubecl_cuda::CudaRuntime;
use cubecl_runtime::runtime::Runtime;
use cudnn_backend_core::kernels::elementwise::copy;
use cudnn_backend_core::ops::{conv_forward, ConvParams, TensorMut, TensorRef};
use cudnn_backend_core::types::DataType;

use crate::error::{Result, SpikeError};
use crate::ordering::Ordering;

/// The score of a claimed convolution. The built-in fusers close on a convolution with no
/// operation (score 0), and the search keeps the strictly highest ready score.
pub const SCORE: u64 = 10;

/// CubeCL's CUDA server, the type `Client::get_resource` names.
type CudaServer = <CudaRuntime as Runtime>::Server;

/// The ordering every claimed convolution uses; set by `main` before the provider is
/// registered (a claimed convolution without it falls back to Burn's).
pub static ORDERING: OnceLock<Ordering> = OnceLock::new();

/// What the fusion search and the claimed operations did (see the field docs).
pub struct Counters {
    /// Operations fed to the fuser (`fuse` calls), whatever their position in a block.
    pub fed: AtomicU64,
    /// Blocks whose first operation is a convolution the fuser accepts (offers of a
    /// single-convolution segment).
    pub conv_heads: AtomicU64,
    /// Blocks whose first operation is a convolution the fuser declines (bias, dtype).
    pub conv_declined: AtomicU64,
    /// Blocks whose first operation is not a 2-D convolution forward.
    pub other_heads: AtomicU64,
    /// Optimizations built from the fuser (`finish`): blocks the fuser won.
    pub claims: AtomicU64,
    /// Claimed convolutions that ran through cuDNN.
    pub cudnn_runs: AtomicU64,
    /// Claimed convolutions that ran Burn's own through the fallback (an error on our path).
    pub fallbacks: AtomicU64,
    /// Bytes of outputs allocated through `client.empty`.
    pub output_bytes: AtomicU64,
}

/// The process's counters.
pub static COUNTERS: Counters = Counters {
    fed: AtomicU64::new(0),
    conv_heads: AtomicU64::new(0),
    conv_declined: AtomicU64::new(0),
    other_heads: AtomicU64::new(0),
    claims: AtomicU64::new(0),
    cudnn_runs: AtomicU64::new(0),
    fallbacks: AtomicU64::new(0),
    output_bytes: AtomicU64::new(0),
};

/// A copy of [`COUNTERS`] at one moment.
#[derive(Clone, Copy, Debug, Default)]
pub struct Snapshot {
    pub fed: u64,
    pub conv_heads: u64,
    pub conv_declined: u64,
    pub other_heads: u64,
    pub claims: u64,
    pub cudnn_runs: u64,
    pub fallbacks: u64,
    pub output_bytes: u64,
}

impl Counters {
    /// The counters now.
    pub fn snapshot(&self) -> Snapshot {
        let l = |a: &AtomicU64| a.load(AtomicOrdering::SeqCst);
        Snapshot {
            fed: l(&self.fed),
            conv_heads: l(&self.conv_heads),
            conv_declined: l(&self.conv_declined),
            other_heads: l(&self.other_heads),
            claims: l(&self.claims),
            cudnn_runs: l(&self.cudnn_runs),
            fallbacks: l(&self.fallbacks),
            output_bytes: l(&self.output_bytes),
        }
    }
}

impl Snapshot {
    /// What happened between `earlier` and `self`.
    pub fn since(self, earlier: Snapshot) -> Snapshot {
        Snapshot {
            fed: self.fed - earlier.fed,
            conv_heads: self.conv_heads - earlier.conv_heads,
            conv_declined: self.conv_declined - earlier.conv_declined,
            other_heads: self.other_heads - earlier.other_heads,
            claims: self.claims - earlier.claims,
            cudnn_runs: self.cudnn_runs - earlier.cudnn_runs,
            fallbacks: self.fallbacks - earlier.fallbacks,
            output_bytes: self.output_bytes - earlier.output_bytes,
        }
    }
}

fn bump(counter: &AtomicU64, by: u64) {
    counter.fetch_add(by, AtomicOrdering::SeqCst);
}

/// The provider `main` registers with `burn_cubecl::fusion::register`.
pub struct CudnnConvProvider;

impl OptimizationProvider for CudnnConvProvider {
    type Operation = CudnnConv;

    fn fuser(&self, _device: &CubeDevice) -> CubeFuser {
        CubeFuser::new(ConvFuser {
            op: None,
            status: FuserStatus::Open,
        })
    }
}

/// Takes a block's first operation when it is a supported convolution, then closes: the
/// claimed segment is that one convolution.
#[derive(Clone)]
struct ConvFuser {
    op: Option<Conv2dOpIr>,
    status: FuserStatus,
}

/// Why the fuser leaves a convolution to Burn, if it does.
fn declined(op: &Conv2dOpIr) -> Option<&'static str> {
    if op.bias.is_some() {
        return Some("bias (conv_forward has none; conv_bias_act_forward would)");
    }
    if data_type(op.x.dtype).is_none() || op.x.dtype != op.weight.dtype || op.x.dtype != op.out.dtype {
        return Some("dtype");
    }
    None
}

fn data_type(d: DType) -> Option<DataType> {
    match d {
        DType::F32 => Some(DataType::F32),
        DType::F16 => Some(DataType::F16),
        DType::BF16 => Some(DataType::BF16),
        _ => None,
    }
}

impl OperationFuser<CubeOptimization> for ConvFuser {
    fn fuse(&mut self, operation: &OperationIr) {
        bump(&COUNTERS.fed, 1);
        if self.status == FuserStatus::Closed {
            return;
        }
        match operation {
            OperationIr::Module(ModuleOperationIr::Conv2d(op)) => match declined(op) {
                None => {
                    bump(&COUNTERS.conv_heads, 1);
                    self.op = Some(op.clone());
                }
                Some(_) => bump(&COUNTERS.conv_declined, 1),
            },
            _ => bump(&COUNTERS.other_heads, 1),
        }
        self.status = FuserStatus::Closed;
    }

    fn finish(&mut self) -> CubeOptimization {
        bump(&COUNTERS.claims, 1);
        CubeOptimization::new(CudnnConv { op: self.op.clone() })
    }

    fn reset(&mut self) {
        self.op = None;
        self.status = FuserStatus::Open;
    }

    fn status(&self) -> FuserStatus {
        self.status
    }

    fn properties(&self) -> FuserProperties {
        let ready = self.op.is_some();
        FuserProperties {
            score: if ready { SCORE } else { 0 },
            ready,
        }
    }

    fn len(&self) -> usize {
        usize::from(self.op.is_some())
    }

    fn clone_dyn(&self) -> Box<dyn OperationFuser<CubeOptimization>> {
        Box::new(self.clone())
    }
}

/// One claimed convolution, in stream-relative IR (its tensors resolve through the
/// execution context's `tensors`; the CubeCL client comes from the input handles).
pub struct CudnnConv {
    op: Option<Conv2dOpIr>,
}

impl FusedOperation for CudnnConv {
    const NAME: &'static str = "CudnnConv2d";
    type State = Option<Conv2dOpIr>;

    fn num_ops_fused(&self) -> usize {
        usize::from(self.op.is_some())
    }

    fn run(&mut self, context: &mut Context<CubeFusionHandle>, fallback: &dyn Fn(usize) -> Box<dyn FallbackOperation>) {
        let Some(op) = &self.op else {
            return;
        };
        match run_conv(context, op) {
            Ok(()) => bump(&COUNTERS.cudnn_runs, 1),
            Err(e) => {
                let n = COUNTERS.fallbacks.fetch_add(1, AtomicOrdering::SeqCst);
                if n < 5 {
                    eprintln!("cudnn_spike: claimed convolution ran Burn's instead: {e}");
                }
                // Nothing was consumed from the context: Burn's convolution runs as if unclaimed.
                fallback(0).run(context);
            }
        }
    }

    fn to_state(&self) -> Self::State {
        self.op.clone()
    }

    fn from_state(_device: &CubeDevice, state: Self::State) -> Self {
        Self { op: state }
    }
}

/// The context's tensor for a relative id.
fn resolve(context: &Context<CubeFusionHandle>, t: &TensorIr) -> Result<TensorIr> {
    context
        .tensors
        .get(&t.id)
        .cloned()
        .ok_or_else(|| SpikeError::Run(format!("tensor {:?} missing from the execution context", t.id)))
}

fn dims_i64(t: &TensorIr) -> Vec<i64> {
    t.shape.iter().map(|&d| d as i64).collect()
}

/// `src` itself, or (with `packed`) a packed copy of it made on `stream` at address `packed`.
///
/// # Safety
/// `packed`, when given, addresses `dims`' element count of `dtype` on `stream`'s device,
/// alive and unused by others until the returned view's last use on `stream`.
unsafe fn packed_view<'a>(
    stream: &std::sync::Arc<cudnn_backend_core::cudarc::driver::CudaStream>,
    src: TensorRef<'a>,
    packed: Option<u64>,
    dims: &[usize],
    dtype: DataType,
) -> cudnn_backend_core::Result<TensorRef<'a>> {
    let Some(ptr) = packed else { return Ok(src) };
    let dims_i64: Vec<i64> = dims.iter().map(|&d| d as i64).collect();
    let strides: Vec<i64> = contiguous(dims).iter().map(|&s| s as i64).collect();
    // SAFETY: the caller guarantees `ptr` holds `dims`' elements of `dtype`, exclusively ours.
    let dst = unsafe { TensorMut::from_raw(&dims_i64, &strides, dtype, ptr) };
    copy(stream, &src, &dst)?;
    // SAFETY: as above; the copy into it is enqueued on `stream` before any later reader.
    Ok(unsafe { TensorRef::from_raw(&dims_i64, &strides, dtype, ptr) })
}

/// Whether `strides` lay `dims` out row-major with no gaps (size-1 dims' strides ignored).
fn is_packed(dims: &[usize], strides: &[usize]) -> bool {
    let want = contiguous(dims);
    dims.iter()
        .zip(strides.iter().zip(&want))
        .all(|(&d, (&s, &w))| d == 1 || s == w)
}

fn contiguous(dims: &[usize]) -> Vec<usize> {
    let mut strides = vec![1usize; dims.len()];
    for i in (0..dims.len().saturating_sub(1)).rev() {
        strides[i] = strides[i + 1] * dims[i + 1];
    }
    strides
}

/// Runs `op` on cuDNN. On `Err` nothing of the context was consumed or registered, and no
/// work of ours is left running, so the caller may run Burn's convolution instead.
fn run_conv(context: &mut Context<CubeFusionHandle>, op: &Conv2dOpIr) -> Result<()> {
    let ordering = ORDERING
        .get()
        .ok_or_else(|| SpikeError::Run("no ordering set up".into()))?;
    let (x_ir, w_ir, out_ir) = (
        resolve(context, &op.x)?,
        resolve(context, &op.weight)?,
        resolve(context, &op.out)?,
    );
    let handle = |t: &TensorIr| {
        context
            .handles
            .get_handle_ref(&t.id)
            .cloned()
            .ok_or_else(|| SpikeError::Run(format!("no handle for tensor {:?}", t.id)))
    };
    let (xh, wh) = (handle(&x_ir)?, handle(&w_ir)?);
    if xh.tiles.is_some() || wh.tiles.is_some() {
        return Err(SpikeError::Run("storage-tiled input".into()));
    }
    let dtype = data_type(out_ir.dtype).ok_or_else(|| SpikeError::Run(format!("dtype {:?}", out_ir.dtype)))?;
    let o = &op.options;
    let params = ConvParams {
        pre_padding: o.padding.iter().map(|p| p.0 as i64).collect(),
        post_padding: o.padding.iter().map(|p| p.1 as i64).collect(),
        stride: o.stride.iter().map(|&s| s as i64).collect(),
        dilation: o.dilation.iter().map(|&d| d as i64).collect(),
        groups: o.groups as i64,
    };
    let out_dims: Vec<usize> = out_ir.shape.iter().copied().collect();
    let out_strides = contiguous(&out_dims);
    let bytes = out_dims.iter().product::<usize>() * dtype.size();

    // The output, from CubeCL's allocator on the client's stream; then the three addresses.
    // Both come before the ordering's first launch, so the allocation precedes, in CubeCL's
    // stream order, everything our stream waits for.
    let client = xh.client.clone();
    let out = client.empty(bytes);
    bump(&COUNTERS.output_bytes, bytes as u64);
    let get = |h: &burn_cubecl::cubecl::server::Handle, what: &str| {
        client
            .get_resource::<CudaServer>(h.clone())
            .map_err(|e| SpikeError::run(&format!("client.get_resource({what})"), e))
    };
    let (x_res, w_res, y_res) = (get(&xh.handle, "x")?, get(&wh.handle, "w")?, get(&out, "y")?);
    let (x_ptr, w_ptr, y_ptr) = (x_res.resource().ptr, w_res.resource().ptr, y_res.resource().ptr);

    // CubeCL stores tensors made from host data "pitched" (each row padded to 16 bytes), which
    // cuDNN takes for a filter only packed and runs slowly for an activation: such an operand
    // is copied into a packed buffer from CubeCL's allocator, on our stream, after the wait.
    let x_dims: Vec<usize> = x_ir.shape.iter().copied().collect();
    let w_dims: Vec<usize> = w_ir.shape.iter().copied().collect();
    let staging = |dims: &[usize], strides: &[usize]| {
        (!is_packed(dims, strides)).then(|| client.empty(dims.iter().product::<usize>() * dtype.size()))
    };
    let (x_stage, w_stage) = (staging(&x_dims, &xh.strides), staging(&w_dims, &wh.strides));
    let staged =
        |h: &Option<burn_cubecl::cubecl::server::Handle>, what: &str| h.as_ref().map(|h| get(h, what)).transpose();
    let (xs_res, ws_res) = (staged(&x_stage, "packed x")?, staged(&w_stage, "packed w")?);
    let (xs_ptr, ws_ptr) = (
        xs_res.as_ref().map(|r| r.resource().ptr),
        ws_res.as_ref().map(|r| r.resource().ptr),
    );

    let ticket = ordering.before(&client)?;
    let i64s = |s: &[usize]| s.iter().map(|&v| v as i64).collect::<Vec<_>>();
    // SAFETY: the three addresses come from `get_resource` guards (`*_res`), which keep the
    // allocations alive and in place until this function returns; the dims and strides are the
    // context's for these handles (x, w: their `strides`; y: packed over `bytes`, allocated
    // above), with the dtype the IR states. The ordering makes CubeCL's earlier writes of x and
    // w precede the convolution, and its later work (reuse of any of the three included) follow
    // it: `before` above, `after` below (or the synchronize on failure).
    // `xs_ptr` / `ws_ptr` (packed copies, when made) come from the `xs_res` / `ws_res` guards,
    // allocated above like `y` and used by nothing else, so `packed_view`'s contract holds.
    let result = unsafe {
        let x = TensorRef::from_raw(&dims_i64(&x_ir), &i64s(&xh.strides), dtype, x_ptr);
        let w = TensorRef::from_raw(&dims_i64(&w_ir), &i64s(&wh.strides), dtype, w_ptr);
        let y = TensorMut::from_raw(&dims_i64(&out_ir), &i64s(&out_strides), dtype, y_ptr);
        let stream = &ordering.stream;
        packed_view(stream, x, xs_ptr, &x_dims, dtype)
            .and_then(|x| Ok((x, packed_view(stream, w, ws_ptr, &w_dims, dtype)?)))
            .and_then(|(x, w)| conv_forward(stream, &x, &w, &y, &params))
    };
    let ordered = ordering.after(&client, ticket, result.is_ok());
    if result.is_err() || ordered.is_err() {
        // Whatever was enqueued finishes before the buffers go back to CubeCL.
        let _ = ordering.stream.synchronize();
    }
    result?;
    ordered?;
    drop((x_res, w_res, y_res, xs_res, ws_res));

    // Success: consume the inputs as Burn's convolution would, and register the output.
    let _ = context.handles.get_handle(&x_ir.id, &x_ir.status);
    let _ = context.handles.get_handle(&w_ir.id, &w_ir.status);
    context.handles.register_handle(
        out_ir.id,
        CubeFusionHandle {
            client,
            handle: out,
            device: xh.device.clone(),
            dtype: out_ir.dtype,
            strides: Strides::new(&out_strides),
            tiles: None,
            qparams: None,
        },
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn contiguous_strides() {
        assert_eq!(contiguous(&[64, 128, 28, 28]), vec![128 * 28 * 28, 28 * 28, 28, 1]);
        assert_eq!(contiguous(&[5]), vec![1]);
    }

    #[test]
    fn snapshots_subtract() {
        let a = Snapshot {
            claims: 3,
            cudnn_runs: 10,
            ..Snapshot::default()
        };
        let b = Snapshot {
            claims: 5,
            cudnn_runs: 15,
            ..Snapshot::default()
        };
        let d = b.since(a);
        assert_eq!((d.claims, d.cudnn_runs, d.fallbacks), (2, 5, 0));
    }
}
