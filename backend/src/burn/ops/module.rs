//! Module ops (`ModuleOps`): convolutions, pooling, linear, interpolation, embeddings,
//! deformable convolution, attention, CTC loss and real FFTs. The work lives in
//! [`crate::burn::layers`]; this file maps Burn's arguments onto it.

use burn_backend::ops::*;
use burn_backend::tensor::{BoolTensor, FloatTensor, IntTensor};

use crate::burn::layers::{self, PoolArgs};
use crate::burn::tensor::{expect, CudnnTensor};
use crate::burn::Cudnn;
use crate::types::ConvGeometry;

fn i64s(v: &[usize]) -> Vec<i64> {
    v.iter().map(|&x| x as i64).collect()
}

/// The geometry of Burn's convolution options.
pub(crate) fn conv_geom<const N: usize>(o: &ConvOptions<N>) -> ConvGeometry {
    ConvGeometry::new(&i64s(&o.padding), &i64s(&o.stride), &i64s(&o.dilation), o.groups as i64)
}

fn transpose_geom<const N: usize>(o: &ConvTransposeOptions<N>) -> crate::ops::ConvTransposeParams {
    crate::ops::ConvTransposeParams {
        conv: ConvGeometry::new(&i64s(&o.padding), &i64s(&o.stride), &i64s(&o.dilation), o.groups as i64),
        padding_out: i64s(&o.padding_out),
    }
}

/// Burn's 1-D pooling arguments as 2-D ones over `[N, C, 1, L]`.
fn pool_1d(kernel: usize, stride: usize, padding: usize, dilation: usize, ceil_mode: bool) -> PoolArgs {
    PoolArgs {
        kernel: [1, kernel],
        stride: [1, stride],
        padding: [0, padding],
        dilation: [1, dilation],
        ceil_mode,
    }
}

fn pool_2d(
    kernel: [usize; 2],
    stride: [usize; 2],
    padding: [usize; 2],
    dilation: [usize; 2],
    ceil_mode: bool,
) -> PoolArgs {
    PoolArgs {
        kernel,
        stride,
        padding,
        dilation,
        ceil_mode,
    }
}

/// `f` on `t [N, C, L]` viewed as `[N, C, 1, L]`, its `[N, C, 1, L']` result viewed back.
fn on_1d(
    t: &CudnnTensor,
    op: &str,
    f: impl FnOnce(CudnnTensor) -> crate::error::Result<CudnnTensor>,
) -> crate::error::Result<CudnnTensor> {
    layers::as_1d(&f(layers::as_2d(t, op)?)?, op)
}

impl ModuleOps<Cudnn> for Cudnn {
    fn embedding(weights: FloatTensor<Cudnn>, indices: IntTensor<Cudnn>) -> FloatTensor<Cudnn> {
        expect("embedding", layers::embedding(weights, indices))
    }

    fn embedding_backward(
        weights: FloatTensor<Cudnn>,
        output_grad: FloatTensor<Cudnn>,
        indices: IntTensor<Cudnn>,
    ) -> FloatTensor<Cudnn> {
        expect(
            "embedding_backward",
            layers::embedding_backward(&weights, output_grad, indices),
        )
    }

    fn linear(
        x: FloatTensor<Cudnn>,
        weight: FloatTensor<Cudnn>,
        bias: Option<FloatTensor<Cudnn>>,
    ) -> FloatTensor<Cudnn> {
        expect("linear", layers::linear(x, weight, bias))
    }

    fn linear_x_backward(weight: FloatTensor<Cudnn>, output_grad: FloatTensor<Cudnn>) -> FloatTensor<Cudnn> {
        expect("linear_x_backward", layers::linear_x_backward(weight, output_grad))
    }

    fn linear_weight_backward(x: FloatTensor<Cudnn>, output_grad: FloatTensor<Cudnn>) -> FloatTensor<Cudnn> {
        expect("linear_weight_backward", layers::linear_weight_backward(x, output_grad))
    }

    fn linear_bias_backward(output_grad: FloatTensor<Cudnn>) -> FloatTensor<Cudnn> {
        expect("linear_bias_backward", layers::linear_bias_backward(output_grad))
    }

    fn conv1d(
        x: FloatTensor<Cudnn>,
        weight: FloatTensor<Cudnn>,
        bias: Option<FloatTensor<Cudnn>>,
        options: ConvOptions<1>,
    ) -> FloatTensor<Cudnn> {
        expect("conv1d", layers::conv("conv1d", x, weight, bias, &conv_geom(&options)))
    }

