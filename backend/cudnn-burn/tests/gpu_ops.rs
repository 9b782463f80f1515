//! Every node cudnn-burn claims, run by Burn 0.22 on `Device::cuda(0)` with `register()` in
//! the process, against a float64 reference (f32 and bf16), with the provider's counters
//! showing that the engine ran each of them. One test: registering is process-wide.
//!
//! ```sh
//! BURN_022_PROFILE=release bash scripts/burn-0.22-offline.sh backend/cudnn-burn/Cargo.toml --lib --tests --examples
//! target/burn-0.22/release/deps/gpu_ops-<hash> --include-ignored --nocapture
//! ```

use burn::prelude::*;
use burn::tensor::module::{
    adaptive_avg_pool1d, adaptive_avg_pool2d, avg_pool1d, avg_pool2d, conv1d, conv2d, conv3d, conv_transpose2d,
    embedding, max_pool2d,
};
use burn::tensor::ops::{AvgPoolOptions, ConvOptions, ConvTransposeOptions, MaxPoolOptions};
use burn::tensor::{bf16, DType, FloatDType, TensorData};
use cudnn_backend_reference as reference;
use cudnn_backend_reference::{rel_l2_error, ConvGeometry, PoolGeometry, SplitMix64};
use cudnn_burn::Stats;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Dtype {
    F32,
    Bf16,
}

impl Dtype {
    /// The relative L2 error a correct result stays under: f32 allows TF32 tensor cores,
    /// bf16 the rounding of bf16 outputs.
    fn tolerance(self) -> f64 {
        match self {
            Dtype::F32 => 5e-3,
            Dtype::Bf16 => 2e-2,
        }
    }
}

/// `n` values uniform in [-scale, scale), bf16-exact for bf16 runs (so the reference sees the
/// values the GPU reads).
fn values(rng: &mut SplitMix64, n: usize, scale: f64, dtype: Dtype) -> Vec<f32> {
    (0..n)
        .map(|_| {
            let v = (rng.next_f64() * scale) as f32;
            match dtype {
                Dtype::F32 => v,
                Dtype::Bf16 => bf16::from_f32(v).to_f32(),
            }
        })
        .collect()
}

/// `v` on the device in `dtype`, uploaded as such: no cast operation precedes the node under
/// test (a block of one element-wise operation and a pool stays Burn's: docs/burn-0.22.md).
fn upload<const D: usize>(device: &Device, v: &[f32], shape: [usize; D], dtype: Dtype) -> Tensor<D> {
    match dtype {
        Dtype::F32 => Tensor::<D>::from_data(TensorData::new(v.to_vec(), shape), device),
        Dtype::Bf16 => {
            let v: Vec<bf16> = v.iter().map(|&x| bf16::from_f32(x)).collect();
            Tensor::<D>::from_data(TensorData::new(v, shape), (device, DType::BF16))
        }
    }
}

fn download<const D: usize>(t: Tensor<D>) -> Vec<f64> {
    let data = t.cast(FloatDType::F32).into_data();
    data.try_to_vec::<f32>()
        .expect("f32 data")
        .into_iter()
        .map(f64::from)
        .collect()
}

fn wide(v: &[f32]) -> Vec<f64> {
    v.iter().map(|&x| f64::from(x)).collect()
}

/// Collects (case, error) rows and the worst error per tolerance.
struct Checks {
    rows: Vec<(String, f64, bool)>,
}

impl Checks {
    fn check(&mut self, case: &str, dtype: Dtype, got: &[f64], want: &[f64]) {
        assert_eq!(got.len(), want.len(), "{case}: length");
        let err = rel_l2_error(got, want);
        let ok = err <= dtype.tolerance();
        println!(
            "{case:<48} {dtype:?} rel L2 {err:.2e} {}",
            if ok { "ok" } else { "FAIL" }
        );
        self.rows.push((format!("{case} {dtype:?}"), err, ok));
    }
}

fn stats() -> Stats {
    cudnn_burn::stats().expect("registered")
}

