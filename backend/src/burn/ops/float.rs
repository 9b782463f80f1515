//! Float tensor ops (`FloatTensorOps`).

use burn_backend::ops::*;
use burn_backend::tensor::{BoolTensor, FloatTensor, IntTensor, QuantizedTensor};
use burn_backend::*;
use std::future::Future;

use crate::burn::{data, exec};
use crate::burn::{Cudnn, CudnnDevice};

impl FloatTensorOps<Cudnn> for Cudnn {
    fn float_from_data(data: TensorData, device: &CudnnDevice) -> FloatTensor<Cudnn> {
        data::from_data(data, device, DType::F32, "float_from_data")
    }

    fn float_random(
        shape: Shape,
        distribution: Distribution,
        device: &CudnnDevice,
        dtype: FloatDType,
    ) -> FloatTensor<Cudnn> {
        todo!("float_random")
    }

    fn float_into_data(tensor: FloatTensor<Cudnn>) -> impl Future<Output = Result<TensorData, ExecutionError>> + Send {
        data::into_data(tensor)
    }

    fn float_device(tensor: &FloatTensor<Cudnn>) -> CudnnDevice {
        tensor.burn_device()
    }

    fn float_to_device(tensor: FloatTensor<Cudnn>, device: &CudnnDevice) -> FloatTensor<Cudnn> {
        data::to_device(tensor, device)
    }

    fn float_into_int(tensor: FloatTensor<Cudnn>, out_dtype: IntDType) -> IntTensor<Cudnn> {
        todo!("float_into_int")
    }

    fn float_empty(shape: Shape, device: &CudnnDevice, dtype: FloatDType) -> FloatTensor<Cudnn> {
        exec::empty(device, &shape, dtype.into(), "float_empty")
    }

    fn float_add(lhs: FloatTensor<Cudnn>, rhs: FloatTensor<Cudnn>) -> FloatTensor<Cudnn> {
        todo!("float_add")
    }

    fn float_add_scalar(lhs: FloatTensor<Cudnn>, rhs: Scalar) -> FloatTensor<Cudnn> {
        todo!("float_add_scalar")
    }

    fn float_sub(lhs: FloatTensor<Cudnn>, rhs: FloatTensor<Cudnn>) -> FloatTensor<Cudnn> {
        todo!("float_sub")
    }

    fn float_sub_scalar(lhs: FloatTensor<Cudnn>, rhs: Scalar) -> FloatTensor<Cudnn> {
        todo!("float_sub_scalar")
    }

    fn float_mul(lhs: FloatTensor<Cudnn>, rhs: FloatTensor<Cudnn>) -> FloatTensor<Cudnn> {
        todo!("float_mul")
    }

    fn float_mul_scalar(lhs: FloatTensor<Cudnn>, rhs: Scalar) -> FloatTensor<Cudnn> {
        todo!("float_mul_scalar")
    }

    fn float_div(lhs: FloatTensor<Cudnn>, rhs: FloatTensor<Cudnn>) -> FloatTensor<Cudnn> {
        todo!("float_div")
    }

    fn float_div_scalar(lhs: FloatTensor<Cudnn>, rhs: Scalar) -> FloatTensor<Cudnn> {
        todo!("float_div_scalar")
    }

    fn float_remainder(lhs: FloatTensor<Cudnn>, rhs: FloatTensor<Cudnn>) -> FloatTensor<Cudnn> {
        todo!("float_remainder")
    }

    fn float_remainder_scalar(lhs: FloatTensor<Cudnn>, rhs: Scalar) -> FloatTensor<Cudnn> {
        todo!("float_remainder_scalar")
    }

    fn float_matmul(lhs: FloatTensor<Cudnn>, rhs: FloatTensor<Cudnn>) -> FloatTensor<Cudnn> {
        todo!("float_matmul")
    }

    fn float_cross(lhs: FloatTensor<Cudnn>, rhs: FloatTensor<Cudnn>, dim: usize) -> FloatTensor<Cudnn> {
        todo!("float_cross")
    }

    fn float_recip(tensor: FloatTensor<Cudnn>) -> FloatTensor<Cudnn> {
        todo!("float_recip")
    }

    fn float_swap_dims(tensor: FloatTensor<Cudnn>, dim1: usize, dim2: usize) -> FloatTensor<Cudnn> {
        todo!("float_swap_dims")
    }

    fn float_permute(tensor: FloatTensor<Cudnn>, axes: &[usize]) -> FloatTensor<Cudnn> {
        todo!("float_permute")
    }

    fn float_flip(tensor: FloatTensor<Cudnn>, axes: &[usize]) -> FloatTensor<Cudnn> {
        todo!("float_flip")
    }

    fn float_reshape(tensor: FloatTensor<Cudnn>, shape: Shape) -> FloatTensor<Cudnn> {
        todo!("float_reshape")
    }

    fn float_gather(dim: usize, tensor: FloatTensor<Cudnn>, indices: IntTensor<Cudnn>) -> FloatTensor<Cudnn> {
        todo!("float_gather")
    }

