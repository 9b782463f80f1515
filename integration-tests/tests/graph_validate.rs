//! CPU tests of `Graph::validate`: shape/stride/dtype inference for every node kind, and one
//! test per class of rejected input (each checks the error names the problem).

use cudnn_backend::graph::{
    ConvAttrs, DataType, Graph, PointwiseMode, ReduceOp, ResampleAttrs, ResampleMode, Scalar, TensorId,
};
use cudnn_backend::Error;

use DataType::{BF16, F16, F32, I32, I8};

/// Packed row-major strides (NCHW for images).
fn nchw(dims: &[i64]) -> Vec<i64> {
    let mut s = vec![1i64; dims.len()];
    for i in (0..dims.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * dims[i + 1];
    }
    s
}

/// Packed channels-last strides (N, spatial..., C), written out by hand so the test does not
/// trust the library's own layout helpers.
fn nhwc(dims: &[i64]) -> Vec<i64> {
    let c = dims[1];
    let mut s = vec![0i64; dims.len()];
    s[1] = 1;
    let mut acc = c;
    for i in (2..dims.len()).rev() {
        s[i] = acc;
        acc *= dims[i];
    }
    s[0] = acc;
    s
}

/// An input tensor with packed NCHW strides.
fn input(g: &mut Graph, name: &str, dims: &[i64], dtype: DataType) -> TensorId {
    g.tensor(name, dims, &nchw(dims), dtype)
}

fn conv(pad: &[i64], stride: &[i64], dilation: &[i64]) -> ConvAttrs {
    ConvAttrs::new(pad, stride, dilation)
}

fn pool(mode: ResampleMode, window: &[i64], stride: &[i64], pad: &[i64]) -> ResampleAttrs {
    ResampleAttrs {
        mode,
        window: window.to_vec(),
        stride: stride.to_vec(),
        pre_padding: pad.to_vec(),
        post_padding: pad.to_vec(),
    }
}

/// Asserts a tensor's inferred dims, strides and dtype.
#[track_caller]
fn assert_tensor(g: &Graph, t: TensorId, case: &str, dims: &[i64], strides: &[i64], dtype: DataType) {
    let info = g.tensor_info(t);
    assert_eq!(info.dims, dims, "{case}: dims of `{}`", info.name);
    assert_eq!(info.strides, strides, "{case}: strides of `{}`", info.name);
    assert_eq!(info.dtype, Some(dtype), "{case}: dtype of `{}`", info.name);
}

#[track_caller]
fn validate_ok(g: &mut Graph, case: &str) {
    if let Err(e) = g.validate() {
        panic!("{case}: validate failed: {e}");
    }
    assert!(g.is_validated(), "{case}: is_validated() after a successful validate");
}

/// Asserts `validate()` fails with `Error::InvalidGraph` whose message contains every needle.
#[track_caller]
fn expect_invalid(g: &mut Graph, case: &str, needles: &[&str]) {
    match g.validate() {
        Err(Error::InvalidGraph(msg)) => {
            for n in needles {
                assert!(msg.contains(n), "{case}: message `{msg}` should contain `{n}`");
            }
        }
        Err(other) => panic!("{case}: expected Error::InvalidGraph, got {other:?}"),
        Ok(()) => panic!("{case}: validate() accepted an invalid graph"),
    }
    assert!(!g.is_validated(), "{case}: is_validated() after a failed validate");
}

/// conv_fprop of packed NCHW x and w, output marked f32; returns (graph, y).
fn conv_graph(x: &[i64], w: &[i64], attrs: ConvAttrs) -> (Graph, TensorId) {
    let mut g = Graph::new();
    let xi = input(&mut g, "x", x, F32);
    let wi = input(&mut g, "w", w, F32);
    let y = g.conv_fprop(xi, wi, attrs);
    g.set_output(y, F32);
    (g, y)
}

// ---------------------------------------------------------------- shape inference

#[test]
fn conv_fprop_2d_same_padding() {
    let (mut g, y) = conv_graph(&[2, 3, 8, 8], &[4, 3, 3, 3], conv(&[1, 1], &[1, 1], &[1, 1]));
    validate_ok(&mut g, "conv 2-D");
    assert_tensor(&g, y, "conv 2-D", &[2, 4, 8, 8], &[256, 64, 8, 1], F32);
}

#[test]
fn conv_fprop_1d() {
    let (mut g, y) = conv_graph(&[2, 4, 10], &[6, 4, 3], conv(&[0], &[1], &[1]));
    validate_ok(&mut g, "conv 1-D");
    assert_tensor(&g, y, "conv 1-D", &[2, 6, 8], &[48, 8, 1], F32);
}

#[test]
fn conv_fprop_3d() {
    let (mut g, y) = conv_graph(
        &[1, 2, 5, 6, 7],
        &[3, 2, 3, 3, 3],
        conv(&[1, 1, 1], &[1, 1, 1], &[1, 1, 1]),
    );
    validate_ok(&mut g, "conv 3-D");
    assert_tensor(&g, y, "conv 3-D", &[1, 3, 5, 6, 7], &[630, 210, 42, 7, 1], F32);
}

#[test]
fn conv_fprop_grouped() {
    // 8 input channels, 2 per group -> 4 groups; 4 filters (one per group).
    let (mut g, y) = conv_graph(&[2, 8, 6, 6], &[4, 2, 3, 3], conv(&[0, 0], &[1, 1], &[1, 1]));
    validate_ok(&mut g, "grouped conv");
    assert_tensor(&g, y, "grouped conv", &[2, 4, 4, 4], &[64, 16, 4, 1], F32);
    // Depthwise: groups == channels.
    let (mut g, y) = conv_graph(&[1, 6, 5, 5], &[12, 1, 3, 3], conv(&[1, 1], &[1, 1], &[1, 1]));
    validate_ok(&mut g, "depthwise conv");
    assert_tensor(&g, y, "depthwise conv", &[1, 12, 5, 5], &[300, 25, 5, 1], F32);
}

#[test]
fn conv_fprop_stride_2() {
    // (9 + 2 - 3) / 2 + 1 = 5 and (10 + 2 - 3) / 2 + 1 = 5 (floor).
    let (mut g, y) = conv_graph(&[1, 3, 9, 10], &[2, 3, 3, 3], conv(&[1, 1], &[2, 2], &[1, 1]));
    validate_ok(&mut g, "stride 2");
    assert_tensor(&g, y, "stride 2", &[1, 2, 5, 5], &[50, 25, 5, 1], F32);
}

#[test]
fn conv_fprop_dilation_2() {
    // Effective filter 2 * (3 - 1) + 1 = 5: 10 - 5 + 1 = 6.
    let (mut g, y) = conv_graph(&[1, 1, 10, 10], &[1, 1, 3, 3], conv(&[0, 0], &[1, 1], &[2, 2]));
    validate_ok(&mut g, "dilation 2");
    assert_tensor(&g, y, "dilation 2", &[1, 1, 6, 6], &[36, 36, 6, 1], F32);
}

#[test]
fn conv_fprop_asymmetric_padding() {
    let mut attrs = conv(&[0, 0], &[1, 1], &[1, 1]);
    attrs.geometry.pre_padding = vec![0, 2];
    attrs.geometry.post_padding = vec![1, 0];
    // H: 5 + 0 + 1 - 3 + 1 = 4; W: 7 + 2 + 0 - 3 + 1 = 7.
    let (mut g, y) = conv_graph(&[1, 1, 5, 7], &[1, 1, 3, 3], attrs);
    validate_ok(&mut g, "asymmetric padding");
    assert_tensor(&g, y, "asymmetric padding", &[1, 1, 4, 7], &[28, 28, 7, 1], F32);
}

