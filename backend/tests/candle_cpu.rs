//! CPU tests of the Candle feature (run on CI, no GPU): the `cpu_fwd` reference paths against
//! naive float64 code and Candle's own CPU ops, gradients against Candle's autograd of its own
//! ops, NHWC and strided inputs, parameter validation, and VarBuilder compatibility with
//! candle-nn.
#![cfg(feature = "candle")]

use candle_core::{DType, Device, Module, ModuleT, Result, Tensor, Var, D};
use candle_nn::{Optimizer, VarBuilder, VarMap};
use cudnn_backend::candle::nn as cnn;
use cudnn_backend::candle::{
    Activation, Conv1dParams, Conv2dParams, Conv3dParams, ConvParams, ConvTranspose2dParams, CudnnExt,
};
use cudnn_backend_reference::SplitMix64;

fn rand_t(rng: &mut SplitMix64, dims: &[usize]) -> Tensor {
    let n: usize = dims.iter().product();
    let v: Vec<f64> = (0..n).map(|_| rng.next_f64() * 2.0 - 1.0).collect();
    Tensor::from_vec(v, dims, &Device::Cpu).unwrap()
}

fn vals(t: &Tensor) -> Vec<f64> {
    t.to_dtype(DType::F64)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1::<f64>()
        .unwrap()
}

fn rel_err(a: &Tensor, b: &Tensor) -> f64 {
    assert_eq!(a.dims(), b.dims(), "shapes differ");
    let (a, b) = (vals(a), vals(b));
    let num: f64 = a.iter().zip(&b).map(|(x, y)| (x - y) * (x - y)).sum();
    let den: f64 = b.iter().map(|y| y * y).sum();
    (num / den.max(1e-300)).sqrt()
}

fn assert_close(a: &Tensor, b: &Tensor, tol: f64, what: &str) {
    let e = rel_err(a, b);
    assert!(e <= tol, "{what}: relative L2 error {e:e} > {tol:e}");
}

/// Naive 2-D convolution (cross-correlation) with groups, for checking the op.
#[allow(clippy::too_many_arguments)]
fn naive_conv2d(x: &Tensor, w: &Tensor, pad: [usize; 2], stride: [usize; 2], dil: [usize; 2], groups: usize) -> Tensor {
    let (n, c, h, wd) = x.dims4().unwrap();
    let (k, cg, kh, kw) = w.dims4().unwrap();
    let (xv, wv) = (vals(x), vals(w));
    let oh = (h + 2 * pad[0] - dil[0] * (kh - 1) - 1) / stride[0] + 1;
    let ow = (wd + 2 * pad[1] - dil[1] * (kw - 1) - 1) / stride[1] + 1;
    let kg = k / groups;
    let mut y = vec![0.0; n * k * oh * ow];
    for b in 0..n {
        for o in 0..k {
            let g = o / kg;
            for i in 0..oh {
                for j in 0..ow {
                    let mut acc = 0.0;
                    for cc in 0..cg {
                        let ch = g * cg + cc;
                        for r in 0..kh {
                            for s in 0..kw {
                                let yy = (i * stride[0] + r * dil[0]) as isize - pad[0] as isize;
                                let xx = (j * stride[1] + s * dil[1]) as isize - pad[1] as isize;
                                if yy < 0 || xx < 0 || yy >= h as isize || xx >= wd as isize {
                                    continue;
                                }
                                acc += xv[((b * c + ch) * h + yy as usize) * wd + xx as usize]
                                    * wv[((o * cg + cc) * kh + r) * kw + s];
                            }
                        }
                    }
                    y[((b * k + o) * oh + i) * ow + j] = acc;
                }
            }
        }
    }
    Tensor::from_vec(y, (n, k, oh, ow), &Device::Cpu).unwrap()
}

#[test]
fn conv2d_matches_naive_reference_and_candle() {
    let mut rng = SplitMix64::new(1);
    for case in 0..12 {
        let groups = [1, 2, 4][case % 3];
        let (n, h, w) = (1 + case % 2, 5 + case % 4, 6 + case % 3);
        let c = groups * (1 + case % 2);
        let k = groups * (1 + (case / 2) % 3);
        let (kh, kw) = (1 + case % 3, 1 + (case + 1) % 3);
        let pad = [case % 2, (case / 2) % 2];
        let stride = [1 + case % 2, 1 + (case / 3) % 2];
        let dil = [1 + (case / 4) % 2, 1];
        let x = rand_t(&mut rng, &[n, c, h, w]);
        let wt = rand_t(&mut rng, &[k, c / groups, kh, kw]);
        let p = Conv2dParams {
            padding: pad,
            stride,
            dilation: dil,
            groups,
        };
        let Ok(y) = x.cudnn_conv2d(&wt, p) else {
            continue; // filter larger than the padded input in this combination
        };
        assert_close(
            &y,
            &naive_conv2d(&x, &wt, pad, stride, dil, groups),
            1e-12,
            "conv2d vs naive",
        );
        if pad[0] == pad[1] && stride[0] == stride[1] && dil[0] == dil[1] {
            let c_ref = x.conv2d(&wt, pad[0], stride[0], dil[0], groups).unwrap();
            assert_close(&y, &c_ref, 1e-12, "conv2d vs candle");
        }
    }
}

#[test]
fn conv1d_and_conv3d_match_references() {
    let mut rng = SplitMix64::new(2);
    let x = rand_t(&mut rng, &[2, 4, 11]);
    let w = rand_t(&mut rng, &[6, 2, 3]);
    let p = Conv1dParams {
        padding: 1,
        stride: 2,
        dilation: 2,
        groups: 2,
    };
    let y = x.cudnn_conv1d(&w, p).unwrap();
    assert_close(&y, &x.conv1d(&w, 1, 2, 2, 2).unwrap(), 1e-12, "conv1d vs candle");

    // 3-D with a depth-1 filter equals a 2-D conv per depth slice.
    let x = rand_t(&mut rng, &[1, 3, 4, 6, 5]);
    let w = rand_t(&mut rng, &[2, 3, 1, 3, 3]);
    let p = Conv3dParams {
        padding: [0, 1, 1],
        ..Default::default()
    };
    let y = x.cudnn_conv3d(&w, p).unwrap();
    assert_eq!(y.dims(), &[1, 2, 4, 6, 5]);
    let w2 = w.squeeze(2).unwrap();
    for d in 0..4 {
        let xs = x.narrow(2, d, 1).unwrap().squeeze(2).unwrap();
        let ys = y.narrow(2, d, 1).unwrap().squeeze(2).unwrap();
        assert_close(&ys, &xs.conv2d(&w2, 1, 1, 1, 1).unwrap(), 1e-12, "conv3d slice");
    }
}

#[test]
fn asymmetric_padding_through_conv_params() {
    let mut rng = SplitMix64::new(3);
    let x = rand_t(&mut rng, &[1, 2, 5, 5]);
    let w = rand_t(&mut rng, &[3, 2, 2, 2]);
    // pre (0, 1), post (1, 0) == pad the input explicitly then convolve without padding.
    let p = ConvParams::new(&[0, 1], &[1, 1], &[1, 1], 1).with_post_padding(&[1, 0]);
    let y = x.cudnn_conv(&w, &p).unwrap();
    let xp = x.pad_with_zeros(2, 0, 1).unwrap().pad_with_zeros(3, 1, 0).unwrap();
    assert_close(&y, &xp.conv2d(&w, 0, 1, 1, 1).unwrap(), 1e-12, "asymmetric padding");
}

#[test]
fn conv_transpose2d_matches_candle() {
    let mut rng = SplitMix64::new(4);
    for (stride, pad, out_pad, dil) in [(1, 0, 0, 1), (2, 1, 1, 1), (2, 0, 1, 2), (3, 1, 2, 1)] {
        let x = rand_t(&mut rng, &[2, 3, 4, 5]);
        let w = rand_t(&mut rng, &[3, 2, 3, 3]);
        let p = ConvTranspose2dParams {
            padding: [pad; 2],
            output_padding: [out_pad; 2],
            stride: [stride; 2],
            dilation: [dil; 2],
            groups: 1,
        };
        let y = x.cudnn_conv_transpose2d(&w, p).unwrap();
        let r = x.conv_transpose2d(&w, pad, out_pad, stride, dil).unwrap();
        assert_close(&y, &r, 1e-12, "conv_transpose2d");
    }
}

#[test]
fn fused_conv_bias_act_matches_composition() {
    let mut rng = SplitMix64::new(5);
    let x = rand_t(&mut rng, &[2, 4, 6, 6]);
    let w = rand_t(&mut rng, &[5, 4, 3, 3]);
    let b = rand_t(&mut rng, &[5]);
    let p = Conv2dParams {
        padding: [1, 1],
        ..Default::default()
    };
    let z = x
        .conv2d(&w, 1, 1, 1, 1)
        .unwrap()
        .broadcast_add(&b.reshape((1, 5, 1, 1)).unwrap())
        .unwrap();
    for (act, r) in [
        (Activation::Identity, z.clone()),
        (Activation::Relu, z.relu().unwrap()),
        (Activation::Tanh, z.tanh().unwrap()),
        (Activation::Gelu, z.gelu_erf().unwrap()),
        (Activation::Swish(1.0), z.silu().unwrap()),
    ] {
        let y = x.cudnn_conv2d_bias_act(&w, &b, p, act).unwrap();
        assert_close(&y, &r, 1e-6, &format!("conv_bias_act {act:?}"));
    }
}

#[test]
fn matmul_and_fused_matmul_match_candle() {
    let mut rng = SplitMix64::new(6);
    let a = rand_t(&mut rng, &[3, 4, 5]);
    let b = rand_t(&mut rng, &[3, 5, 6]);
    assert_close(&a.cudnn_matmul(&b).unwrap(), &a.matmul(&b).unwrap(), 1e-12, "matmul");
    // Broadcast batch and a transposed (strided) operand.
    let b1 = rand_t(&mut rng, &[1, 6, 5]);
    let r = a
        .matmul(&b1.t().unwrap().broadcast_as((3, 5, 6)).unwrap().contiguous().unwrap())
        .unwrap();
    assert_close(
        &a.cudnn_matmul(&b1.t().unwrap()).unwrap(),
        &r,
        1e-12,
        "broadcast transposed matmul",
    );
    // Rank 2 against rank 3. The reference materializes the broadcast: Candle 0.11.0's own
    // CPU matmul mishandles a stride-0 batch (fixed in 0.11.1), and 0.11.0 is the lowest
    // version this crate accepts.
    let a2 = rand_t(&mut rng, &[4, 5]);
    let r = a2
        .broadcast_as((3, 4, 5))
        .unwrap()
        .contiguous()
        .unwrap()
        .matmul(&b)
        .unwrap();
    assert_close(&a2.cudnn_matmul(&b).unwrap(), &r, 1e-12, "rank-2 · rank-3");
    let bias = rand_t(&mut rng, &[6]);
    let y = a.cudnn_matmul_bias_act(&b, &bias, Activation::Relu).unwrap();
    let r = a.matmul(&b).unwrap().broadcast_add(&bias).unwrap().relu().unwrap();
    assert_close(&y, &r, 1e-12, "matmul_bias_act");
}

