//! Running one [`Claim`] on the engine inside Burn's fusion execution context: operands from
//! CubeCL's handles (packed first when pitched or strided), outputs from CubeCL's allocator,
//! the engine's stream ordered with CubeCL's by [`crate::ordering`].

use std::sync::Arc;

use burn_backend::DType;
use burn_cubecl::cubecl::client::Client;
use burn_cubecl::cubecl::server::Handle;
use burn_cubecl::cubecl::zspace::Strides;
use burn_cubecl::fusion::CubeFusionHandle;
use burn_cubecl::CubeDevice;
use burn_fusion::stream::Context;
use burn_ir::TensorIr;
use cubecl_cuda::CudaRuntime;
use cubecl_runtime::runtime::Runtime;
use cudnn_backend_core::cudarc::driver::CudaStream;
use cudnn_backend_core::ops::{self, Activation, TensorMut, TensorRef};
use cudnn_backend_core::types::DataType;

use crate::claim::Claim;
use crate::error::{Error, Result};
use crate::layout::{contiguous, is_packed, numel, packed_view, to_i64};
use crate::provider::Shared;
use crate::stats::Event;

/// CubeCL's CUDA server, the type `Client::get_resource` names.
type CudaServer = <CudaRuntime as Runtime>::Server;

/// An operand the engine reads, as stored by CubeCL.
struct Operand {
    dims: Vec<usize>,
    strides: Vec<usize>,
    /// The claim's float dtype, or the integer dtype of its indices.
    dtype: DataType,
    handle: Handle,
    /// A packed copy's buffer, when the stored layout is not packed row-major.
    staging: Option<Handle>,
}

/// The CUDA ordinal of a CubeCL device (claimed operations run on CUDA devices only).
pub fn cuda_ordinal(device: &CubeDevice) -> Option<usize> {
    match device {
        CubeDevice::Cuda(d) => Some(d.index),
        _ => None,
    }
}

