//! Max and average pooling, forward and backward.

use candle_core::backend::BackendStorage;
#[cfg(feature = "candle-cuda")]
use candle_core::CudaStorage;
use candle_core::{CpuStorage, CustomOp1, CustomOp3, DType, Layout, Result, Shape, Tensor};

use super::{idims, in_format, is_channels_last, logical, packed, physical_dims, same_dtype};
#[cfg(feature = "candle-cuda")]
use crate::candle::cuda;
use crate::candle::{arg_err, cpu};
use crate::ops::{PoolMode, PoolParams};
use cudnn_backend_reference as reference;

fn geometry(p: &PoolParams) -> reference::PoolGeometry {
    let u = |v: &[i64]| v.iter().map(|&x| x as usize).collect::<Vec<_>>();
    reference::PoolGeometry {
        window: u(&p.window),
        stride: u(&p.stride),
        pre_padding: u(&p.pre_padding),
        post_padding: u(&p.post_padding),
        mode: match p.mode {
            PoolMode::Max => reference::PoolMode::Max,
            PoolMode::AvgIncludePadding => reference::PoolMode::AvgIncludePadding,
            PoolMode::AvgExcludePadding => reference::PoolMode::AvgExcludePadding,
        },
    }
}

/// Validates pooling `x` and returns y's logical dims.
pub(crate) fn pool_out_dims(op: &'static str, p: &PoolParams, x: &[usize]) -> Result<Vec<usize>> {
    if !(1..=3).contains(&p.window.len()) {
        return Err(arg_err(op, "params", "1, 2 or 3 spatial dims are supported"));
    }
    let y = p.output_dims(&idims(x)).map_err(candle_core::Error::wrap)?;
    if p.pre_padding != p.post_padding {
        return Err(arg_err(op, "padding", "pooling needs symmetric padding"));
    }
    if p.pre_padding.iter().zip(&p.window).any(|(&pad, &k)| pad >= k) {
        return Err(arg_err(
            op,
            "padding",
            format!(
                "padding {:?} must be smaller than the window {:?}",
                p.pre_padding, p.window
            ),
        ));
    }
    Ok(cpu::udims(&y))
}

fn finish_cpu(op: &'static str, v: Vec<f64>, dims: &[usize], cl: bool, dtype: DType) -> Result<(CpuStorage, Shape)> {
    let v = cpu::to_physical(v, dims, cl);
    Ok((cpu::write(op, &v, dtype)?, physical_dims(dims, cl).into()))
}

/// `y = pool(x)` (max or average, any number of spatial dims). Input: x (N, C, spatial...).
#[derive(Clone, Debug)]
pub struct Pool {
    /// Mode, window, stride, padding.
    pub params: PoolParams,
    /// Produce the output channels-last.
    pub channels_last: bool,
}

impl CustomOp1 for Pool {
    fn name(&self) -> &'static str {
        "cudnn-pool"
    }

    fn cpu_fwd(&self, xs: &CpuStorage, xl: &Layout) -> Result<(CpuStorage, Shape)> {
        const OP: &str = "candle pool";
        let y = pool_out_dims(OP, &self.params, xl.dims())?;
        let out = if y.contains(&0) {
            Vec::new()
        } else {
            reference::pool_forward(&cpu::read(OP, "x", xs, xl)?, xl.dims(), &geometry(&self.params))
        };
        finish_cpu(OP, out, &y, self.channels_last, xs.dtype())
    }

    #[cfg(feature = "candle-cuda")]
    fn cuda_fwd(&self, xs: &CudaStorage, xl: &Layout) -> Result<(CudaStorage, Shape)> {
        const OP: &str = "candle pool";
        let y = pool_out_dims(OP, &self.params, xl.dims())?;
        let stream = cuda::stream(xs);
        let x = cuda::input(OP, "x", xs, xl, &stream)?;
        let strides = super::packed_strides(&y, self.channels_last);
        let out = cuda::with_output(OP, &xs.device, &stream, x.dtype(), &idims(&y), &strides, |yr| {
            crate::ops::pool_forward(&stream, &x, yr, &self.params)
        })?;
        Ok((out, physical_dims(&y, self.channels_last).into()))
    }

    fn bwd(&self, x: &Tensor, res: &Tensor, grad: &Tensor) -> Result<Option<Tensor>> {
        let g = logical(grad.clone(), self.channels_last)?;
        let dx = match self.params.mode {
            PoolMode::Max => {
                let y = logical(res.clone(), self.channels_last)?;
                pool_backward(Some(x), Some(&y), &g, x.dims(), &self.params)?
            }
            _ => pool_backward(None, None, &g, x.dims(), &self.params)?,
        };
        Ok(Some(dx))
    }
}