#[test]
fn pooling_matches_candle() {
    let mut rng = SplitMix64::new(7);
    let x = rand_t(&mut rng, &[2, 3, 8, 7]);
    let y = x.cudnn_max_pool2d([2, 3], [2, 2], [0, 0]).unwrap();
    assert_close(&y, &x.max_pool2d_with_stride((2, 3), (2, 2)).unwrap(), 0.0, "max pool");
    let y = x.cudnn_avg_pool2d([3, 2], [1, 2], [0, 0], true).unwrap();
    assert_close(
        &y,
        &x.avg_pool2d_with_stride((3, 2), (1, 2)).unwrap(),
        1e-12,
        "avg pool",
    );
    // Padding: include vs exclude differ only at the borders.
    let inc = x.cudnn_avg_pool2d([3, 3], [1, 1], [1, 1], true).unwrap();
    let exc = x.cudnn_avg_pool2d([3, 3], [1, 1], [1, 1], false).unwrap();
    let centre = |t: &Tensor| t.narrow(2, 1, 6).unwrap().narrow(3, 1, 5).unwrap();
    assert_close(&centre(&inc), &centre(&exc), 1e-12, "avg pool interior");
    let corner = vals(&exc.narrow(2, 0, 1).unwrap().narrow(3, 0, 1).unwrap());
    let xv = vals(&x);
    let expect = (xv[0] + xv[1] + xv[7] + xv[8]) / 4.0;
    assert!((corner[0] - expect).abs() < 1e-12);
    // Padded max pool equals max over -inf padded input.
    let y = x.cudnn_max_pool2d([3, 3], [2, 2], [1, 1]).unwrap();
    let xp = x
        .pad_with_same(2, 1, 1)
        .unwrap()
        .pad_with_same(3, 1, 1)
        .unwrap()
        .max_pool2d_with_stride((3, 3), (2, 2))
        .unwrap();
    assert_close(&y, &xp, 0.0, "padded max pool");
}

#[test]
fn channels_last_inputs_give_channels_last_outputs_with_the_same_values() {
    let mut rng = SplitMix64::new(8);
    let x_nhwc = rand_t(&mut rng, &[2, 6, 5, 4]); // N H W C
    let x = x_nhwc.permute((0, 3, 1, 2)).unwrap(); // NCHW view, channels-last strides
    let w = rand_t(&mut rng, &[3, 4, 3, 3]);
    let p = Conv2dParams {
        padding: [1, 1],
        ..Default::default()
    };
    let y = x.cudnn_conv2d(&w, p).unwrap();
    assert_eq!(y.dims(), &[2, 3, 6, 5]);
    assert_eq!(y.stride(), &[90, 1, 15, 3], "channels-last output");
    let r = x.contiguous().unwrap().cudnn_conv2d(&w, p).unwrap();
    assert!(r.is_contiguous());
    assert_close(&y, &r, 1e-12, "NHWC vs NCHW");
    let yp = y.cudnn_max_pool2d([2, 2], [2, 2], [0, 0]).unwrap();
    assert_eq!(yp.stride()[1], 1, "pooling keeps channels-last");
    assert_close(&yp, &r.max_pool2d(2).unwrap(), 0.0, "NHWC pool");
}

#[test]
fn strided_and_half_inputs() {
    let mut rng = SplitMix64::new(9);
    let big = rand_t(&mut rng, &[2, 3, 9, 9]);
    let x = big.narrow(2, 1, 6).unwrap().narrow(3, 2, 6).unwrap(); // gaps: copied once
    let w = rand_t(&mut rng, &[4, 3, 3, 3]);
    let y = x.cudnn_conv2d(&w, Conv2dParams::default()).unwrap();
    assert_close(
        &y,
        &x.contiguous().unwrap().conv2d(&w, 0, 1, 1, 1).unwrap(),
        1e-12,
        "strided",
    );
    for dt in [DType::F32, DType::F16, DType::BF16] {
        let (xh, wh) = (x.to_dtype(dt).unwrap(), w.to_dtype(dt).unwrap());
        let y = xh.cudnn_conv2d(&wh, Conv2dParams::default()).unwrap();
        assert_eq!(y.dtype(), dt);
        let r = xh
            .to_dtype(DType::F64)
            .unwrap()
            .conv2d(&wh.to_dtype(DType::F64).unwrap(), 0, 1, 1, 1)
            .unwrap();
        let tol = if dt == DType::F32 { 1e-6 } else { 1e-2 };
        assert_close(&y, &r, tol, &format!("{dt:?} conv"));
    }
}

fn grads_of(vars: &[&Var], loss: &Tensor) -> Vec<Tensor> {
    let g = loss.backward().unwrap();
    vars.iter()
        .map(|v| g.get(v.as_tensor()).expect("gradient").clone())
        .collect()
}

#[test]
fn conv_gradients_match_candles_conv2d() {
    let mut rng = SplitMix64::new(10);
    for (groups, stride, pad, dil) in [(1, 1, 1, 1), (2, 2, 0, 1), (1, 1, 2, 2)] {
        let x = Var::from_tensor(&rand_t(&mut rng, &[2, 4, 7, 7])).unwrap();
        let w = Var::from_tensor(&rand_t(&mut rng, &[6, 4 / groups, 3, 3])).unwrap();
        let t = rand_t(&mut rng, &[1]); // weights the loss so dy is not all ones
        let p = Conv2dParams {
            padding: [pad; 2],
            stride: [stride; 2],
            dilation: [dil; 2],
            groups,
        };
        let ours = x.as_tensor().cudnn_conv2d(w.as_tensor(), p).unwrap();
        let theirs = x.as_tensor().conv2d(w.as_tensor(), pad, stride, dil, groups).unwrap();
        let lw = rand_t(&mut rng, ours.dims());
        let loss = |y: &Tensor| (y * &lw).unwrap().sum_all().unwrap().broadcast_mul(&t).unwrap();
        let g1 = grads_of(&[&x, &w], &loss(&ours));
        let g2 = grads_of(&[&x, &w], &loss(&theirs));
        assert_close(&g1[0], &g2[0], 1e-10, "dx");
        assert_close(&g1[1], &g2[1], 1e-10, "dw");
    }
}

#[test]
fn channels_last_gradients_match_nchw() {
    let mut rng = SplitMix64::new(17);
    let xn = rand_t(&mut rng, &[2, 5, 6, 4]); // N H W C
    let xv = Var::from_tensor(&xn).unwrap(); // the variable holds NHWC data
    let x = xv.as_tensor().permute((0, 3, 1, 2)).unwrap();
    let w = Var::from_tensor(&rand_t(&mut rng, &[3, 4, 3, 3])).unwrap();
    let b = Var::from_tensor(&rand_t(&mut rng, &[3])).unwrap();
    let p = Conv2dParams {
        padding: [1, 1],
        ..Default::default()
    };
    let y = x
        .cudnn_conv2d_bias_act(w.as_tensor(), b.as_tensor(), p, Activation::Tanh)
        .unwrap();
    let y = y.cudnn_max_pool2d([2, 2], [2, 2], [0, 0]).unwrap();
    assert_eq!(y.stride()[1], 1, "channels-last through the chain");
    let lw = rand_t(&mut rng, y.dims());
    let g1 = grads_of(&[&xv, &w, &b], &(&y * &lw).unwrap().sum_all().unwrap());
    let (xc, wc, bc) = (
        x.contiguous().unwrap(),
        w.as_tensor().clone(),
        b.as_tensor().reshape((1, 3, 1, 1)).unwrap(),
    );
    let xc = Var::from_tensor(&xc).unwrap();
    let z = xc
        .as_tensor()
        .conv2d(&wc, 1, 1, 1, 1)
        .unwrap()
        .broadcast_add(&bc)
        .unwrap()
        .tanh()
        .unwrap();
    let z = z.cudnn_max_pool2d([2, 2], [2, 2], [0, 0]).unwrap();
    assert_close(&y, &z, 1e-12, "NHWC chain forward");
    let g2 = grads_of(&[&xc], &(&z * &lw).unwrap().sum_all().unwrap());
    assert_close(&g1[0].permute((0, 3, 1, 2)).unwrap(), &g2[0], 1e-10, "NHWC chain dx");
}