/// Runs `claim` on the engine. On `Err` nothing of the context was consumed or registered
/// and none of this call's work is left running, so the caller may run Burn's instead.
pub(crate) fn execute(context: &mut Context<CubeFusionHandle>, claim: &Claim, shared: &Shared) -> Result<()> {
    let op = claim.name();
    let dtype = claim.dtype().map_err(|d| Error::unsupported(op, format!("{d:?}")))?;
    // The context's tensors for the node's stream-relative ones (concrete ids and shapes).
    let resolve = |t: &TensorIr| {
        context
            .tensors
            .get(&t.id)
            .cloned()
            .ok_or_else(|| Error::unsupported(op, format!("tensor {:?} missing from the execution context", t.id)))
    };
    let inputs = claim.inputs().into_iter().map(resolve).collect::<Result<Vec<_>>>()?;
    let out_ir = resolve(claim.output())?;
    let handles = inputs
        .iter()
        .map(|t| {
            context
                .handles
                .get_handle_ref(&t.id)
                .cloned()
                .ok_or_else(|| Error::unsupported(op, format!("no usable handle for tensor {:?}", t.id)))
        })
        .collect::<Result<Vec<_>>>()?;
    let first = &handles[0];
    let ordinal = cuda_ordinal(&first.device).ok_or_else(|| Error::unsupported(op, "not a CUDA device"))?;
    let client = first.client.clone();

    // The operands the engine reads (indices into `inputs`), in the engine call's order.
    let reads: &[usize] = match claim {
        Claim::ConvForward { bias: Some(_), .. } | Claim::ConvTransposeForward { bias: Some(_), .. } => &[0, 1, 2],
        Claim::ConvForward { bias: None, .. } | Claim::ConvTransposeForward { bias: None, .. } => &[0, 1],
        Claim::ConvBackwardData { .. } => &[1, 2],
        Claim::ConvBackwardFilter { .. } => &[0, 2],
        Claim::PoolForward { .. } | Claim::AvgPoolKernel { .. } | Claim::AdaptiveAvgPool { .. } => &[0],
        Claim::AvgPoolBackward { .. } | Claim::AvgPoolKernelBackward { .. } | Claim::AdaptiveAvgPoolBackward { .. } => {
            &[1]
        }
        Claim::RowsAdd { .. } => &[0, 1, 2],
        Claim::MaxPoolBackward { .. } => &[0, 1],
    };
    let mut operands = Vec::with_capacity(reads.len());
    for &i in reads {
        let h = &handles[i];
        if h.tiles.is_some() {
            return Err(Error::unsupported(op, "storage-tiled operand"));
        }
        let dims: Vec<usize> = inputs[i].shape.iter().copied().collect();
        let strides: Vec<usize> = h.strides.iter().copied().collect();
        let dtype = operand_dtype(&inputs[i], dtype);
        let staging = (!is_packed(&dims, &strides)).then(|| client.empty(numel(&dims) * dtype.size()));
        operands.push(Operand {
            dims,
            strides,
            dtype,
            handle: h.handle.clone(),
            staging,
        });
    }

    // The output (and max pooling's recomputed forward output), from CubeCL's allocator on
    // the client's stream. Every allocation and address comes before the ordering's first
    // launch, so in CubeCL's stream order it precedes what the engine's stream waits for.
    let out_dims: Vec<usize> = out_ir.shape.iter().copied().collect();
    let out = client.empty(numel(&out_dims) * dtype.size());
    let pooled = match claim {
        Claim::MaxPoolBackward { .. } => Some(client.empty(numel(&operands[1].dims) * dtype.size())),
        _ => None,
    };
    let get = |h: &Handle, what: &'static str| {
        client
            .get_resource::<CudaServer>(h.clone())
            .map_err(|e| Error::cubecl(what, e))
    };
    // The guards keep each allocation alive and in place until this function returns.
    let mut guards = Vec::new();
    let mut addr = |h: &Handle| -> Result<u64> {
        let g = get(h, "client.get_resource")?;
        let ptr = g.resource().ptr;
        guards.push(g);
        Ok(ptr)
    };
    let mut ptrs = Vec::with_capacity(operands.len());
    for o in &operands {
        let ptr = addr(&o.handle)?;
        let staged = o.staging.as_ref().map(&mut addr).transpose()?;
        ptrs.push((ptr, staged));
    }
    let out_ptr = addr(&out)?;
    let pooled_ptr = pooled.as_ref().map(&mut addr).transpose()?;

    let ordering = shared
        .orderings
        .for_current_stream(ordinal, &client, || shared.counters.bump(Event::StreamOrdering))?;
    let mut ordering = ordering.lock().unwrap_or_else(|e| e.into_inner());
    let stream = &ordering.stream.clone();
    let ticket = ordering.before(&client)?;
    // SAFETY: every address comes from a `get_resource` guard in `guards`, alive and in place
    // until this function returns, after the engine's work is enqueued and (on failure)
    // finished; dims and strides are the context's for these handles (operands: their
    // `strides`; staging, output and `pooled`: packed over the bytes allocated above for
    // them), with the dtype the IR states. Staging buffers, the output and `pooled` are
    // allocated above and used by nothing else. The ordering makes CubeCL's earlier writes
    // precede the engine's work and its later work (reuse of any buffer included) follow it.
    let result = unsafe { enqueue(stream, claim, dtype, &operands, &ptrs, &out_dims, out_ptr, pooled_ptr) };
    let ordered = ordering.after(&client, ticket, result.is_ok());
    if result.is_err() || ordered.is_err() {
        // Whatever was enqueued finishes before the buffers go back to CubeCL.
        stream
            .synchronize()
            .map_err(|e| Error::cuda("cuStreamSynchronize", e))?;
    }
    result?;
    ordered?;
    drop(ordering);
    drop(guards);

    // Success: consume the inputs as Burn's implementation would, register the output. The
    // node's (relative) tensors carry this operation's status: the context's copies may not
    // (a tensor read again later must stay).
    for (global, relative) in inputs.iter().zip(claim.inputs()) {
        let _ = context.handles.get_handle(&global.id, &relative.status);
    }
    register_output(context, &client, first.device.clone(), out, &out_ir, &out_dims);
    Ok(())
}