/// A convolution with bias of `dims`-D spatial size, forward and both gradients through
/// autodiff (loss = sum(y * g) for a random g, so dy = g).
fn conv_case<const D: usize, const S: usize>(
    checks: &mut Checks,
    dtype: Dtype,
    x_dims: [usize; D],
    w_dims: [usize; D],
    g: ConvGeometry,
    run: impl Fn(Tensor<D>, Tensor<D>, Tensor<1>) -> Tensor<D>,
) {
    let device = Device::cuda(0).autodiff();
    let mut rng = SplitMix64::new(0xC0DE + D as u64 + g.groups as u64);
    let fan_in: usize = w_dims[1..].iter().product();
    let x = values(&mut rng, x_dims.iter().product(), 1.0, dtype);
    let w = values(&mut rng, w_dims.iter().product(), 1.0 / (fan_in as f64).sqrt(), dtype);
    let b = values(&mut rng, w_dims[0], 0.5, dtype);
    let mut want_y = reference::conv_forward(&wide(&x), &x_dims, &wide(&w), &w_dims, &g);
    let y_dims = {
        let mut d = vec![x_dims[0], w_dims[0]];
        for i in 0..S {
            let span = (w_dims[i + 2] - 1) * g.dilation[i] + 1;
            d.push((x_dims[i + 2] + g.pre_padding[i] + g.post_padding[i] - span) / g.stride[i] + 1);
        }
        d
    };
    let per_channel: usize = y_dims[2..].iter().product();
    for (i, v) in want_y.iter_mut().enumerate() {
        *v += f64::from(b[(i / per_channel) % w_dims[0]]);
    }
    let gy = values(&mut rng, y_dims.iter().product(), 1.0, dtype);
    let want_dx = reference::conv_backward_data(&wide(&gy), &y_dims, &wide(&w), &w_dims, &x_dims, &g);
    let want_dw = reference::conv_backward_filter(&wide(&x), &x_dims, &wide(&gy), &y_dims, &w_dims, &g);

    let xt = upload(&device, &x, x_dims, dtype).require_grad();
    let wt = upload(&device, &w, w_dims, dtype).require_grad();
    let bt = upload(&device, &b, [w_dims[0]], dtype);
    let y_shape: [usize; D] = y_dims.clone().try_into().expect("rank");
    let gt = upload(&device, &gy, y_shape, dtype);
    let y = run(xt.clone(), wt.clone(), bt);
    let grads = (y.clone() * gt).sum().backward();
    let case = format!("conv{S}d x{x_dims:?} w{w_dims:?} groups {}", g.groups);
    checks.check(&format!("{case} forward"), dtype, &download(y), &want_y);
    checks.check(
        &format!("{case} dx"),
        dtype,
        &download(xt.grad(&grads).expect("dx")),
        &want_dx,
    );
    checks.check(
        &format!("{case} dw"),
        dtype,
        &download(wt.grad(&grads).expect("dw")),
        &want_dw,
    );
}

/// 3x2 windows, stride 2, padding (1, 0): the max pooling the pooling cases run.
fn max_options() -> MaxPoolOptions<2> {
    MaxPoolOptions::new([3, 2]).with_stride([2, 2]).with_padding([1, 0])
}

fn pool_case(checks: &mut Checks, dtype: Dtype, max: bool) {
    let device = Device::cuda(0).autodiff();
    let mut rng = SplitMix64::new(0x9001 + u64::from(max));
    let x_dims = [2usize, 3, 9, 8];
    let x = values(&mut rng, x_dims.iter().product(), 1.0, dtype);
    let g = PoolGeometry {
        window: vec![3, 2],
        stride: vec![2, 2],
        pre_padding: vec![1, 0],
        post_padding: vec![1, 0],
        mode: if max {
            reference::PoolMode::Max
        } else {
            reference::PoolMode::AvgIncludePadding
        },
    };
    let y_dims = g.output_dims(&x_dims);
    let gy = values(&mut rng, y_dims.iter().product(), 1.0, dtype);
    let want_y = reference::pool_forward(&wide(&x), &x_dims, &g);
    let want_dx = reference::pool_backward(&wide(&x), &x_dims, &wide(&gy), &g);
    let y_shape: [usize; 4] = y_dims.clone().try_into().expect("rank");

    let xt = upload(&device, &x, x_dims, dtype).require_grad();
    let gt = upload(&device, &gy, y_shape, dtype);
    let y = if max {
        max_pool2d(xt.clone(), max_options())
    } else {
        avg_pool2d(
            xt.clone(),
            AvgPoolOptions::new([3, 2])
                .with_stride([2, 2])
                .with_padding([1, 0])
                .with_count_include_pad(true),
        )
    };
    let grads = (y.clone() * gt).sum().backward();
    let case = if max {
        "max_pool2d 3x2 s2 p(1,0)"
    } else {
        "avg_pool2d 3x2 s2 p(1,0) incl. pad"
    };
    checks.check(&format!("{case} forward"), dtype, &download(y), &want_y);
    checks.check(
        &format!("{case} dx"),
        dtype,
        &download(xt.grad(&grads).expect("dx")),
        &want_dx,
    );

    if max {
        // Outside autodiff max pooling is a plain `MaxPool2d` node (no indices).
        let plain = Device::cuda(0);
        let y = max_pool2d(upload(&plain, &x, x_dims, dtype), max_options());
        checks.check(&format!("{case} forward, no autodiff"), dtype, &download(y), &want_y);
    }
}

