//! Real discrete Fourier transforms (`rfft`, `irfft`) with PyTorch's conventions
//! (`torch.fft.rfft` / `irfft`, norm "backward"), as matmuls of the signal against cos/sin
//! matrices built on the device. The matmuls run on the exact GEMM kernel
//! ([`linalg::matmul`]: f64 products and sums, no TF32), so F32 transforms carry only the
//! twiddles' f32 rounding; F64 is supported too. O(n²) work; the matrices are generated in
//! column blocks of at most [`MAX_BLOCK`] elements so memory stays bounded for long
//! signals.

use std::f64::consts::PI;

use burn_backend::DType;

use super::{arange, check_pair, fill, narrow, require_float, view};
use crate::burn::exec;
use crate::burn::tensor::CudnnTensor;
use crate::error::{Error, InOp, Result};
use crate::ops::elementwise::{BinaryOp, UnaryOp};
use crate::ops::linalg;

/// Most elements of one generated twiddle block.
const MAX_BLOCK: i64 = 1 << 24;

/// `t` with axis `dim` moved last (a view) and the permutation that undoes it.
fn move_last(t: &CudnnTensor, dim: usize, op: &str) -> Result<(CudnnTensor, Vec<usize>)> {
    let r = t.rank();
    if dim >= r {
        return Err(Error::invalid_input(op, format!("dim {dim} out of range for rank {r}")));
    }
    let mut perm: Vec<usize> = (0..r).filter(|&i| i != dim).collect();
    perm.push(dim);
    let mut inv = vec![0usize; r];
    for (i, &p) in perm.iter().enumerate() {
        inv[p] = i;
    }
    Ok((view(t, op, |l| l.permute(&perm))?, inv))
}

/// The last axis of `t` truncated or zero-padded to `n` (a view when truncating).
fn fit_last(t: CudnnTensor, n: i64, op: &str) -> Result<CudnnTensor> {
    let r = t.rank();
    let len = t.dims()[r - 1];
    if n <= len {
        return narrow(&t, op, r - 1, 0, n);
    }
    let mut dims = t.dims().to_vec();
    dims[r - 1] = n;
    let z = exec::full(t.device(), &dims, t.dtype, 0.0, op)?;
    exec::copy_into(&t, &narrow(&z, op, r - 1, 0, len)?, op)?;
    Ok(z)
}

/// Angles `2π ((r · c) mod n) / n` (F64) for `r` in `0..rows` and `c` in `c0..c0 + cols`,
/// as `[rows, cols]`; the product is reduced modulo `n` in integers so the angle stays exact.
fn angles(like: &CudnnTensor, rows: i64, c0: i64, cols: i64, n: i64, op: &str) -> Result<CudnnTensor> {
    let r = arange(like.device(), rows, DType::I64, op)?.reshape(&[rows, 1])?;
    let c = arange(like.device(), cols, DType::I64, op)?;
    let c = exec::unary(c, UnaryOp::AddScalar(c0 as f64), op)?.reshape(&[1, cols])?;
    let prod = exec::binary(r, c, BinaryOp::Mul, op)?;
    let m = exec::binary_scalar(prod, n as f64, BinaryOp::Rem, op)?;
    let a = exec::cast(m, DType::F64, op)?;
    exec::unary(a, UnaryOp::MulScalar(2.0 * PI / n as f64), op)
}

/// Column blocks `(start, len)` covering `0..total` with `rows · len <= MAX_BLOCK`.
fn blocks(rows: i64, total: i64) -> Vec<(i64, i64)> {
    let step = (MAX_BLOCK / rows.max(1)).max(1);
    (0..total)
        .step_by(step as usize)
        .map(|c| (c, step.min(total - c)))
        .collect()
}

/// Runs `write` on columns `c0..c0 + cols` of the packed `[rows, total]` tensor `out`:
/// on `out` itself when they are all of it, else on a packed temporary copied in after.
fn with_cols(
    out: &CudnnTensor,
    c0: i64,
    cols: i64,
    op: &str,
    write: impl FnOnce(&CudnnTensor) -> Result<()>,
) -> Result<()> {
    if cols == out.dims()[1] {
        return write(out);
    }
    let tmp = out.empty_on(&[out.dims()[0], cols], out.dtype, op)?;
    write(&tmp)?;
    exec::copy_into(&tmp, &narrow(out, op, 1, c0, c0 + cols)?, op)?;
    Ok(())
}

/// `c = a · b` on the exact GEMM kernel (any strides).
fn matmul(a: &CudnnTensor, b: &CudnnTensor, c: &CudnnTensor, op: &str) -> Result<()> {
    linalg::matmul(c.stream(), &a.tref(), &b.tref(), &c.tmut()).in_op(op)
}