#[test]
fn conv_transpose_fused_matmul_and_pool_gradients() {
    let mut rng = SplitMix64::new(11);
    // Transposed convolution.
    let x = Var::from_tensor(&rand_t(&mut rng, &[2, 3, 4, 4])).unwrap();
    let w = Var::from_tensor(&rand_t(&mut rng, &[3, 2, 3, 3])).unwrap();
    let p = ConvTranspose2dParams {
        padding: [1, 1],
        output_padding: [1, 1],
        stride: [2, 2],
        ..Default::default()
    };
    let ours = x.as_tensor().cudnn_conv_transpose2d(w.as_tensor(), p).unwrap();
    let theirs = x.as_tensor().conv_transpose2d(w.as_tensor(), 1, 1, 2, 1).unwrap();
    let lw = rand_t(&mut rng, ours.dims());
    let g1 = grads_of(&[&x, &w], &(&ours * &lw).unwrap().sum_all().unwrap());
    let g2 = grads_of(&[&x, &w], &(&theirs * &lw).unwrap().sum_all().unwrap());
    assert_close(&g1[0], &g2[0], 1e-10, "conv_transpose dx");
    assert_close(&g1[1], &g2[1], 1e-10, "conv_transpose dw");

    // Conv + bias + activation (output-based and recomputed derivatives).
    for act in [
        Activation::Relu,
        Activation::Sigmoid,
        Activation::Gelu,
        Activation::GeluTanh,
        Activation::Swish(1.0),
    ] {
        let x = Var::from_tensor(&rand_t(&mut rng, &[2, 3, 5, 5])).unwrap();
        let w = Var::from_tensor(&rand_t(&mut rng, &[4, 3, 3, 3])).unwrap();
        let b = Var::from_tensor(&rand_t(&mut rng, &[4])).unwrap();
        let p = Conv2dParams {
            padding: [1, 1],
            ..Default::default()
        };
        let ours = x
            .as_tensor()
            .cudnn_conv2d_bias_act(w.as_tensor(), b.as_tensor(), p, act)
            .unwrap();
        let z = x
            .as_tensor()
            .conv2d(w.as_tensor(), 1, 1, 1, 1)
            .unwrap()
            .broadcast_add(&b.as_tensor().reshape((1, 4, 1, 1)).unwrap())
            .unwrap();
        let theirs = match act {
            Activation::Relu => z.relu(),
            Activation::Sigmoid => candle_nn::ops::sigmoid(&z),
            Activation::Gelu => z.gelu_erf(),
            Activation::GeluTanh => z.gelu(),
            _ => z.silu(),
        }
        .unwrap();
        let lw = rand_t(&mut rng, ours.dims());
        let g1 = grads_of(&[&x, &w, &b], &(&ours * &lw).unwrap().sum_all().unwrap());
        let g2 = grads_of(&[&x, &w, &b], &(&theirs * &lw).unwrap().sum_all().unwrap());
        for (i, name) in ["dx", "dw", "db"].iter().enumerate() {
            assert_close(&g1[i], &g2[i], 1e-6, &format!("conv_bias_act {act:?} {name}"));
        }
    }

    // Matmul with broadcast batch, and matmul + bias + tanh.
    let a = Var::from_tensor(&rand_t(&mut rng, &[3, 4, 5])).unwrap();
    let b = Var::from_tensor(&rand_t(&mut rng, &[1, 5, 6])).unwrap();
    let bias = Var::from_tensor(&rand_t(&mut rng, &[6])).unwrap();
    let ours = a
        .as_tensor()
        .cudnn_matmul_bias_act(b.as_tensor(), bias.as_tensor(), Activation::Tanh)
        .unwrap();
    let theirs = a
        .as_tensor()
        .broadcast_matmul(b.as_tensor())
        .unwrap()
        .broadcast_add(bias.as_tensor())
        .unwrap()
        .tanh()
        .unwrap();
    let lw = rand_t(&mut rng, ours.dims());
    let g1 = grads_of(&[&a, &b, &bias], &(&ours * &lw).unwrap().sum_all().unwrap());
    let g2 = grads_of(&[&a, &b, &bias], &(&theirs * &lw).unwrap().sum_all().unwrap());
    for i in 0..3 {
        assert_close(&g1[i], &g2[i], 1e-10, "matmul_bias_act grads");
    }

    // Max and average pooling.
    let x = Var::from_tensor(&rand_t(&mut rng, &[2, 3, 8, 8])).unwrap();
    let ours = x.as_tensor().cudnn_max_pool2d([2, 2], [2, 2], [0, 0]).unwrap();
    // Candle 0.11's own max_pool2d backward scales the gradient by 1/(kh·kw), so the
    // reference is the same pooling written as reshape + max (whose backward is exact).
    let theirs = x
        .as_tensor()
        .reshape((2, 3, 4, 2, 4, 2))
        .unwrap()
        .max_keepdim(5)
        .unwrap()
        .max_keepdim(3)
        .unwrap()
        .reshape((2, 3, 4, 4))
        .unwrap();
    assert_close(&ours, &theirs, 0.0, "max pool via reshape");
    let lw = rand_t(&mut rng, ours.dims());
    let g1 = grads_of(&[&x], &(&ours * &lw).unwrap().sum_all().unwrap());
    let g2 = grads_of(&[&x], &(&theirs * &lw).unwrap().sum_all().unwrap());
    assert_close(&g1[0], &g2[0], 1e-12, "max pool dx");
    let ours = x.as_tensor().cudnn_avg_pool2d([2, 2], [2, 2], [0, 0], true).unwrap();
    let theirs = x.as_tensor().avg_pool2d(2).unwrap();
    let lw = rand_t(&mut rng, ours.dims());
    let g1 = grads_of(&[&x], &(&ours * &lw).unwrap().sum_all().unwrap());
    let g2 = grads_of(&[&x], &(&theirs * &lw).unwrap().sum_all().unwrap());
    assert_close(&g1[0], &g2[0], 1e-12, "avg pool dx");
    // Overlapping padded windows (Candle has no backward for those): a depthwise conv with
    // a constant 1/9 filter is the same average (padding counted).
    let ours = x.as_tensor().cudnn_avg_pool2d([3, 3], [2, 2], [1, 1], true).unwrap();
    let box_w = (Tensor::ones((3, 1, 3, 3), DType::F64, &Device::Cpu).unwrap() / 9.0).unwrap();
    let theirs = x.as_tensor().conv2d(&box_w, 1, 2, 1, 3).unwrap();
    assert_close(&ours, &theirs, 1e-12, "avg pool as conv");
    let lw = rand_t(&mut rng, ours.dims());
    let g1 = grads_of(&[&x], &(&ours * &lw).unwrap().sum_all().unwrap());
    let g2 = grads_of(&[&x], &(&theirs * &lw).unwrap().sum_all().unwrap());
    assert_close(&g1[0], &g2[0], 1e-12, "avg pool dx");
}

#[test]
fn norms_and_attention_match_candle() {
    let mut rng = SplitMix64::new(12);
    let f32 = |t: Tensor| t.to_dtype(DType::F32).unwrap(); // candle-nn's fused norms take no f64
    let x = f32(rand_t(&mut rng, &[2, 3, 8]));
    let w = f32(rand_t(&mut rng, &[8]));
    let b = f32(rand_t(&mut rng, &[8]));
    let r = candle_nn::LayerNorm::new(w.clone(), b.clone(), 1e-5)
        .forward(&x)
        .unwrap();
    assert_close(&x.cudnn_layer_norm(&w, Some(&b), 1e-5).unwrap(), &r, 1e-6, "layer norm");
    let r = candle_nn::RmsNorm::new(w.clone(), 1e-5).forward(&x).unwrap();
    assert_close(&x.cudnn_rms_norm(&w, 1e-5).unwrap(), &r, 1e-6, "rms norm");

    let (q, k, v) = (
        rand_t(&mut rng, &[2, 2, 5, 4]),
        rand_t(&mut rng, &[2, 2, 7, 4]),
        rand_t(&mut rng, &[2, 2, 7, 3]),
    );
    let scale = 0.5;
    let s = (q.matmul(&k.t().unwrap()).unwrap() * scale).unwrap();
    let r = candle_nn::ops::softmax(&s, D::Minus1).unwrap().matmul(&v).unwrap();
    assert_close(&q.cudnn_sdpa(&k, &v, None, scale).unwrap(), &r, 1e-10, "sdpa");
    // A causal-style U8 mask (keep j <= i + 2) equals an additive -inf mask.
    let keep: Vec<u8> = (0..5).flat_map(|i| (0..7).map(move |j| u8::from(j <= i + 2))).collect();
    let keep = Tensor::from_vec(keep, (5, 7), &Device::Cpu).unwrap();
    let add = keep
        .to_dtype(DType::F64)
        .unwrap()
        .affine(1.0, -1.0)
        .unwrap()
        .affine(1e30, 0.0)
        .unwrap();
    let y1 = q.cudnn_sdpa(&k, &v, Some(&keep), scale).unwrap();
    let y2 = q.cudnn_sdpa(&k, &v, Some(&add), scale).unwrap();
    assert_close(&y1, &y2, 1e-10, "masked sdpa");
    // That mask is the bottom-right causal one for 5 queries and 7 keys.
    let causal = q.cudnn_causal_sdpa(&k, &v, scale).unwrap();
    assert_close(&causal, &y1, 1e-10, "causal sdpa");
    let op = cudnn_backend::candle::ops::sdpa(&q, &k, &v, scale, true).unwrap();
    assert_close(&op, &y1, 1e-10, "causal sdpa op");
    let e = k
        .cudnn_causal_sdpa(&q, &q, scale)
        .expect_err("more queries than keys")
        .to_string();
    assert!(e.contains("queries"), "{e}");
}

#[test]
fn cross_entropy_matches_candle_nn_with_its_gradient() {
    use cudnn_backend::candle::ops::{cross_entropy, cross_entropy_ignore_index};
    let mut rng = SplitMix64::new(31);
    let (rows, classes) = (6, 9);
    let logits = Var::from_tensor(&(rand_t(&mut rng, &[rows, classes]) * 4.0).unwrap()).unwrap();
    let targets = Tensor::new(&[3u32, 0, 8, 8, 5, 1], &Device::Cpu).unwrap();

    let ours = cross_entropy(logits.as_tensor(), &targets).unwrap();
    let theirs = candle_nn::loss::cross_entropy(logits.as_tensor(), &targets).unwrap();
    assert_eq!(ours.dims(), theirs.dims(), "a scalar, as candle-nn's");
    assert_close(&ours, &theirs, 1e-12, "cross-entropy");
    let g_ours = grads_of(&[&logits], &(ours.clone() * 3.0).unwrap());
    let g_theirs = grads_of(&[&logits], &(theirs.clone() * 3.0).unwrap());
    assert_close(&g_ours[0], &g_theirs[0], 1e-12, "cross-entropy gradient");

    // Rows whose target is ignored add nothing; the mean is over the others (PyTorch's
    // ignore_index), here rows 2 and 3.
    let ignored = cross_entropy_ignore_index(logits.as_tensor(), &targets, 8).unwrap();
    let keep = Tensor::new(&[0u32, 1, 4, 5], &Device::Cpu).unwrap();
    let kept = logits.as_tensor().index_select(&keep, 0).unwrap();
    let kept_targets = targets.index_select(&keep, 0).unwrap();
    let expected = candle_nn::loss::cross_entropy(&kept, &kept_targets).unwrap();
    assert_close(&ignored, &expected, 1e-12, "cross-entropy with an ignored class");
    let g_ignored = grads_of(&[&logits], &ignored).remove(0);
    let g_rows: Vec<f64> = (0..rows)
        .map(|r| vals(&g_ignored.get(r).unwrap()).iter().map(|v| v.abs()).sum())
        .collect();
    assert!(
        g_rows[2] == 0.0 && g_rows[3] == 0.0,
        "ignored rows get no gradient: {g_rows:?}"
    );
    assert!(g_rows.iter().enumerate().all(|(r, &g)| r == 2 || r == 3 || g > 0.0));

    // f32 and bf16 logits give a scalar of their own dtype.
    for dt in [DType::F32, DType::BF16] {
        let l = logits.as_tensor().to_dtype(dt).unwrap();
        let y = cross_entropy(&l, &targets).unwrap();
        assert_eq!(y.dtype(), dt);
        let tol = if dt == DType::F32 { 1e-6 } else { 1e-2 };
        assert_close(&y, &theirs, tol, "cross-entropy in a narrower dtype");
    }

    for (what, r, names) in [
        (
            "1-D logits",
            cross_entropy(&logits.as_tensor().flatten_all().unwrap(), &targets),
            &["logits"][..],
        ),
        (
            "targets of another length",
            cross_entropy(logits.as_tensor(), &targets.narrow(0, 0, 4).unwrap()),
            &["targets"][..],
        ),
        (
            "float targets",
            cross_entropy(logits.as_tensor(), &targets.to_dtype(DType::F32).unwrap()),
            &["targets"][..],
        ),
    ] {
        assert_rejected(what, r, names);
    }
}

