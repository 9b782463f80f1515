//! Deformable 2-D convolution (forward and backward) on the device, composed from the
//! index kernels (each bilinear tap gathers its four neighbouring pixels; the input
//! gradient scatters back to them), elementwise kernels, reductions and cuDNN matmuls.
//! The formulas are burn-ndarray 0.21's (`ops/deform_conv.rs`: zero padding outside the
//! input, offsets laid out `(offset group, ky, kx, {y, x})`, masks `(offset group, ky, kx)`),
//! computed in f32 and cast back to the input dtype.

use burn_backend::ops::DeformConvOptions;
use burn_backend::DType;

use super::{arange, binary_into, conv_bias_backward, require_cudnn_float, sum_axis, sum_axis_into, view};
use crate::burn::exec;
use crate::burn::tensor::CudnnTensor;
use crate::error::{Error, Result};
use crate::ops;
use crate::ops::elementwise::{BinaryOp, UnaryOp};
use crate::ops::index as kindex;

/// Gradients of [`deform_conv2d`] (`mask` and `bias` only when those inputs were given).
pub(crate) struct DeformGrads {
    pub x: CudnnTensor,
    pub offset: CudnnTensor,
    pub weight: CudnnTensor,
    pub mask: Option<CudnnTensor>,
    pub bias: Option<CudnnTensor>,
}

/// Sizes of one deformable convolution.
#[derive(Clone, Copy, Debug)]
struct Geom {
    b: i64,
    c: i64,
    h: i64,
    w: i64,
    o: i64,
    kh: i64,
    kw: i64,
    oh: i64,
    ow: i64,
    /// Offset groups.
    g: i64,
    /// Weight groups.
    wg: i64,
}

impl Geom {
    fn new(
        op: &str,
        x: &CudnnTensor,
        offset: &CudnnTensor,
        weight: &CudnnTensor,
        o: &DeformConvOptions<2>,
    ) -> Result<Self> {
        let (xd, fd, wd) = (x.dims(), offset.dims(), weight.dims());
        if !(xd.len() == 4 && fd.len() == 4 && wd.len() == 4) {
            return Err(Error::invalid_input(
                op,
                format!("x {xd:?}, offset {fd:?} and weight {wd:?} must all be rank 4"),
            ));
        }
        let (g, wg) = (o.offset_groups as i64, o.weight_groups as i64);
        let (kh, kw) = (wd[2], wd[3]);
        let size = |a: usize, k: i64| {
            let (s, p, d) = (o.stride[a] as i64, o.padding[a] as i64, o.dilation[a] as i64);
            let num = xd[2 + a] + 2 * p - d * (k - 1) - 1;
            if num < 0 {
                return Err(Error::invalid_input(
                    op,
                    format!("the dilated kernel does not fit the padded input {xd:?}"),
                ));
            }
            Ok(num / s + 1)
        };
        let geom = Self {
            b: xd[0],
            c: xd[1],
            h: xd[2],
            w: xd[3],
            o: wd[0],
            kh,
            kw,
            oh: size(0, kh)?,
            ow: size(1, kw)?,
            g,
            wg,
        };
        if !(geom.c % g == 0 && geom.c % wg == 0 && geom.o % wg == 0 && wd[1] * wg == geom.c) {
            return Err(Error::invalid_input(op, format!("{} input channels, {} output channels and weight {wd:?} do not fit {wg} weight groups and {g} offset groups", geom.c, geom.o)));
        }
        let want = [geom.b, 2 * g * kh * kw, geom.oh, geom.ow];
        if fd != want {
            return Err(Error::invalid_input(op, format!("offset {fd:?} must be {want:?}")));
        }
        Ok(geom)
    }

    /// Kernel taps.
    fn k(&self) -> i64 {
        self.kh * self.kw
    }

    /// Output positions per image.
    fn l(&self) -> i64 {
        self.oh * self.ow
    }
}

/// `t` converted to f32 (a view when it already is).
fn f32(t: CudnnTensor, op: &str) -> Result<CudnnTensor> {
    exec::cast(t, DType::F32, op)
}

/// `[0 <= q < size]` as 0/1 for integer-valued `q`: `clamp(q + 1, 0, 1) · clamp(size - q, 0, 1)`.
fn inside(q: &CudnnTensor, size: i64, op: &str) -> Result<CudnnTensor> {
    let clamp01 = UnaryOp::Clamp { min: 0.0, max: 1.0 };
    let lo = exec::unary(q.clone(), UnaryOp::AddScalar(1.0), op)?;
    let lo = exec::unary(lo, clamp01, op)?;
    let hi = exec::unary(q.clone(), UnaryOp::MulScalar(-1.0), op)?;
    let hi = exec::unary(hi, UnaryOp::AddScalar(size as f64), op)?;
    let hi = exec::unary(hi, clamp01, op)?;
    exec::binary(lo, hi, BinaryOp::Mul, op)
}

