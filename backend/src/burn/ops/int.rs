//! Int tensor ops (`IntTensorOps`).

use burn_backend::ops::*;
use burn_backend::tensor::{BoolTensor, FloatTensor, IntTensor, QuantizedTensor};
use burn_backend::*;
use std::future::Future;

use crate::burn::{data, exec};
use crate::burn::{Cudnn, CudnnDevice};

impl IntTensorOps<Cudnn> for Cudnn {
    fn int_empty(shape: Shape, device: &CudnnDevice, dtype: IntDType) -> IntTensor<Cudnn> {
        exec::empty(device, &shape, dtype.into(), "int_empty")
    }

    fn int_into_data(tensor: IntTensor<Cudnn>) -> impl Future<Output = Result<TensorData, ExecutionError>> + Send {
        data::into_data(tensor)
    }

    fn int_from_data(data: TensorData, device: &CudnnDevice) -> IntTensor<Cudnn> {
        data::from_data(data, device, DType::I64, "int_from_data")
    }

    fn int_device(tensor: &IntTensor<Cudnn>) -> CudnnDevice {
        tensor.burn_device()
    }

    fn int_to_device(tensor: IntTensor<Cudnn>, device: &CudnnDevice) -> IntTensor<Cudnn> {
        data::to_device(tensor, device)
    }

    fn int_reshape(tensor: IntTensor<Cudnn>, shape: Shape) -> IntTensor<Cudnn> {
        todo!("int_reshape")
    }

    fn int_slice(tensor: IntTensor<Cudnn>, slices: &[Slice]) -> IntTensor<Cudnn> {
        todo!("int_slice")
    }

    fn int_slice_assign(tensor: IntTensor<Cudnn>, slices: &[Slice], value: IntTensor<Cudnn>) -> IntTensor<Cudnn> {
        todo!("int_slice_assign")
    }

    fn int_into_float(tensor: IntTensor<Cudnn>, out_dtype: FloatDType) -> FloatTensor<Cudnn> {
        todo!("int_into_float")
    }

    fn int_mask_where(tensor: IntTensor<Cudnn>, mask: BoolTensor<Cudnn>, value: IntTensor<Cudnn>) -> IntTensor<Cudnn> {
        todo!("int_mask_where")
    }

    fn int_mask_fill(tensor: IntTensor<Cudnn>, mask: BoolTensor<Cudnn>, value: Scalar) -> IntTensor<Cudnn> {
        todo!("int_mask_fill")
    }

    fn int_gather(dim: usize, tensor: IntTensor<Cudnn>, indices: IntTensor<Cudnn>) -> IntTensor<Cudnn> {
        todo!("int_gather")
    }

    fn int_scatter_add(
        dim: usize,
        tensor: IntTensor<Cudnn>,
        indices: IntTensor<Cudnn>,
        value: IntTensor<Cudnn>,
    ) -> IntTensor<Cudnn> {
        todo!("int_scatter_add")
    }

    fn int_select(tensor: IntTensor<Cudnn>, dim: usize, indices: IntTensor<Cudnn>) -> IntTensor<Cudnn> {
        todo!("int_select")
    }

    fn int_select_add(
        tensor: IntTensor<Cudnn>,
        dim: usize,
        indices: IntTensor<Cudnn>,
        value: IntTensor<Cudnn>,
    ) -> IntTensor<Cudnn> {
        todo!("int_select_add")
    }

    fn int_equal(lhs: IntTensor<Cudnn>, rhs: IntTensor<Cudnn>, out_dtype: BoolDType) -> BoolTensor<Cudnn> {
        todo!("int_equal")
    }

    fn int_equal_elem(lhs: IntTensor<Cudnn>, rhs: Scalar, out_dtype: BoolDType) -> BoolTensor<Cudnn> {
        todo!("int_equal_elem")
    }

    fn int_greater(lhs: IntTensor<Cudnn>, rhs: IntTensor<Cudnn>, out_dtype: BoolDType) -> BoolTensor<Cudnn> {
        todo!("int_greater")
    }

    fn int_greater_elem(lhs: IntTensor<Cudnn>, rhs: Scalar, out_dtype: BoolDType) -> BoolTensor<Cudnn> {
        todo!("int_greater_elem")
    }