#[test]
fn invalid_arguments_are_errors_not_panics() {
    let mut rng = SplitMix64::new(13);
    let x = rand_t(&mut rng, &[1, 4, 5, 5]);
    let err = |r: Result<Tensor>| r.expect_err("must fail").to_string();
    // groups that do not divide the channels
    let w = rand_t(&mut rng, &[3, 2, 3, 3]);
    let e = err(x.cudnn_conv2d(
        &w,
        Conv2dParams {
            groups: 2,
            ..Default::default()
        },
    ));
    assert!(e.contains("groups"), "{e}");
    // filter larger than the input
    let w = rand_t(&mut rng, &[2, 4, 7, 7]);
    let e = err(x.cudnn_conv2d(&w, Conv2dParams::default()));
    assert!(e.contains("does not fit"), "{e}");
    // wrong rank
    let w = rand_t(&mut rng, &[2, 4, 3]);
    assert!(err(x.cudnn_conv2d(&w, Conv2dParams::default())).contains("rank"));
    // zero stride
    let w = rand_t(&mut rng, &[2, 4, 3, 3]);
    let e = err(x.cudnn_conv2d(
        &w,
        Conv2dParams {
            stride: [0, 1],
            ..Default::default()
        },
    ));
    assert!(e.contains("stride"), "{e}");
    // bias of the wrong size
    let b = rand_t(&mut rng, &[3]);
    let e = err(x.cudnn_conv2d_bias_act(&w, &b, Conv2dParams::default(), Activation::Relu));
    assert!(e.contains("bias") || e.contains("`b`"), "{e}");
    // dtype mismatch
    let e = err(x
        .to_dtype(DType::F32)
        .unwrap()
        .cudnn_conv2d(&w, Conv2dParams::default()));
    assert!(e.contains("dtype"), "{e}");
    // unsupported dtype
    let xi = x.to_dtype(DType::U32).unwrap();
    let e = err(xi.cudnn_conv2d(&w.to_dtype(DType::U32).unwrap(), Conv2dParams::default()));
    assert!(e.contains("not supported"), "{e}");
    // matmul inner dims
    let e = err(rand_t(&mut rng, &[3, 4]).cudnn_matmul(&rand_t(&mut rng, &[5, 2])));
    assert!(e.contains("inner"), "{e}");
    // matmul batch dims that do not broadcast
    let e = err(rand_t(&mut rng, &[2, 3, 4]).cudnn_matmul(&rand_t(&mut rng, &[3, 4, 2])));
    assert!(e.contains("broadcast"), "{e}");
    // pooling: padding as large as the window, window larger than the input
    assert!(err(x.cudnn_max_pool2d([2, 2], [1, 1], [2, 2])).contains("padding"));
    assert!(err(x.cudnn_max_pool2d([9, 9], [1, 1], [0, 0])).contains("window"));
    // transposed conv: output padding too large
    let w = rand_t(&mut rng, &[4, 2, 3, 3]);
    let p = ConvTranspose2dParams {
        output_padding: [1, 1],
        ..Default::default()
    };
    assert!(err(x.cudnn_conv_transpose2d(&w, p)).contains("output_padding"));
    // The error is our crate's, wrapped.
    let e = x.cudnn_matmul(&rand_t(&mut rng, &[1, 4, 3, 5])).unwrap_err();
    assert!(e.to_string().contains("invalid argument"), "{e}");
}

#[test]
fn layers_load_candle_nn_varbuilder_names() {
    let dev = Device::Cpu;
    let map = VarMap::new();
    let vb = VarBuilder::from_varmap(&map, DType::F32, &dev);
    let cfg = candle_nn::Conv2dConfig {
        padding: 1,
        groups: 2,
        ..Default::default()
    };
    // candle-nn's layers create the variables...
    let c_conv = candle_nn::conv2d(4, 6, 3, cfg, vb.pp("conv")).unwrap();
    let c_lin = candle_nn::linear(12, 5, vb.pp("fc")).unwrap();
    let c_bn = candle_nn::batch_norm(6, 1e-5, vb.pp("bn")).unwrap();
    let c_ln = candle_nn::layer_norm(12, 1e-5, vb.pp("ln")).unwrap();
    let c_rms = candle_nn::rms_norm(12, 1e-5, vb.pp("rms")).unwrap();
    let n_vars = map.all_vars().len();
    // ...and ours load exactly those (no new variable appears).
    let o_conv = cnn::Conv2d::new(vb.pp("conv"), 4, 6, 3, cfg).unwrap();
    let o_lin = cnn::linear(12, 5, vb.pp("fc")).unwrap();
    let o_bn = cnn::batch_norm(6, 1e-5, vb.pp("bn")).unwrap();
    let o_ln = cnn::layer_norm(12, 1e-5, vb.pp("ln")).unwrap();
    let o_rms = cnn::rms_norm(12, 1e-5, vb.pp("rms")).unwrap();
    assert_eq!(map.all_vars().len(), n_vars, "our layers created new variables");
    let mut names: Vec<String> = map.data().lock().unwrap().keys().cloned().collect();
    names.sort();
    assert_eq!(
        names,
        [
            "bn.bias",
            "bn.running_mean",
            "bn.running_var",
            "bn.weight",
            "conv.bias",
            "conv.weight",
            "fc.bias",
            "fc.weight",
            "ln.bias",
            "ln.weight",
            "rms.weight"
        ]
    );

    let mut rng = SplitMix64::new(14);
    let x = rand_t(&mut rng, &[2, 4, 5, 5]).to_dtype(DType::F32).unwrap();
    assert_close(
        &o_conv.forward(&x).unwrap(),
        &c_conv.forward(&x).unwrap(),
        1e-6,
        "Conv2d",
    );
    let y = c_conv.forward(&x).unwrap();
    assert_close(
        &o_bn.forward_t(&y, false).unwrap(),
        &c_bn.forward_t(&y, false).unwrap(),
        1e-6,
        "BatchNorm eval",
    );
    assert_close(
        &o_bn.forward_t(&y, true).unwrap(),
        &c_bn.forward_t(&y, true).unwrap(),
        1e-5,
        "BatchNorm train",
    );
    let h = rand_t(&mut rng, &[2, 3, 12]).to_dtype(DType::F32).unwrap();
    assert_close(&o_lin.forward(&h).unwrap(), &c_lin.forward(&h).unwrap(), 1e-6, "Linear");
    assert_close(
        &o_ln.forward(&h).unwrap(),
        &c_ln.forward(&h).unwrap(),
        1e-5,
        "LayerNorm",
    );
    assert_close(
        &o_rms.forward(&h).unwrap(),
        &c_rms.forward(&h).unwrap(),
        1e-5,
        "RmsNorm",
    );
}

#[test]
fn layers_load_from_a_candle_nn_checkpoint() {
    // Save a candle-nn model's VarMap, load it into ours through a fresh VarBuilder.
    let dev = Device::Cpu;
    let map = VarMap::new();
    let vb = VarBuilder::from_varmap(&map, DType::F32, &dev);
    let c_conv = candle_nn::conv2d(3, 4, 3, Default::default(), vb.pp("features.0")).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("model.safetensors");
    map.save(&path).unwrap();
    // SAFETY: the file was just written by this test and is not modified while mapped.
    let vb2 = unsafe { VarBuilder::from_mmaped_safetensors(&[&path], DType::F32, &dev) }.unwrap();
    let o_conv = cnn::conv2d(3, 4, 3, Default::default(), vb2.pp("features.0")).unwrap();
    let mut rng = SplitMix64::new(15);
    let x = rand_t(&mut rng, &[1, 3, 6, 6]).to_dtype(DType::F32).unwrap();
    assert_close(
        &o_conv.forward(&x).unwrap(),
        &c_conv.forward(&x).unwrap(),
        1e-6,
        "checkpoint",
    );
}

/// A small CNN of our layers trains on the CPU: the loss falls.
#[test]
fn small_cnn_trains_on_cpu() {
    let dev = Device::Cpu;
    let map = VarMap::new();
    let vb = VarBuilder::from_varmap(&map, DType::F32, &dev);
    let conv1 = cnn::conv2d(
        1,
        4,
        3,
        candle_nn::Conv2dConfig {
            padding: 1,
            ..Default::default()
        },
        vb.pp("c1"),
    )
    .unwrap()
    .with_activation(Activation::Relu);
    let bn = cnn::batch_norm(4, 1e-5, vb.pp("bn")).unwrap();
    let fc = cnn::linear(4 * 4 * 4, 2, vb.pp("fc")).unwrap();
    let mut opt = candle_nn::SGD::new(map.all_vars(), 0.05).unwrap();
    // Two classes: a bright top half or a bright bottom half.
    let mut rng = SplitMix64::new(16);
    let n = 16;
    let mut xs = vec![0f32; n * 64];
    let mut ys = vec![0u32; n];
    for i in 0..n {
        ys[i] = (i % 2) as u32;
        for p in 0..64 {
            let top = p < 32;
            let on = top == (ys[i] == 0);
            xs[i * 64 + p] = if on { 1.0 } else { 0.0 } + 0.1 * (rng.next_f64() as f32 - 0.5);
        }
    }
    let x = Tensor::from_vec(xs, (n, 1, 8, 8), &dev).unwrap();
    let y = Tensor::from_vec(ys, n, &dev).unwrap();
    let mut losses = Vec::new();
    for _ in 0..15 {
        let h = conv1.forward(&x).unwrap();
        let h = bn.forward_t(&h, true).unwrap();
        let h = h
            .cudnn_max_pool2d([2, 2], [2, 2], [0, 0])
            .unwrap()
            .flatten_from(1)
            .unwrap();
        let logits = fc.forward(&h).unwrap();
        let loss = candle_nn::loss::cross_entropy(&logits, &y).unwrap();
        losses.push(loss.to_scalar::<f32>().unwrap());
        opt.backward_step(&loss).unwrap();
    }
    assert!(
        losses.last().unwrap() < &(losses[0] * 0.5),
        "loss did not fall: {losses:?}"
    );
}