#[test]
fn conv_fprop_output_follows_input_layout() {
    for (case, x_strides, y_strides) in [
        ("NCHW", nchw(&[2, 3, 8, 8]), vec![256, 64, 8, 1]),
        ("NHWC", nhwc(&[2, 3, 8, 8]), vec![256, 1, 32, 4]),
    ] {
        let mut g = Graph::new();
        let x = g.tensor("x", &[2, 3, 8, 8], &x_strides, F16);
        let w = input(&mut g, "w", &[4, 3, 3, 3], F16);
        let y = g.conv_fprop(x, w, conv(&[1, 1], &[1, 1], &[1, 1]));
        g.set_output(y, F16);
        validate_ok(&mut g, case);
        assert_tensor(&g, y, case, &[2, 4, 8, 8], &y_strides, F16);
    }
    assert_eq!(nhwc(&[2, 3, 8, 8]), [192, 1, 24, 3], "hand-written NHWC helper");
}

#[test]
fn conv_fprop_explicit_output_strides_are_kept() {
    let (mut g, y) = conv_graph(&[2, 3, 8, 8], &[4, 3, 3, 3], conv(&[1, 1], &[1, 1], &[1, 1]));
    g.set_strides(y, &nhwc(&[2, 4, 8, 8]));
    validate_ok(&mut g, "NCHW in, NHWC out");
    assert_tensor(&g, y, "NCHW in, NHWC out", &[2, 4, 8, 8], &[256, 1, 32, 4], F32);
}

#[test]
fn virtual_tensors_take_the_intermediate_type_and_outputs_their_set_dtype() {
    for (case, intermediate, out) in [("f32 / f16", F32, F16), ("f16 / bf16", F16, BF16)] {
        let mut g = Graph::new();
        g.intermediate_type = intermediate;
        let x = input(&mut g, "x", &[1, 2, 4, 4], F16);
        let w = input(&mut g, "w", &[3, 2, 1, 1], F16);
        let y = g.conv_fprop(x, w, conv(&[0, 0], &[1, 1], &[1, 1]));
        let r = g.pointwise(PointwiseMode::Relu, y, None);
        g.set_output(r, out);
        validate_ok(&mut g, case);
        assert!(g.tensor_info(y).is_virtual, "{case}: conv output stays virtual");
        assert_tensor(&g, y, case, &[1, 3, 4, 4], &[48, 16, 4, 1], intermediate);
        assert_tensor(&g, r, case, &[1, 3, 4, 4], &[48, 16, 4, 1], out);
    }
}

#[test]
fn conv_dgrad_infers_dx_strides_from_dy() {
    for (case, dy_strides, dx_strides) in [
        ("NCHW", nchw(&[2, 4, 8, 8]), vec![192, 64, 8, 1]),
        ("NHWC", nhwc(&[2, 4, 8, 8]), vec![192, 1, 24, 3]),
    ] {
        let mut g = Graph::new();
        let dy = g.tensor("dy", &[2, 4, 8, 8], &dy_strides, F32);
        let w = input(&mut g, "w", &[4, 3, 3, 3], F32);
        let dx = g.conv_dgrad(dy, w, &[2, 3, 8, 8], conv(&[1, 1], &[1, 1], &[1, 1]));
        g.set_output(dx, F16);
        validate_ok(&mut g, case);
        assert_tensor(&g, dx, case, &[2, 3, 8, 8], &dx_strides, F16);
    }
}

#[test]
fn conv_dgrad_strided_accepts_both_rounded_input_sizes() {
    // Stride 2 maps both 9 and 10 to 5, so both dx sizes are consistent with dy.
    for h in [9, 10] {
        let case = format!("dgrad dx H={h}");
        let mut g = Graph::new();
        let dy = input(&mut g, "dy", &[1, 2, 5, 5], F32);
        let w = input(&mut g, "w", &[2, 3, 3, 3], F32);
        let dx = g.conv_dgrad(dy, w, &[1, 3, h, 9], conv(&[1, 1], &[2, 2], &[1, 1]));
        g.set_output(dx, F32);
        validate_ok(&mut g, &case);
        assert_tensor(&g, dx, &case, &[1, 3, h, 9], &[3 * h * 9, h * 9, 9, 1], F32);
    }
}

#[test]
fn conv_wgrad_infers_dw_strides_from_x() {
    for (case, x_strides, dw_strides) in [
        ("NCHW", nchw(&[2, 3, 8, 8]), vec![27, 9, 3, 1]),
        ("NHWC", nhwc(&[2, 3, 8, 8]), vec![27, 1, 9, 3]),
    ] {
        let mut g = Graph::new();
        let x = g.tensor("x", &[2, 3, 8, 8], &x_strides, BF16);
        let dy = input(&mut g, "dy", &[2, 4, 8, 8], BF16);
        let dw = g.conv_wgrad(x, dy, &[4, 3, 3, 3], conv(&[1, 1], &[1, 1], &[1, 1]));
        g.set_output(dw, F32);
        validate_ok(&mut g, case);
        assert_tensor(&g, dw, case, &[4, 3, 3, 3], &dw_strides, F32);
    }
}

#[test]
fn matmul_rank2_rank3_and_broadcast_batch() {
    for (case, a, b, c, c_strides) in [
        ("rank 2", vec![5, 7], vec![7, 3], vec![5, 3], vec![3, 1]),
        ("rank 3", vec![4, 5, 7], vec![4, 7, 3], vec![4, 5, 3], vec![15, 3, 1]),
        (
            "broadcast a",
            vec![1, 5, 7],
            vec![4, 7, 3],
            vec![4, 5, 3],
            vec![15, 3, 1],
        ),
        (
            "broadcast both",
            vec![2, 1, 5, 7],
            vec![1, 3, 7, 4],
            vec![2, 3, 5, 4],
            vec![60, 20, 4, 1],
        ),
    ] {
        let mut g = Graph::new();
        let ai = input(&mut g, "a", &a, BF16);
        let bi = input(&mut g, "b", &b, BF16);
        let ci = g.matmul(ai, bi);
        g.set_output(ci, BF16);
        validate_ok(&mut g, case);
        assert_tensor(&g, ci, case, &c, &c_strides, BF16);
    }
}

#[test]
fn matmul_with_transposed_b_gives_row_major_c() {
    let mut g = Graph::new();
    let a = input(&mut g, "a", &[2, 5, 7], F32);
    let b = g.tensor("bT", &[2, 7, 3], &[21, 1, 7], F32);
    let c = g.matmul(a, b);
    let r = g.pointwise(PointwiseMode::Tanh, c, None);
    g.set_output(r, F32);
    validate_ok(&mut g, "transposed b");
    assert_tensor(&g, c, "virtual c", &[2, 5, 3], &[15, 3, 1], F32);
    assert_tensor(&g, r, "tanh(c)", &[2, 5, 3], &[15, 3, 1], F32);
}