    fn int_greater_equal(lhs: IntTensor<Cudnn>, rhs: IntTensor<Cudnn>, out_dtype: BoolDType) -> BoolTensor<Cudnn> {
        todo!("int_greater_equal")
    }

    fn int_greater_equal_elem(lhs: IntTensor<Cudnn>, rhs: Scalar, out_dtype: BoolDType) -> BoolTensor<Cudnn> {
        todo!("int_greater_equal_elem")
    }

    fn int_lower(lhs: IntTensor<Cudnn>, rhs: IntTensor<Cudnn>, out_dtype: BoolDType) -> BoolTensor<Cudnn> {
        todo!("int_lower")
    }

    fn int_lower_elem(lhs: IntTensor<Cudnn>, rhs: Scalar, out_dtype: BoolDType) -> BoolTensor<Cudnn> {
        todo!("int_lower_elem")
    }

    fn int_lower_equal(lhs: IntTensor<Cudnn>, rhs: IntTensor<Cudnn>, out_dtype: BoolDType) -> BoolTensor<Cudnn> {
        todo!("int_lower_equal")
    }

    fn int_lower_equal_elem(lhs: IntTensor<Cudnn>, rhs: Scalar, out_dtype: BoolDType) -> BoolTensor<Cudnn> {
        todo!("int_lower_equal_elem")
    }

    fn int_add(lhs: IntTensor<Cudnn>, rhs: IntTensor<Cudnn>) -> IntTensor<Cudnn> {
        todo!("int_add")
    }

    fn int_add_scalar(lhs: IntTensor<Cudnn>, rhs: Scalar) -> IntTensor<Cudnn> {
        todo!("int_add_scalar")
    }

    fn int_sub(lhs: IntTensor<Cudnn>, rhs: IntTensor<Cudnn>) -> IntTensor<Cudnn> {
        todo!("int_sub")
    }

    fn int_sub_scalar(lhs: IntTensor<Cudnn>, rhs: Scalar) -> IntTensor<Cudnn> {
        todo!("int_sub_scalar")
    }

    fn int_mul(lhs: IntTensor<Cudnn>, rhs: IntTensor<Cudnn>) -> IntTensor<Cudnn> {
        todo!("int_mul")
    }

    fn int_mul_scalar(lhs: IntTensor<Cudnn>, rhs: Scalar) -> IntTensor<Cudnn> {
        todo!("int_mul_scalar")
    }

    fn int_div(lhs: IntTensor<Cudnn>, rhs: IntTensor<Cudnn>) -> IntTensor<Cudnn> {
        todo!("int_div")
    }

    fn int_div_scalar(lhs: IntTensor<Cudnn>, rhs: Scalar) -> IntTensor<Cudnn> {
        todo!("int_div_scalar")
    }

    fn int_remainder(lhs: IntTensor<Cudnn>, rhs: IntTensor<Cudnn>) -> IntTensor<Cudnn> {
        todo!("int_remainder")
    }

    fn int_remainder_scalar(lhs: IntTensor<Cudnn>, rhs: Scalar) -> IntTensor<Cudnn> {
        todo!("int_remainder_scalar")
    }

    fn int_matmul(lhs: IntTensor<Cudnn>, rhs: IntTensor<Cudnn>) -> IntTensor<Cudnn> {
        todo!("int_matmul")
    }

    fn int_sum(tensor: IntTensor<Cudnn>) -> IntTensor<Cudnn> {
        todo!("int_sum")
    }

    fn int_sum_dim(tensor: IntTensor<Cudnn>, dim: usize) -> IntTensor<Cudnn> {
        todo!("int_sum_dim")
    }

    fn int_prod(tensor: IntTensor<Cudnn>) -> IntTensor<Cudnn> {
        todo!("int_prod")
    }

    fn int_prod_dim(tensor: IntTensor<Cudnn>, dim: usize) -> IntTensor<Cudnn> {
        todo!("int_prod_dim")
    }

    fn int_mean_dim(tensor: IntTensor<Cudnn>, dim: usize) -> IntTensor<Cudnn> {
        todo!("int_mean_dim")
    }

    fn int_cumsum(tensor: IntTensor<Cudnn>, dim: usize) -> IntTensor<Cudnn> {
        todo!("int_cumsum")
    }

    fn int_cumprod(tensor: IntTensor<Cudnn>, dim: usize) -> IntTensor<Cudnn> {
        todo!("int_cumprod")
    }

