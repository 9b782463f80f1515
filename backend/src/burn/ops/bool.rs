//! Bool tensor ops (`BoolTensorOps`).

use burn_backend::ops::*;
use burn_backend::tensor::{BoolTensor, FloatTensor, IntTensor};
use burn_backend::*;
use std::future::Future;

use crate::burn::math::{self, BinaryOp, CompareOp, ReduceOp};
use crate::burn::structure as st;
use crate::burn::tensor::expect;
use crate::burn::{data, exec};
use crate::burn::{Cudnn, CudnnDevice};

impl BoolTensorOps<Cudnn> for Cudnn {
    fn bool_empty(shape: Shape, device: &CudnnDevice, dtype: BoolDType) -> BoolTensor<Cudnn> {
        expect("bool_empty", exec::empty(device, &shape, dtype.into(), "bool_empty"))
    }

    fn bool_zeros(shape: Shape, device: &CudnnDevice, dtype: BoolDType) -> BoolTensor<Cudnn> {
        const OP: &str = "bool_zeros";
        expect(
            OP,
            exec::bool_dtype(OP, dtype).and_then(|dtype| st::full(device, &shape, dtype, Scalar::Bool(false), OP)),
        )
    }

    fn bool_ones(shape: Shape, device: &CudnnDevice, dtype: BoolDType) -> BoolTensor<Cudnn> {
        const OP: &str = "bool_ones";
        expect(
            OP,
            exec::bool_dtype(OP, dtype).and_then(|dtype| st::full(device, &shape, dtype, Scalar::Bool(true), OP)),
        )
    }

    fn bool_into_data(tensor: BoolTensor<Cudnn>) -> impl Future<Output = Result<TensorData, ExecutionError>> + Send {
        data::into_data(tensor)
    }

    fn bool_from_data(data: TensorData, device: &CudnnDevice) -> BoolTensor<Cudnn> {
        expect(
            "bool_from_data",
            data::from_data(data, device, DType::Bool(BoolStore::Native), "bool_from_data"),
        )
    }

    fn bool_into_int(tensor: BoolTensor<Cudnn>, out_dtype: IntDType) -> IntTensor<Cudnn> {
        expect("bool_into_int", st::cast(tensor, out_dtype.into(), "bool_into_int"))
    }

    fn bool_into_float(tensor: BoolTensor<Cudnn>, out_dtype: FloatDType) -> FloatTensor<Cudnn> {
        expect("bool_into_float", st::cast(tensor, out_dtype.into(), "bool_into_float"))
    }

    fn bool_transpose(tensor: BoolTensor<Cudnn>) -> BoolTensor<Cudnn> {
        expect("bool_transpose", st::transpose(tensor, "bool_transpose"))
    }

    fn bool_repeat_dim(tensor: BoolTensor<Cudnn>, dim: usize, times: usize) -> BoolTensor<Cudnn> {
        expect("bool_repeat_dim", st::repeat_dim(tensor, dim, times, "bool_repeat_dim"))
    }

    fn bool_cat(tensors: Vec<BoolTensor<Cudnn>>, dim: usize) -> BoolTensor<Cudnn> {
        expect("bool_cat", st::cat(tensors, dim, "bool_cat"))
    }