/// `1 - t`.
fn one_minus(t: &CudnnTensor, op: &str) -> Result<CudnnTensor> {
    let r = exec::unary(t.clone(), UnaryOp::MulScalar(-1.0), op)?;
    exec::unary(r, UnaryOp::AddScalar(1.0), op)
}

fn mul(a: &CudnnTensor, b: &CudnnTensor, op: &str) -> Result<CudnnTensor> {
    exec::binary(a.clone(), b.clone(), BinaryOp::Mul, op)
}

/// One of the four bilinear neighbours of every sampling point. Tensors are
/// `[B, G, 1, K·L]` (broadcast over the channels of an offset group).
struct Tap {
    /// Flat `y · W + x` pixel index (I64), clamped into the image (out-of-image taps have
    /// zero weights).
    index: CudnnTensor,
    /// Bilinear weight, zero outside the image.
    weight: CudnnTensor,
    /// Coefficients of the pixel in the sample's derivative along y and along x.
    dy: Option<CudnnTensor>,
    dx: Option<CudnnTensor>,
}

/// Sampling coordinates (y, x) in pixels, each `[B, G, KH, KW, OH, OW]`:
/// `o · stride + k · dilation - padding + offset`.
fn coords(offset: &CudnnTensor, geo: &Geom, o: &DeformConvOptions<2>, op: &str) -> Result<(CudnnTensor, CudnnTensor)> {
    let off = offset
        .clone()
        .reshape(&[geo.b, geo.g, geo.kh, geo.kw, 2, geo.oh, geo.ow])?;
    let dev = offset.device();
    let axis_coord = |dir: i64| {
        let a = dir as usize;
        let part = view(&off, op, |l| l.slice(4, dir, dir + 1, 1)?.squeeze(4))?;
        let (k, n) = if a == 0 { (geo.kh, geo.oh) } else { (geo.kw, geo.ow) };
        let kk = arange(dev, k, DType::F32, op)?;
        let kk = exec::unary(kk, UnaryOp::MulScalar(o.dilation[a] as f64), op)?;
        let pos = arange(dev, n, DType::F32, op)?;
        let pos = exec::unary(pos, UnaryOp::MulScalar(o.stride[a] as f64), op)?;
        let pos = exec::unary(pos, UnaryOp::AddScalar(-(o.padding[a] as f64)), op)?;
        let (kd, pd) = if a == 0 {
            ([1, 1, k, 1, 1, 1], [1, 1, 1, 1, n, 1])
        } else {
            ([1, 1, 1, k, 1, 1], [1, 1, 1, 1, 1, n])
        };
        let c = exec::binary(part, kk.reshape(&kd)?, BinaryOp::Add, op)?;
        exec::binary(c, pos.reshape(&pd)?, BinaryOp::Add, op)
    };
    Ok((axis_coord(0)?, axis_coord(1)?))
}

