//! Lanczos3 resizing of `[N, C, H, W]`, matching burn-ndarray 0.21's
//! `lanczos3_interpolate`, and its adjoint (the gradient with respect to the input).
//!
//! burn-ndarray takes, for each output pixel, the 6x6 source window around its sample
//! position (rows `floor(y) - 2 ..= floor(y) + 3`, skipping positions outside the image),
//! weights each source pixel by `L(y - row) · L(x - col)` with the Lanczos3 kernel `L`, and
//! divides by the sum of the weights used. Both the weights and their sum factor into a row
//! part and a column part, so the resize is `Y = Wy · X · Wxᵀ` per image, with `Wy [oh, h]`
//! and `Wx [ow, w]` the per-axis weights each normalised to unit row sums. The weights
//! depend on the sizes only: they are built on the host (no tensor data is read) and the
//! two products run on the exact GEMM kernel (f64 products and sums). The result equals
//! burn-ndarray's up to f64 rounding. The backward pass is `dX = Wyᵀ · dY · Wx`.

use burn_backend::{DType, TensorData};

use super::{compute_dtype, require_float, view};
use crate::burn::data::from_data;
use crate::burn::exec;
use crate::burn::math::exact_matmul;
use crate::burn::tensor::CudnnTensor;
use crate::error::{Error, Result};

/// burn-ndarray's Lanczos3 kernel `sinc(x) · sinc(x / 3)` on `(-3, 3)`, 0 elsewhere.
fn lanczos3(x: f64) -> f64 {
    if x == 0.0 {
        return 1.0;
    }
    if x.abs() >= 3.0 {
        return 0.0;
    }
    let pi_x = std::f64::consts::PI * x;
    let pi_x_over_3 = pi_x / 3.0;
    (pi_x.sin() * pi_x_over_3.sin()) / (pi_x * pi_x_over_3)
}

/// The sample position in the input of output index `o` (burn-ndarray's formulas).
fn source_position(o: usize, input: usize, output: usize, align_corners: bool) -> f64 {
    if align_corners {
        let ratio = (input.saturating_sub(1)) as f64 / (output.saturating_sub(1).max(1)) as f64;
        ratio * o as f64
    } else {
        (o as f64 + 0.5) * (input as f64 / output as f64) - 0.5
    }
}

/// Row-major `[output, input]` weights of one axis: row `o` holds the Lanczos3 weights of
/// the (at most 6) in-range source samples around output `o`'s position, divided by their
/// sum (left as they are when the sum is 0, as burn-ndarray does).
pub(crate) fn axis_weights(input: usize, output: usize, align_corners: bool) -> Vec<f64> {
    let mut w = vec![0.0f64; input * output];
    for o in 0..output {
        let frac = source_position(o, input, output, align_corners);
        let f0 = frac.floor();
        let row = &mut w[o * input..(o + 1) * input];
        let mut sum = 0.0;
        for k in -2..=3i64 {
            let i = f0 as i64 + k;
            if i < 0 || i >= input as i64 {
                continue;
            }
            let v = lanczos3(frac - (f0 + k as f64));
            row[i as usize] = v;
            sum += v;
        }
        if sum != 0.0 {
            row.iter_mut().for_each(|v| *v /= sum);
        }
    }
    w
}

/// The `[output, input]` weights of one axis on `like`'s device, as `dtype`, viewed as
/// `[1, 1, output, input]` (transposed to `[1, 1, input, output]` when `transpose`).
fn weights_on(
    like: &CudnnTensor,
    input: i64,
    output: i64,
    ac: bool,
    transpose: bool,
    dtype: DType,
) -> Result<CudnnTensor> {
    const OP: &str = "interpolate";
    let (i, o) = (input as usize, output as usize);
    let data = TensorData::new(axis_weights(i, o, ac), [o, i]);
    let w = exec::cast(from_data(data, &like.burn_device(), DType::F64, OP)?, dtype, OP)?;
    let w = w.reshape(&[1, 1, output, input])?;
    if transpose {
        view(&w, OP, |l| l.transpose(2, 3))
    } else {
        Ok(w)
    }
}

/// Checks `t` is a float `[N, C, H, W]` and returns its dims.
fn dims4(op: &str, t: &CudnnTensor) -> Result<[i64; 4]> {
    require_float(op, t)?;
    let d = t.dims();
    if d.len() != 4 {
        return Err(Error::invalid_input(op, format!("input {d:?} must be [N, C, H, W]")));
    }
    Ok([d[0], d[1], d[2], d[3]])
}

/// Lanczos3 resize of `x [N, C, H, W]` to `[N, C, size[0], size[1]]`.
pub(crate) fn lanczos3_interpolate(x: CudnnTensor, size: [usize; 2], align_corners: bool) -> Result<CudnnTensor> {
    const OP: &str = "interpolate";
    let [_, _, h, w] = dims4(OP, &x)?;
    let (oh, ow) = (size[0] as i64, size[1] as i64);
    let dtype = x.dtype;
    let work = compute_dtype(dtype);
    let x = exec::cast(x, work, OP)?;
    // Columns first: [N, C, H, W] · Wxᵀ [W, ow], then Wy [oh, H] · [N, C, H, ow].
    let wxt = weights_on(&x, w, ow, align_corners, true, work)?;
    let t = exact_matmul(&x, &wxt, OP)?;
    let wy = weights_on(&x, h, oh, align_corners, false, work)?;
    let y = exact_matmul(&wy, &t, OP)?;
    exec::cast(y, dtype, OP)
}