/// Max-pooling backward: `dx` from the forward's x and y and the output gradient dy
/// (the whole gradient of a window goes to its maximum). Inputs: x, y, dy.
#[derive(Clone, Debug)]
pub struct PoolBackwardMax {
    /// The forward's parameters (mode `Max`).
    pub params: PoolParams,
    /// Produce dx channels-last.
    pub channels_last: bool,
}

impl PoolBackwardMax {
    fn check(&self, op: &'static str, x: &[usize], y: &[usize], dy: &[usize]) -> Result<()> {
        let expect = pool_out_dims(op, &self.params, x)?;
        if expect != y || y != dy {
            return Err(arg_err(
                op,
                "dy",
                format!("x {x:?} pools to {expect:?}, got y {y:?} and dy {dy:?}"),
            ));
        }
        Ok(())
    }
}

impl CustomOp3 for PoolBackwardMax {
    fn name(&self) -> &'static str {
        "cudnn-max-pool-backward"
    }

    fn cpu_fwd(
        &self,
        xs: &CpuStorage,
        xl: &Layout,
        ys: &CpuStorage,
        yl: &Layout,
        ds: &CpuStorage,
        dl: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        const OP: &str = "candle max_pool_backward";
        self.check(OP, xl.dims(), yl.dims(), dl.dims())?;
        same_dtype(OP, &[("x", xs.dtype()), ("y", ys.dtype()), ("dy", ds.dtype())])?;
        let out = if xl.dims().contains(&0) {
            Vec::new()
        } else {
            let (x, dy) = (cpu::read(OP, "x", xs, xl)?, cpu::read(OP, "dy", ds, dl)?);
            reference::pool_backward(&x, xl.dims(), &dy, &geometry(&self.params))
        };
        finish_cpu(OP, out, xl.dims(), self.channels_last, xs.dtype())
    }

    #[cfg(feature = "candle-cuda")]
    fn cuda_fwd(
        &self,
        xs: &CudaStorage,
        xl: &Layout,
        ys: &CudaStorage,
        yl: &Layout,
        ds: &CudaStorage,
        dl: &Layout,
    ) -> Result<(CudaStorage, Shape)> {
        const OP: &str = "candle max_pool_backward";
        self.check(OP, xl.dims(), yl.dims(), dl.dims())?;
        same_dtype(OP, &[("x", xs.dtype()), ("y", ys.dtype()), ("dy", ds.dtype())])?;
        let stream = cuda::stream(xs);
        let x = cuda::input(OP, "x", xs, xl, &stream)?;
        let y = cuda::input(OP, "y", ys, yl, &stream)?;
        let dy = cuda::input(OP, "dy", ds, dl, &stream)?;
        let xd = xl.dims();
        let strides = super::packed_strides(xd, self.channels_last);
        let out = cuda::with_output(OP, &xs.device, &stream, x.dtype(), &idims(xd), &strides, |dx| {
            crate::ops::pool_backward(&stream, Some(&x), Some(&y), &dy, dx, &self.params)
        })?;
        Ok((out, physical_dims(xd, self.channels_last).into()))
    }
}

/// Average-pooling backward: spreads dy over each window with the forward's divisor.
/// Input: dy.
#[derive(Clone, Debug)]
pub struct PoolBackwardAvg {
    /// The forward's parameters (an average mode).
    pub params: PoolParams,
    /// Logical dims of x (and so of dx).
    pub x_dims: Vec<usize>,
    /// Produce dx channels-last.
    pub channels_last: bool,
}

