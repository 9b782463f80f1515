//! cuDNN's legacy pooling API, used when no graph engine supports a pooling graph
//! (e.g. NCHW resample, or resample backward) — the "fallback path" of the plan layer.

use std::ffi::c_void;

use super::api::{api, CudnnApi};
use super::CudnnHandle;
use crate::error::{Error, Result};

/// Legacy pooling modes (`cudnnPoolingMode_t` values).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum LegacyPoolMode {
    Max = 0,
    AvgIncludePadding = 1,
    AvgExcludePadding = 2,
    /// Max pooling whose backward pass is bitwise reproducible.
    MaxDeterministic = 3,
}

/// One pooling problem in legacy-API terms. Dims and strides include N and C; spatial rank
/// 1 is lifted to 2 (a unit height) because the legacy API needs 4-D tensors.
pub(crate) struct LegacyPooling {
    pub x_dims: Vec<i64>,
    pub x_strides: Vec<i64>,
    pub y_dims: Vec<i64>,
    pub y_strides: Vec<i64>,
    pub data_type: u32,
    pub mode: LegacyPoolMode,
    pub window: Vec<i64>,
    pub padding: Vec<i64>,
    pub stride: Vec<i64>,
}

struct TensorDesc(*mut c_void, &'static CudnnApi);
impl Drop for TensorDesc {
    fn drop(&mut self) {
        // SAFETY: created by cudnnCreateTensorDescriptor, destroyed once.
        let _ = unsafe { (self.1.destroy_tensor_desc)(self.0) };
    }
}
struct PoolDesc(*mut c_void, &'static CudnnApi);
impl Drop for PoolDesc {
    fn drop(&mut self) {
        // SAFETY: created by cudnnCreatePoolingDescriptor, destroyed once.
        let _ = unsafe { (self.1.destroy_pooling_desc)(self.0) };
    }
}

fn to_i32(v: &[i64], what: &'static str) -> Result<Vec<i32>> {
    v.iter()
        .map(|&x| i32::try_from(x).map_err(|_| Error::invalid_arg("legacy pooling", what, format!("{x} exceeds i32"))))
        .collect()
}

fn lift(dims: &[i64], strides: &[i64]) -> (Vec<i64>, Vec<i64>) {
    if dims.len() == 3 {
        // N, C, W -> N, C, 1, W
        (
            vec![dims[0], dims[1], 1, dims[2]],
            vec![strides[0], strides[1], strides[2] * dims[2], strides[2]],
        )
    } else {
        (dims.to_vec(), strides.to_vec())
    }
}

fn tensor(api: &'static CudnnApi, dt: u32, dims: &[i64], strides: &[i64]) -> Result<TensorDesc> {
    let (d, s) = lift(dims, strides);
    let (d, s) = (to_i32(&d, "dims")?, to_i32(&s, "strides")?);
    let mut raw = std::ptr::null_mut();
    // SAFETY: valid out-pointer.
    api.check(
        unsafe { (api.create_tensor_desc)(&mut raw) },
        "cudnnCreateTensorDescriptor",
    )?;
    let desc = TensorDesc(raw, api);
    // SAFETY: `d` and `s` hold `d.len()` elements each.
    let st = unsafe { (api.set_tensor_nd)(raw, dt, d.len() as i32, d.as_ptr(), s.as_ptr()) };
    api.check(st, "cudnnSetTensorNdDescriptor")?;
    Ok(desc)
}

impl LegacyPooling {
    fn descriptors(&self) -> Result<(TensorDesc, TensorDesc, PoolDesc)> {
        let api = api()?;
        let x = tensor(api, self.data_type, &self.x_dims, &self.x_strides)?;
        let y = tensor(api, self.data_type, &self.y_dims, &self.y_strides)?;
        let (mut w, mut p, mut s) = (self.window.clone(), self.padding.clone(), self.stride.clone());
        if w.len() == 1 {
            w.insert(0, 1);
            p.insert(0, 0);
            s.insert(0, 1);
        }
        let (w, p, s) = (to_i32(&w, "window")?, to_i32(&p, "padding")?, to_i32(&s, "stride")?);
        let mut raw = std::ptr::null_mut();
        // SAFETY: valid out-pointer.
        api.check(
            unsafe { (api.create_pooling_desc)(&mut raw) },
            "cudnnCreatePoolingDescriptor",
        )?;
        let pool = PoolDesc(raw, api);
        // SAFETY: the three arrays hold `w.len()` elements each; NaN propagation = 1.
        let st = unsafe {
            (api.set_pooling_nd)(
                raw,
                self.mode as u32,
                1,
                w.len() as i32,
                w.as_ptr(),
                p.as_ptr(),
                s.as_ptr(),
            )
        };
        api.check(st, "cudnnSetPoolingNdDescriptor")?;
        Ok((x, y, pool))
    }

    /// y = pool(x) on the handle's stream.
    pub(crate) fn forward(&self, handle: &CudnnHandle, x: u64, y: u64) -> Result<()> {
        let api = api()?;
        let (xd, yd, pd) = self.descriptors()?;
        let (alpha, beta) = (1.0f32, 0.0f32);
        // SAFETY: descriptors are live; x and y are device buffers matching them (validated
        // by the caller); alpha/beta are host floats as cuDNN requires for non-double data.
        let st = unsafe {
            (api.pooling_forward)(
                handle.raw(),
                pd.0,
                (&alpha as *const f32).cast(),
                xd.0,
                x as *const c_void,
                (&beta as *const f32).cast(),
                yd.0,
                y as *mut c_void,
            )
        };
        api.check(st, "cudnnPoolingForward")
    }

    /// dx = pool_backward(x, y, dy) on the handle's stream.
    pub(crate) fn backward(&self, handle: &CudnnHandle, x: u64, y: u64, dy: u64, dx: u64) -> Result<()> {
        let api = api()?;
        let (xd, yd, pd) = self.descriptors()?;
        let (alpha, beta) = (1.0f32, 0.0f32);
        // SAFETY: as in `forward`; dy shares y's descriptor and dx shares x's.
        let st = unsafe {
            (api.pooling_backward)(
                handle.raw(),
                pd.0,
                (&alpha as *const f32).cast(),
                yd.0,
                y as *const c_void,
                yd.0,
                dy as *const c_void,
                xd.0,
                x as *const c_void,
                (&beta as *const f32).cast(),
                xd.0,
                dx as *mut c_void,
            )
        };
        api.check(st, "cudnnPoolingBackward")
    }
}