/// The four bilinear taps of every sampling point (order (y0, x0), (y0, x1), (y1, x0),
/// (y1, x1)), with the derivative coefficients when `grads`.
fn taps(y: CudnnTensor, x: CudnnTensor, geo: &Geom, grads: bool, op: &str) -> Result<Vec<Tap>> {
    let y0 = exec::unary(y.clone(), UnaryOp::Floor, op)?;
    let x0 = exec::unary(x.clone(), UnaryOp::Floor, op)?;
    let ly = exec::binary(y, y0.clone(), BinaryOp::Sub, op)?;
    let lx = exec::binary(x, x0.clone(), BinaryOp::Sub, op)?;
    let y1 = exec::unary(y0.clone(), UnaryOp::AddScalar(1.0), op)?;
    let x1 = exec::unary(x0.clone(), UnaryOp::AddScalar(1.0), op)?;
    let vy = [inside(&y0, geo.h, op)?, inside(&y1, geo.h, op)?];
    let vx = [inside(&x0, geo.w, op)?, inside(&x1, geo.w, op)?];
    // Interpolation weights along each axis (without and with validity).
    let wyd = [one_minus(&ly, op)?, ly];
    let wxd = [one_minus(&lx, op)?, lx];
    let wy = [mul(&wyd[0], &vy[0], op)?, mul(&wyd[1], &vy[1], op)?];
    let wx = [mul(&wxd[0], &vx[0], op)?, mul(&wxd[1], &vx[1], op)?];
    // Flat index of (y0, x0).
    let yi = exec::cast(y0, DType::I64, op)?;
    let yi = exec::unary(yi, UnaryOp::MulScalar(geo.w as f64), op)?;
    let base = exec::binary(yi, exec::cast(x0, DType::I64, op)?, BinaryOp::Add, op)?;
    let flat = |t: CudnnTensor| t.reshape(&[geo.b, geo.g, 1, geo.k() * geo.l()]);
    let mut out = Vec::with_capacity(4);
    for a in 0..2 {
        for b in 0..2 {
            let index = exec::unary(
                base.clone(),
                UnaryOp::AddScalar((a as i64 * geo.w + b as i64) as f64),
                op,
            )?;
            let index = exec::unary(
                index,
                UnaryOp::Clamp {
                    min: 0.0,
                    max: (geo.h * geo.w - 1).max(0) as f64,
                },
                op,
            )?;
            let weight = mul(&wy[a], &wx[b], op)?;
            let (dy, dx) = if grads {
                // d/dy: ±(x weight) on the valid pixel; d/dx: ±(y weight).
                let valid = mul(&vy[a], &vx[b], op)?;
                let sy = if a == 1 { 1.0 } else { -1.0 };
                let sx = if b == 1 { 1.0 } else { -1.0 };
                let cy = exec::unary(mul(&wxd[b], &valid, op)?, UnaryOp::MulScalar(sy), op)?;
                let cx = exec::unary(mul(&wyd[a], &valid, op)?, UnaryOp::MulScalar(sx), op)?;
                (Some(flat(cy)?), Some(flat(cx)?))
            } else {
                (None, None)
            };
            out.push(Tap {
                index: flat(index)?,
                weight: flat(weight)?,
                dy,
                dx,
            });
        }
    }
    Ok(out)
}

/// The pixels of `x4 [B, G, Cg, H·W]` at a tap, into `dst [B, G, Cg, K·L]`.
fn gather(x4: &CudnnTensor, tap: &Tap, dst: &CudnnTensor, op: &str) -> Result<()> {
    let idx = exec::expand(tap.index.clone(), dst.dims(), op)?;
    kindex::gather(dst.stream(), &x4.tref(), 3, &idx.tref(), &dst.tmut())?;
    Ok(())
}

/// `acc += v · coef` (`acc` created on first use; `tmp` is scratch of `v`'s dims).
fn accumulate(
    acc: &mut Option<CudnnTensor>,
    v: &CudnnTensor,
    coef: &CudnnTensor,
    tmp: &CudnnTensor,
    op: &str,
) -> Result<()> {
    match acc {
        None => {
            let t = v.empty_like(v.dtype, op)?;
            binary_into(v, coef, BinaryOp::Mul, &t, op)?;
            *acc = Some(t);
        }
        Some(a) => {
            binary_into(v, coef, BinaryOp::Mul, tmp, op)?;
            binary_into(a, tmp, BinaryOp::Add, a, op)?;
        }
    }
    Ok(())
}

/// The f32 inputs shared by forward and backward: `x` as `[B, G, Cg, H·W]`, the taps,
/// and the mask as `[B, G, 1, K·L]`.
fn prepare(
    op: &str,
    x: CudnnTensor,
    offset: CudnnTensor,
    mask: Option<CudnnTensor>,
    geo: &Geom,
    o: &DeformConvOptions<2>,
    grads: bool,
) -> Result<(CudnnTensor, Vec<Tap>, Option<CudnnTensor>)> {
    let x4 = f32(x, op)?.reshape(&[geo.b, geo.g, geo.c / geo.g, geo.h * geo.w])?;
    let (y, xc) = coords(&f32(offset, op)?, geo, o, op)?;
    let taps = taps(y, xc, geo, grads, op)?;
    let mask = mask.map(|m| {
        let want = [geo.b, geo.g * geo.k(), geo.oh, geo.ow];
        if m.dims() != want {
            return Err(Error::invalid_input(
                op,
                format!("mask {:?} must be {want:?}", m.dims()),
            ));
        }
        f32(m, op)?.reshape(&[geo.b, geo.g, 1, geo.k() * geo.l()])
    });
    Ok((x4, taps, mask.transpose()?))
}

