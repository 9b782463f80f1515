//! Module ops (`ModuleOps`): convolutions, pooling, linear, interpolation.

use burn_backend::ops::*;
use burn_backend::tensor::{BoolTensor, FloatTensor, IntTensor, QuantizedTensor};
use burn_backend::*;

use crate::burn::{Cudnn, CudnnDevice};

impl ModuleOps<Cudnn> for Cudnn {
    fn conv2d(
        x: FloatTensor<Cudnn>,
        weight: FloatTensor<Cudnn>,
        bias: Option<FloatTensor<Cudnn>>,
        options: ConvOptions<2>,
    ) -> FloatTensor<Cudnn> {
        todo!("conv2d")
    }

    fn deform_conv2d(
        x: FloatTensor<Cudnn>,
        offset: FloatTensor<Cudnn>,
        weight: FloatTensor<Cudnn>,
        mask: Option<FloatTensor<Cudnn>>,
        bias: Option<FloatTensor<Cudnn>>,
        options: DeformConvOptions<2>,
    ) -> FloatTensor<Cudnn> {
        todo!("deform_conv2d")
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
        todo!("deform_conv2d_backward")
    }

    fn conv3d(
        x: FloatTensor<Cudnn>,
        weight: FloatTensor<Cudnn>,
        bias: Option<FloatTensor<Cudnn>>,
        options: ConvOptions<3>,
    ) -> FloatTensor<Cudnn> {
        todo!("conv3d")
    }

    fn conv_transpose2d(
        x: FloatTensor<Cudnn>,
        weight: FloatTensor<Cudnn>,
        bias: Option<FloatTensor<Cudnn>>,
        options: ConvTransposeOptions<2>,
    ) -> FloatTensor<Cudnn> {
        todo!("conv_transpose2d")
    }

    fn conv_transpose3d(
        x: FloatTensor<Cudnn>,
        weight: FloatTensor<Cudnn>,
        bias: Option<FloatTensor<Cudnn>>,
        options: ConvTransposeOptions<3>,
    ) -> FloatTensor<Cudnn> {
        todo!("conv_transpose3d")
    }

    fn avg_pool2d(
        x: FloatTensor<Cudnn>,
        kernel_size: [usize; 2],
        stride: [usize; 2],
        padding: [usize; 2],
        count_include_pad: bool,
        ceil_mode: bool,
    ) -> FloatTensor<Cudnn> {
        todo!("avg_pool2d")
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
        todo!("avg_pool2d_backward")
    }

    fn adaptive_avg_pool2d(x: FloatTensor<Cudnn>, output_size: [usize; 2]) -> FloatTensor<Cudnn> {
        todo!("adaptive_avg_pool2d")
    }

    fn adaptive_avg_pool2d_backward(x: FloatTensor<Cudnn>, grad: FloatTensor<Cudnn>) -> FloatTensor<Cudnn> {
        todo!("adaptive_avg_pool2d_backward")
    }

    fn max_pool2d(
        x: FloatTensor<Cudnn>,
        kernel_size: [usize; 2],
        stride: [usize; 2],
        padding: [usize; 2],
        dilation: [usize; 2],
        ceil_mode: bool,
    ) -> FloatTensor<Cudnn> {
        todo!("max_pool2d")
    }

    fn max_pool2d_with_indices(
        x: FloatTensor<Cudnn>,
        kernel_size: [usize; 2],
        stride: [usize; 2],
        padding: [usize; 2],
        dilation: [usize; 2],
        ceil_mode: bool,
    ) -> MaxPool2dWithIndices<Cudnn> {
        todo!("max_pool2d_with_indices")
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
        todo!("max_pool2d_with_indices_backward")
    }

    fn interpolate(x: FloatTensor<Cudnn>, output_size: [usize; 2], options: InterpolateOptions) -> FloatTensor<Cudnn> {
        todo!("interpolate")
    }

    fn interpolate_backward(
        x: FloatTensor<Cudnn>,
        grad: FloatTensor<Cudnn>,
        output_size: [usize; 2],
        options: InterpolateOptions,
    ) -> FloatTensor<Cudnn> {
        todo!("interpolate_backward")
    }

    fn attention(
        query: FloatTensor<Cudnn>,
        key: FloatTensor<Cudnn>,
        value: FloatTensor<Cudnn>,
        mask: Option<BoolTensor<Cudnn>>,
        attn_bias: Option<FloatTensor<Cudnn>>,
        options: AttentionModuleOptions,
    ) -> FloatTensor<Cudnn> {
        todo!("attention")
    }

    fn rfft(signal: FloatTensor<Cudnn>, dim: usize, n: Option<usize>) -> (FloatTensor<Cudnn>, FloatTensor<Cudnn>) {
        todo!("rfft")
    }

    fn irfft(
        spectrum_re: FloatTensor<Cudnn>,
        spectrum_im: FloatTensor<Cudnn>,
        dim: usize,
        n: Option<usize>,
    ) -> FloatTensor<Cudnn> {
        todo!("irfft")
    }
}