#[test]
fn pointwise_unary_keeps_dims_and_layout() {
    use PointwiseMode::*;
    for mode in [
        Exp,
        Log,
        Sqrt,
        Rsqrt,
        Neg,
        Abs,
        Identity,
        Relu,
        Gelu,
        GeluTanh,
        Sigmoid,
        Tanh,
        Elu(1.0),
        Swish(1.0),
    ] {
        let case = format!("{mode:?}");
        let mut g = Graph::new();
        let x = g.tensor("x", &[2, 3, 4, 5], &nhwc(&[2, 3, 4, 5]), F16);
        let y = g.pointwise(mode, x, None);
        g.set_output(y, F16);
        validate_ok(&mut g, &case);
        assert_tensor(&g, y, &case, &[2, 3, 4, 5], &[60, 1, 15, 3], F16);
    }
}

#[test]
fn pointwise_binary_broadcasts_bias() {
    use PointwiseMode::*;
    for mode in [Add, Sub, Mul, Div, Max, Min] {
        let case = format!("{mode:?}");
        let mut g = Graph::new();
        let x = input(&mut g, "x", &[2, 4, 3, 3], F32);
        let bias = input(&mut g, "bias", &[1, 4, 1, 1], F32);
        let y = g.pointwise(mode, x, Some(bias));
        g.set_output(y, F32);
        validate_ok(&mut g, &case);
        assert_tensor(&g, y, &case, &[2, 4, 3, 3], &[36, 9, 3, 1], F32);
    }
    // Both operands broadcast: [2,1,3] op [1,4,3] -> [2,4,3].
    let mut g = Graph::new();
    let a = input(&mut g, "a", &[2, 1, 3], F32);
    let b = input(&mut g, "b", &[1, 4, 3], F32);
    let y = g.pointwise(Mul, a, Some(b));
    g.set_output(y, F32);
    validate_ok(&mut g, "two-sided broadcast");
    assert_tensor(&g, y, "two-sided broadcast", &[2, 4, 3], &[12, 3, 1], F32);
}

#[test]
fn pointwise_with_by_value_scalar() {
    let mut g = Graph::new();
    let x = input(&mut g, "x", &[2, 3, 4, 4], F32);
    let s = g.scalar("scale", Scalar::F32(0.5), 4);
    let y = g.pointwise(PointwiseMode::Mul, x, Some(s));
    g.set_output(y, F32);
    validate_ok(&mut g, "x * scalar");
    assert_tensor(&g, y, "x * scalar", &[2, 3, 4, 4], &[48, 16, 4, 1], F32);
    assert_eq!(g.tensor_info(s).by_value, Some(Scalar::F32(0.5)));
}

/// The causal-mask pattern of fused attention: row/column indices (i32), a shifted row,
/// a comparison (bool) and a select of the scores against a by-value fill.
#[test]
fn causal_mask_indices_compare_and_select() {
    use PointwiseMode::*;
    let mut g = Graph::new();
    let s = input(&mut g, "scores", &[2, 3, 5, 9], F32);
    let fill = g.scalar("fill", Scalar::F32(f32::NEG_INFINITY), 4);
    let shift = g.scalar("shift", Scalar::I32(4), 4);
    let row = g.pointwise_typed(GenIndex(2), s, None, F32, I32);
    let col = g.pointwise_typed(GenIndex(3), s, None, F32, I32);
    let row = g.pointwise_typed(Add, row, Some(shift), I32, I32);
    let keep = g.pointwise_typed(CmpGe, row, Some(col), DataType::Bool, DataType::Bool);
    let y = g.select(s, fill, keep);
    g.set_output(y, F32);
    validate_ok(&mut g, "causal mask");
    assert_tensor(&g, row, "shifted row index", &[2, 3, 5, 9], &[135, 45, 9, 1], I32);
    assert_tensor(&g, keep, "comparison", &[2, 3, 5, 9], &[135, 45, 9, 1], DataType::Bool);
    assert_tensor(&g, y, "select", &[2, 3, 5, 9], &[135, 45, 9, 1], F32);
}

#[test]
fn rejects_bad_index_axis_and_non_bool_select_mask() {
    use PointwiseMode::*;
    let mut g = Graph::new();
    let s = input(&mut g, "scores", &[2, 3, 5, 9], F32);
    let idx = g.pointwise_typed(GenIndex(4), s, None, F32, I32);
    g.set_output(idx, I32);
    expect_invalid(&mut g, "axis 4 of a rank-4 tensor", &["axis 4", "rank 4"]);

    let mut g = Graph::new();
    let s = input(&mut g, "scores", &[2, 3, 5, 9], F32);
    let mask = input(&mut g, "mask", &[2, 3, 5, 9], F32);
    let fill = g.scalar("fill", Scalar::F32(0.0), 4);
    let y = g.select(s, fill, mask);
    g.set_output(y, F32);
    expect_invalid(&mut g, "float mask", &["mask", "Bool"]);
}

#[test]
fn activation_backward_modes() {
    use PointwiseMode::*;
    for mode in [ReluBwd, GeluBwd, SigmoidBwd, TanhBwd] {
        let case = format!("{mode:?}");
        let mut g = Graph::new();
        let dy = g.tensor("dy", &[2, 3, 4, 4], &nhwc(&[2, 3, 4, 4]), BF16);
        let x = g.tensor("x", &[2, 3, 4, 4], &nhwc(&[2, 3, 4, 4]), BF16);
        let dx = g.pointwise(mode, dy, Some(x));
        g.set_output(dx, BF16);
        validate_ok(&mut g, &case);
        assert_tensor(&g, dx, &case, &[2, 3, 4, 4], &[48, 1, 12, 3], BF16);
    }
}

#[test]
fn reduction_to_broadcastable_shapes() {
    for (case, out, strides) in [
        ("per sample", vec![2, 1, 1, 1], vec![1, 1, 1, 1]),
        ("per channel", vec![1, 3, 1, 1], vec![3, 1, 1, 1]),
        ("over W", vec![2, 3, 4, 1], vec![12, 4, 1, 1]),
        ("total", vec![1, 1, 1, 1], vec![1, 1, 1, 1]),
        ("identity", vec![2, 3, 4, 5], vec![60, 20, 5, 1]),
    ] {
        for op in [ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min, ReduceOp::Mean] {
            let case = format!("{case} {op:?}");
            let mut g = Graph::new();
            let x = input(&mut g, "x", &[2, 3, 4, 5], F16);
            let y = g.reduction(op, x, &out);
            g.set_output(y, F32);
            validate_ok(&mut g, &case);
            assert_tensor(&g, y, &case, &out, &strides, F32);
        }
    }
}