    fn bool_argwhere(
        tensor: BoolTensor<Cudnn>,
        out_dtype: IntDType,
    ) -> impl Future<Output = IntTensor<Cudnn>> + 'static + Send {
        // The output shape depends on the data, so the work (one count read) happens now.
        std::future::ready(expect(
            "bool_argwhere",
            st::argwhere(tensor, out_dtype, "bool_argwhere"),
        ))
    }

    fn bool_device(tensor: &BoolTensor<Cudnn>) -> CudnnDevice {
        tensor.burn_device()
    }

    fn bool_to_device(tensor: BoolTensor<Cudnn>, device: &CudnnDevice) -> BoolTensor<Cudnn> {
        expect("bool_to_device", data::to_device(tensor, device))
    }

    fn bool_reshape(tensor: BoolTensor<Cudnn>, shape: Shape) -> BoolTensor<Cudnn> {
        expect("bool_reshape", st::reshape(tensor, &shape))
    }

    fn bool_slice(tensor: BoolTensor<Cudnn>, slices: &[Slice]) -> BoolTensor<Cudnn> {
        expect("bool_slice", st::slice(tensor, slices, "bool_slice"))
    }

    fn bool_slice_assign(tensor: BoolTensor<Cudnn>, slices: &[Slice], value: BoolTensor<Cudnn>) -> BoolTensor<Cudnn> {
        expect(
            "bool_slice_assign",
            st::slice_assign(tensor, slices, value, "bool_slice_assign"),
        )
    }

    fn bool_mask_where(
        tensor: BoolTensor<Cudnn>,
        mask: BoolTensor<Cudnn>,
        value: BoolTensor<Cudnn>,
    ) -> BoolTensor<Cudnn> {
        expect(
            "bool_mask_where",
            st::mask_where(tensor, mask, value, "bool_mask_where"),
        )
    }

    fn bool_mask_fill(tensor: BoolTensor<Cudnn>, mask: BoolTensor<Cudnn>, value: Scalar) -> BoolTensor<Cudnn> {
        expect("bool_mask_fill", st::mask_fill(tensor, mask, value, "bool_mask_fill"))
    }

    fn bool_gather(dim: usize, tensor: BoolTensor<Cudnn>, indices: IntTensor<Cudnn>) -> BoolTensor<Cudnn> {
        expect("bool_gather", st::gather(dim, tensor, indices, "bool_gather"))
    }

    fn bool_scatter_or(
        dim: usize,
        tensor: BoolTensor<Cudnn>,
        indices: IntTensor<Cudnn>,
        value: BoolTensor<Cudnn>,
    ) -> BoolTensor<Cudnn> {
        expect(
            "bool_scatter_or",
            st::scatter_add(dim, tensor, indices, value, "bool_scatter_or"),
        )
    }

    fn bool_select(tensor: BoolTensor<Cudnn>, dim: usize, indices: IntTensor<Cudnn>) -> BoolTensor<Cudnn> {
        expect("bool_select", st::select(tensor, dim, indices, "bool_select"))
    }

    fn bool_select_or(
        tensor: BoolTensor<Cudnn>,
        dim: usize,
        indices: IntTensor<Cudnn>,
        value: BoolTensor<Cudnn>,
    ) -> BoolTensor<Cudnn> {
        expect(
            "bool_select_or",
            st::select_add(tensor, dim, indices, value, "bool_select_or"),
        )
    }

    fn bool_equal(lhs: BoolTensor<Cudnn>, rhs: BoolTensor<Cudnn>) -> BoolTensor<Cudnn> {
        expect("bool_equal", math::bool_compare(lhs, rhs, CompareOp::Eq, "bool_equal"))
    }

    fn bool_equal_elem(lhs: BoolTensor<Cudnn>, rhs: Scalar) -> BoolTensor<Cudnn> {
        expect(
            "bool_equal_elem",
            math::bool_compare_scalar(lhs, rhs, CompareOp::Eq, "bool_equal_elem"),
        )
    }

    fn bool_not(tensor: BoolTensor<Cudnn>) -> BoolTensor<Cudnn> {
        expect("bool_not", math::not(tensor, "bool_not"))
    }

    fn bool_and(lhs: BoolTensor<Cudnn>, rhs: BoolTensor<Cudnn>) -> BoolTensor<Cudnn> {
        expect("bool_and", exec::binary(lhs, rhs, BinaryOp::BitAnd, "bool_and"))
    }

    fn bool_or(lhs: BoolTensor<Cudnn>, rhs: BoolTensor<Cudnn>) -> BoolTensor<Cudnn> {
        expect("bool_or", exec::binary(lhs, rhs, BinaryOp::BitOr, "bool_or"))
    }

    fn bool_not_equal(lhs: BoolTensor<Cudnn>, rhs: BoolTensor<Cudnn>) -> BoolTensor<Cudnn> {
        expect(
            "bool_not_equal",
            math::bool_compare(lhs, rhs, CompareOp::Ne, "bool_not_equal"),
        )
    }

    fn bool_not_equal_elem(lhs: BoolTensor<Cudnn>, rhs: Scalar) -> BoolTensor<Cudnn> {
        expect(
            "bool_not_equal_elem",
            math::bool_compare_scalar(lhs, rhs, CompareOp::Ne, "bool_not_equal_elem"),
        )
    }

    fn bool_xor(lhs: BoolTensor<Cudnn>, rhs: BoolTensor<Cudnn>) -> BoolTensor<Cudnn> {
        expect("bool_xor", exec::binary(lhs, rhs, BinaryOp::BitXor, "bool_xor"))
    }

    fn bool_any(tensor: BoolTensor<Cudnn>) -> BoolTensor<Cudnn> {
        expect("bool_any", math::bool_logical_all(tensor, ReduceOp::Any, "bool_any"))
    }

    fn bool_any_dim(tensor: BoolTensor<Cudnn>, dim: usize) -> BoolTensor<Cudnn> {
        expect(
            "bool_any_dim",
            math::bool_logical_dim(tensor, dim, ReduceOp::Any, "bool_any_dim"),
        )
    }

    fn bool_all(tensor: BoolTensor<Cudnn>) -> BoolTensor<Cudnn> {
        expect("bool_all", math::bool_logical_all(tensor, ReduceOp::All, "bool_all"))
    }

    fn bool_all_dim(tensor: BoolTensor<Cudnn>, dim: usize) -> BoolTensor<Cudnn> {
        expect(
            "bool_all_dim",
            math::bool_logical_dim(tensor, dim, ReduceOp::All, "bool_all_dim"),
        )
    }

    fn bool_swap_dims(tensor: BoolTensor<Cudnn>, dim1: usize, dim2: usize) -> BoolTensor<Cudnn> {
        expect("bool_swap_dims", st::swap_dims(tensor, dim1, dim2, "bool_swap_dims"))
    }

    fn bool_permute(tensor: BoolTensor<Cudnn>, axes: &[usize]) -> BoolTensor<Cudnn> {
        expect("bool_permute", st::permute(tensor, axes, "bool_permute"))
    }

    fn bool_flip(tensor: BoolTensor<Cudnn>, axes: &[usize]) -> BoolTensor<Cudnn> {
        expect("bool_flip", st::flip(tensor, axes, "bool_flip"))
    }

    fn bool_expand(tensor: BoolTensor<Cudnn>, shape: Shape) -> BoolTensor<Cudnn> {
        expect("bool_expand", st::expand(tensor, &shape, "bool_expand"))
    }

    fn bool_unfold(tensor: BoolTensor<Cudnn>, dim: usize, size: usize, step: usize) -> BoolTensor<Cudnn> {
        expect("bool_unfold", st::unfold(tensor, dim, size, step, "bool_unfold"))
    }
}