    fn int_cummin(tensor: IntTensor<Cudnn>, dim: usize) -> IntTensor<Cudnn> {
        todo!("int_cummin")
    }

    fn int_cummax(tensor: IntTensor<Cudnn>, dim: usize) -> IntTensor<Cudnn> {
        todo!("int_cummax")
    }

    fn int_argmax(tensor: IntTensor<Cudnn>, dim: usize) -> IntTensor<Cudnn> {
        todo!("int_argmax")
    }

    fn int_argtopk(tensor: IntTensor<Cudnn>, dim: usize, k: usize) -> IntTensor<Cudnn> {
        todo!("int_argtopk")
    }

    fn int_argmin(tensor: IntTensor<Cudnn>, dim: usize) -> IntTensor<Cudnn> {
        todo!("int_argmin")
    }

    fn int_abs(tensor: IntTensor<Cudnn>) -> IntTensor<Cudnn> {
        todo!("int_abs")
    }

    fn int_swap_dims(tensor: IntTensor<Cudnn>, dim1: usize, dim2: usize) -> IntTensor<Cudnn> {
        todo!("int_swap_dims")
    }

    fn int_permute(tensor: IntTensor<Cudnn>, axes: &[usize]) -> IntTensor<Cudnn> {
        todo!("int_permute")
    }

    fn int_flip(tensor: IntTensor<Cudnn>, axes: &[usize]) -> IntTensor<Cudnn> {
        todo!("int_flip")
    }

    fn int_random(shape: Shape, distribution: Distribution, device: &CudnnDevice, dtype: IntDType) -> IntTensor<Cudnn> {
        todo!("int_random")
    }

    fn int_expand(tensor: IntTensor<Cudnn>, shape: Shape) -> IntTensor<Cudnn> {
        todo!("int_expand")
    }

    fn bitwise_and(lhs: IntTensor<Cudnn>, rhs: IntTensor<Cudnn>) -> IntTensor<Cudnn> {
        todo!("bitwise_and")
    }

    fn bitwise_and_scalar(lhs: IntTensor<Cudnn>, rhs: Scalar) -> IntTensor<Cudnn> {
        todo!("bitwise_and_scalar")
    }

    fn bitwise_or(lhs: IntTensor<Cudnn>, rhs: IntTensor<Cudnn>) -> IntTensor<Cudnn> {
        todo!("bitwise_or")
    }

    fn bitwise_or_scalar(lhs: IntTensor<Cudnn>, rhs: Scalar) -> IntTensor<Cudnn> {
        todo!("bitwise_or_scalar")
    }

    fn bitwise_xor(lhs: IntTensor<Cudnn>, rhs: IntTensor<Cudnn>) -> IntTensor<Cudnn> {
        todo!("bitwise_xor")
    }

    fn bitwise_xor_scalar(lhs: IntTensor<Cudnn>, rhs: Scalar) -> IntTensor<Cudnn> {
        todo!("bitwise_xor_scalar")
    }

    fn bitwise_not(tensor: IntTensor<Cudnn>) -> IntTensor<Cudnn> {
        todo!("bitwise_not")
    }

    fn bitwise_left_shift(lhs: IntTensor<Cudnn>, rhs: IntTensor<Cudnn>) -> IntTensor<Cudnn> {
        todo!("bitwise_left_shift")
    }

    fn bitwise_left_shift_scalar(lhs: IntTensor<Cudnn>, rhs: Scalar) -> IntTensor<Cudnn> {
        todo!("bitwise_left_shift_scalar")
    }

    fn bitwise_right_shift(lhs: IntTensor<Cudnn>, rhs: IntTensor<Cudnn>) -> IntTensor<Cudnn> {
        todo!("bitwise_right_shift")
    }

    fn bitwise_right_shift_scalar(lhs: IntTensor<Cudnn>, rhs: Scalar) -> IntTensor<Cudnn> {
        todo!("bitwise_right_shift_scalar")
    }

    fn int_cast(tensor: IntTensor<Cudnn>, dtype: IntDType) -> IntTensor<Cudnn> {
        todo!("int_cast")
    }

    fn int_unfold(tensor: IntTensor<Cudnn>, dim: usize, size: usize, step: usize) -> IntTensor<Cudnn> {
        todo!("int_unfold")
    }
}