#[test]
fn resample_fwd_max_with_index_and_avg() {
    // Max 2x2 / 2 with the argmax index (i8, same dims as y).
    let mut g = Graph::new();
    let x = input(&mut g, "x", &[1, 2, 6, 6], F32);
    let (y, idx) = g.resample_fwd(x, pool(ResampleMode::MaxPool, &[2, 2], &[2, 2], &[0, 0]), true);
    let idx = idx.expect("max pool with_index returns an index tensor");
    g.set_output(y, F32);
    g.set_output(idx, I8);
    validate_ok(&mut g, "max pool + index");
    assert_tensor(&g, y, "max pool y", &[1, 2, 3, 3], &[18, 9, 3, 1], F32);
    assert_tensor(&g, idx, "max pool index", &[1, 2, 3, 3], &[18, 9, 3, 1], I8);

    // Average 3x3 / 1, padding 1, NHWC input: same spatial size, NHWC output.
    for mode in [ResampleMode::AvgPoolIncludePadding, ResampleMode::AvgPoolExcludePadding] {
        let case = format!("{mode:?}");
        let mut g = Graph::new();
        let x = g.tensor("x", &[1, 2, 6, 6], &nhwc(&[1, 2, 6, 6]), F16);
        let (y, idx) = g.resample_fwd(x, pool(mode, &[3, 3], &[1, 1], &[1, 1]), false);
        assert!(idx.is_none(), "{case}: no index requested");
        g.set_output(y, F16);
        validate_ok(&mut g, &case);
        assert_tensor(&g, y, &case, &[1, 2, 6, 6], &[72, 1, 12, 2], F16);
    }

    // 1-D and 3-D windows; stride 2 with padding 1: (7 + 2 - 3) / 2 + 1 = 4.
    let mut g = Graph::new();
    let x = input(&mut g, "x", &[2, 3, 7], F32);
    let (y, _) = g.resample_fwd(x, pool(ResampleMode::MaxPool, &[3], &[2], &[1]), false);
    g.set_output(y, F32);
    validate_ok(&mut g, "1-D pool");
    assert_tensor(&g, y, "1-D pool", &[2, 3, 4], &[12, 4, 1], F32);
    let mut g = Graph::new();
    let x = input(&mut g, "x", &[1, 1, 4, 4, 4], F32);
    let (y, _) = g.resample_fwd(
        x,
        pool(ResampleMode::AvgPoolIncludePadding, &[2, 2, 2], &[2, 2, 2], &[0, 0, 0]),
        false,
    );
    g.set_output(y, F32);
    validate_ok(&mut g, "3-D pool");
    assert_tensor(&g, y, "3-D pool", &[1, 1, 2, 2, 2], &[8, 8, 4, 2, 1], F32);
}

#[test]
fn resample_bwd_avg_and_max() {
    let attrs = |mode| pool(mode, &[2, 2], &[2, 2], &[0, 0]);
    // Average: dy only.
    let mut g = Graph::new();
    let dy = g.tensor("dy", &[1, 2, 3, 3], &nhwc(&[1, 2, 3, 3]), F32);
    let dx = g.resample_bwd(
        dy,
        &[1, 2, 6, 6],
        attrs(ResampleMode::AvgPoolIncludePadding),
        None,
        None,
        None,
    );
    g.set_output(dx, F32);
    validate_ok(&mut g, "avg pool bwd");
    assert_tensor(&g, dx, "avg pool bwd", &[1, 2, 6, 6], &[72, 1, 12, 2], F32);

    // Max with the forward's x and y.
    let mut g = Graph::new();
    let dy = input(&mut g, "dy", &[1, 2, 3, 3], F16);
    let x = input(&mut g, "x", &[1, 2, 6, 6], F16);
    let y = input(&mut g, "y", &[1, 2, 3, 3], F16);
    let dx = g.resample_bwd(dy, &[1, 2, 6, 6], attrs(ResampleMode::MaxPool), Some(x), Some(y), None);
    g.set_output(dx, F16);
    validate_ok(&mut g, "max pool bwd (x, y)");
    assert_tensor(&g, dx, "max pool bwd (x, y)", &[1, 2, 6, 6], &[72, 36, 6, 1], F16);

    // Max with the forward's index, all in one graph.
    let mut g = Graph::new();
    let x = input(&mut g, "x", &[1, 2, 6, 6], F32);
    let dy = input(&mut g, "dy", &[1, 2, 3, 3], F32);
    let (y, idx) = g.resample_fwd(x, attrs(ResampleMode::MaxPool), true);
    g.set_output(y, F32);
    let dx = g.resample_bwd(dy, &[1, 2, 6, 6], attrs(ResampleMode::MaxPool), None, None, idx);
    g.set_output(dx, F32);
    validate_ok(&mut g, "max pool bwd (index)");
    let idx = idx.expect("index");
    assert!(g.tensor_info(idx).is_virtual, "index consumed by bwd stays virtual");
    assert_tensor(&g, idx, "virtual index", &[1, 2, 3, 3], &[18, 9, 3, 1], I8);
    assert_tensor(&g, dx, "max pool bwd (index)", &[1, 2, 6, 6], &[72, 36, 6, 1], F32);
}

#[test]
fn fused_conv_bias_relu() {
    let mut g = Graph::new();
    let x = g.tensor("x", &[1, 3, 8, 8], &nhwc(&[1, 3, 8, 8]), F16);
    let w = g.tensor("w", &[8, 3, 3, 3], &nhwc(&[8, 3, 3, 3]), F16);
    let bias = input(&mut g, "bias", &[1, 8, 1, 1], F16);
    let c = g.conv_fprop(x, w, conv(&[1, 1], &[1, 1], &[1, 1]));
    let b = g.bias_add(c, bias);
    let y = g.pointwise(PointwiseMode::Relu, b, None);
    g.set_output(y, F16);
    validate_ok(&mut g, "conv+bias+relu");
    let nhwc_y = [512, 1, 64, 8];
    assert_tensor(&g, c, "conv (virtual)", &[1, 8, 8, 8], &nhwc_y, F32);
    assert_tensor(&g, b, "bias_add (virtual)", &[1, 8, 8, 8], &nhwc_y, F32);
    assert_tensor(&g, y, "relu (output)", &[1, 8, 8, 8], &nhwc_y, F16);
    assert!(g.tensor_info(c).is_virtual && g.tensor_info(b).is_virtual && !g.tensor_info(y).is_virtual);
    assert_eq!(g.nodes().len(), 3);
    let kinds: Vec<&str> = g.nodes().iter().map(|n| n.op.kind_name()).collect();
    assert_eq!(kinds, ["conv_fprop", "pointwise", "pointwise"]);
}

#[test]
fn validate_twice_is_idempotent() {
    let (mut g, y) = conv_graph(&[2, 3, 8, 8], &[4, 3, 3, 3], conv(&[1, 1], &[1, 1], &[1, 1]));
    validate_ok(&mut g, "first");
    let once = g.clone();
    validate_ok(&mut g, "second");
    assert_eq!(g, once, "a second validate changes nothing");
    assert_tensor(&g, y, "second", &[2, 4, 8, 8], &[256, 64, 8, 1], F32);
}

#[test]
fn modifying_a_validated_graph_clears_is_validated() {
    type Edit = fn(&mut Graph, TensorId, TensorId);
    let edits: [(&str, Edit); 7] = [
        ("set_output", |g, _, y| {
            g.set_output(y, F16);
        }),
        ("set_strides", |g, _, y| {
            g.set_strides(y, &[256, 1, 32, 4]);
        }),
        ("set_dims", |g, _, y| {
            g.set_dims(y, &[2, 4, 8, 8]);
        }),
        ("set_alignment", |g, x, _| {
            g.set_alignment(x, 8);
        }),
        ("new tensor", |g, _, _| {
            g.tensor("extra", &[1], &[1], F32);
        }),
        ("new scalar", |g, _, _| {
            g.scalar("s", Scalar::F32(1.0), 4);
        }),
        ("new node", |g, _, y| {
            let r = g.pointwise(PointwiseMode::Relu, y, None);
            g.set_output(r, F32);
        }),
    ];
    for (case, edit) in edits {
        let mut g = Graph::new();
        let x = input(&mut g, "x", &[2, 3, 8, 8], F32);
        let w = input(&mut g, "w", &[4, 3, 3, 3], F32);
        let y = g.conv_fprop(x, w, conv(&[1, 1], &[1, 1], &[1, 1]));
        g.set_output(y, F32);
        assert!(!g.is_validated(), "{case}: a fresh graph is not validated");
        validate_ok(&mut g, case);
        edit(&mut g, x, y);
        assert!(
            !g.is_validated(),
            "{case}: modifying the graph must clear is_validated()"
        );
        validate_ok(&mut g, &format!("{case}, revalidated"));
    }
}

