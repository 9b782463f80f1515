//! Bool tensor ops (`BoolTensorOps`).

use burn_backend::ops::*;
use burn_backend::tensor::{BoolTensor, FloatTensor, IntTensor, QuantizedTensor};
use burn_backend::*;
use std::future::Future;

use crate::burn::{data, exec};
use crate::burn::{Cudnn, CudnnDevice};

impl BoolTensorOps<Cudnn> for Cudnn {
    fn bool_empty(shape: Shape, device: &CudnnDevice, dtype: BoolDType) -> BoolTensor<Cudnn> {
        exec::empty(device, &shape, dtype.into(), "bool_empty")
    }

    fn bool_zeros(shape: Shape, device: &CudnnDevice, dtype: BoolDType) -> BoolTensor<Cudnn> {
        todo!("bool_zeros")
    }

    fn bool_ones(shape: Shape, device: &CudnnDevice, dtype: BoolDType) -> BoolTensor<Cudnn> {
        todo!("bool_ones")
    }

    fn bool_into_data(tensor: BoolTensor<Cudnn>) -> impl Future<Output = Result<TensorData, ExecutionError>> + Send {
        data::into_data(tensor)
    }

    fn bool_from_data(data: TensorData, device: &CudnnDevice) -> BoolTensor<Cudnn> {
        data::from_data(data, device, DType::Bool(BoolStore::Native), "bool_from_data")
    }

    fn bool_into_int(tensor: BoolTensor<Cudnn>, out_dtype: IntDType) -> IntTensor<Cudnn> {
        todo!("bool_into_int")
    }

    fn bool_into_float(tensor: BoolTensor<Cudnn>, out_dtype: FloatDType) -> FloatTensor<Cudnn> {
        todo!("bool_into_float")
    }

    fn bool_device(tensor: &BoolTensor<Cudnn>) -> CudnnDevice {
        tensor.burn_device()
    }

    fn bool_to_device(tensor: BoolTensor<Cudnn>, device: &CudnnDevice) -> BoolTensor<Cudnn> {
        data::to_device(tensor, device)
    }

    fn bool_reshape(tensor: BoolTensor<Cudnn>, shape: Shape) -> BoolTensor<Cudnn> {
        todo!("bool_reshape")
    }

    fn bool_slice(tensor: BoolTensor<Cudnn>, slices: &[Slice]) -> BoolTensor<Cudnn> {
        todo!("bool_slice")
    }

    fn bool_slice_assign(tensor: BoolTensor<Cudnn>, slices: &[Slice], value: BoolTensor<Cudnn>) -> BoolTensor<Cudnn> {
        todo!("bool_slice_assign")
    }

    fn bool_mask_where(
        tensor: BoolTensor<Cudnn>,
        mask: BoolTensor<Cudnn>,
        value: BoolTensor<Cudnn>,
    ) -> BoolTensor<Cudnn> {
        todo!("bool_mask_where")
    }

    fn bool_mask_fill(tensor: BoolTensor<Cudnn>, mask: BoolTensor<Cudnn>, value: Scalar) -> BoolTensor<Cudnn> {
        todo!("bool_mask_fill")
    }

    fn bool_gather(dim: usize, tensor: BoolTensor<Cudnn>, indices: IntTensor<Cudnn>) -> BoolTensor<Cudnn> {
        todo!("bool_gather")
    }

    fn bool_scatter_or(
        dim: usize,
        tensor: BoolTensor<Cudnn>,
        indices: IntTensor<Cudnn>,
        value: BoolTensor<Cudnn>,
    ) -> BoolTensor<Cudnn> {
        todo!("bool_scatter_or")
    }

    fn bool_select(tensor: BoolTensor<Cudnn>, dim: usize, indices: IntTensor<Cudnn>) -> BoolTensor<Cudnn> {
        todo!("bool_select")
    }

    fn bool_select_or(
        tensor: BoolTensor<Cudnn>,
        dim: usize,
        indices: IntTensor<Cudnn>,
        value: BoolTensor<Cudnn>,
    ) -> BoolTensor<Cudnn> {
        todo!("bool_select_or")
    }

    fn bool_equal(lhs: BoolTensor<Cudnn>, rhs: BoolTensor<Cudnn>) -> BoolTensor<Cudnn> {
        todo!("bool_equal")
    }

    fn bool_equal_elem(lhs: BoolTensor<Cudnn>, rhs: Scalar) -> BoolTensor<Cudnn> {
        todo!("bool_equal_elem")
    }

    fn bool_not(tensor: BoolTensor<Cudnn>) -> BoolTensor<Cudnn> {
        todo!("bool_not")
    }

    fn bool_and(lhs: BoolTensor<Cudnn>, rhs: BoolTensor<Cudnn>) -> BoolTensor<Cudnn> {
        todo!("bool_and")
    }

    fn bool_or(lhs: BoolTensor<Cudnn>, rhs: BoolTensor<Cudnn>) -> BoolTensor<Cudnn> {
        todo!("bool_or")
    }

    fn bool_swap_dims(tensor: BoolTensor<Cudnn>, dim1: usize, dim2: usize) -> BoolTensor<Cudnn> {
        todo!("bool_swap_dims")
    }

    fn bool_permute(tensor: BoolTensor<Cudnn>, axes: &[usize]) -> BoolTensor<Cudnn> {
        todo!("bool_permute")
    }

    fn bool_flip(tensor: BoolTensor<Cudnn>, axes: &[usize]) -> BoolTensor<Cudnn> {
        todo!("bool_flip")
    }

    fn bool_expand(tensor: BoolTensor<Cudnn>, shape: Shape) -> BoolTensor<Cudnn> {
        todo!("bool_expand")
    }

    fn bool_unfold(tensor: BoolTensor<Cudnn>, dim: usize, size: usize, step: usize) -> BoolTensor<Cudnn> {
        todo!("bool_unfold")
    }
}