    fn float_scatter_add(
        dim: usize,
        tensor: FloatTensor<Cudnn>,
        indices: IntTensor<Cudnn>,
        value: FloatTensor<Cudnn>,
    ) -> FloatTensor<Cudnn> {
        todo!("float_scatter_add")
    }

    fn float_select(tensor: FloatTensor<Cudnn>, dim: usize, indices: IntTensor<Cudnn>) -> FloatTensor<Cudnn> {
        todo!("float_select")
    }

    fn float_select_add(
        tensor: FloatTensor<Cudnn>,
        dim: usize,
        indices: IntTensor<Cudnn>,
        value: FloatTensor<Cudnn>,
    ) -> FloatTensor<Cudnn> {
        todo!("float_select_add")
    }

    fn float_slice(tensor: FloatTensor<Cudnn>, slices: &[Slice]) -> FloatTensor<Cudnn> {
        todo!("float_slice")
    }

    fn float_slice_assign(
        tensor: FloatTensor<Cudnn>,
        slices: &[Slice],
        value: FloatTensor<Cudnn>,
    ) -> FloatTensor<Cudnn> {
        todo!("float_slice_assign")
    }

    fn float_mask_where(
        tensor: FloatTensor<Cudnn>,
        mask: BoolTensor<Cudnn>,
        value: FloatTensor<Cudnn>,
    ) -> FloatTensor<Cudnn> {
        todo!("float_mask_where")
    }

    fn float_mask_fill(tensor: FloatTensor<Cudnn>, mask: BoolTensor<Cudnn>, value: Scalar) -> FloatTensor<Cudnn> {
        todo!("float_mask_fill")
    }

    fn float_equal(lhs: FloatTensor<Cudnn>, rhs: FloatTensor<Cudnn>, out_dtype: BoolDType) -> BoolTensor<Cudnn> {
        todo!("float_equal")
    }

    fn float_equal_elem(lhs: FloatTensor<Cudnn>, rhs: Scalar, out_dtype: BoolDType) -> BoolTensor<Cudnn> {
        todo!("float_equal_elem")
    }

    fn float_greater(lhs: FloatTensor<Cudnn>, rhs: FloatTensor<Cudnn>, out_dtype: BoolDType) -> BoolTensor<Cudnn> {
        todo!("float_greater")
    }

    fn float_greater_elem(lhs: FloatTensor<Cudnn>, rhs: Scalar, out_dtype: BoolDType) -> BoolTensor<Cudnn> {
        todo!("float_greater_elem")
    }

    fn float_greater_equal(
        lhs: FloatTensor<Cudnn>,
        rhs: FloatTensor<Cudnn>,
        out_dtype: BoolDType,
    ) -> BoolTensor<Cudnn> {
        todo!("float_greater_equal")
    }

    fn float_greater_equal_elem(lhs: FloatTensor<Cudnn>, rhs: Scalar, out_dtype: BoolDType) -> BoolTensor<Cudnn> {
        todo!("float_greater_equal_elem")
    }

    fn float_lower(lhs: FloatTensor<Cudnn>, rhs: FloatTensor<Cudnn>, out_dtype: BoolDType) -> BoolTensor<Cudnn> {
        todo!("float_lower")
    }

    fn float_lower_elem(lhs: FloatTensor<Cudnn>, rhs: Scalar, out_dtype: BoolDType) -> BoolTensor<Cudnn> {
        todo!("float_lower_elem")
    }

    fn float_lower_equal(lhs: FloatTensor<Cudnn>, rhs: FloatTensor<Cudnn>, out_dtype: BoolDType) -> BoolTensor<Cudnn> {
        todo!("float_lower_equal")
    }

    fn float_lower_equal_elem(lhs: FloatTensor<Cudnn>, rhs: Scalar, out_dtype: BoolDType) -> BoolTensor<Cudnn> {
        todo!("float_lower_equal_elem")
    }

    fn float_sum(tensor: FloatTensor<Cudnn>) -> FloatTensor<Cudnn> {
        todo!("float_sum")
    }

    fn float_sum_dim(tensor: FloatTensor<Cudnn>, dim: usize) -> FloatTensor<Cudnn> {
        todo!("float_sum_dim")
    }

    fn float_mean_dim(tensor: FloatTensor<Cudnn>, dim: usize) -> FloatTensor<Cudnn> {
        todo!("float_mean_dim")
    }

    fn float_cumsum(tensor: FloatTensor<Cudnn>, dim: usize) -> FloatTensor<Cudnn> {
        todo!("float_cumsum")
    }

    fn float_cumprod(tensor: FloatTensor<Cudnn>, dim: usize) -> FloatTensor<Cudnn> {
        todo!("float_cumprod")
    }

    fn float_cummin(tensor: FloatTensor<Cudnn>, dim: usize) -> FloatTensor<Cudnn> {
        todo!("float_cummin")
    }