// ---------------------------------------------------------------- rejections

#[test]
fn rejects_conv_rank_mismatch() {
    let (mut g, _) = conv_graph(&[1, 3, 8, 8], &[4, 3, 3], conv(&[1, 1], &[1, 1], &[1, 1]));
    expect_invalid(
        &mut g,
        "x rank 4 vs w rank 3",
        &["rank mismatch", "`w`", "conv_fprop#0"],
    );
    let (mut g, _) = conv_graph(&[1, 3, 8, 8], &[4, 3, 3, 3], conv(&[1], &[1], &[1]));
    expect_invalid(&mut g, "rank 4 for a 1-D conv", &["rank mismatch", "`x`", "1-D conv"]);
    let (mut g, _) = conv_graph(&[1, 3, 8, 8], &[4, 3, 3, 3], conv(&[1], &[1, 1], &[1, 1]));
    expect_invalid(
        &mut g,
        "padding entries",
        &["pre_padding has 1 entries for 2 spatial dims"],
    );
}

#[test]
fn rejects_matmul_rank_mismatch() {
    for (case, a, b, needle) in [
        ("rank 3 vs rank 2", vec![2, 5, 7], vec![7, 3], "rank mismatch"),
        ("rank 1", vec![7], vec![7], "rank mismatch"),
        ("inner dims", vec![5, 7], vec![6, 3], "inner dims differ"),
        ("batch", vec![2, 5, 7], vec![3, 7, 3], "do not broadcast at axis 0"),
    ] {
        let mut g = Graph::new();
        let ai = input(&mut g, "a", &a, F32);
        let bi = input(&mut g, "b", &b, F32);
        let c = g.matmul(ai, bi);
        g.set_output(c, F32);
        expect_invalid(&mut g, case, &[needle, "matmul#0"]);
    }
}

#[test]
fn rejects_pointwise_rank_or_shape_mismatch() {
    let mut g = Graph::new();
    let x = input(&mut g, "x", &[2, 3, 4, 4], F32);
    let b = input(&mut g, "b", &[3, 1, 1], F32);
    let y = g.pointwise(PointwiseMode::Add, x, Some(b));
    g.set_output(y, F32);
    expect_invalid(&mut g, "rank 4 + rank 3", &["rank mismatch", "pointwise#0"]);

    let mut g = Graph::new();
    let x = input(&mut g, "x", &[2, 3, 4, 4], F32);
    let b = input(&mut g, "b", &[1, 2, 1, 1], F32);
    let y = g.pointwise(PointwiseMode::Add, x, Some(b));
    g.set_output(y, F32);
    expect_invalid(&mut g, "C 3 vs 2", &["do not broadcast at axis 1"]);

    let mut g = Graph::new();
    let dy = input(&mut g, "dy", &[2, 3, 4, 4], F32);
    let x = input(&mut g, "x", &[1, 3, 4, 4], F32);
    let dx = g.pointwise(PointwiseMode::ReluBwd, dy, Some(x));
    g.set_output(dx, F32);
    expect_invalid(&mut g, "relu bwd broadcast", &["needs dy and x of equal dims"]);
}

#[test]
fn rejects_pointwise_arity_mismatch() {
    let mut g = Graph::new();
    let x = input(&mut g, "x", &[2, 3], F32);
    let y = g.pointwise(PointwiseMode::Add, x, None);
    g.set_output(y, F32);
    expect_invalid(&mut g, "add without b", &["Add takes 2 input(s)"]);

    let mut g = Graph::new();
    let x = input(&mut g, "x", &[2, 3], F32);
    let b = input(&mut g, "b", &[2, 3], F32);
    let y = g.pointwise(PointwiseMode::Relu, x, Some(b));
    g.set_output(y, F32);
    expect_invalid(&mut g, "relu with b", &["Relu takes 1 input(s)"]);
}

#[test]
fn rejects_reduction_to_a_non_broadcastable_shape() {
    let mut g = Graph::new();
    let x = input(&mut g, "x", &[2, 3, 4, 5], F32);
    let y = g.reduction(ReduceOp::Sum, x, &[2, 2, 1, 1]);
    g.set_output(y, F32);
    expect_invalid(&mut g, "dim 1 = 2", &["output dim 1 is 2: must be 3 or 1"]);

    let mut g = Graph::new();
    let x = input(&mut g, "x", &[2, 3, 4, 5], F32);
    let y = g.reduction(ReduceOp::Sum, x, &[2, 1]);
    g.set_output(y, F32);
    expect_invalid(&mut g, "rank 2", &["rank mismatch", "reduction#0"]);
}

#[test]
fn rejects_channel_group_mismatch() {
    let (mut g, _) = conv_graph(&[1, 6, 8, 8], &[4, 4, 3, 3], conv(&[1, 1], &[1, 1], &[1, 1]));
    expect_invalid(
        &mut g,
        "C 6 vs w C 4",
        &["channel/group mismatch", "6 channels", "4 per group"],
    );
    // 8 channels, 2 per group -> 4 groups, but 6 filters.
    let (mut g, _) = conv_graph(&[1, 8, 8, 8], &[6, 2, 3, 3], conv(&[1, 1], &[1, 1], &[1, 1]));
    expect_invalid(
        &mut g,
        "K 6 into 4 groups",
        &["channel/group mismatch", "6 filters not divisible into 4 groups"],
    );
    // Same for wgrad, where dw carries the per-group channel count.
    let mut g = Graph::new();
    let x = input(&mut g, "x", &[1, 6, 8, 8], F32);
    let dy = input(&mut g, "dy", &[1, 4, 8, 8], F32);
    let dw = g.conv_wgrad(x, dy, &[4, 4, 3, 3], conv(&[1, 1], &[1, 1], &[1, 1]));
    g.set_output(dw, F32);
    expect_invalid(&mut g, "wgrad C 6 vs dw C 4", &["channel/group mismatch"]);
}

#[test]
fn rejects_zero_and_negative_dims() {
    for (case, dims, needle) in [
        ("dim 0", [0i64, 3, 8, 8], "has dim 0 = 0"),
        ("dim -3", [1, 3, -3, 8], "has dim 2 = -3"),
    ] {
        let mut g = Graph::new();
        let x = g.tensor("x", &dims, &[192, 64, 8, 1], F32);
        let w = input(&mut g, "w", &[4, 3, 3, 3], F32);
        let y = g.conv_fprop(x, w, conv(&[1, 1], &[1, 1], &[1, 1]));
        g.set_output(y, F32);
        expect_invalid(&mut g, case, &["`x`", needle, "must be >= 1"]);
    }
    // Inferred outputs with a zero dim (dgrad's dx given by the caller).
    let mut g = Graph::new();
    let dy = input(&mut g, "dy", &[1, 4, 8, 8], F32);
    let w = input(&mut g, "w", &[4, 3, 3, 3], F32);
    let dx = g.conv_dgrad(dy, w, &[1, 3, 0, 8], conv(&[1, 1], &[1, 1], &[1, 1]));
    g.set_output(dx, F32);
    expect_invalid(&mut g, "dx dim 0", &["`dx` has dim 2 = 0"]);
}