/// The error of `r` as text (it must be one; an `Ok` fails the test).
fn err_text(what: &str, r: Result<Tensor>) -> String {
    match r {
        Ok(t) => panic!("{what}: returned a {:?} tensor instead of an error", t.dims()),
        Err(e) => e.to_string(),
    }
}

/// Asserts `r` is an error whose message names one of `names`.
fn assert_rejected(what: &str, r: Result<Tensor>, names: &[&str]) {
    let e = err_text(what, r);
    assert!(
        names.iter().any(|n| e.contains(n)),
        "{what}: the error names none of {names:?}: {e}"
    );
}

#[test]
fn bad_shapes_and_dtypes_are_errors_naming_the_op() {
    let mut rng = SplitMix64::new(21);
    let x = rand_t(&mut rng, &[2, 4, 6, 6]);
    // Mismatched shapes.
    let w = rand_t(&mut rng, &[3, 5, 3, 3]);
    assert_rejected(
        "conv2d channel mismatch",
        x.cudnn_conv2d(&w, Conv2dParams::default()),
        &["conv"],
    );
    let w1 = rand_t(&mut rng, &[3, 4, 3]);
    assert_rejected(
        "conv1d on a rank-4 input",
        x.cudnn_conv1d(&w1, Conv1dParams::default()),
        &["conv"],
    );
    let a = rand_t(&mut rng, &[3, 4]);
    assert_rejected(
        "matmul inner dims",
        a.cudnn_matmul(&rand_t(&mut rng, &[5, 4])),
        &["matmul"],
    );
    assert_rejected(
        "matmul of a vector",
        a.cudnn_matmul(&rand_t(&mut rng, &[4])),
        &["matmul"],
    );
    let w = rand_t(&mut rng, &[3, 4, 3, 3]);
    let bias = rand_t(&mut rng, &[2]);
    assert_rejected(
        "matmul_bias_act bias length",
        a.cudnn_matmul_bias_act(&rand_t(&mut rng, &[4, 5]), &bias, Activation::Relu),
        &["matmul"],
    );
    assert_rejected(
        "conv2d_bias_act bias length",
        x.cudnn_conv2d_bias_act(&w, &bias, Conv2dParams::default(), Activation::Identity),
        &["conv"],
    );
    assert_rejected(
        "pool on a rank-2 input",
        a.cudnn_max_pool2d([2, 2], [1, 1], [0, 0]),
        &["pool"],
    );
    // Mixed dtypes.
    let w16 = w.to_dtype(DType::F16).unwrap();
    assert_rejected(
        "conv2d f64 x f16",
        x.cudnn_conv2d(&w16, Conv2dParams::default()),
        &["conv"],
    );
    let a32 = a.to_dtype(DType::F32).unwrap();
    assert_rejected(
        "matmul f32 x f64",
        a32.cudnn_matmul(&rand_t(&mut rng, &[4, 2])),
        &["matmul"],
    );
    let b16 = rand_t(&mut rng, &[3]).to_dtype(DType::BF16).unwrap();
    assert_rejected(
        "conv2d_bias_act with a bf16 bias",
        x.cudnn_conv2d_bias_act(&w, &b16, Conv2dParams::default(), Activation::Relu),
        &["conv"],
    );
    assert_rejected(
        "matmul of i64",
        a.to_dtype(DType::I64)
            .unwrap()
            .cudnn_matmul(&rand_t(&mut rng, &[4, 2]).to_dtype(DType::I64).unwrap()),
        &["matmul"],
    );
}

#[test]
fn invalid_conv_params_are_errors_naming_the_op() {
    let mut rng = SplitMix64::new(22);
    let x = rand_t(&mut rng, &[1, 6, 7, 7]);
    let w = rand_t(&mut rng, &[4, 3, 3, 3]);
    let with = |f: fn(&mut Conv2dParams)| {
        let mut p = Conv2dParams {
            groups: 2,
            ..Default::default()
        };
        f(&mut p);
        p
    };
    // The valid baseline (2 groups of 3 channels) works.
    x.cudnn_conv2d(&w, with(|_| {})).expect("grouped conv");
    let cases: [(&str, Conv2dParams); 5] = [
        ("groups 0", with(|p| p.groups = 0)),
        ("groups not dividing the channels", with(|p| p.groups = 4)),
        ("zero stride", with(|p| p.stride = [1, 0])),
        ("zero dilation", with(|p| p.dilation = [0, 1])),
        ("dilated filter larger than the input", with(|p| p.dilation = [4, 4])),
    ];
    for (what, p) in cases {
        assert_rejected(what, x.cudnn_conv2d(&w, p), &["conv"]);
    }
    // Pooling with zero stride or an empty window.
    assert_rejected(
        "pool zero stride",
        x.cudnn_max_pool2d([2, 2], [0, 1], [0, 0]),
        &["pool"],
    );
    assert_rejected(
        "pool empty window",
        x.cudnn_max_pool2d([0, 2], [1, 1], [0, 0]),
        &["pool"],
    );
    // Transposed conv with zero stride.
    let wt = rand_t(&mut rng, &[6, 2, 3, 3]);
    let p = ConvTranspose2dParams {
        stride: [0, 1],
        ..Default::default()
    };
    assert_rejected(
        "conv_transpose2d zero stride",
        x.cudnn_conv_transpose2d(&wt, p),
        &["conv"],
    );
}

#[test]
fn zero_sized_dims_give_empty_or_zero_results() {
    let mut rng = SplitMix64::new(23);
    let w = rand_t(&mut rng, &[4, 3, 3, 3]);
    // Batch 0.
    let x0 = Tensor::zeros((0, 3, 6, 6), DType::F64, &Device::Cpu).unwrap();
    let y = x0.cudnn_conv2d(&w, Conv2dParams::default()).expect("conv2d batch 0");
    assert_eq!(y.dims(), &[0, 4, 4, 4]);
    let y = x0.cudnn_max_pool2d([2, 2], [2, 2], [0, 0]).expect("pool batch 0");
    assert_eq!(y.dims(), &[0, 3, 3, 3]);
    // Zero output channels.
    let x = rand_t(&mut rng, &[2, 3, 6, 6]);
    let wk0 = Tensor::zeros((0, 3, 3, 3), DType::F64, &Device::Cpu).unwrap();
    let y = x
        .cudnn_conv2d(&wk0, Conv2dParams::default())
        .expect("conv2d with 0 filters");
    assert_eq!(y.dims(), &[2, 0, 4, 4]);
    // Zero input channels: a sum over nothing.
    let xc0 = Tensor::zeros((2, 0, 5, 5), DType::F64, &Device::Cpu).unwrap();
    let wc0 = Tensor::zeros((3, 0, 3, 3), DType::F64, &Device::Cpu).unwrap();
    let y = xc0
        .cudnn_conv2d(
            &wc0,
            Conv2dParams {
                padding: [1, 1],
                ..Default::default()
            },
        )
        .expect("conv2d with 0 channels");
    assert_eq!(y.dims(), &[2, 3, 5, 5]);
    assert!(vals(&y).iter().all(|&v| v == 0.0), "conv over 0 channels must be 0");
    // Matmuls: k = 0 gives zeros, m = 0 or n = 0 gives empty results.
    let z = |d: &[usize]| Tensor::zeros(d, DType::F32, &Device::Cpu).unwrap();
    let y = z(&[3, 0]).cudnn_matmul(&z(&[0, 2])).expect("matmul k = 0");
    assert_eq!(y.dims(), &[3, 2]);
    assert!(vals(&y).iter().all(|&v| v == 0.0), "matmul with k = 0 must be 0");
    let y = z(&[0, 4]).cudnn_matmul(&rand_t(&mut rng, &[4, 2]).to_dtype(DType::F32).unwrap());
    assert_eq!(y.expect("matmul m = 0").dims(), &[0, 2]);
    let y = z(&[2, 5, 4]).cudnn_matmul(&z(&[2, 4, 0])).expect("matmul n = 0");
    assert_eq!(y.dims(), &[2, 5, 0]);
    let y = z(&[0, 5, 4]).cudnn_matmul(&z(&[0, 4, 3])).expect("matmul batch 0");
    assert_eq!(y.dims(), &[0, 5, 3]);
    let bias = rand_t(&mut rng, &[2]).to_dtype(DType::F32).unwrap();
    let y = z(&[3, 0])
        .cudnn_matmul_bias_act(&z(&[0, 2]), &bias, Activation::Identity)
        .expect("matmul_bias_act k = 0");
    assert_close(
        &y,
        &bias.unsqueeze(0).unwrap().broadcast_as((3, 2)).unwrap(),
        0.0,
        "k = 0 + bias",
    );
}