/// A grouped 2-D transposed convolution in float64 by its definition
/// (`y[n, g·cog + co, i·s + k·d - p] += x[n, g·cig + ci, i] · w[g·cig + ci, co, k]` per axis),
/// with its input and filter gradients for `dy`: `(y, dx, dw)`.
#[allow(clippy::too_many_arguments)]
fn conv_transpose2d_reference(
    x: &[f64],
    [n, cin, h, w_in]: [usize; 4],
    w: &[f64],
    [kh, kw]: [usize; 2],
    cog: usize,
    groups: usize,
    [s, p, po, d]: [[usize; 2]; 4],
    dy: &[f64],
) -> (Vec<f64>, [usize; 4], Vec<f64>, Vec<f64>) {
    let out = |l: usize, i: usize| (l - 1) * s[i] + d[i] * ([kh, kw][i] - 1) + 1 + po[i] - 2 * p[i];
    let (oh, ow) = (out(h, 0), out(w_in, 1));
    let cout = cog * groups;
    let cig = cin / groups;
    let mut y = vec![0.0; n * cout * oh * ow];
    let (mut dx, mut dw) = (vec![0.0; x.len()], vec![0.0; w.len()]);
    for b in 0..n {
        for g in 0..groups {
            for ci in 0..cig {
                for co in 0..cog {
                    for i in 0..h {
                        for j in 0..w_in {
                            for ki in 0..kh {
                                for kj in 0..kw {
                                    let oi = (i * s[0] + ki * d[0]) as isize - p[0] as isize;
                                    let oj = (j * s[1] + kj * d[1]) as isize - p[1] as isize;
                                    if oi < 0 || oj < 0 || oi >= oh as isize || oj >= ow as isize {
                                        continue;
                                    }
                                    let xi = ((b * cin + g * cig + ci) * h + i) * w_in + j;
                                    let wi = (((g * cig + ci) * cog + co) * kh + ki) * kw + kj;
                                    let yi = ((b * cout + g * cog + co) * oh + oi as usize) * ow + oj as usize;
                                    y[yi] += x[xi] * w[wi];
                                    dx[xi] += dy[yi] * w[wi];
                                    dw[wi] += dy[yi] * x[xi];
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    (y, [n, cout, oh, ow], dx, dw)
}

/// A grouped, strided 2-D transposed convolution with `padding_out` and bias, forward and
/// gradients through autodiff (its gradients reach the provider as convolution nodes).
fn conv_transpose_case(checks: &mut Checks, dtype: Dtype) {
    let device = Device::cuda(0).autodiff();
    let mut rng = SplitMix64::new(0x7a11);
    let (x_dims, (kh, kw), cog, groups) = ([2usize, 4, 5, 6], (3usize, 2usize), 3usize, 2usize);
    let geometry = [[2, 1], [1, 0], [1, 0], [1, 2]];
    let w_dims = [x_dims[1], cog, kh, kw];
    let x = values(&mut rng, x_dims.iter().product(), 1.0, dtype);
    let w = values(&mut rng, w_dims.iter().product(), 0.5, dtype);
    let b = values(&mut rng, cog * groups, 1.0, dtype);
    // (l - 1)·s + d·(k - 1) + 1 + padding_out - 2·padding: 10 x 8.
    let y_dims = [x_dims[0], cog * groups, 10, 8];
    let gy = values(&mut rng, y_dims.iter().product(), 1.0, dtype);
    let (mut want_y, ref_dims, want_dx, want_dw) = conv_transpose2d_reference(
        &wide(&x),
        x_dims,
        &wide(&w),
        [kh, kw],
        cog,
        groups,
        geometry,
        &wide(&gy),
    );
    assert_eq!(ref_dims, y_dims);
    let plane = y_dims[2] * y_dims[3];
    for (i, v) in want_y.iter_mut().enumerate() {
        *v += f64::from(b[(i / plane) % (cog * groups)]);
    }
    let xt = upload(&device, &x, x_dims, dtype).require_grad();
    let wt = upload(&device, &w, w_dims, dtype).require_grad();
    let bt = upload(&device, &b, [cog * groups], dtype).require_grad();
    let options = ConvTransposeOptions::new([2, 1], [1, 0], [1, 0], [1, 2], groups);
    let y = conv_transpose2d(xt.clone(), wt.clone(), Some(bt), options);
    let gt = upload(&device, &gy, y_dims, dtype);
    let grads = (y.clone() * gt).sum().backward();
    let case = "conv_transpose2d s(2,1) p(1,0) po(1,0) d(1,2) g2";
    checks.check(&format!("{case} forward"), dtype, &download(y), &want_y);
    checks.check(
        &format!("{case} dx"),
        dtype,
        &download(xt.grad(&grads).expect("dx")),
        &want_dx,
    );
    checks.check(
        &format!("{case} dw"),
        dtype,
        &download(wt.grad(&grads).expect("dw")),
        &want_dw,
    );
}

/// An embedding lookup whose gradient (a `select_assign` with addition) the provider runs as
/// the engine's row adds: 4,096 ids of which 40 % name row 0 and 20 % row 1 (padding and mask
/// tokens), the rest uniform over a 1,000-row table; the table gradient against float64.
fn embedding_case(checks: &mut Checks, dtype: Dtype) {
    let device = Device::cuda(0).autodiff();
    let mut rng = SplitMix64::new(0xe3b);
    let (vocab, width, batch, seq) = (1000usize, 96usize, 8usize, 512usize);
    let table = values(&mut rng, vocab * width, 1.0, dtype);
    let ids: Vec<i64> = (0..batch * seq)
        .map(|_| match rng.below(10) {
            0..=3 => 0,
            4 | 5 => 1,
            _ => rng.below(vocab as u64) as i64,
        })
        .collect();
    let gy = values(&mut rng, batch * seq * width, 1.0, dtype);
    let mut want = vec![0.0; vocab * width];
    for (k, &id) in ids.iter().enumerate() {
        for c in 0..width {
            want[id as usize * width + c] += f64::from(gy[k * width + c]);
        }
    }
    let wt = upload(&device, &table, [vocab, width], dtype).require_grad();
    let idx = Tensor::<2, Int>::from_data(TensorData::new(ids, [batch, seq]), &device);
    let y = embedding(wt.clone(), idx);
    let grads = (y * upload(&device, &gy, [batch, seq, width], dtype)).sum().backward();
    checks.check(
        "embedding gradient, 60 % of ids on two rows",
        dtype,
        &download(wt.grad(&grads).expect("dtable")),
        &want,
    );
}

/// Output `i` of `o` adaptive windows over `l` inputs: `floor(i * l / o) .. ceil((i + 1) * l / o)`.
fn adaptive_window(i: usize, o: usize, l: usize) -> std::ops::Range<usize> {
    (i * l / o)..((i + 1) * l).div_ceil(o)
}

/// Adaptive average pooling of `x` `[planes, h, w]` to `[planes, oh, ow]` and its gradient for
/// `gy`, in float64.
fn adaptive_reference(x: &[f64], [planes, h, w]: [usize; 3], gy: &[f64], [oh, ow]: [usize; 2]) -> (Vec<f64>, Vec<f64>) {
    let (mut y, mut dx) = (vec![0.0; planes * oh * ow], vec![0.0; x.len()]);
    for p in 0..planes {
        for i in 0..oh {
            for j in 0..ow {
                let (rows, cols) = (adaptive_window(i, oh, h), adaptive_window(j, ow, w));
                let n = (rows.len() * cols.len()) as f64;
                let o = (p * oh + i) * ow + j;
                for r in rows.clone() {
                    for c in cols.clone() {
                        y[o] += x[(p * h + r) * w + c] / n;
                        dx[(p * h + r) * w + c] += gy[o] / n;
                    }
                }
            }
        }
    }
    (y, dx)
}

/// Runs `f` on `x` with autodiff and checks its output and input gradient (for the output
/// gradient `gy`) against `want_y` and `want_dx`.
#[allow(clippy::too_many_arguments)]
fn check_forward_and_dx<const D: usize>(
    checks: &mut Checks,
    dtype: Dtype,
    case: &str,
    (x, x_shape): (&[f32], [usize; D]),
    (gy, y_shape): (&[f32], [usize; D]),
    f: impl Fn(Tensor<D>) -> Tensor<D>,
    want_y: &[f64],
    want_dx: &[f64],
) {
    let device = Device::cuda(0).autodiff();
    let xt = upload(&device, x, x_shape, dtype).require_grad();
    let y = f(xt.clone());
    let grads = (y.clone() * upload(&device, gy, y_shape, dtype)).sum().backward();
    checks.check(&format!("{case} forward"), dtype, &download(y), want_y);
    checks.check(
        &format!("{case} dx"),
        dtype,
        &download(xt.grad(&grads).expect("dx")),
        want_dx,
    );
}

/// The pools the engine runs on its pooling kernels: 2-D average pooling with `ceil_mode`,
/// 1-D average pooling (with `ceil_mode` too), and 1-D and 2-D adaptive average pooling (a
/// ResNet head's 7x7 -> 1x1 and a non-dividing size), forward and gradient through autodiff.
/// Average pooling with `ceil_mode` and padding excluded from the divisor is the
/// reference's exclusive average with the ceil-mode window as extra trailing padding.
fn kernel_pool_cases(checks: &mut Checks, dtype: Dtype) {
    let mut rng = SplitMix64::new(0x9101);
    let exclusive = |window: [usize; 2], stride: [usize; 2], pre: [usize; 2], post: [usize; 2]| PoolGeometry {
        window: window.to_vec(),
        stride: stride.to_vec(),
        pre_padding: pre.to_vec(),
        post_padding: post.to_vec(),
        mode: reference::PoolMode::AvgExcludePadding,
    };

    let (x_dims, g) = ([2usize, 3, 8, 9], exclusive([3, 3], [2, 2], [1, 0], [2, 1]));
    assert_eq!(g.output_dims(&x_dims), vec![2, 3, 5, 4], "ceil_mode output size");
    let x = values(&mut rng, 2 * 3 * 8 * 9, 1.0, dtype);
    let gy = values(&mut rng, 2 * 3 * 5 * 4, 1.0, dtype);
    let options = AvgPoolOptions::new([3, 3])
        .with_stride([2, 2])
        .with_padding([1, 0])
        .with_count_include_pad(false)
        .with_ceil_mode(true);
    check_forward_and_dx(
        checks,
        dtype,
        "avg_pool2d 3x3 s2 p(1,0) ceil excl. pad",
        (&x, x_dims),
        (&gy, [2, 3, 5, 4]),
        |t| avg_pool2d(t, options.clone()),
        &reference::pool_forward(&wide(&x), &x_dims, &g),
        &reference::pool_backward(&wide(&x), &x_dims, &wide(&gy), &g),
    );

    let (x_dims, g) = ([2usize, 4, 1, 17], exclusive([1, 4], [1, 3], [0, 1], [0, 2]));
    assert_eq!(g.output_dims(&x_dims), vec![2, 4, 1, 6], "1-D ceil_mode output size");
    let x = values(&mut rng, 2 * 4 * 17, 1.0, dtype);
    let gy = values(&mut rng, 2 * 4 * 6, 1.0, dtype);
    let options = AvgPoolOptions::new([4])
        .with_stride([3])
        .with_padding([1])
        .with_count_include_pad(false)
        .with_ceil_mode(true);
    check_forward_and_dx(
        checks,
        dtype,
        "avg_pool1d 4 s3 p1 ceil excl. pad",
        (&x, [2, 4, 17]),
        (&gy, [2, 4, 6]),
        |t| avg_pool1d(t, options.clone()),
        &reference::pool_forward(&wide(&x), &x_dims, &g),
        &reference::pool_backward(&wide(&x), &x_dims, &wide(&gy), &g),
    );

    for ([n, c, h, w], [oh, ow]) in [([2usize, 8, 7, 7], [1usize, 1]), ([2, 3, 9, 7], [4, 3])] {
        let x = values(&mut rng, n * c * h * w, 1.0, dtype);
        let gy = values(&mut rng, n * c * oh * ow, 1.0, dtype);
        let (want_y, want_dx) = adaptive_reference(&wide(&x), [n * c, h, w], &wide(&gy), [oh, ow]);
        check_forward_and_dx(
            checks,
            dtype,
            &format!("adaptive_avg_pool2d {h}x{w} -> {oh}x{ow}"),
            (&x, [n, c, h, w]),
            (&gy, [n, c, oh, ow]),
            |t| adaptive_avg_pool2d(t, [oh, ow]),
            &want_y,
            &want_dx,
        );
    }
    let (n, c, l, o) = (2usize, 5usize, 30usize, 7usize);
    let x = values(&mut rng, n * c * l, 1.0, dtype);
    let gy = values(&mut rng, n * c * o, 1.0, dtype);
    let (want_y, want_dx) = adaptive_reference(&wide(&x), [n * c, 1, l], &wide(&gy), [1, o]);
    check_forward_and_dx(
        checks,
        dtype,
        "adaptive_avg_pool1d 30 -> 7",
        (&x, [n, c, l]),
        (&gy, [n, c, o]),
        |t| adaptive_avg_pool1d(t, o),
        &want_y,
        &want_dx,
    );
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn claimed_nodes_match_float64_and_run_on_the_engine() {
    cudnn_burn::register().expect("register before the first tensor operation");
    let mut checks = Checks { rows: Vec::new() };
    for dtype in [Dtype::F32, Dtype::Bf16] {
        let before = stats();
        // 2-D: asymmetric padding, stride, dilation, groups.
        let g2 = ConvGeometry {
            pre_padding: vec![1, 2],
            post_padding: vec![1, 2],
            stride: vec![2, 1],
            dilation: vec![1, 2],
            groups: 2,
        };
        conv_case::<4, 2>(&mut checks, dtype, [2, 4, 11, 10], [6, 2, 3, 3], g2, |x, w, b| {
            conv2d(x, w, Some(b), ConvOptions::new([2, 1], [1, 2], [1, 2], 2))
        });
        let g1 = ConvGeometry {
            pre_padding: vec![2],
            post_padding: vec![2],
            stride: vec![1],
            dilation: vec![1],
            groups: 1,
        };
        conv_case::<3, 1>(&mut checks, dtype, [2, 3, 17], [5, 3, 5], g1, |x, w, b| {
            conv1d(x, w, Some(b), ConvOptions::new([1], [2], [1], 1))
        });
        let g3 = ConvGeometry {
            pre_padding: vec![1, 0, 1],
            post_padding: vec![1, 0, 1],
            stride: vec![1, 1, 2],
            dilation: vec![1, 1, 1],
            groups: 1,
        };
        conv_case::<5, 3>(&mut checks, dtype, [1, 2, 5, 4, 6], [3, 2, 3, 1, 3], g3, |x, w, b| {
            conv3d(x, w, Some(b), ConvOptions::new([1, 1, 2], [1, 0, 1], [1, 1, 1], 1))
        });
        pool_case(&mut checks, dtype, false);
        pool_case(&mut checks, dtype, true);
        kernel_pool_cases(&mut checks, dtype);
        conv_transpose_case(&mut checks, dtype);
        embedding_case(&mut checks, dtype);
        let d = stats().since(before);
        println!("{dtype:?}: {d:?}");
        assert!(
            d.conv_forward >= 3,
            "{dtype:?}: convolution forwards on the engine: {d:?}"
        );
        assert!(
            d.conv_backward_data >= 3,
            "{dtype:?}: data gradients on the engine: {d:?}"
        );
        assert!(
            d.conv_backward_filter >= 3,
            "{dtype:?}: weight gradients on the engine: {d:?}"
        );
        assert!(
            d.index_add >= 1,
            "{dtype:?}: the embedding gradient's row adds on the engine: {d:?}"
        );
        assert!(
            d.conv_transpose_forward >= 1,
            "{dtype:?}: the transposed convolution on the engine: {d:?}"
        );
        assert!(
            d.pool_forward >= 2 + 5,
            "{dtype:?}: avg, plain max and the kernel-run pools on the engine: {d:?}"
        );
        assert!(
            d.pool_backward >= 2 + 5,
            "{dtype:?}: their gradients on the engine: {d:?}"
        );
        assert_eq!(
            d.fallbacks, 0,
            "{dtype:?}: claimed nodes that ran Burn's instead: {d:?}"
        );
    }
    let failed: Vec<_> = checks.rows.iter().filter(|r| !r.2).collect();
    assert!(failed.is_empty(), "results off the float64 reference: {failed:?}");
}