/// Real FFT along `dim` (length `n`, default the signal's): `(re, im)` with `n / 2 + 1`
/// bins, `X[k] = Σ x[t] e^{-2πi kt/n}`.
pub(crate) fn rfft(signal: CudnnTensor, dim: usize, n: Option<usize>) -> Result<(CudnnTensor, CudnnTensor)> {
    const OP: &str = "rfft";
    require_float(OP, &signal)?;
    let dtype = signal.dtype;
    let (x, inv) = move_last(&signal, dim, OP)?;
    let len = x.dims()[x.rank() - 1];
    let n = n.map(|v| v as i64).unwrap_or(len);
    if n < 1 {
        return Err(Error::invalid_input(
            OP,
            format!("the transform length must be >= 1 (got {n})"),
        ));
    }
    let x = fit_last(x, n, OP)?;
    let lead: Vec<i64> = x.dims()[..x.rank() - 1].to_vec();
    let rows: i64 = lead.iter().product();
    let x2 = x.reshape(&[rows, n])?;
    let bins = n / 2 + 1;
    let re = x2.empty_on(&[rows, bins], dtype, OP)?;
    let im = x2.empty_on(&[rows, bins], dtype, OP)?;
    for (c0, cols) in blocks(n, bins) {
        let ang = angles(&x2, n, c0, cols, n, OP)?;
        let cos = exec::cast(exec::unary(ang.clone(), UnaryOp::Cos, OP)?, dtype, OP)?;
        let sin = exec::unary(ang, UnaryOp::Sin, OP)?;
        let msin = exec::cast(exec::unary(sin, UnaryOp::Neg, OP)?, dtype, OP)?;
        with_cols(&re, c0, cols, OP, |dst| matmul(&x2, &cos, dst, OP))?;
        with_cols(&im, c0, cols, OP, |dst| matmul(&x2, &msin, dst, OP))?;
    }
    let back = |t: CudnnTensor| {
        let mut dims = lead.clone();
        dims.push(bins);
        let t = t.reshape(&dims)?;
        view(&t, OP, |l| l.permute(&inv))
    };
    Ok((back(re)?, back(im)?))
}

/// Inverse real FFT along `dim` to `n` samples (default `2 (bins - 1)`):
/// `x[t] = (1/n) Σ_k c_k (Re X[k] cos(2πkt/n) - Im X[k] sin(2πkt/n))` over the first
/// `min(bins, n / 2 + 1)` bins (missing ones are zero), with `c_0 = 1`, `c_{n/2} = 1` for
/// even `n` and 2 otherwise; the imaginary parts of those two bins are ignored, as in
/// PyTorch.
pub(crate) fn irfft(re: CudnnTensor, im: CudnnTensor, dim: usize, n: Option<usize>) -> Result<CudnnTensor> {
    const OP: &str = "irfft";
    require_float(OP, &re)?;
    check_pair(OP, &re, &im)?;
    if re.dims() != im.dims() {
        return Err(Error::invalid_input(
            OP,
            format!(
                "real {:?} and imaginary {:?} parts differ in shape",
                re.dims(),
                im.dims()
            ),
        ));
    }
    let dtype = re.dtype;
    let (xr, inv) = move_last(&re, dim, OP)?;
    let (xi, _) = move_last(&im, dim, OP)?;
    let m = xr.dims()[xr.rank() - 1];
    let n = n.map(|v| v as i64).unwrap_or(2 * (m - 1));
    if n < 1 {
        return Err(Error::invalid_input(
            OP,
            format!("the output length must be >= 1 (got {n}; pass `n` for a 1-bin spectrum)"),
        ));
    }
    let used = m.min(n / 2 + 1);
    let lead: Vec<i64> = xr.dims()[..xr.rank() - 1].to_vec();
    let rows: i64 = lead.iter().product();
    let fold = |t: CudnnTensor| narrow(&t, OP, t.rank() - 1, 0, used)?.reshape(&[rows, used]);
    let (xr, xi) = (fold(xr)?, fold(xi)?);
    // Per-bin weights c_k / n as a [used, 1] column.
    let coef = exec::full(xr.device(), &[used, 1], DType::F64, 2.0 / n as f64, OP)?;
    fill(&narrow(&coef, OP, 0, 0, 1)?, 1.0 / n as f64, OP)?;
    if n % 2 == 0 && n / 2 < used {
        fill(&narrow(&coef, OP, 0, n / 2, n / 2 + 1)?, 1.0 / n as f64, OP)?;
    }
    let out = xr.empty_on(&[rows, n], dtype, OP)?;
    for (c0, cols) in blocks(used, n) {
        let ang = angles(&xr, used, c0, cols, n, OP)?;
        let cos = exec::unary(ang.clone(), UnaryOp::Cos, OP)?;
        let cos = exec::cast(exec::binary(cos, coef.clone(), BinaryOp::Mul, OP)?, dtype, OP)?;
        let sin = exec::unary(ang, UnaryOp::Sin, OP)?;
        let sin = exec::unary(sin, UnaryOp::Neg, OP)?;
        let sin = exec::cast(exec::binary(sin, coef.clone(), BinaryOp::Mul, OP)?, dtype, OP)?;
        with_cols(&out, c0, cols, OP, |dst| {
            matmul(&xr, &cos, dst, OP)?;
            let part_im = dst.empty_like(dtype, OP)?;
            matmul(&xi, &sin, &part_im, OP)?;
            super::binary_into(dst, &part_im, BinaryOp::Add, dst, OP)
        })?;
    }
    let mut dims = lead;
    dims.push(n);
    let out = out.reshape(&dims)?;
    view(&out, OP, |l| l.permute(&inv))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn column_blocks_cover_every_column_once() {
        for (rows, total) in [(1, 1), (4, 3), (1 << 20, 1 << 19), (3, 0), (1 << 25, 5)] {
            let b = blocks(rows, total);
            let mut next = 0;
            for &(c, len) in &b {
                assert_eq!(c, next);
                assert!(len >= 1 && (rows * len <= MAX_BLOCK || len == 1));
                next += len;
            }
            assert_eq!(next, total);
        }
        assert_eq!(blocks(8, 5), vec![(0, 5)]);
    }
}