    fn conv1d_x_backward(
        x: FloatTensor<Cudnn>,
        weight: FloatTensor<Cudnn>,
        output_grad: FloatTensor<Cudnn>,
        options: ConvOptions<1>,
    ) -> FloatTensor<Cudnn> {
        expect(
            "conv1d_x_backward",
            layers::conv_x_backward("conv1d_x_backward", x.dims(), weight, output_grad, &conv_geom(&options)),
        )
    }

    fn conv1d_weight_backward(
        x: FloatTensor<Cudnn>,
        weight: FloatTensor<Cudnn>,
        output_grad: FloatTensor<Cudnn>,
        options: ConvOptions<1>,
    ) -> FloatTensor<Cudnn> {
        expect(
            "conv1d_weight_backward",
            layers::conv_weight_backward(
                "conv1d_weight_backward",
                x,
                weight.dims(),
                output_grad,
                &conv_geom(&options),
            ),
        )
    }

    fn conv1d_bias_backward(
        _x: FloatTensor<Cudnn>,
        _bias: FloatTensor<Cudnn>,
        output_grad: FloatTensor<Cudnn>,
    ) -> FloatTensor<Cudnn> {
        expect(
            "conv1d_bias_backward",
            layers::conv_bias_backward("conv1d_bias_backward", output_grad),
        )
    }

    fn conv2d(
        x: FloatTensor<Cudnn>,
        weight: FloatTensor<Cudnn>,
        bias: Option<FloatTensor<Cudnn>>,
        options: ConvOptions<2>,
    ) -> FloatTensor<Cudnn> {
        expect("conv2d", layers::conv("conv2d", x, weight, bias, &conv_geom(&options)))
    }

    fn conv2d_x_backward(
        x: FloatTensor<Cudnn>,
        weight: FloatTensor<Cudnn>,
        output_grad: FloatTensor<Cudnn>,
        options: ConvOptions<2>,
    ) -> FloatTensor<Cudnn> {
        expect(
            "conv2d_x_backward",
            layers::conv_x_backward("conv2d_x_backward", x.dims(), weight, output_grad, &conv_geom(&options)),
        )
    }

    fn conv2d_weight_backward(
        x: FloatTensor<Cudnn>,
        weight: FloatTensor<Cudnn>,
        output_grad: FloatTensor<Cudnn>,
        options: ConvOptions<2>,
    ) -> FloatTensor<Cudnn> {
        expect(
            "conv2d_weight_backward",
            layers::conv_weight_backward(
                "conv2d_weight_backward",
                x,
                weight.dims(),
                output_grad,
                &conv_geom(&options),
            ),
        )
    }

    fn conv2d_bias_backward(
        _x: FloatTensor<Cudnn>,
        _bias: FloatTensor<Cudnn>,
        output_grad: FloatTensor<Cudnn>,
    ) -> FloatTensor<Cudnn> {
        expect(
            "conv2d_bias_backward",
            layers::conv_bias_backward("conv2d_bias_backward", output_grad),
        )
    }

    fn deform_conv2d(
        x: FloatTensor<Cudnn>,
        offset: FloatTensor<Cudnn>,
        weight: FloatTensor<Cudnn>,
        mask: Option<FloatTensor<Cudnn>>,
        bias: Option<FloatTensor<Cudnn>>,
        options: DeformConvOptions<2>,
    ) -> FloatTensor<Cudnn> {
        expect(
            "deform_conv2d",
            layers::deform_conv2d(x, offset, weight, mask, bias, &options),
        )
    }

    fn deform_conv2d_backward(
        x: FloatTensor<Cudnn>,
        offset: FloatTensor<Cudnn>,
        weight: FloatTensor<Cudnn>,
        mask: Option<FloatTensor<Cudnn>>,
        bias: Option<FloatTensor<Cudnn>>,
        output_grad: FloatTensor<Cudnn>,
        options: DeformConvOptions<2>,
    ) -> DeformConv2dBackward<Cudnn> {
        let g = expect(
            "deform_conv2d_backward",
            layers::deform_conv2d_backward(x, offset, weight, mask, bias, output_grad, &options),
        );
        DeformConv2dBackward::new(g.x, g.offset, g.weight, g.mask, g.bias)
    }

    fn conv3d(
        x: FloatTensor<Cudnn>,
        weight: FloatTensor<Cudnn>,
        bias: Option<FloatTensor<Cudnn>>,
        options: ConvOptions<3>,
    ) -> FloatTensor<Cudnn> {
        expect("conv3d", layers::conv("conv3d", x, weight, bias, &conv_geom(&options)))
    }