#[test]
fn transposed_and_narrowed_inputs_match_candle() {
    let mut rng = SplitMix64::new(24);
    // Transposed operands (column-major views) and a narrowed (offset, gapped) operand.
    let a = rand_t(&mut rng, &[6, 5]).t().unwrap();
    let b = rand_t(&mut rng, &[9, 7])
        .narrow(0, 2, 6)
        .unwrap()
        .narrow(1, 1, 4)
        .unwrap();
    let want = a.contiguous().unwrap().matmul(&b.contiguous().unwrap()).unwrap();
    assert_close(&a.cudnn_matmul(&b).unwrap(), &want, 1e-12, "matmul of views");
    // A batch-transposed rank-3 operand.
    let a3 = rand_t(&mut rng, &[3, 4, 2]).transpose(1, 2).unwrap();
    let b3 = rand_t(&mut rng, &[3, 4, 5]);
    let want = a3.contiguous().unwrap().matmul(&b3).unwrap();
    assert_close(&a3.cudnn_matmul(&b3).unwrap(), &want, 1e-12, "batched matmul of a view");
    // Conv of a narrowed input (gaps in every dim) and of a spatially transposed input.
    let w = rand_t(&mut rng, &[4, 3, 3, 3]);
    let big = rand_t(&mut rng, &[3, 5, 9, 10]);
    let x = big
        .narrow(0, 1, 2)
        .unwrap()
        .narrow(1, 1, 3)
        .unwrap()
        .narrow(2, 2, 6)
        .unwrap();
    let p = Conv2dParams {
        padding: [1, 1],
        ..Default::default()
    };
    let want = naive_conv2d(&x.contiguous().unwrap(), &w, [1, 1], [1, 1], [1, 1], 1);
    assert_close(
        &x.cudnn_conv2d(&w, p).unwrap(),
        &want,
        1e-12,
        "conv of a narrowed input",
    );
    let xt = rand_t(&mut rng, &[2, 3, 8, 7]).transpose(2, 3).unwrap();
    let want = naive_conv2d(&xt.contiguous().unwrap(), &w, [1, 1], [1, 1], [1, 1], 1);
    assert_close(
        &xt.cudnn_conv2d(&w, p).unwrap(),
        &want,
        1e-12,
        "conv of a transposed input",
    );
    // A broadcast (stride-0) operand.
    let row = rand_t(&mut rng, &[1, 5]).broadcast_as((4, 5)).unwrap();
    let m = rand_t(&mut rng, &[5, 3]);
    let want = row.contiguous().unwrap().matmul(&m).unwrap();
    assert_close(
        &row.cudnn_matmul(&m).unwrap(),
        &want,
        1e-12,
        "matmul of a broadcast view",
    );
}

/// The attention op over (B, L, H·D) tensors (`sdpa_heads`, heads side by side as a linear
/// layer writes them) on the CPU: the same output and gradients as `sdpa` over the
/// (B, H, L, D) tensors it holds, unmasked and causal; heads that do not divide the features
/// are an argument error.
#[test]
fn sdpa_heads_matches_sdpa_over_split_heads_on_cpu() {
    use cudnn_backend::candle::ops::{sdpa, sdpa_heads};
    let mut rng = SplitMix64::new(10);
    let (b, h, lq, lk, d, dv) = (2, 3, 5, 7, 4, 2);
    let q = Var::from_tensor(&rand_t(&mut rng, &[b, lq, h * d])).unwrap();
    let k = Var::from_tensor(&rand_t(&mut rng, &[b, lk, h * d])).unwrap();
    let v = Var::from_tensor(&rand_t(&mut rng, &[b, lk, h * dv])).unwrap();
    let probe = rand_t(&mut rng, &[b, lq, h * dv]);
    let split = |t: &Tensor, x: usize| {
        let (bb, l, _) = t.dims3().unwrap();
        t.reshape((bb, l, h, x))
            .unwrap()
            .transpose(1, 2)
            .unwrap()
            .contiguous()
            .unwrap()
    };
    for causal in [false, true] {
        let ours = sdpa_heads(q.as_tensor(), k.as_tensor(), v.as_tensor(), h, 0.4, causal).unwrap();
        assert_eq!(ours.dims(), &[b, lq, h * dv]);
        let theirs = sdpa(
            &split(q.as_tensor(), d),
            &split(k.as_tensor(), d),
            &split(v.as_tensor(), dv),
            0.4,
            causal,
        )
        .unwrap()
        .transpose(1, 2)
        .unwrap()
        .reshape((b, lq, h * dv))
        .unwrap();
        assert!(rel_err(&ours, &theirs) < 1e-12, "sdpa_heads forward (causal {causal})");
        let g1 = (&ours * &probe).unwrap().sum_all().unwrap().backward().unwrap();
        let g2 = (&theirs * &probe).unwrap().sum_all().unwrap().backward().unwrap();
        for t in [&q, &k, &v] {
            let (a, e) = (g1.get(t.as_tensor()).unwrap(), g2.get(t.as_tensor()).unwrap());
            assert_eq!(a.dims(), t.dims());
            assert!(
                rel_err(a, e) < 1e-10,
                "sdpa_heads gradient (causal {causal}): {}",
                rel_err(a, e)
            );
        }
    }
    let e = sdpa_heads(q.as_tensor(), k.as_tensor(), v.as_tensor(), 5, 1.0, false)
        .unwrap_err()
        .to_string();
    assert!(e.contains("sdpa") && e.contains("heads"), "{e}");
}

/// The norm and attention custom ops (cuDNN graphs on CUDA) on the CPU: their float64
/// references against the same math in Candle ops, and their composed backward passes
/// against autograd through Candle ops.
#[test]
fn norm_and_sdpa_ops_match_candle_math_on_cpu() {
    use cudnn_backend::candle::ops::{norm, sdpa};
    use cudnn_backend::graph::NormMode;
    let mut rng = SplitMix64::new(9);
    let x = Var::from_tensor(&rand_t(&mut rng, &[3, 4, 10])).unwrap();
    let w = Var::from_tensor(&rand_t(&mut rng, &[10])).unwrap();
    let b = Var::from_tensor(&rand_t(&mut rng, &[10])).unwrap();
    let probe = rand_t(&mut rng, &[3, 4, 10]);
    for rms in [false, true] {
        let mode = if rms { NormMode::RmsNorm } else { NormMode::LayerNorm };
        let bias = (!rms).then(|| b.as_tensor());
        let ours = norm(x.as_tensor(), w.as_tensor(), bias, mode, 1e-5).unwrap();
        let xt = x.as_tensor();
        let c = if rms {
            xt.clone()
        } else {
            xt.broadcast_sub(&xt.mean_keepdim(D::Minus1).unwrap()).unwrap()
        };
        let inv = (c.sqr().unwrap().mean_keepdim(D::Minus1).unwrap() + 1e-5)
            .unwrap()
            .sqrt()
            .unwrap();
        let mut theirs = c.broadcast_div(&inv).unwrap().broadcast_mul(w.as_tensor()).unwrap();
        if let Some(bias) = bias {
            theirs = theirs.broadcast_add(bias).unwrap();
        }
        assert!(rel_err(&ours, &theirs) < 1e-12, "{mode:?} forward");
        let vars = [&x, &w, &b];
        let g1 = (&ours * &probe).unwrap().sum_all().unwrap().backward().unwrap();
        let g2 = (&theirs * &probe).unwrap().sum_all().unwrap().backward().unwrap();
        for v in &vars[..if rms { 2 } else { 3 }] {
            let (a, e) = (g1.get(v.as_tensor()).unwrap(), g2.get(v.as_tensor()).unwrap());
            assert!(rel_err(a, e) < 1e-10, "{mode:?} gradient: {}", rel_err(a, e));
        }
    }
    let q = Var::from_tensor(&rand_t(&mut rng, &[2, 2, 5, 8])).unwrap();
    let k = Var::from_tensor(&rand_t(&mut rng, &[2, 2, 7, 8])).unwrap();
    let v = Var::from_tensor(&rand_t(&mut rng, &[2, 2, 7, 4])).unwrap();
    let probe = rand_t(&mut rng, &[2, 2, 5, 4]);
    for causal in [false, true] {
        let ours = sdpa(q.as_tensor(), k.as_tensor(), v.as_tensor(), 0.3, causal).unwrap();
        let mut s = (q.as_tensor().matmul(&k.as_tensor().t().unwrap()).unwrap() * 0.3).unwrap();
        if causal {
            // 5 queries, 7 keys: query i sees keys j <= i + 2.
            let hidden: Vec<f64> = (0..35)
                .map(|e| if e % 7 > e / 7 + 2 { f64::NEG_INFINITY } else { 0.0 })
                .collect();
            s = s
                .broadcast_add(&Tensor::from_vec(hidden, (5, 7), &Device::Cpu).unwrap())
                .unwrap();
        }
        let e = s
            .broadcast_sub(&s.max_keepdim(D::Minus1).unwrap())
            .unwrap()
            .exp()
            .unwrap();
        let p = e.broadcast_div(&e.sum_keepdim(D::Minus1).unwrap()).unwrap();
        let theirs = p.matmul(v.as_tensor()).unwrap();
        assert!(rel_err(&ours, &theirs) < 1e-12, "sdpa forward (causal {causal})");
        let g1 = (&ours * &probe).unwrap().sum_all().unwrap().backward().unwrap();
        let g2 = (&theirs * &probe).unwrap().sum_all().unwrap().backward().unwrap();
        for t in [&q, &k, &v] {
            let (a, e) = (g1.get(t.as_tensor()).unwrap(), g2.get(t.as_tensor()).unwrap());
            assert!(
                rel_err(a, e) < 1e-10,
                "sdpa gradient (causal {causal}): {}",
                rel_err(a, e)
            );
        }
    }
    // Wrong shapes are argument errors naming the op.
    let e = sdpa(q.as_tensor(), v.as_tensor(), v.as_tensor(), 1.0, false)
        .unwrap_err()
        .to_string();
    assert!(e.contains("sdpa"), "{e}");
    let e = norm(x.as_tensor(), &rand_t(&mut rng, &[9]), None, NormMode::LayerNorm, 1e-5)
        .unwrap_err()
        .to_string();
    assert!(e.contains("layer_norm") && e.contains("weight"), "{e}");
}

// ---------------------------------------------------------------------------
// Training ops: batch norm, the norm backward pass, FusedAdamW
// ---------------------------------------------------------------------------

/// Training batch norm from Candle ops in float64 (autograd through them): the output and the
/// batch mean and unbiased variance per channel.
fn composed_batch_norm(x: &Tensor, wb: Option<(&Tensor, &Tensor)>, eps: f64, relu: bool) -> (Tensor, Tensor, Tensor) {
    let c = x.dim(1).unwrap();
    let xt = x.transpose(0, 1).unwrap().flatten_from(1).unwrap(); // (C, M)
    let m = xt.dim(1).unwrap() as f64;
    let mean = xt.mean_keepdim(1).unwrap();
    let var = xt.broadcast_sub(&mean).unwrap().sqr().unwrap().mean_keepdim(1).unwrap();
    let shape: Vec<usize> = (0..x.rank()).map(|i| if i == 1 { c } else { 1 }).collect();
    let per_channel = |t: &Tensor| t.reshape(shape.as_slice()).unwrap();
    let inv = (var.clone() + eps).unwrap().sqrt().unwrap().recip().unwrap();
    let mut y = x
        .broadcast_sub(&per_channel(&mean))
        .unwrap()
        .broadcast_mul(&per_channel(&inv))
        .unwrap();
    if let Some((w, b)) = wb {
        y = y
            .broadcast_mul(&per_channel(w))
            .unwrap()
            .broadcast_add(&per_channel(b))
            .unwrap();
    }
    if relu {
        y = y.relu().unwrap();
    }
    let unbiased = (var.flatten_all().unwrap() * (m / (m - 1.0))).unwrap();
    (y, mean.flatten_all().unwrap(), unbiased)
}