#[test]
fn rejects_element_count_overflow() {
    let big = 1i64 << 40;
    let mut g = Graph::new();
    let x = g.tensor("x", &[big, big, 1, 1], &[big, 1, 1, 1], F32);
    let y = g.pointwise(PointwiseMode::Relu, x, None);
    g.set_output(y, F32);
    expect_invalid(&mut g, "2^80 elements", &["`x`", "overflow"]);
}

#[test]
fn rejects_byte_extent_overflow() {
    // 2^62 elements fit in i64, 2^64 bytes of f32 do not.
    let d = 1i64 << 31;
    let mut g = Graph::new();
    let x = g.tensor("x", &[d, d], &[d, 1], F32);
    let y = g.pointwise(PointwiseMode::Relu, x, None);
    g.set_output(y, F32);
    expect_invalid(&mut g, "2^64 bytes", &["`x`", "overflow a 64-bit byte extent"]);
    // Strides alone can overflow the extent of a small tensor.
    let mut g = Graph::new();
    let x = g.tensor("x", &[3, 2], &[i64::MAX / 2, 1], F32);
    let y = g.pointwise(PointwiseMode::Relu, x, None);
    g.set_output(y, F32);
    expect_invalid(&mut g, "huge stride", &["`x`", "overflow"]);
}

#[test]
fn rejects_dtype_mismatch() {
    let mut g = Graph::new();
    let x = input(&mut g, "x", &[1, 3, 8, 8], F16);
    let w = input(&mut g, "w", &[4, 3, 3, 3], F32);
    let y = g.conv_fprop(x, w, conv(&[1, 1], &[1, 1], &[1, 1]));
    g.set_output(y, F16);
    expect_invalid(
        &mut g,
        "conv x f16 vs w f32",
        &["dtype mismatch", "x is F16 but w is F32"],
    );

    let mut g = Graph::new();
    let a = input(&mut g, "a", &[4, 8], BF16);
    let b = input(&mut g, "b", &[8, 2], F32);
    let c = g.matmul(a, b);
    g.set_output(c, F32);
    expect_invalid(
        &mut g,
        "matmul a bf16 vs b f32",
        &["dtype mismatch", "a is BF16 but b is F32"],
    );

    let mut g = Graph::new();
    let x = input(&mut g, "x", &[1, 3, 8, 8], I32);
    let y = g.pointwise(PointwiseMode::Relu, x, None);
    g.set_output(y, F32);
    expect_invalid(&mut g, "pointwise i32", &["non-float dtype I32"]);

    let mut g = Graph::new();
    let x = input(&mut g, "x", &[1, 3, 8, 8], F32);
    let s = g.scalar("s", Scalar::I64(2), 4);
    let y = g.pointwise(PointwiseMode::Mul, x, Some(s));
    g.set_output(y, F32);
    expect_invalid(&mut g, "pointwise b i64 scalar", &["input b has non-float dtype I64"]);

    let mut g = Graph::new();
    let x = input(&mut g, "x", &[1, 3, 8, 8], I32);
    let w = input(&mut g, "w", &[4, 3, 3, 3], I32);
    let y = g.conv_fprop(x, w, conv(&[1, 1], &[1, 1], &[1, 1]));
    g.set_output(y, F32);
    expect_invalid(&mut g, "conv i32", &["x has dtype I32; expected f32, f16 or bf16"]);
}

#[test]
fn rejects_bad_strides() {
    for (case, strides, needle) in [
        ("wrong count", vec![192, 64, 8], "has 3 strides for 4 dims"),
        ("zero stride", vec![192, 0, 8, 1], "stride 1 = 0; strides must be >= 1"),
        (
            "negative stride",
            vec![192, 64, 8, -1],
            "stride 3 = -1; strides must be >= 1",
        ),
    ] {
        let mut g = Graph::new();
        let x = g.tensor("x", &[1, 3, 8, 8], &strides, F32);
        let y = g.pointwise(PointwiseMode::Relu, x, None);
        g.set_output(y, F32);
        expect_invalid(&mut g, case, &["`x`", needle]);
    }
    for (case, strides, needle) in [
        ("output wrong count", vec![256, 64, 8], "has 3 strides for 4 dims"),
        ("output zero stride", vec![256, 64, 0, 1], "stride 2 = 0"),
        ("overlapping output", vec![64, 16, 8, 1], "overlap"),
        ("overlapping output (C and W)", vec![256, 1, 32, 1], "overlap"),
    ] {
        let (mut g, y) = conv_graph(&[2, 3, 8, 8], &[4, 3, 3, 3], conv(&[1, 1], &[1, 1], &[1, 1]));
        g.set_strides(y, &strides);
        expect_invalid(&mut g, case, &["conv_fprop#0.y", needle]);
    }
}

#[test]
fn gapped_output_strides_are_accepted() {
    // Writing into a slice of a larger buffer (gaps, no overlap) is legal.
    let (mut g, y) = conv_graph(&[2, 3, 8, 8], &[4, 3, 3, 3], conv(&[1, 1], &[1, 1], &[1, 1]));
    g.set_strides(y, &[512, 128, 16, 1]);
    validate_ok(&mut g, "gapped output");
    assert_tensor(&g, y, "gapped output", &[2, 4, 8, 8], &[512, 128, 16, 1], F32);
}

#[test]
fn rejects_unaligned_pointers() {
    for (case, align, needle) in [
        ("2 on f32", 2u32, "pointer alignment 2 bytes for F32"),
        ("3", 3, "pointer alignment 3 bytes"),
        ("32", 32, "pointer alignment 32 bytes"),
        ("0", 0, "pointer alignment 0 bytes"),
    ] {
        let mut g = Graph::new();
        let x = input(&mut g, "x", &[1, 3, 8, 8], F32);
        g.set_alignment(x, align);
        let y = g.pointwise(PointwiseMode::Relu, x, None);
        g.set_output(y, F32);
        expect_invalid(&mut g, case, &["`x` is unaligned", needle]);
    }
    // On an output.
    let (mut g, y) = conv_graph(&[2, 3, 8, 8], &[4, 3, 3, 3], conv(&[1, 1], &[1, 1], &[1, 1]));
    g.set_alignment(y, 2);
    expect_invalid(&mut g, "output 2 on f32", &["`conv_fprop#0.y` is unaligned"]);
    // Alignments of at least the element size are fine.
    for align in [16u32, 8, 4, 2] {
        let mut g = Graph::new();
        let x = input(&mut g, "x", &[1, 3, 8, 8], F16);
        g.set_alignment(x, align);
        let y = g.pointwise(PointwiseMode::Relu, x, None);
        g.set_output(y, F16);
        g.set_alignment(y, align);
        validate_ok(&mut g, &format!("f16 aligned to {align}"));
    }
}