    fn conv3d_x_backward(
        x: FloatTensor<Cudnn>,
        weight: FloatTensor<Cudnn>,
        output_grad: FloatTensor<Cudnn>,
        options: ConvOptions<3>,
    ) -> FloatTensor<Cudnn> {
        expect(
            "conv3d_x_backward",
            layers::conv_x_backward("conv3d_x_backward", x.dims(), weight, output_grad, &conv_geom(&options)),
        )
    }

    fn conv3d_weight_backward(
        x: FloatTensor<Cudnn>,
        weight: FloatTensor<Cudnn>,
        output_grad: FloatTensor<Cudnn>,
        options: ConvOptions<3>,
    ) -> FloatTensor<Cudnn> {
        expect(
            "conv3d_weight_backward",
            layers::conv_weight_backward(
                "conv3d_weight_backward",
                x,
                weight.dims(),
                output_grad,
                &conv_geom(&options),
            ),
        )
    }

    fn conv3d_bias_backward(
        _x: FloatTensor<Cudnn>,
        _bias: FloatTensor<Cudnn>,
        output_grad: FloatTensor<Cudnn>,
    ) -> FloatTensor<Cudnn> {
        expect(
            "conv3d_bias_backward",
            layers::conv_bias_backward("conv3d_bias_backward", output_grad),
        )
    }

    fn conv_transpose1d(
        x: FloatTensor<Cudnn>,
        weight: FloatTensor<Cudnn>,
        bias: Option<FloatTensor<Cudnn>>,
        options: ConvTransposeOptions<1>,
    ) -> FloatTensor<Cudnn> {
        expect(
            "conv_transpose1d",
            layers::conv_transpose("conv_transpose1d", x, weight, bias, &transpose_geom(&options)),
        )
    }

    fn conv_transpose1d_x_backward(
        weight: FloatTensor<Cudnn>,
        output_grad: FloatTensor<Cudnn>,
        options: ConvTransposeOptions<1>,
    ) -> FloatTensor<Cudnn> {
        expect(
            "conv_transpose1d_x_backward",
            layers::conv_transpose_x_backward(
                "conv_transpose1d_x_backward",
                weight,
                output_grad,
                &transpose_geom(&options),
            ),
        )
    }

    fn conv_transpose1d_weight_backward(
        x: FloatTensor<Cudnn>,
        weight: FloatTensor<Cudnn>,
        output_grad: FloatTensor<Cudnn>,
        options: ConvTransposeOptions<1>,
    ) -> FloatTensor<Cudnn> {
        expect(
            "conv_transpose1d_weight_backward",
            layers::conv_transpose_weight_backward(
                "conv_transpose1d_weight_backward",
                x,
                weight.dims(),
                output_grad,
                &transpose_geom(&options),
            ),
        )
    }

    fn conv_transpose1d_bias_backward(
        _x: FloatTensor<Cudnn>,
        _bias: FloatTensor<Cudnn>,
        output_grad: FloatTensor<Cudnn>,
    ) -> FloatTensor<Cudnn> {
        expect(
            "conv_transpose1d_bias_backward",
            layers::conv_bias_backward("conv_transpose1d_bias_backward", output_grad),
        )
    }

    fn conv_transpose2d(
        x: FloatTensor<Cudnn>,
        weight: FloatTensor<Cudnn>,
        bias: Option<FloatTensor<Cudnn>>,
        options: ConvTransposeOptions<2>,
    ) -> FloatTensor<Cudnn> {
        expect(
            "conv_transpose2d",
            layers::conv_transpose("conv_transpose2d", x, weight, bias, &transpose_geom(&options)),
        )
    }

    fn conv_transpose2d_x_backward(
        weight: FloatTensor<Cudnn>,
        output_grad: FloatTensor<Cudnn>,
        options: ConvTransposeOptions<2>,
    ) -> FloatTensor<Cudnn> {
        expect(
            "conv_transpose2d_x_backward",
            layers::conv_transpose_x_backward(
                "conv_transpose2d_x_backward",
                weight,
                output_grad,
                &transpose_geom(&options),
            ),
        )
    }