/// The weight (f32) as `[1, WG, O / WG, (C / WG)·K]`.
fn weight_matrix(weight: CudnnTensor, geo: &Geom, op: &str) -> Result<CudnnTensor> {
    let cwk = (geo.c / geo.wg) * geo.k();
    f32(weight, op)?
        .reshape(&[1, geo.wg, geo.o / geo.wg, cwk])?
        .cudnn_ready()
}

/// The error for a sum over bilinear taps that had none, or lacked their derivatives
/// (`prepare` makes four, with derivatives when asked): a broken invariant, as an error.
fn no_taps(op: &str) -> Error {
    Error::invalid_input(op, "internal error: the bilinear taps or their derivatives are missing")
}

/// Deformable convolution: every output position samples the input bilinearly at its
/// kernel taps displaced by `offset` (times `mask`), then one matmul with the weight.
pub(crate) fn deform_conv2d(
    x: CudnnTensor,
    offset: CudnnTensor,
    weight: CudnnTensor,
    mask: Option<CudnnTensor>,
    bias: Option<CudnnTensor>,
    o: &DeformConvOptions<2>,
) -> Result<CudnnTensor> {
    const OP: &str = "deform_conv2d";
    require_cudnn_float(OP, &x)?;
    exec::check_same_device(OP, &x, &offset)?;
    exec::check_same_device(OP, &x, &weight)?;
    let dtype = x.dtype;
    let geo = Geom::new(OP, &x, &offset, &weight, o)?;
    let (x4, taps, mask) = prepare(OP, x, offset, mask, &geo, o, false)?;
    let cols_dims = [geo.b, geo.g, geo.c / geo.g, geo.k() * geo.l()];
    let sample = x4.empty_on(&cols_dims, DType::F32, OP)?;
    let tmp = x4.empty_on(&cols_dims, DType::F32, OP)?;
    let mut cols = None;
    for tap in &taps {
        gather(&x4, tap, &sample, OP)?;
        accumulate(&mut cols, &sample, &tap.weight, &tmp, OP)?;
    }
    drop((sample, tmp));
    let mut cols = cols.ok_or_else(|| no_taps(OP))?;
    if let Some(m) = &mask {
        binary_into(&cols, m, BinaryOp::Mul, &cols, OP)?;
    }
    let cwk = (geo.c / geo.wg) * geo.k();
    cols = cols.reshape(&[geo.b, geo.wg, cwk, geo.l()])?;
    let w = weight_matrix(weight, &geo, OP)?;
    let out = cols.empty_on(&[geo.b, geo.wg, geo.o / geo.wg, geo.l()], DType::F32, OP)?;
    ops::matmul(out.stream(), &w.tref(), &cols.tref(), &out.tmut())?;
    let mut out = out.reshape(&[geo.b, geo.o, geo.oh, geo.ow])?;
    if let Some(b) = bias {
        let b = f32(b, OP)?.reshape(&[1, geo.o, 1, 1])?;
        out = exec::binary(out, b, BinaryOp::Add, OP)?;
    }
    exec::cast(out, dtype, OP)
}