/// The engine call for `claim` on `stream`, with packed copies of strided operands first.
/// `operands` are the operands the engine reads, in the order `execute` lists them per claim
/// (convolution and transposed convolution forward: x, w, bias; data gradient: w, dy; filter
/// gradient: x, dy; pooling forward: x; average pooling backward: dy; max pooling backward:
/// x, dy; rows add: tensor, indices, value).
///
/// # Safety
/// `ptrs[i]` addresses `operands[i]` as stored (and its packed staging buffer, if any);
/// `out_ptr` (and `pooled_ptr` for max pooling backward) address packed buffers of the
/// output's (the pooled output's) elements; all stay alive and unused by other work until the
/// enqueued work has run.
#[allow(clippy::too_many_arguments)]
unsafe fn enqueue(
    stream: &Arc<CudaStream>,
    claim: &Claim,
    dtype: DataType,
    operands: &[Operand],
    ptrs: &[(u64, Option<u64>)],
    out_dims: &[usize],
    out_ptr: u64,
    pooled_ptr: Option<u64>,
) -> Result<()> {
    let mut views = Vec::with_capacity(operands.len());
    for (o, &(ptr, staged)) in operands.iter().zip(ptrs) {
        // SAFETY: the caller guarantees that `ptr` addresses the operand as stored (dims,
        // strides, dtype), alive and ordered with `stream`.
        let stored = unsafe { TensorRef::from_raw(&to_i64(&o.dims), &to_i64(&o.strides), o.dtype, ptr) };
        // SAFETY: the caller guarantees that `staged`, when given, is a buffer of the operand's
        // element count used by nothing else until the enqueued work has run.
        views.push(unsafe { packed_view(stream, stored, staged, &o.dims, o.dtype) }?);
    }
    let packed_out = |dims: &[usize], ptr: u64| {
        // SAFETY: the caller guarantees that `out_ptr` (`pooled_ptr`) addresses a packed buffer
        // of `dims`' elements, used by nothing else until the enqueued work has run.
        unsafe { TensorMut::from_raw(&to_i64(dims), &to_i64(&contiguous(dims)), dtype, ptr) }
    };
    let y = packed_out(out_dims, out_ptr);
    // 1-D pooling runs on the 2-D kernels: `[N, C, L]` as `[N, C, 1, L]` (all packed here).
    let (views, y) = if claim.unit_height() {
        let unsqueeze = |dims: &[i64]| -> (Vec<i64>, Vec<i64>) {
            let d = vec![dims[0], dims[1], 1, dims[2]];
            let s = vec![dims[1] * dims[2], dims[2], dims[2], 1];
            (d, s)
        };
        let mut four = Vec::with_capacity(views.len());
        for v in &views {
            let (d, s) = unsqueeze(v.dims());
            four.push(v.reshaped(&d, &s)?);
        }
        let (d, s) = unsqueeze(y.dims());
        (four, y.reshaped_mut(&d, &s)?)
    } else {
        (views, y)
    };
    match claim {
        Claim::ConvForward { bias: None, params, .. } => ops::conv_forward(stream, &views[0], &views[1], &y, params)?,
        Claim::ConvForward {
            bias: Some(_), params, ..
        } => ops::conv_bias_act_forward(
            stream,
            &views[0],
            &views[1],
            &views[2],
            &y,
            params,
            Activation::Identity,
        )?,
        Claim::ConvTransposeForward { params, .. } => {
            ops::conv_transpose_forward(stream, &views[0], &views[1], views.get(2), &y, params)?
        }
        Claim::ConvBackwardData { params, .. } => ops::conv_backward_data(stream, &views[1], &views[0], &y, params)?,
        Claim::ConvBackwardFilter { params, .. } => {
            ops::conv_backward_filter(stream, &views[0], &views[1], &y, params)?
        }
        Claim::PoolForward { params, .. } => ops::pool_forward(stream, &views[0], &y, params)?,
        Claim::AvgPoolBackward { params, .. } => ops::pool_backward(stream, None, None, &views[0], &y, params)?,
        Claim::AvgPoolKernel {
            pool,
            count_include_pad,
            ..
        } => ops::pool2d::avg_pool2d(stream, &views[0], pool, *count_include_pad, &y)?,
        Claim::AvgPoolKernelBackward {
            pool,
            count_include_pad,
            ..
        } => ops::pool2d::avg_pool2d_backward(stream, &views[0], pool, *count_include_pad, &y)?,
        Claim::AdaptiveAvgPool { .. } => ops::pool2d::adaptive_avg_pool2d(stream, &views[0], &y)?,
        Claim::AdaptiveAvgPoolBackward { .. } => ops::pool2d::adaptive_avg_pool2d_backward(stream, &views[0], &y)?,
        Claim::RowsAdd { .. } => {
            ops::elementwise::copy(stream, &views[0], &y)?;
            ops::index::index_add(stream, &y, 0, &views[1], &views[2])?
        }
        Claim::MaxPoolBackward { params, .. } => {
            let ptr =
                pooled_ptr.ok_or_else(|| Error::unsupported("pool_backward", "no buffer for the pooled output"))?;
            let pooled = packed_out(&operands[1].dims, ptr);
            ops::pool_forward(stream, &views[0], &pooled, params)?;
            ops::pool_backward(stream, Some(&views[0]), Some(&pooled), &views[1], &y, params)?
        }
    }
    Ok(())
}

/// The engine dtype of operand `t` (the context's tensor): I32 or I64 for integer indices,
/// else the claim's float dtype.
fn operand_dtype(t: &TensorIr, float: DataType) -> DataType {
    match t.dtype {
        DType::I32 => DataType::I32,
        DType::I64 => DataType::I64,
        _ => float,
    }
}

/// Registers `out` as the node's output: packed row-major, on the inputs' client and device.
fn register_output(
    context: &mut Context<CubeFusionHandle>,
    client: &Client,
    device: CubeDevice,
    out: Handle,
    out_ir: &TensorIr,
    out_dims: &[usize],
) {
    context.handles.register_handle(
        out_ir.id,
        CubeFusionHandle {
            client: client.clone(),
            handle: out,
            device,
            dtype: out_ir.dtype,
            strides: Strides::new(&contiguous(out_dims)),
            tiles: None,
            qparams: None,
        },
    );
}