/// `x` of logical `dims` as a variable, stored channels-last when asked, and its NCHW view.
fn var_in_format(rng: &mut SplitMix64, dims: &[usize], channels_last: bool) -> (Var, Tensor) {
    let r = dims.len();
    if !channels_last || r < 3 {
        let v = Var::from_tensor(&rand_t(rng, dims)).unwrap();
        let t = v.as_tensor().clone();
        return (v, t);
    }
    let physical: Vec<usize> = std::iter::once(dims[0])
        .chain(dims[2..].iter().copied())
        .chain(std::iter::once(dims[1]))
        .collect();
    let v = Var::from_tensor(&rand_t(rng, &physical)).unwrap();
    let back: Vec<usize> = std::iter::once(0)
        .chain(std::iter::once(r - 1))
        .chain(1..r - 1)
        .collect();
    let t = v.as_tensor().permute(back).unwrap();
    (v, t)
}

/// The batch-norm training op on the CPU (its float64 reference forward and backward) against
/// the same math in Candle ops: output, gradients of x, weight and bias, the running
/// statistics, for NCHW and channels-last inputs of ranks 2 to 5, with and without affine
/// parameters and ReLU, both running-variance conventions.
#[test]
fn batch_norm_train_op_matches_composed_reference() {
    use cudnn_backend::candle::ops::batch_norm_train;
    use cudnn_backend::ops::BatchNormOptions;
    let mut rng = SplitMix64::new(40);
    let cases: [(&[usize], bool, bool, bool, bool); 6] = [
        (&[6, 3], false, true, false, true),
        (&[2, 4, 5, 3], false, true, true, true),
        (&[2, 4, 5, 3], true, true, false, true),
        (&[3, 2, 7], false, false, false, false),
        (&[2, 3, 2, 3, 2], true, true, true, true),
        (&[4, 5, 3, 2], true, false, true, false),
    ];
    for (dims, cl, affine, relu, unbiased) in cases {
        let what = format!("{dims:?} channels_last {cl} affine {affine} relu {relu}");
        let c = dims[1];
        let (xv, x) = var_in_format(&mut rng, dims, cl);
        let w = Var::from_tensor(&rand_t(&mut rng, &[c])).unwrap();
        let b = Var::from_tensor(&rand_t(&mut rng, &[c])).unwrap();
        let rm0 = rand_t(&mut rng, &[c]);
        let rv0 = (rand_t(&mut rng, &[c]).abs().unwrap() + 0.5).unwrap();
        let (rm, rv) = (Var::from_tensor(&rm0).unwrap(), Var::from_tensor(&rv0).unwrap());
        let opts = BatchNormOptions {
            epsilon: 1e-3,
            momentum: 0.3,
            unbiased_running_var: unbiased,
            relu,
        };
        let wb = affine.then_some((w.as_tensor(), b.as_tensor()));
        let ours = batch_norm_train(&x, wb, Some((&rm, &rv)), &opts).unwrap();
        assert_eq!(ours.dims(), dims, "{what}");
        if cl && dims.len() >= 3 {
            let expect = cudnn_backend_reference::channels_last_strides(dims);
            assert_eq!(ours.stride(), expect.as_slice(), "{what}: output stored channels-last");
        }
        let (theirs, mean, var_unbiased) = composed_batch_norm(&x, wb, 1e-3, relu);
        assert_close(&ours, &theirs, 1e-12, &format!("{what}: forward"));
        let m = (dims[0] * dims[2..].iter().product::<usize>()) as f64;
        let batch_var = if unbiased {
            var_unbiased
        } else {
            (var_unbiased * ((m - 1.0) / m)).unwrap()
        };
        let mix = |old: &Tensor, new: &Tensor| ((old * 0.7).unwrap() + (new * 0.3).unwrap()).unwrap();
        assert_close(
            rm.as_tensor(),
            &mix(&rm0, &mean),
            1e-12,
            &format!("{what}: running mean"),
        );
        assert_close(
            rv.as_tensor(),
            &mix(&rv0, &batch_var),
            1e-12,
            &format!("{what}: running var"),
        );
        let probe = rand_t(&mut rng, dims);
        let vars: Vec<&Var> = if affine { vec![&xv, &w, &b] } else { vec![&xv] };
        let got = grads_of(&vars, &(&ours * &probe).unwrap().sum_all().unwrap());
        let want = grads_of(&vars, &(&theirs * &probe).unwrap().sum_all().unwrap());
        for (i, (g, e)) in got.iter().zip(&want).enumerate() {
            assert_close(g, e, 1e-10, &format!("{what}: gradient {i}"));
        }
    }
}

/// The batch-norm op with a residual added before the ReLU on the CPU against the same math in
/// Candle ops: output, gradients of x, the residual, weight and bias (packed into one input by
/// the op), with x and the residual stored alike or differently, with and without affine
/// parameters and ReLU.
#[test]
fn batch_norm_add_train_op_matches_composed_reference() {
    use cudnn_backend::candle::ops::batch_norm_add_train;
    use cudnn_backend::ops::BatchNormOptions;
    let mut rng = SplitMix64::new(43);
    let cases: [(&[usize], bool, bool, bool, bool); 5] = [
        (&[6, 3], false, false, true, true),
        (&[2, 4, 5, 3], false, false, true, true),
        (&[2, 4, 5, 3], true, true, true, true),
        (&[3, 2, 7], false, true, false, true),
        (&[2, 3, 2, 3, 2], true, false, true, false),
    ];
    for (dims, x_cl, r_cl, affine, relu) in cases {
        let what = format!("{dims:?} x channels_last {x_cl} residual channels_last {r_cl} affine {affine} relu {relu}");
        let c = dims[1];
        let (xv, x) = var_in_format(&mut rng, dims, x_cl);
        let (rv_, r) = var_in_format(&mut rng, dims, r_cl);
        let w = Var::from_tensor(&rand_t(&mut rng, &[c])).unwrap();
        let b = Var::from_tensor(&rand_t(&mut rng, &[c])).unwrap();
        let rm = Var::from_tensor(&rand_t(&mut rng, &[c])).unwrap();
        let rvar = Var::from_tensor(&(rand_t(&mut rng, &[c]).abs().unwrap() + 0.5).unwrap()).unwrap();
        let opts = BatchNormOptions {
            epsilon: 1e-3,
            momentum: 0.3,
            unbiased_running_var: true,
            relu,
        };
        let wb = affine.then_some((w.as_tensor(), b.as_tensor()));
        let ours = batch_norm_add_train(&x, &r, wb, Some((&rm, &rvar)), &opts).unwrap();
        assert_eq!(ours.dims(), dims, "{what}");
        let (bn, _, _) = composed_batch_norm(&x, wb, 1e-3, false);
        let mut theirs = (bn + &r).unwrap();
        if relu {
            theirs = theirs.relu().unwrap();
        }
        assert_close(&ours, &theirs, 1e-12, &format!("{what}: forward"));
        let probe = rand_t(&mut rng, dims);
        let vars: Vec<&Var> = if affine {
            vec![&xv, &rv_, &w, &b]
        } else {
            vec![&xv, &rv_]
        };
        let got = grads_of(&vars, &(&ours * &probe).unwrap().sum_all().unwrap());
        let want = grads_of(&vars, &(&theirs * &probe).unwrap().sum_all().unwrap());
        for (i, (g, e)) in got.iter().zip(&want).enumerate() {
            assert_close(g, e, 1e-10, &format!("{what}: gradient {i}"));
        }
    }
    let o = BatchNormOptions::default();
    let x = rand_t(&mut rng, &[2, 3, 4]);
    let e = |r: Result<Tensor>| err_text("batch_norm_train", r);
    let dims = e(batch_norm_add_train(&x, &rand_t(&mut rng, &[2, 3, 5]), None, None, &o));
    assert!(dims.contains("residual"), "{dims}");
    let f32r = rand_t(&mut rng, &[2, 3, 4]).to_dtype(DType::F32).unwrap();
    let dtype = e(batch_norm_add_train(&x, &f32r, None, None, &o));
    assert!(dtype.contains("residual") && dtype.contains("dtype"), "{dtype}");
}

/// `nn::BatchNorm` in training trains like candle-nn's: the same outputs, running statistics
/// (momentum and unbiased running variance as candle-nn 0.11) and inference outputs over
/// several steps, also without mean removal (composed) and on the composed path; the running
/// statistics are updated in the `VarMap`'s variables, so a checkpoint saves them.
#[test]
fn batch_norm_layer_trains_like_candle_nn() {
    let dev = Device::Cpu;
    let mut rng = SplitMix64::new(41);
    for (remove_mean, fused) in [(true, true), (true, false), (false, true)] {
        let what = format!("remove_mean {remove_mean} fused {fused}");
        let cfg = candle_nn::BatchNormConfig {
            remove_mean,
            momentum: 0.2,
            ..Default::default()
        };
        let (ours_map, theirs_map) = (VarMap::new(), VarMap::new());
        let ours = cnn::batch_norm(5, cfg, VarBuilder::from_varmap(&ours_map, DType::F32, &dev).pp("bn"))
            .unwrap()
            .with_fused_training(fused);
        let theirs =
            candle_nn::batch_norm(5, cfg, VarBuilder::from_varmap(&theirs_map, DType::F32, &dev).pp("bn")).unwrap();
        for step in 0..3 {
            let x = (rand_t(&mut rng, &[4, 5, 3, 3]).to_dtype(DType::F32).unwrap() * (step as f64 + 1.0)).unwrap();
            let (a, b) = (ours.forward_t(&x, true).unwrap(), theirs.forward_t(&x, true).unwrap());
            assert_close(&a, &b, 1e-5, &format!("{what}: step {step} output"));
            assert_close(
                ours.running_mean(),
                theirs.running_mean(),
                1e-6,
                &format!("{what}: running mean"),
            );
            assert_close(
                ours.running_var(),
                theirs.running_var(),
                1e-6,
                &format!("{what}: running var"),
            );
            let relu = ours.forward_relu_t(&x, true).unwrap();
            assert_close(&relu, &b.relu().unwrap(), 1e-5, &format!("{what}: forward_relu_t"));
            // forward_relu_t updated the statistics once more: so does candle-nn's layer.
            theirs.forward_t(&x, true).unwrap();
            let skip = rand_t(&mut rng, &[4, 5, 3, 3]).to_dtype(DType::F32).unwrap();
            let added = ours.forward_add_relu_t(&x, &skip, true).unwrap();
            let want = (theirs.forward_t(&x, true).unwrap() + &skip).unwrap().relu().unwrap();
            assert_close(&added, &want, 1e-5, &format!("{what}: forward_add_relu_t"));
        }
        let x = rand_t(&mut rng, &[2, 5, 4, 4]).to_dtype(DType::F32).unwrap();
        let (a, b) = (ours.forward_t(&x, false).unwrap(), theirs.forward_t(&x, false).unwrap());
        assert_close(&a, &b, 1e-5, &format!("{what}: inference"));
        let saved = ours_map
            .data()
            .lock()
            .unwrap()
            .get("bn.running_var")
            .unwrap()
            .as_tensor()
            .clone();
        assert_close(
            &saved,
            ours.running_var(),
            0.0,
            &format!("{what}: the VarMap holds the update"),
        );
    }
}