/// Gradient of [`lanczos3_interpolate`] with respect to its input of dims `x_dims`:
/// `dx = Wyᵀ · dy · Wx` for `dy [N, C, oh, ow]`.
pub(crate) fn lanczos3_interpolate_backward(
    x_dims: &[i64],
    dy: CudnnTensor,
    align_corners: bool,
) -> Result<CudnnTensor> {
    const OP: &str = "interpolate_backward";
    let [n, c, oh, ow] = dims4(OP, &dy)?;
    if !(x_dims.len() == 4 && x_dims[0] == n && x_dims[1] == c) {
        return Err(Error::invalid_input(
            OP,
            format!(
                "input {x_dims:?} and output gradient {:?} must be [N, C, H, W] and [N, C, oh, ow]",
                dy.dims()
            ),
        ));
    }
    let (h, w) = (x_dims[2], x_dims[3]);
    let dtype = dy.dtype;
    let work = compute_dtype(dtype);
    let dy = exec::cast(dy, work, OP)?;
    let wx = weights_on(&dy, w, ow, align_corners, false, work)?;
    let t = exact_matmul(&dy, &wx, OP)?;
    let wyt = weights_on(&dy, h, oh, align_corners, true, work)?;
    let dx = exact_matmul(&wyt, &t, OP)?;
    exec::cast(dx, dtype, OP)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// burn-ndarray's direct 2-D formula for one output pixel of a `[h, w]` image.
    fn direct(img: &[f64], (h, w): (usize, usize), (oh, ow): (usize, usize), (r, c): (usize, usize), ac: bool) -> f64 {
        let fy = source_position(r, h, oh, ac);
        let fx = source_position(c, w, ow, ac);
        let (y0, x0) = (fy.floor(), fx.floor());
        let (mut acc, mut sum) = (0.0, 0.0);
        for ky in -2..=3i64 {
            let yi = y0 as i64 + ky;
            if yi < 0 || yi >= h as i64 {
                continue;
            }
            let wy = lanczos3(fy - (y0 + ky as f64));
            for kx in -2..=3i64 {
                let xi = x0 as i64 + kx;
                if xi < 0 || xi >= w as i64 {
                    continue;
                }
                let wgt = wy * lanczos3(fx - (x0 + kx as f64));
                acc += img[yi as usize * w + xi as usize] * wgt;
                sum += wgt;
            }
        }
        if sum != 0.0 {
            acc / sum
        } else {
            acc
        }
    }

    #[test]
    fn separable_weights_match_the_direct_formula() {
        let (h, w) = (5usize, 6usize);
        let img: Vec<f64> = (0..h * w).map(|i| ((i * 37 % 11) as f64 - 5.0) / 3.0).collect();
        for ac in [true, false] {
            for (oh, ow) in [(8, 9), (3, 4), (10, 12), (5, 6), (1, 1), (2, 13)] {
                let (wy, wx) = (axis_weights(h, oh, ac), axis_weights(w, ow, ac));
                for r in 0..oh {
                    for c in 0..ow {
                        let mut sep = 0.0;
                        for y in 0..h {
                            for x in 0..w {
                                sep += wy[r * h + y] * img[y * w + x] * wx[c * w + x];
                            }
                        }
                        let want = direct(&img, (h, w), (oh, ow), (r, c), ac);
                        assert!(
                            (sep - want).abs() <= 1e-12 * (1.0 + want.abs()),
                            "ac {ac} {oh}x{ow} at ({r}, {c}): {sep} vs {want}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn weights_interpolate_identity_and_constants() {
        // Same size: the sample positions are the pixels themselves (weight 1 there, sinc
        // zeros elsewhere).
        for ac in [true, false] {
            let wts = axis_weights(4, 4, ac);
            for o in 0..4 {
                for i in 0..4 {
                    let want = if i == o { 1.0 } else { 0.0 };
                    assert!(
                        (wts[o * 4 + i] - want).abs() < 1e-12,
                        "{ac} {o} {i}: {}",
                        wts[o * 4 + i]
                    );
                }
            }
        }
        // Every row sums to 1; a 1-pixel input is copied.
        for (i, o) in [(7, 3), (3, 11), (1, 5)] {
            let wts = axis_weights(i, o, false);
            for r in 0..o {
                let s: f64 = wts[r * i..(r + 1) * i].iter().sum();
                assert!((s - 1.0).abs() < 1e-12, "{i}->{o} row {r}: {s}");
            }
        }
        assert_eq!(lanczos3(0.0), 1.0);
        assert_eq!(lanczos3(3.0), 0.0);
        assert_eq!(lanczos3(-3.5), 0.0);
        assert!(lanczos3(1.0).abs() < 1e-15 && lanczos3(0.5) > 0.6);
    }
}