#[test]
fn rejects_filter_larger_than_padded_input() {
    let (mut g, _) = conv_graph(&[1, 1, 4, 4], &[1, 1, 7, 7], conv(&[1, 1], &[1, 1], &[1, 1]));
    expect_invalid(
        &mut g,
        "7x7 on padded 6x6",
        &["spatial dim 0", "exceeds padded input 4 + 1 + 1"],
    );
    // Dilation makes a fitting filter too large: 2 * (3 - 1) + 1 = 5 > 4.
    let (mut g, _) = conv_graph(&[1, 1, 8, 4], &[1, 1, 3, 3], conv(&[0, 0], &[1, 1], &[2, 2]));
    expect_invalid(
        &mut g,
        "dilated filter",
        &["spatial dim 1", "(dilation 2) exceeds padded input"],
    );
}

#[test]
fn rejects_bad_conv_attributes() {
    for (case, attrs, needle) in [
        (
            "stride 0",
            conv(&[1, 1], &[0, 1], &[1, 1]),
            "stride and dilation must be >= 1",
        ),
        (
            "dilation 0",
            conv(&[1, 1], &[1, 1], &[1, 0]),
            "stride and dilation must be >= 1",
        ),
        (
            "negative padding",
            conv(&[-1, 1], &[1, 1], &[1, 1]),
            "padding must be >= 0",
        ),
        ("4 spatial dims", conv(&[0; 4], &[1; 4], &[1; 4]), "4 spatial dims"),
    ] {
        let (mut g, _) = conv_graph(&[1, 3, 8, 8], &[4, 3, 3, 3], attrs);
        expect_invalid(&mut g, case, &[needle]);
    }
}

#[test]
fn rejects_pool_window_larger_than_input() {
    let mut g = Graph::new();
    let x = input(&mut g, "x", &[1, 1, 3, 3], F32);
    let (y, _) = g.resample_fwd(x, pool(ResampleMode::MaxPool, &[4, 4], &[1, 1], &[0, 0]), false);
    g.set_output(y, F32);
    expect_invalid(&mut g, "4x4 window on 3x3", &["window 4 exceeds padded input 3"]);
}

#[test]
fn rejects_pool_padding_not_below_window() {
    for (case, pad) in [("pad == window", 2), ("pad > window", 3), ("negative pad", -1)] {
        let mut g = Graph::new();
        let x = input(&mut g, "x", &[1, 1, 8, 8], F32);
        let (y, _) = g.resample_fwd(
            x,
            pool(ResampleMode::AvgPoolIncludePadding, &[2, 2], &[1, 1], &[pad, 0]),
            false,
        );
        g.set_output(y, F32);
        expect_invalid(&mut g, case, &["padding of spatial dim 0 must be in 0..window (2)"]);
    }
}

#[test]
fn rejects_bad_pool_attributes() {
    for (case, attrs, needle) in [
        (
            "window 0",
            pool(ResampleMode::MaxPool, &[0, 2], &[1, 1], &[0, 0]),
            "window and stride must be >= 1",
        ),
        (
            "stride 0",
            pool(ResampleMode::MaxPool, &[2, 2], &[1, 0], &[0, 0]),
            "window and stride must be >= 1",
        ),
        ("rank", pool(ResampleMode::MaxPool, &[2], &[1], &[0]), "rank mismatch"),
        (
            "stride entries",
            pool(ResampleMode::MaxPool, &[2, 2], &[1], &[0, 0]),
            "one entry per spatial dim",
        ),
    ] {
        let mut g = Graph::new();
        let x = input(&mut g, "x", &[1, 1, 8, 8], F32);
        let (y, _) = g.resample_fwd(x, attrs, false);
        g.set_output(y, F32);
        expect_invalid(&mut g, case, &[needle, "resample_fwd#0"]);
    }
    // An index output exists only for max pooling.
    let mut g = Graph::new();
    let x = input(&mut g, "x", &[1, 1, 8, 8], F32);
    let (y, idx) = g.resample_fwd(
        x,
        pool(ResampleMode::AvgPoolIncludePadding, &[2, 2], &[2, 2], &[0, 0]),
        true,
    );
    g.set_output(y, F32);
    g.set_output(idx.expect("index requested"), I8);
    expect_invalid(
        &mut g,
        "avg pool with index",
        &["index output exists only for max pooling"],
    );
}

#[test]
fn rejects_dgrad_dx_inconsistent_with_dy() {
    let mut g = Graph::new();
    let dy = input(&mut g, "dy", &[1, 4, 8, 8], F32);
    let w = input(&mut g, "w", &[4, 3, 3, 3], F32);
    let dx = g.conv_dgrad(dy, w, &[1, 3, 9, 9], conv(&[1, 1], &[1, 1], &[1, 1]));
    g.set_output(dx, F32);
    expect_invalid(
        &mut g,
        "dx 9x9 vs dy 8x8",
        &["conv_dgrad#0", "give dy spatial [9, 9], not [8, 8]"],
    );

    let mut g = Graph::new();
    let dy = input(&mut g, "dy", &[2, 4, 8, 8], F32);
    let w = input(&mut g, "w", &[4, 3, 3, 3], F32);
    let dx = g.conv_dgrad(dy, w, &[1, 3, 8, 8], conv(&[1, 1], &[1, 1], &[1, 1]));
    g.set_output(dx, F32);
    expect_invalid(&mut g, "batch", &["batch mismatch: dy N=2 vs dx N=1"]);

    let mut g = Graph::new();
    let dy = input(&mut g, "dy", &[1, 5, 8, 8], F32);
    let w = input(&mut g, "w", &[4, 3, 3, 3], F32);
    let dx = g.conv_dgrad(dy, w, &[1, 3, 8, 8], conv(&[1, 1], &[1, 1], &[1, 1]));
    g.set_output(dx, F32);
    expect_invalid(&mut g, "dy channels", &["dy has 5 channels but w has 4 filters"]);
}

#[test]
fn rejects_wgrad_dw_inconsistent_with_dy() {
    let mut g = Graph::new();
    let x = input(&mut g, "x", &[1, 3, 8, 8], F32);
    let dy = input(&mut g, "dy", &[1, 4, 8, 8], F32);
    let dw = g.conv_wgrad(x, dy, &[4, 3, 5, 5], conv(&[1, 1], &[1, 1], &[1, 1]));
    g.set_output(dw, F32);
    expect_invalid(
        &mut g,
        "dw 5x5",
        &["conv_wgrad#0", "give dy spatial [6, 6], not [8, 8]"],
    );
}

#[test]
fn rejects_preset_output_dims_that_differ_from_inference() {
    let (mut g, y) = conv_graph(&[2, 3, 8, 8], &[4, 3, 3, 3], conv(&[1, 1], &[1, 1], &[1, 1]));
    g.set_dims(y, &[2, 4, 7, 7]);
    expect_invalid(
        &mut g,
        "y dims",
        &["was given dims [2, 4, 7, 7] but the op produces [2, 4, 8, 8]"],
    );
}

#[test]
fn rejects_unused_virtual_tensor() {
    let mut g = Graph::new();
    let x = input(&mut g, "x", &[1, 3, 8, 8], F32);
    let w = input(&mut g, "w", &[4, 3, 3, 3], F32);
    let y = g.conv_fprop(x, w, conv(&[1, 1], &[1, 1], &[1, 1]));
    let _dangling = g.pointwise(PointwiseMode::Relu, y, None);
    expect_invalid(
        &mut g,
        "relu output unused",
        &["`pointwise#1.y` is never used", "set_output"],
    );
    // An unused max-pool index is reported too.
    let mut g = Graph::new();
    let x = input(&mut g, "x", &[1, 1, 4, 4], F32);
    let (y, _) = g.resample_fwd(x, pool(ResampleMode::MaxPool, &[2, 2], &[2, 2], &[0, 0]), true);
    g.set_output(y, F32);
    expect_invalid(&mut g, "unused index", &["resample_fwd#0.index", "is never used"]);
}