/// Invalid batch-norm training calls are errors naming the op and the operand, not panics or
/// hangs (running statistics that share storage are refused before anything is locked).
#[test]
fn batch_norm_train_rejects_bad_arguments() {
    use cudnn_backend::candle::ops::batch_norm_train;
    use cudnn_backend::ops::BatchNormOptions;
    let mut rng = SplitMix64::new(42);
    let o = BatchNormOptions::default();
    let f = |t: Tensor| t.to_dtype(DType::F32).unwrap();
    let x = f(rand_t(&mut rng, &[2, 3, 4]));
    let (w, b) = (f(rand_t(&mut rng, &[3])), f(rand_t(&mut rng, &[3])));
    let rm = Var::from_tensor(&f(rand_t(&mut rng, &[3]))).unwrap();
    let rv = Var::from_tensor(&f(rand_t(&mut rng, &[3]))).unwrap();
    let e = |r: Result<Tensor>| err_text("batch_norm_train", r);
    let one = e(batch_norm_train(&f(rand_t(&mut rng, &[1, 3])), None, None, &o));
    assert!(one.contains("more than one"), "{one}");
    let bad_w = e(batch_norm_train(&x, Some((&f(rand_t(&mut rng, &[4])), &b)), None, &o));
    assert!(
        bad_w.contains("weight") && bad_w.contains("batch_norm_train"),
        "{bad_w}"
    );
    let half = Var::from_tensor(&rand_t(&mut rng, &[3]).to_dtype(DType::BF16).unwrap()).unwrap();
    let mixed = e(batch_norm_train(&x, Some((&w, &b)), Some((&half, &rv)), &o));
    assert!(mixed.contains("running_mean"), "{mixed}");
    let same = e(batch_norm_train(&x, None, Some((&rm, &rm)), &o));
    assert!(same.contains("shares its storage"), "{same}");
    let aliased = e(batch_norm_train(&x, Some((rm.as_tensor(), &b)), Some((&rm, &rv)), &o));
    assert!(aliased.contains("shares its storage"), "{aliased}");
    let rank1 = e(batch_norm_train(&f(rand_t(&mut rng, &[3])), None, None, &o));
    assert!(rank1.contains("(N, C"), "{rank1}");
    let ints = Tensor::zeros((2, 3, 4), DType::U32, &Device::Cpu).unwrap();
    let ints = e(batch_norm_train(&ints, None, None, &o));
    assert!(ints.contains("dtype"), "{ints}");
    // Nothing was updated by the refused calls.
    let before = vals(rv.as_tensor());
    assert!(batch_norm_train(&x, Some((&w, &b)), Some((&rm, &rv)), &o).is_ok());
    assert_ne!(vals(rv.as_tensor()), before, "a valid call updates the statistics");
}

/// The norm ops' backward pass (the engine's on CUDA) from saved statistics, and from
/// recomputed ones when the op value kept none (the inference op, or an op applied twice),
/// against autograd through Candle ops; empty inputs give empty gradients.
#[test]
fn norm_backward_with_saved_and_recomputed_statistics() {
    use cudnn_backend::candle::ops::Norm;
    use cudnn_backend::graph::NormMode;
    let mut rng = SplitMix64::new(43);
    let x = Var::from_tensor(&rand_t(&mut rng, &[3, 5, 12])).unwrap();
    let w = Var::from_tensor(&rand_t(&mut rng, &[12])).unwrap();
    let b = Var::from_tensor(&rand_t(&mut rng, &[12])).unwrap();
    let probe = rand_t(&mut rng, &[3, 5, 12]);
    for mode in [NormMode::LayerNorm, NormMode::RmsNorm] {
        let reference = x
            .as_tensor()
            .cudnn_layer_norm(w.as_tensor(), Some(b.as_tensor()), 1e-5)
            .unwrap();
        let reference = match mode {
            NormMode::LayerNorm => reference,
            NormMode::RmsNorm => {
                let xt = x.as_tensor();
                let inv = (xt.sqr().unwrap().mean_keepdim(D::Minus1).unwrap() + 1e-5)
                    .unwrap()
                    .sqrt()
                    .unwrap();
                xt.broadcast_div(&inv)
                    .unwrap()
                    .broadcast_mul(w.as_tensor())
                    .unwrap()
                    .broadcast_add(b.as_tensor())
                    .unwrap()
            }
        };
        let want = grads_of(&[&x, &w, &b], &(&reference * &probe).unwrap().sum_all().unwrap());
        let training = x
            .as_tensor()
            .apply_op3(w.as_tensor(), b.as_tensor(), Norm::training(mode, 1e-5))
            .unwrap();
        let inference = x
            .as_tensor()
            .apply_op3(w.as_tensor(), b.as_tensor(), Norm::new(mode, 1e-5))
            .unwrap();
        let shared =
            std::sync::Arc::new(Box::new(Norm::training(mode, 1e-5)) as Box<dyn candle_core::CustomOp3 + Send + Sync>);
        let twice = x
            .as_tensor()
            .apply_op3_arc(w.as_tensor(), b.as_tensor(), shared.clone())
            .unwrap();
        let _again = (x.as_tensor() * 2.0)
            .unwrap()
            .apply_op3_arc(w.as_tensor(), b.as_tensor(), shared)
            .unwrap();
        for (name, y) in [("saved", training), ("recomputed", inference), ("applied twice", twice)] {
            assert_close(&y, &reference, 1e-12, &format!("{mode:?} {name}: forward"));
            let got = grads_of(&[&x, &w, &b], &(&y * &probe).unwrap().sum_all().unwrap());
            for (i, (g, e)) in got.iter().zip(&want).enumerate() {
                assert_close(g, e, 1e-10, &format!("{mode:?} {name}: gradient {i}"));
            }
        }
    }
    let empty = Var::from_tensor(&Tensor::zeros((0, 12), DType::F64, &Device::Cpu).unwrap()).unwrap();
    let y =
        cudnn_backend::candle::ops::norm(empty.as_tensor(), w.as_tensor(), None, NormMode::LayerNorm, 1e-5).unwrap();
    assert_eq!(y.dims(), [0, 12]);
    let g = grads_of(&[&empty, &w], &y.sum_all().unwrap());
    assert_eq!(g[0].dims(), [0, 12]);
    assert_eq!(vals(&g[1]), vec![0.0; 12]);
}

/// `FusedAdamW` updates like candle-nn's `AdamW` (bias correction, decoupled weight decay,
/// one step count for all variables; variables without a gradient untouched), each variable
/// once even when listed twice; a gradient of the wrong shape is an error.
#[test]
fn fused_adamw_matches_candle_nn_adamw() {
    use cudnn_backend::candle::optim::{FusedAdamW, ParamsAdamW};
    let mut rng = SplitMix64::new(44);
    let shapes: [&[usize]; 4] = [&[3, 4], &[7], &[2, 3, 2], &[5]];
    let init: Vec<Tensor> = shapes
        .iter()
        .map(|d| rand_t(&mut rng, d).to_dtype(DType::F32).unwrap())
        .collect();
    let targets: Vec<Tensor> = shapes
        .iter()
        .map(|d| rand_t(&mut rng, d).to_dtype(DType::F32).unwrap())
        .collect();
    let make = || -> Vec<Var> { init.iter().map(|t| Var::from_tensor(t).unwrap()).collect() };
    let (ours_vars, theirs_vars) = (make(), make());
    let params = ParamsAdamW {
        lr: 0.05,
        weight_decay: 0.1,
        ..Default::default()
    };
    let mut listed = ours_vars.clone();
    listed.push(ours_vars[0].clone()); // listed twice: updated once
    let mut ours = FusedAdamW::new(listed, params.clone()).unwrap();
    let mut theirs = candle_nn::AdamW::new(theirs_vars.clone(), params).unwrap();
    // The last variable gets no gradient (it is left out of the loss).
    let loss = |vars: &[Var]| -> Tensor {
        let mut total = Tensor::zeros((), DType::F32, &Device::Cpu).unwrap();
        for (v, t) in vars.iter().zip(&targets).take(3) {
            let d = (v.as_tensor() - t).unwrap();
            total = (total + (d.sqr().unwrap() * 3.0).unwrap().sum_all().unwrap()).unwrap();
        }
        total
    };
    for _ in 0..5 {
        ours.backward_step(&loss(&ours_vars)).unwrap();
        theirs.backward_step(&loss(&theirs_vars)).unwrap();
    }
    assert_eq!(ours.step_count(), 5);
    assert_eq!(ours.vars().len(), 4);
    for (i, (a, b)) in ours_vars.iter().zip(&theirs_vars).enumerate() {
        assert_close(a.as_tensor(), b.as_tensor(), 1e-6, &format!("variable {i}"));
    }
    assert_close(ours_vars[3].as_tensor(), &init[3], 0.0, "no gradient, no update");
    let mut grads = candle_core::backprop::GradStore::default();
    grads.insert(
        ours_vars[0].as_tensor(),
        Tensor::zeros(5, DType::F32, &Device::Cpu).unwrap(),
    );
    let e = ours.step(&grads).unwrap_err().to_string();
    assert!(e.contains("FusedAdamW") && e.contains("gradient"), "{e}");
    ours.set_learning_rate(0.5);
    assert_eq!(ours.learning_rate(), 0.5);
}