    fn conv_transpose2d_weight_backward(
        x: FloatTensor<Cudnn>,
        weight: FloatTensor<Cudnn>,
        output_grad: FloatTensor<Cudnn>,
        options: ConvTransposeOptions<2>,
    ) -> FloatTensor<Cudnn> {
        expect(
            "conv_transpose2d_weight_backward",
            layers::conv_transpose_weight_backward(
                "conv_transpose2d_weight_backward",
                x,
                weight.dims(),
                output_grad,
                &transpose_geom(&options),
            ),
        )
    }

    fn conv_transpose2d_bias_backward(
        _x: FloatTensor<Cudnn>,
        _bias: FloatTensor<Cudnn>,
        output_grad: FloatTensor<Cudnn>,
    ) -> FloatTensor<Cudnn> {
        expect(
            "conv_transpose2d_bias_backward",
            layers::conv_bias_backward("conv_transpose2d_bias_backward", output_grad),
        )
    }

    fn conv_transpose3d(
        x: FloatTensor<Cudnn>,
        weight: FloatTensor<Cudnn>,
        bias: Option<FloatTensor<Cudnn>>,
        options: ConvTransposeOptions<3>,
    ) -> FloatTensor<Cudnn> {
        expect(
            "conv_transpose3d",
            layers::conv_transpose("conv_transpose3d", x, weight, bias, &transpose_geom(&options)),
        )
    }

    fn conv_transpose3d_x_backward(
        weight: FloatTensor<Cudnn>,
        output_grad: FloatTensor<Cudnn>,
        options: ConvTransposeOptions<3>,
    ) -> FloatTensor<Cudnn> {
        expect(
            "conv_transpose3d_x_backward",
            layers::conv_transpose_x_backward(
                "conv_transpose3d_x_backward",
                weight,
                output_grad,
                &transpose_geom(&options),
            ),
        )
    }

    fn conv_transpose3d_weight_backward(
        x: FloatTensor<Cudnn>,
        weight: FloatTensor<Cudnn>,
        output_grad: FloatTensor<Cudnn>,
        options: ConvTransposeOptions<3>,
    ) -> FloatTensor<Cudnn> {
        expect(
            "conv_transpose3d_weight_backward",
            layers::conv_transpose_weight_backward(
                "conv_transpose3d_weight_backward",
                x,
                weight.dims(),
                output_grad,
                &transpose_geom(&options),
            ),
        )
    }

    fn conv_transpose3d_bias_backward(
        _x: FloatTensor<Cudnn>,
        _bias: FloatTensor<Cudnn>,
        output_grad: FloatTensor<Cudnn>,
    ) -> FloatTensor<Cudnn> {
        expect(
            "conv_transpose3d_bias_backward",
            layers::conv_bias_backward("conv_transpose3d_bias_backward", output_grad),
        )
    }

    fn unfold4d(x: FloatTensor<Cudnn>, kernel_size: [usize; 2], options: UnfoldOptions) -> FloatTensor<Cudnn> {
        expect(
            "unfold4d",
            layers::unfold4d(x, kernel_size, options.stride, options.padding, options.dilation),
        )
    }

    fn avg_pool1d(
        x: FloatTensor<Cudnn>,
        kernel_size: usize,
        stride: usize,
        padding: usize,
        count_include_pad: bool,
        ceil_mode: bool,
    ) -> FloatTensor<Cudnn> {
        const OP: &str = "avg_pool1d";
        let a = pool_1d(kernel_size, stride, padding, 1, ceil_mode);
        expect(OP, on_1d(&x, OP, |x| layers::avg_pool2d(x, &a, count_include_pad)))
    }

    fn avg_pool1d_backward(
        x: FloatTensor<Cudnn>,
        grad: FloatTensor<Cudnn>,
        kernel_size: usize,
        stride: usize,
        padding: usize,
        count_include_pad: bool,
        ceil_mode: bool,
    ) -> FloatTensor<Cudnn> {
        const OP: &str = "avg_pool1d_backward";
        let a = pool_1d(kernel_size, stride, padding, 1, ceil_mode);
        let x = expect(OP, layers::as_2d(&x, OP));
        expect(
            OP,
            on_1d(&grad, OP, |g| layers::avg_pool2d_backward(&x, g, &a, count_include_pad)),
        )
    }

    fn avg_pool2d(
        x: FloatTensor<Cudnn>,
        kernel_size: [usize; 2],
        stride: [usize; 2],
        padding: [usize; 2],
        count_include_pad: bool,
        ceil_mode: bool,
    ) -> FloatTensor<Cudnn> {
        let a = pool_2d(kernel_size, stride, padding, [1, 1], ceil_mode);
        expect("avg_pool2d", layers::avg_pool2d(x, &a, count_include_pad))
    }