impl PoolBackwardAvg {
    fn check(&self, op: &'static str, dy: &[usize]) -> Result<()> {
        let expect = pool_out_dims(op, &self.params, &self.x_dims)?;
        if expect != dy {
            return Err(arg_err(
                op,
                "dy",
                format!("x {:?} pools to {expect:?}, got dy {dy:?}", self.x_dims),
            ));
        }
        Ok(())
    }
}

impl CustomOp1 for PoolBackwardAvg {
    fn name(&self) -> &'static str {
        "cudnn-avg-pool-backward"
    }

    fn cpu_fwd(&self, ds: &CpuStorage, dl: &Layout) -> Result<(CpuStorage, Shape)> {
        const OP: &str = "candle avg_pool_backward";
        self.check(OP, dl.dims())?;
        let xd = &self.x_dims;
        let out = if xd.contains(&0) {
            Vec::new()
        } else {
            let x = vec![0.0; xd.iter().product()];
            let dy = cpu::read(OP, "dy", ds, dl)?;
            reference::pool_backward(&x, xd, &dy, &geometry(&self.params))
        };
        finish_cpu(OP, out, xd, self.channels_last, ds.dtype())
    }

    #[cfg(feature = "candle-cuda")]
    fn cuda_fwd(&self, ds: &CudaStorage, dl: &Layout) -> Result<(CudaStorage, Shape)> {
        const OP: &str = "candle avg_pool_backward";
        self.check(OP, dl.dims())?;
        let stream = cuda::stream(ds);
        let dy = cuda::input(OP, "dy", ds, dl, &stream)?;
        let xd = &self.x_dims;
        let strides = super::packed_strides(xd, self.channels_last);
        let out = cuda::with_output(OP, &ds.device, &stream, dy.dtype(), &idims(xd), &strides, |dx| {
            crate::ops::pool_backward(&stream, None, None, &dy, dx, &self.params)
        })?;
        Ok((out, physical_dims(xd, self.channels_last).into()))
    }

    fn bwd(&self, _dy: &Tensor, _res: &Tensor, grad: &Tensor) -> Result<Option<Tensor>> {
        // Linear in dy: the adjoint is the average-pooling forward.
        let g = logical(grad.clone(), self.channels_last)?;
        Ok(Some(pool(&g, &self.params)?))
    }
}

/// `y = pool(x)` with autograd (max or average; x (N, C, spatial...), symmetric padding
/// smaller than the window). A channels-last x gives a channels-last y.
pub fn pool(x: &Tensor, p: &PoolParams) -> Result<Tensor> {
    pool_out_dims("pool", p, x.dims())?;
    let x = packed(x)?;
    let cl = is_channels_last(x.layout());
    let op = Pool {
        params: p.clone(),
        channels_last: cl,
    };
    logical(x.apply_op1(op)?, cl)
}

/// `dx = pool_backward(dy)`: max pooling needs the forward's `x` and `y`; average pooling
/// takes `None` for both. `x_dims` are the forward input's dims.
pub fn pool_backward(
    x: Option<&Tensor>,
    y: Option<&Tensor>,
    dy: &Tensor,
    x_dims: &[usize],
    p: &PoolParams,
) -> Result<Tensor> {
    match (p.mode, x, y) {
        (PoolMode::Max, Some(x), Some(y)) => {
            let x = packed(x)?;
            let cl = is_channels_last(x.layout());
            let (y, dy) = (in_format(y, cl)?, in_format(dy, cl)?);
            let op = PoolBackwardMax {
                params: p.clone(),
                channels_last: cl,
            };
            op.check("max_pool_backward", x.dims(), y.dims(), dy.dims())?;
            logical(x.apply_op3_no_bwd(&y, &dy, &op)?, cl)
        }
        (PoolMode::Max, _, _) => Err(arg_err(
            "pool_backward",
            "x",
            "max pooling backward needs the forward's x and y",
        )),
        _ => {
            let dy = packed(dy)?;
            let cl = is_channels_last(dy.layout());
            let op = PoolBackwardAvg {
                params: p.clone(),
                x_dims: x_dims.to_vec(),
                channels_last: cl,
            };
            op.check("avg_pool_backward", dy.dims())?;
            logical(dy.apply_op1(op)?, cl)
        }
    }
}