    fn float_cummax(tensor: FloatTensor<Cudnn>, dim: usize) -> FloatTensor<Cudnn> {
        todo!("float_cummax")
    }

    fn float_cast(tensor: FloatTensor<Cudnn>, dtype: FloatDType) -> FloatTensor<Cudnn> {
        todo!("float_cast")
    }

    fn float_exp(tensor: FloatTensor<Cudnn>) -> FloatTensor<Cudnn> {
        todo!("float_exp")
    }

    fn float_log(tensor: FloatTensor<Cudnn>) -> FloatTensor<Cudnn> {
        todo!("float_log")
    }

    fn float_log1p(tensor: FloatTensor<Cudnn>) -> FloatTensor<Cudnn> {
        todo!("float_log1p")
    }

    fn float_powf(lhs: FloatTensor<Cudnn>, rhs: FloatTensor<Cudnn>) -> FloatTensor<Cudnn> {
        todo!("float_powf")
    }

    fn float_powf_scalar_impl(tensor: FloatTensor<Cudnn>, value: Scalar) -> FloatTensor<Cudnn> {
        todo!("float_powf_scalar_impl")
    }

    fn float_sqrt(tensor: FloatTensor<Cudnn>) -> FloatTensor<Cudnn> {
        todo!("float_sqrt")
    }

    fn float_abs(tensor: FloatTensor<Cudnn>) -> FloatTensor<Cudnn> {
        todo!("float_abs")
    }

    fn float_cos(tensor: FloatTensor<Cudnn>) -> FloatTensor<Cudnn> {
        todo!("float_cos")
    }

    fn float_sin(tensor: FloatTensor<Cudnn>) -> FloatTensor<Cudnn> {
        todo!("float_sin")
    }

    fn float_tan(tensor: FloatTensor<Cudnn>) -> FloatTensor<Cudnn> {
        todo!("float_tan")
    }

    fn float_cosh(tensor: FloatTensor<Cudnn>) -> FloatTensor<Cudnn> {
        todo!("float_cosh")
    }

    fn float_sinh(tensor: FloatTensor<Cudnn>) -> FloatTensor<Cudnn> {
        todo!("float_sinh")
    }

    fn float_tanh(tensor: FloatTensor<Cudnn>) -> FloatTensor<Cudnn> {
        todo!("float_tanh")
    }

    fn float_acos(tensor: FloatTensor<Cudnn>) -> FloatTensor<Cudnn> {
        todo!("float_acos")
    }

    fn float_acosh(tensor: FloatTensor<Cudnn>) -> FloatTensor<Cudnn> {
        todo!("float_acosh")
    }

    fn float_asin(tensor: FloatTensor<Cudnn>) -> FloatTensor<Cudnn> {
        todo!("float_asin")
    }

    fn float_asinh(tensor: FloatTensor<Cudnn>) -> FloatTensor<Cudnn> {
        todo!("float_asinh")
    }

    fn float_atan(tensor: FloatTensor<Cudnn>) -> FloatTensor<Cudnn> {
        todo!("float_atan")
    }

    fn float_atanh(tensor: FloatTensor<Cudnn>) -> FloatTensor<Cudnn> {
        todo!("float_atanh")
    }

    fn float_atan2(lhs: FloatTensor<Cudnn>, rhs: FloatTensor<Cudnn>) -> FloatTensor<Cudnn> {
        todo!("float_atan2")
    }

    fn float_round(tensor: FloatTensor<Cudnn>) -> FloatTensor<Cudnn> {
        todo!("float_round")
    }

    fn float_floor(tensor: FloatTensor<Cudnn>) -> FloatTensor<Cudnn> {
        todo!("float_floor")
    }

    fn float_ceil(tensor: FloatTensor<Cudnn>) -> FloatTensor<Cudnn> {
        todo!("float_ceil")
    }

    fn float_trunc(tensor: FloatTensor<Cudnn>) -> FloatTensor<Cudnn> {
        todo!("float_trunc")
    }

    fn float_erf(tensor: FloatTensor<Cudnn>) -> FloatTensor<Cudnn> {
        todo!("float_erf")
    }

    fn float_argmax(tensor: FloatTensor<Cudnn>, dim: usize, out_dtype: IntDType) -> IntTensor<Cudnn> {
        todo!("float_argmax")
    }

    fn float_argtopk(tensor: FloatTensor<Cudnn>, dim: usize, k: usize, out_dtype: IntDType) -> IntTensor<Cudnn> {
        todo!("float_argtopk")
    }

    fn float_argmin(tensor: FloatTensor<Cudnn>, dim: usize, out_dtype: IntDType) -> IntTensor<Cudnn> {
        todo!("float_argmin")
    }

    fn float_expand(tensor: FloatTensor<Cudnn>, shape: Shape) -> FloatTensor<Cudnn> {
        todo!("float_expand")
    }

    fn float_unfold(tensor: FloatTensor<Cudnn>, dim: usize, size: usize, step: usize) -> FloatTensor<Cudnn> {
        todo!("float_unfold")
    }
}