#[test]
fn rejects_empty_graph() {
    expect_invalid(&mut Graph::new(), "no tensors", &["graph has no nodes"]);
    let mut g = Graph::new();
    input(&mut g, "x", &[1, 2], F32);
    expect_invalid(&mut g, "tensor but no node", &["graph has no nodes"]);
}

#[test]
fn rejects_max_pool_backward_without_x_and_y() {
    for (case, with_x, with_y) in [
        ("neither", false, false),
        ("x only", true, false),
        ("y only", false, true),
    ] {
        let mut g = Graph::new();
        let dy = input(&mut g, "dy", &[1, 2, 3, 3], F32);
        let x = with_x.then(|| input(&mut g, "x", &[1, 2, 6, 6], F32));
        let y = with_y.then(|| input(&mut g, "y", &[1, 2, 3, 3], F32));
        let attrs = pool(ResampleMode::MaxPool, &[2, 2], &[2, 2], &[0, 0]);
        let dx = g.resample_bwd(dy, &[1, 2, 6, 6], attrs, x, y, None);
        g.set_output(dx, F32);
        expect_invalid(&mut g, case, &["max pool backward needs x and y"]);
    }
}

#[test]
fn rejects_pool_backward_shape_mismatches() {
    let attrs = || pool(ResampleMode::MaxPool, &[2, 2], &[2, 2], &[0, 0]);
    let mut g = Graph::new();
    let dy = input(&mut g, "dy", &[1, 2, 4, 4], F32);
    let dx = g.resample_bwd(dy, &[1, 2, 6, 6], attrs(), None, None, None);
    g.set_output(dx, F32);
    expect_invalid(&mut g, "dy vs dx", &["pools to [1, 2, 3, 3], but dy is [1, 2, 4, 4]"]);

    let mut g = Graph::new();
    let dy = input(&mut g, "dy", &[1, 2, 3, 3], F32);
    let x = input(&mut g, "x", &[1, 2, 7, 7], F32);
    let y = input(&mut g, "y", &[1, 2, 3, 3], F32);
    let dx = g.resample_bwd(dy, &[1, 2, 6, 6], attrs(), Some(x), Some(y), None);
    g.set_output(dx, F32);
    expect_invalid(
        &mut g,
        "x vs dx",
        &["x dims [1, 2, 7, 7] differ from dx dims [1, 2, 6, 6]"],
    );
}

#[test]
fn rejects_input_rank_above_eight() {
    let mut g = Graph::new();
    let x = g.tensor("x", &[1; 9], &[1; 9], F32);
    let y = g.pointwise(PointwiseMode::Relu, x, None);
    g.set_output(y, F32);
    expect_invalid(&mut g, "rank 9", &["`x` has rank 9 (must be 1..=8)"]);
}

#[test]
fn error_display_names_the_graph_problem() {
    let (mut g, _) = conv_graph(&[1, 6, 8, 8], &[4, 4, 3, 3], conv(&[1, 1], &[1, 1], &[1, 1]));
    let e = g.validate().expect_err("group mismatch");
    let shown = e.to_string();
    assert!(shown.starts_with("invalid graph: "), "Display: {shown}");
    assert!(shown.contains("channel/group mismatch"), "Display: {shown}");
    assert!(!e.is_not_supported(), "a graph error is not a 'not supported' error");
}

// ------------------------------------------------------- re-validation after edits

/// conv(x, w) -> relu, x and w given; y (conv) virtual, r (relu) the output.
fn conv_relu(x_dims: &[i64], x_strides: &[i64]) -> (Graph, TensorId, TensorId, TensorId) {
    let mut g = Graph::new();
    let x = g.tensor("x", x_dims, x_strides, F32);
    let w = input(&mut g, "w", &[4, 3, 3, 3], F32);
    let y = g.conv_fprop(x, w, conv(&[1, 1], &[1, 1], &[1, 1]));
    let r = g.pointwise(PointwiseMode::Relu, y, None);
    g.set_output(r, F32);
    (g, x, y, r)
}

#[test]
fn revalidation_after_changing_input_dims_reinfers() {
    let (mut g, x, y, r) = conv_relu(&[2, 3, 8, 8], &nchw(&[2, 3, 8, 8]));
    validate_ok(&mut g, "first");
    g.set_dims(x, &[2, 3, 16, 16]).set_strides(x, &nchw(&[2, 3, 16, 16]));
    validate_ok(&mut g, "after set_dims on x");
    assert_tensor(&g, y, "conv y", &[2, 4, 16, 16], &[1024, 256, 16, 1], F32);
    assert_tensor(&g, r, "relu r", &[2, 4, 16, 16], &[1024, 256, 16, 1], F32);
}

#[test]
fn revalidation_after_changing_input_layout_matches_a_fresh_graph() {
    let (mut g, x, y, r) = conv_relu(&[2, 3, 8, 8], &nchw(&[2, 3, 8, 8]));
    validate_ok(&mut g, "first");
    g.set_strides(x, &nhwc(&[2, 3, 8, 8]));
    validate_ok(&mut g, "after NHWC x");
    let (mut fresh, _, fy, fr) = conv_relu(&[2, 3, 8, 8], &nhwc(&[2, 3, 8, 8]));
    validate_ok(&mut fresh, "fresh NHWC");
    assert_eq!(
        fresh.tensor_info(fy).strides,
        [256, 1, 32, 4],
        "fresh graph infers NHWC"
    );
    assert_eq!(
        g.tensor_info(y).strides,
        fresh.tensor_info(fy).strides,
        "edited: conv y strides"
    );
    assert_eq!(
        g.tensor_info(r).strides,
        fresh.tensor_info(fr).strides,
        "edited: relu r strides"
    );
}

#[test]
fn changing_intermediate_type_after_validate_is_not_silently_ignored() {
    let (mut g, _, y, _) = conv_relu(&[2, 3, 8, 8], &nchw(&[2, 3, 8, 8]));
    validate_ok(&mut g, "first");
    g.intermediate_type = F16;
    validate_ok(&mut g, "after intermediate_type = F16");
    assert_eq!(
        g.tensor_info(y).dtype,
        Some(F16),
        "virtual conv output takes the new intermediate type"
    );
}

#[test]
fn rejects_pool_backward_index_with_wrong_dims() {
    let attrs = || pool(ResampleMode::MaxPool, &[2, 2], &[2, 2], &[0, 0]);
    let mut g = Graph::new();
    let x = input(&mut g, "x", &[1, 2, 6, 6], F32);
    let (y, idx) = g.resample_fwd(x, attrs(), true); // index [1, 2, 3, 3]
    g.set_output(y, F32);
    let dy = input(&mut g, "dy", &[1, 2, 4, 4], F32);
    let dx = g.resample_bwd(dy, &[1, 2, 8, 8], attrs(), None, None, idx); // needs a [1, 2, 4, 4] index
    g.set_output(dx, F32);
    expect_invalid(&mut g, "index [1,2,3,3] vs dy [1,2,4,4]", &["index"]);
}