    fn avg_pool2d_backward(
        x: FloatTensor<Cudnn>,
        grad: FloatTensor<Cudnn>,
        kernel_size: [usize; 2],
        stride: [usize; 2],
        padding: [usize; 2],
        count_include_pad: bool,
        ceil_mode: bool,
    ) -> FloatTensor<Cudnn> {
        let a = pool_2d(kernel_size, stride, padding, [1, 1], ceil_mode);
        expect(
            "avg_pool2d_backward",
            layers::avg_pool2d_backward(&x, grad, &a, count_include_pad),
        )
    }

    fn adaptive_avg_pool2d(x: FloatTensor<Cudnn>, output_size: [usize; 2]) -> FloatTensor<Cudnn> {
        expect("adaptive_avg_pool2d", layers::adaptive_avg_pool2d(x, output_size))
    }

    fn adaptive_avg_pool2d_backward(x: FloatTensor<Cudnn>, grad: FloatTensor<Cudnn>) -> FloatTensor<Cudnn> {
        expect(
            "adaptive_avg_pool2d_backward",
            layers::adaptive_avg_pool2d_backward(&x, grad),
        )
    }

    fn adaptive_avg_pool1d(x: FloatTensor<Cudnn>, output_size: usize) -> FloatTensor<Cudnn> {
        const OP: &str = "adaptive_avg_pool1d";
        expect(OP, on_1d(&x, OP, |x| layers::adaptive_avg_pool2d(x, [1, output_size])))
    }

    fn adaptive_avg_pool1d_backward(x: FloatTensor<Cudnn>, grad: FloatTensor<Cudnn>) -> FloatTensor<Cudnn> {
        const OP: &str = "adaptive_avg_pool1d_backward";
        let x = expect(OP, layers::as_2d(&x, OP));
        expect(OP, on_1d(&grad, OP, |g| layers::adaptive_avg_pool2d_backward(&x, g)))
    }

    fn max_pool1d(
        x: FloatTensor<Cudnn>,
        kernel_size: usize,
        stride: usize,
        padding: usize,
        dilation: usize,
        ceil_mode: bool,
    ) -> FloatTensor<Cudnn> {
        const OP: &str = "max_pool1d";
        let a = pool_1d(kernel_size, stride, padding, dilation, ceil_mode);
        expect(OP, on_1d(&x, OP, |x| layers::max_pool2d(x, &a)))
    }

    fn max_pool1d_with_indices(
        x: FloatTensor<Cudnn>,
        kernel_size: usize,
        stride: usize,
        padding: usize,
        dilation: usize,
        ceil_mode: bool,
    ) -> MaxPool1dWithIndices<Cudnn> {
        const OP: &str = "max_pool1d_with_indices";
        let a = pool_1d(kernel_size, stride, padding, dilation, ceil_mode);
        let x = expect(OP, layers::as_2d(&x, OP));
        let (out, idx) = expect(OP, layers::max_pool2d_with_indices(x, &a));
        // Flat indices h·W + w with h = 0 are the positions along L.
        MaxPool1dWithIndices::new(expect(OP, layers::as_1d(&out, OP)), expect(OP, layers::as_1d(&idx, OP)))
    }

    fn max_pool1d_with_indices_backward(
        x: FloatTensor<Cudnn>,
        kernel_size: usize,
        stride: usize,
        padding: usize,
        dilation: usize,
        ceil_mode: bool,
        output_grad: FloatTensor<Cudnn>,
        indices: IntTensor<Cudnn>,
    ) -> MaxPool1dBackward<Cudnn> {
        const OP: &str = "max_pool1d_with_indices_backward";
        let [x, indices] = [x, indices].map(|t| expect(OP, layers::as_2d(&t, OP)));
        let a = pool_1d(kernel_size, stride, padding, dilation, ceil_mode);
        let dx = on_1d(&output_grad, OP, |g| layers::max_pool2d_backward(&x, g, indices, &a));
        MaxPool1dBackward::new(expect(OP, dx))
    }

    fn max_pool2d(
        x: FloatTensor<Cudnn>,
        kernel_size: [usize; 2],
        stride: [usize; 2],
        padding: [usize; 2],
        dilation: [usize; 2],
        ceil_mode: bool,
    ) -> FloatTensor<Cudnn> {
        expect(
            "max_pool2d",
            layers::max_pool2d(x, &pool_2d(kernel_size, stride, padding, dilation, ceil_mode)),
        )
    }