/// Gradients of [`deform_conv2d`] with respect to every input, from `dy [B, O, OH, OW]`.
pub(crate) fn deform_conv2d_backward(
    x: CudnnTensor,
    offset: CudnnTensor,
    weight: CudnnTensor,
    mask: Option<CudnnTensor>,
    bias: Option<CudnnTensor>,
    dy: CudnnTensor,
    o: &DeformConvOptions<2>,
) -> Result<DeformGrads> {
    const OP: &str = "deform_conv2d_backward";
    require_cudnn_float(OP, &x)?;
    exec::check_same_device(OP, &x, &dy)?;
    let dtype = x.dtype;
    let geo = Geom::new(OP, &x, &offset, &weight, o)?;
    let (cg, kl, cwk, ow_g) = (
        geo.c / geo.g,
        geo.k() * geo.l(),
        (geo.c / geo.wg) * geo.k(),
        geo.o / geo.wg,
    );
    let has_mask = mask.is_some();
    let (x4, taps, mask) = prepare(OP, x, offset, mask, &geo, o, true)?;
    let dy = f32(dy, OP)?;
    let bias_grad = bias
        .map(|_| exec::cast(conv_bias_backward(OP, dy.clone())?, dtype, OP))
        .transpose()?;
    let dy4 = dy.reshape(&[geo.b, geo.wg, ow_g, geo.l()])?.cudnn_ready()?;

    // Column gradient: wᵀ · dy, [B, WG, (C / WG)·K, L] = [B, G, Cg, K·L].
    let wt = view(&weight_matrix(weight, &geo, OP)?, OP, |l| l.transpose(2, 3))?;
    let dcols = dy4.empty_on(&[geo.b, geo.wg, cwk, geo.l()], DType::F32, OP)?;
    ops::matmul(dcols.stream(), &wt.tref(), &dy4.tref(), &dcols.tmut())?;
    let dcols = dcols.reshape(&[geo.b, geo.g, cg, kl])?;
    // What reaches the samples: mask · dcols.
    let p = match &mask {
        Some(m) => mul(&dcols, m, OP)?,
        None => dcols.clone(),
    };

    // Per tap: samples, their y/x derivatives, and the input gradient (scatter).
    let dims = [geo.b, geo.g, cg, kl];
    let sample = x4.empty_on(&dims, DType::F32, OP)?;
    let tmp = x4.empty_on(&dims, DType::F32, OP)?;
    let dx = exec::full(x4.device(), x4.dims(), DType::F32, 0.0, OP)?;
    let (mut sampled, mut gy, mut gx) = (None, None, None);
    for tap in &taps {
        gather(&x4, tap, &sample, OP)?;
        accumulate(&mut sampled, &sample, &tap.weight, &tmp, OP)?;
        accumulate(&mut gy, &sample, tap.dy.as_ref().ok_or_else(|| no_taps(OP))?, &tmp, OP)?;
        accumulate(&mut gx, &sample, tap.dx.as_ref().ok_or_else(|| no_taps(OP))?, &tmp, OP)?;
        binary_into(&p, &tap.weight, BinaryOp::Mul, &tmp, OP)?;
        let idx = exec::expand(tap.index.clone(), &dims, OP)?;
        kindex::scatter_add(dx.stream(), &dx.tmut(), 3, &idx.tref(), &tmp.tref())?;
    }
    drop((sample, tmp, taps));
    let (sampled, gy, gx) = (
        sampled.ok_or_else(|| no_taps(OP))?,
        gy.ok_or_else(|| no_taps(OP))?,
        gx.ok_or_else(|| no_taps(OP))?,
    );

    // Offset gradient [B, G, KH, KW, {y, x}, OH, OW]: Σ over the group's channels.
    let og = x4.empty_on(&[geo.b, geo.g, geo.kh, geo.kw, 2, geo.oh, geo.ow], DType::F32, OP)?;
    let full = [geo.b, geo.g, cg, geo.kh, geo.kw, geo.oh, geo.ow];
    for (dir, g) in [(0i64, gy), (1, gx)] {
        let prod = exec::binary(g, p.clone(), BinaryOp::Mul, OP)?.reshape(&full)?;
        let dst = view(&og, OP, |l| l.slice(4, dir, dir + 1, 1)?.squeeze(4)?.unsqueeze(2))?;
        sum_axis_into(&prod, 2, &dst, OP)?;
    }
    let offset_grad = og.reshape(&[geo.b, 2 * geo.g * geo.k(), geo.oh, geo.ow])?;

    // Mask gradient: Σ over the group's channels of dcols · sample.
    let mask_grad = has_mask.then(|| {
        let prod = mul(&dcols, &sampled, OP)?;
        sum_axis(&prod, 2, OP)?.reshape(&[geo.b, geo.g * geo.k(), geo.oh, geo.ow])
    });
    let mask_grad = mask_grad.transpose()?;

    // Weight gradient: Σ_b dy[b] · cols[b]ᵀ with cols = mask · sampled.
    let cols = match &mask {
        Some(m) => exec::binary(sampled, m.clone(), BinaryOp::Mul, OP)?,
        None => sampled,
    };
    let cols_t = view(&cols.reshape(&[geo.b, geo.wg, cwk, geo.l()])?, OP, |l| {
        l.transpose(2, 3)
    })?;
    let dwb = dy4.empty_on(&[geo.b, geo.wg, ow_g, cwk], DType::F32, OP)?;
    ops::matmul(dwb.stream(), &dy4.tref(), &cols_t.tref(), &dwb.tmut())?;
    let dw = if geo.b == 1 { dwb } else { sum_axis(&dwb, 0, OP)? };
    let weight_grad = dw.reshape(&[geo.o, geo.c / geo.wg, geo.kh, geo.kw])?;

    let back = |t: CudnnTensor| exec::cast(t, dtype, OP);
    Ok(DeformGrads {
        x: back(dx.reshape(&[geo.b, geo.c, geo.h, geo.w])?)?,
        offset: back(offset_grad)?,
        weight: back(weight_grad)?,
        mask: mask_grad.map(back).transpose()?,
        bias: bias_grad,
    })
}