    fn max_pool2d_with_indices(
        x: FloatTensor<Cudnn>,
        kernel_size: [usize; 2],
        stride: [usize; 2],
        padding: [usize; 2],
        dilation: [usize; 2],
        ceil_mode: bool,
    ) -> MaxPool2dWithIndices<Cudnn> {
        let args = pool_2d(kernel_size, stride, padding, dilation, ceil_mode);
        let (out, idx) = expect("max_pool2d_with_indices", layers::max_pool2d_with_indices(x, &args));
        MaxPool2dWithIndices::new(out, idx)
    }

    fn max_pool2d_with_indices_backward(
        x: FloatTensor<Cudnn>,
        kernel_size: [usize; 2],
        stride: [usize; 2],
        padding: [usize; 2],
        dilation: [usize; 2],
        ceil_mode: bool,
        output_grad: FloatTensor<Cudnn>,
        indices: IntTensor<Cudnn>,
    ) -> MaxPool2dBackward<Cudnn> {
        let args = pool_2d(kernel_size, stride, padding, dilation, ceil_mode);
        MaxPool2dBackward::new(expect(
            "max_pool2d_with_indices_backward",
            layers::max_pool2d_backward(&x, output_grad, indices, &args),
        ))
    }

    fn interpolate(x: FloatTensor<Cudnn>, output_size: [usize; 2], options: InterpolateOptions) -> FloatTensor<Cudnn> {
        expect("interpolate", layers::interpolate(x, output_size, &options))
    }

    fn interpolate_backward(
        x: FloatTensor<Cudnn>,
        grad: FloatTensor<Cudnn>,
        _output_size: [usize; 2],
        options: InterpolateOptions,
    ) -> FloatTensor<Cudnn> {
        expect("interpolate_backward", layers::interpolate_backward(&x, grad, &options))
    }

    fn attention(
        query: FloatTensor<Cudnn>,
        key: FloatTensor<Cudnn>,
        value: FloatTensor<Cudnn>,
        mask: Option<BoolTensor<Cudnn>>,
        attn_bias: Option<FloatTensor<Cudnn>>,
        options: AttentionModuleOptions,
    ) -> FloatTensor<Cudnn> {
        expect(
            "attention",
            layers::attention(query, key, value, mask, attn_bias, options),
        )
    }

    fn layer_norm(
        tensor: FloatTensor<Cudnn>,
        gamma: FloatTensor<Cudnn>,
        beta: Option<FloatTensor<Cudnn>>,
        epsilon: f64,
    ) -> FloatTensor<Cudnn> {
        expect("layer_norm", layers::layer_norm(tensor, gamma, beta, epsilon))
    }

    fn rfft(signal: FloatTensor<Cudnn>, dim: usize, n: Option<usize>) -> (FloatTensor<Cudnn>, FloatTensor<Cudnn>) {
        expect("rfft", layers::rfft(signal, dim, n))
    }

    fn irfft(
        spectrum_re: FloatTensor<Cudnn>,
        spectrum_im: FloatTensor<Cudnn>,
        dim: usize,
        n: Option<usize>,
    ) -> FloatTensor<Cudnn> {
        expect("irfft", layers::irfft(spectrum_re, spectrum_im, dim, n))
    }

    fn ctc_loss(
        log_probs: FloatTensor<Cudnn>,
        targets: IntTensor<Cudnn>,
        input_lengths: IntTensor<Cudnn>,
        target_lengths: IntTensor<Cudnn>,
        blank: usize,
    ) -> FloatTensor<Cudnn> {
        expect(
            "ctc_loss",
            layers::ctc_loss(log_probs, targets, input_lengths, target_lengths, blank),
        )
    }

    /// True: Autodiff runs the CTC kernels forward and backward instead of differentiating
    /// Burn's decomposed `ctc_loss_default` (a dozen ops per time step, in the input's dtype).
    fn has_ctc_loss_backward() -> bool {
        true
    }

    fn ctc_loss_backward(
        log_probs: FloatTensor<Cudnn>,
        targets: IntTensor<Cudnn>,
        input_lengths: IntTensor<Cudnn>,
        target_lengths: IntTensor<Cudnn>,
        grad_loss: FloatTensor<Cudnn>,
        blank: usize,
    ) -> FloatTensor<Cudnn> {
        expect(
            "ctc_loss_backward",
            layers::ctc_loss_backward(log_probs, targets, input_lengths, target_lengths, grad_loss, blank),
        )
    }
}
