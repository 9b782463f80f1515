//! Int tensor ops (`IntTensorOps`).

use burn_backend::ops::*;
use burn_backend::tensor::{BoolTensor, FloatTensor, IntTensor};
use burn_backend::*;
use std::future::Future;

use crate::burn::math::{self, ArgOp, BinaryOp, CompareOp, ReduceOp, ScanOp, UnaryOp};
use crate::burn::structure as st;
use crate::burn::tensor::expect;
use crate::burn::{data, exec};
use crate::burn::{Cudnn, CudnnDevice};

impl IntTensorOps<Cudnn> for Cudnn {
    fn int_empty(shape: Shape, device: &CudnnDevice, dtype: IntDType) -> IntTensor<Cudnn> {
        expect("int_empty", exec::empty(device, &shape, dtype.into(), "int_empty"))
    }

    fn int_into_data(tensor: IntTensor<Cudnn>) -> impl Future<Output = Result<TensorData, ExecutionError>> + Send {
        data::into_data(tensor)
    }

    fn int_from_data(data: TensorData, device: &CudnnDevice) -> IntTensor<Cudnn> {
        expect(
            "int_from_data",
            data::from_data(data, device, DType::I64, "int_from_data"),
        )
    }

    fn int_device(tensor: &IntTensor<Cudnn>) -> CudnnDevice {
        tensor.burn_device()
    }

    fn int_to_device(tensor: IntTensor<Cudnn>, device: &CudnnDevice) -> IntTensor<Cudnn> {
        expect("int_to_device", data::to_device(tensor, device))
    }

    fn int_reshape(tensor: IntTensor<Cudnn>, shape: Shape) -> IntTensor<Cudnn> {
        expect("int_reshape", st::reshape(tensor, &shape))
    }

    fn int_slice(tensor: IntTensor<Cudnn>, slices: &[Slice]) -> IntTensor<Cudnn> {
        expect("int_slice", st::slice(tensor, slices, "int_slice"))
    }

    fn int_slice_assign(tensor: IntTensor<Cudnn>, slices: &[Slice], value: IntTensor<Cudnn>) -> IntTensor<Cudnn> {
        expect(
            "int_slice_assign",
            st::slice_assign(tensor, slices, value, "int_slice_assign"),
        )
    }

    fn int_into_float(tensor: IntTensor<Cudnn>, out_dtype: FloatDType) -> FloatTensor<Cudnn> {
        expect("int_into_float", st::cast(tensor, out_dtype.into(), "int_into_float"))
    }

    fn int_zeros(shape: Shape, device: &CudnnDevice, dtype: IntDType) -> IntTensor<Cudnn> {
        expect(
            "int_zeros",
            st::full(device, &shape, dtype.into(), Scalar::Int(0), "int_zeros"),
        )
    }

    fn int_ones(shape: Shape, device: &CudnnDevice, dtype: IntDType) -> IntTensor<Cudnn> {
        expect(
            "int_ones",
            st::full(device, &shape, dtype.into(), Scalar::Int(1), "int_ones"),
        )
    }

    fn int_full(shape: Shape, fill_value: Scalar, device: &CudnnDevice, dtype: IntDType) -> IntTensor<Cudnn> {
        expect(
            "int_full",
            st::full(device, &shape, dtype.into(), fill_value, "int_full"),
        )
    }

    fn int_arange(range: std::ops::Range<i64>, device: &CudnnDevice, dtype: IntDType) -> IntTensor<Cudnn> {
        const OP: &str = "int_arange";
        expect(
            OP,
            device
                .open()
                .and_then(|dev| st::arange(&dev, range, 1, dtype.into(), OP)),
        )
    }

    fn int_arange_step(
        range: std::ops::Range<i64>,
        step: usize,
        device: &CudnnDevice,
        dtype: IntDType,
    ) -> IntTensor<Cudnn> {
        const OP: &str = "int_arange_step";
        expect(
            OP,
            device
                .open()
                .and_then(|dev| st::arange(&dev, range, step, dtype.into(), OP)),
        )
    }

    fn int_transpose(tensor: IntTensor<Cudnn>) -> IntTensor<Cudnn> {
        expect("int_transpose", st::transpose(tensor, "int_transpose"))
    }

    fn int_repeat_dim(tensor: IntTensor<Cudnn>, dim: usize, times: usize) -> IntTensor<Cudnn> {
        expect("int_repeat_dim", st::repeat_dim(tensor, dim, times, "int_repeat_dim"))
    }

    fn int_cat(tensors: Vec<IntTensor<Cudnn>>, dim: usize) -> IntTensor<Cudnn> {
        expect("int_cat", st::cat(tensors, dim, "int_cat"))
    }

    fn int_gather_nd(data: IntTensor<Cudnn>, indices: IntTensor<Cudnn>) -> IntTensor<Cudnn> {
        expect("int_gather_nd", st::gather_nd(data, indices, "int_gather_nd"))
    }

    fn int_scatter_nd(
        data: IntTensor<Cudnn>,
        indices: IntTensor<Cudnn>,
        values: IntTensor<Cudnn>,
        reduction: burn_backend::tensor::IndexingUpdateOp,
    ) -> IntTensor<Cudnn> {
        expect(
            "int_scatter_nd",
            st::scatter_nd(data, indices, values, reduction, "int_scatter_nd"),
        )
    }

    fn int_mask_where(tensor: IntTensor<Cudnn>, mask: BoolTensor<Cudnn>, value: IntTensor<Cudnn>) -> IntTensor<Cudnn> {
        expect("int_mask_where", st::mask_where(tensor, mask, value, "int_mask_where"))
    }

    fn int_mask_fill(tensor: IntTensor<Cudnn>, mask: BoolTensor<Cudnn>, value: Scalar) -> IntTensor<Cudnn> {
        expect("int_mask_fill", st::mask_fill(tensor, mask, value, "int_mask_fill"))
    }

    fn int_gather(dim: usize, tensor: IntTensor<Cudnn>, indices: IntTensor<Cudnn>) -> IntTensor<Cudnn> {
        expect("int_gather", st::gather(dim, tensor, indices, "int_gather"))
    }

    fn int_scatter_add(
        dim: usize,
        tensor: IntTensor<Cudnn>,
        indices: IntTensor<Cudnn>,
        value: IntTensor<Cudnn>,
    ) -> IntTensor<Cudnn> {
        expect(
            "int_scatter_add",
            st::scatter_add(dim, tensor, indices, value, "int_scatter_add"),
        )
    }

    fn int_select(tensor: IntTensor<Cudnn>, dim: usize, indices: IntTensor<Cudnn>) -> IntTensor<Cudnn> {
        expect("int_select", st::select(tensor, dim, indices, "int_select"))
    }

    fn int_select_add(
        tensor: IntTensor<Cudnn>,
        dim: usize,
        indices: IntTensor<Cudnn>,
        value: IntTensor<Cudnn>,
    ) -> IntTensor<Cudnn> {
        expect(
            "int_select_add",
            st::select_add(tensor, dim, indices, value, "int_select_add"),
        )
    }

    fn int_equal(lhs: IntTensor<Cudnn>, rhs: IntTensor<Cudnn>, out_dtype: BoolDType) -> BoolTensor<Cudnn> {
        expect(
            "int_equal",
            exec::compare(lhs, rhs, CompareOp::Eq, out_dtype, "int_equal"),
        )
    }

    fn int_equal_elem(lhs: IntTensor<Cudnn>, rhs: Scalar, out_dtype: BoolDType) -> BoolTensor<Cudnn> {
        expect(
            "int_equal_elem",
            math::compare_scalar(lhs, rhs, CompareOp::Eq, out_dtype, "int_equal_elem"),
        )
    }

    fn int_greater(lhs: IntTensor<Cudnn>, rhs: IntTensor<Cudnn>, out_dtype: BoolDType) -> BoolTensor<Cudnn> {
        expect(
            "int_greater",
            exec::compare(lhs, rhs, CompareOp::Gt, out_dtype, "int_greater"),
        )
    }

    fn int_greater_elem(lhs: IntTensor<Cudnn>, rhs: Scalar, out_dtype: BoolDType) -> BoolTensor<Cudnn> {
        expect(
            "int_greater_elem",
            math::compare_scalar(lhs, rhs, CompareOp::Gt, out_dtype, "int_greater_elem"),
        )
    }

    fn int_greater_equal(lhs: IntTensor<Cudnn>, rhs: IntTensor<Cudnn>, out_dtype: BoolDType) -> BoolTensor<Cudnn> {
        expect(
            "int_greater_equal",
            exec::compare(lhs, rhs, CompareOp::Ge, out_dtype, "int_greater_equal"),
        )
    }

    fn int_greater_equal_elem(lhs: IntTensor<Cudnn>, rhs: Scalar, out_dtype: BoolDType) -> BoolTensor<Cudnn> {
        expect(
            "int_greater_equal_elem",
            math::compare_scalar(lhs, rhs, CompareOp::Ge, out_dtype, "int_greater_equal_elem"),
        )
    }

    fn int_lower(lhs: IntTensor<Cudnn>, rhs: IntTensor<Cudnn>, out_dtype: BoolDType) -> BoolTensor<Cudnn> {
        expect(
            "int_lower",
            exec::compare(lhs, rhs, CompareOp::Lt, out_dtype, "int_lower"),
        )
    }

    fn int_lower_elem(lhs: IntTensor<Cudnn>, rhs: Scalar, out_dtype: BoolDType) -> BoolTensor<Cudnn> {
        expect(
            "int_lower_elem",
            math::compare_scalar(lhs, rhs, CompareOp::Lt, out_dtype, "int_lower_elem"),
        )
    }

    fn int_lower_equal(lhs: IntTensor<Cudnn>, rhs: IntTensor<Cudnn>, out_dtype: BoolDType) -> BoolTensor<Cudnn> {
        expect(
            "int_lower_equal",
            exec::compare(lhs, rhs, CompareOp::Le, out_dtype, "int_lower_equal"),
        )
    }

    fn int_lower_equal_elem(lhs: IntTensor<Cudnn>, rhs: Scalar, out_dtype: BoolDType) -> BoolTensor<Cudnn> {
        expect(
            "int_lower_equal_elem",
            math::compare_scalar(lhs, rhs, CompareOp::Le, out_dtype, "int_lower_equal_elem"),
        )
    }

    fn int_add(lhs: IntTensor<Cudnn>, rhs: IntTensor<Cudnn>) -> IntTensor<Cudnn> {
        expect("int_add", exec::binary(lhs, rhs, BinaryOp::Add, "int_add"))
    }

    fn int_add_scalar(lhs: IntTensor<Cudnn>, rhs: Scalar) -> IntTensor<Cudnn> {
        expect("int_add_scalar", math::add_scalar(lhs, rhs, "int_add_scalar"))
    }

    fn int_sub(lhs: IntTensor<Cudnn>, rhs: IntTensor<Cudnn>) -> IntTensor<Cudnn> {
        expect("int_sub", exec::binary(lhs, rhs, BinaryOp::Sub, "int_sub"))
    }

    fn int_sub_scalar(lhs: IntTensor<Cudnn>, rhs: Scalar) -> IntTensor<Cudnn> {
        expect("int_sub_scalar", math::sub_scalar(lhs, rhs, "int_sub_scalar"))
    }

    fn int_mul(lhs: IntTensor<Cudnn>, rhs: IntTensor<Cudnn>) -> IntTensor<Cudnn> {
        expect("int_mul", exec::binary(lhs, rhs, BinaryOp::Mul, "int_mul"))
    }

    fn int_mul_scalar(lhs: IntTensor<Cudnn>, rhs: Scalar) -> IntTensor<Cudnn> {
        expect("int_mul_scalar", math::mul_scalar(lhs, rhs, "int_mul_scalar"))
    }

    fn int_div(lhs: IntTensor<Cudnn>, rhs: IntTensor<Cudnn>) -> IntTensor<Cudnn> {
        expect("int_div", exec::binary(lhs, rhs, BinaryOp::Div, "int_div"))
    }

    fn int_div_scalar(lhs: IntTensor<Cudnn>, rhs: Scalar) -> IntTensor<Cudnn> {
        expect("int_div_scalar", math::div_scalar(lhs, rhs, "int_div_scalar"))
    }

    fn int_remainder(lhs: IntTensor<Cudnn>, rhs: IntTensor<Cudnn>) -> IntTensor<Cudnn> {
        expect("int_remainder", exec::binary(lhs, rhs, BinaryOp::Rem, "int_remainder"))
    }

    fn int_remainder_scalar(lhs: IntTensor<Cudnn>, rhs: Scalar) -> IntTensor<Cudnn> {
        expect(
            "int_remainder_scalar",
            math::rem_scalar(lhs, rhs, "int_remainder_scalar"),
        )
    }

    fn int_matmul(lhs: IntTensor<Cudnn>, rhs: IntTensor<Cudnn>) -> IntTensor<Cudnn> {
        expect("int_matmul", math::int_matmul(lhs, rhs, "int_matmul"))
    }

    fn int_sum(tensor: IntTensor<Cudnn>) -> IntTensor<Cudnn> {
        expect("int_sum", math::reduce_all(tensor, ReduceOp::Sum, "int_sum"))
    }

    fn int_sum_dim(tensor: IntTensor<Cudnn>, dim: usize) -> IntTensor<Cudnn> {
        expect(
            "int_sum_dim",
            math::reduce_dim(tensor, dim, ReduceOp::Sum, "int_sum_dim"),
        )
    }

    fn int_prod(tensor: IntTensor<Cudnn>) -> IntTensor<Cudnn> {
        expect("int_prod", math::reduce_all(tensor, ReduceOp::Prod, "int_prod"))
    }

    fn int_prod_dim(tensor: IntTensor<Cudnn>, dim: usize) -> IntTensor<Cudnn> {
        expect(
            "int_prod_dim",
            math::reduce_dim(tensor, dim, ReduceOp::Prod, "int_prod_dim"),
        )
    }

    fn int_mean_dim(tensor: IntTensor<Cudnn>, dim: usize) -> IntTensor<Cudnn> {
        expect("int_mean_dim", math::mean_dim(tensor, dim, "int_mean_dim"))
    }

    fn int_cumsum(tensor: IntTensor<Cudnn>, dim: usize) -> IntTensor<Cudnn> {
        expect("int_cumsum", math::scan(tensor, dim, ScanOp::CumSum, "int_cumsum"))
    }

    fn int_cumprod(tensor: IntTensor<Cudnn>, dim: usize) -> IntTensor<Cudnn> {
        expect("int_cumprod", math::scan(tensor, dim, ScanOp::CumProd, "int_cumprod"))
    }

    fn int_cummin(tensor: IntTensor<Cudnn>, dim: usize) -> IntTensor<Cudnn> {
        expect("int_cummin", math::scan(tensor, dim, ScanOp::CumMin, "int_cummin"))
    }

    fn int_cummax(tensor: IntTensor<Cudnn>, dim: usize) -> IntTensor<Cudnn> {
        expect("int_cummax", math::scan(tensor, dim, ScanOp::CumMax, "int_cummax"))
    }

    fn int_argmax(tensor: IntTensor<Cudnn>, dim: usize) -> IntTensor<Cudnn> {
        expect(
            "int_argmax",
            math::arg_reduce(tensor, dim, ArgOp::ArgMax, DType::I64, "int_argmax"),
        )
    }

    fn int_argtopk(tensor: IntTensor<Cudnn>, dim: usize, k: usize) -> IntTensor<Cudnn> {
        let dtype = tensor.dtype;
        expect("int_argtopk", math::argtopk(tensor, dim, k, dtype, "int_argtopk"))
    }

    fn int_argmin(tensor: IntTensor<Cudnn>, dim: usize) -> IntTensor<Cudnn> {
        expect(
            "int_argmin",
            math::arg_reduce(tensor, dim, ArgOp::ArgMin, DType::I64, "int_argmin"),
        )
    }

    fn int_abs(tensor: IntTensor<Cudnn>) -> IntTensor<Cudnn> {
        expect("int_abs", math::abs(tensor, "int_abs"))
    }

    fn int_neg(tensor: IntTensor<Cudnn>) -> IntTensor<Cudnn> {
        expect("int_neg", exec::unary(tensor, UnaryOp::Neg, "int_neg"))
    }

    fn int_sign(tensor: IntTensor<Cudnn>) -> IntTensor<Cudnn> {
        expect("int_sign", exec::unary(tensor, UnaryOp::Sign, "int_sign"))
    }

    fn int_clamp_min(tensor: IntTensor<Cudnn>, min: Scalar) -> IntTensor<Cudnn> {
        expect("int_clamp_min", math::clamp(tensor, Some(min), None, "int_clamp_min"))
    }

    fn int_clamp_max(tensor: IntTensor<Cudnn>, max: Scalar) -> IntTensor<Cudnn> {
        expect("int_clamp_max", math::clamp(tensor, None, Some(max), "int_clamp_max"))
    }

    fn int_clamp(tensor: IntTensor<Cudnn>, min: Scalar, max: Scalar) -> IntTensor<Cudnn> {
        expect("int_clamp", math::clamp(tensor, Some(min), Some(max), "int_clamp"))
    }

    fn int_powi(lhs: IntTensor<Cudnn>, rhs: IntTensor<Cudnn>) -> IntTensor<Cudnn> {
        expect("int_powi", math::pow(lhs, rhs, "int_powi"))
    }

    fn int_powi_scalar(lhs: IntTensor<Cudnn>, rhs: Scalar) -> IntTensor<Cudnn> {
        expect("int_powi_scalar", math::powi_scalar(lhs, rhs, "int_powi_scalar"))
    }

    fn int_powi_scalar_impl(lhs: IntTensor<Cudnn>, rhs: Scalar) -> IntTensor<Cudnn> {
        expect(
            "int_powi_scalar_impl",
            math::pow_scalar(lhs, rhs, "int_powi_scalar_impl"),
        )
    }

    fn int_not_equal(lhs: IntTensor<Cudnn>, rhs: IntTensor<Cudnn>, out_dtype: BoolDType) -> BoolTensor<Cudnn> {
        expect(
            "int_not_equal",
            exec::compare(lhs, rhs, CompareOp::Ne, out_dtype, "int_not_equal"),
        )
    }

    fn int_not_equal_elem(lhs: IntTensor<Cudnn>, rhs: Scalar, out_dtype: BoolDType) -> BoolTensor<Cudnn> {
        expect(
            "int_not_equal_elem",
            math::compare_scalar(lhs, rhs, CompareOp::Ne, out_dtype, "int_not_equal_elem"),
        )
    }

    fn int_mean(tensor: IntTensor<Cudnn>) -> IntTensor<Cudnn> {
        expect("int_mean", math::mean(tensor, "int_mean"))
    }

    fn int_max(tensor: IntTensor<Cudnn>) -> IntTensor<Cudnn> {
        expect("int_max", math::reduce_all(tensor, ReduceOp::Max, "int_max"))
    }

    fn int_max_dim(tensor: IntTensor<Cudnn>, dim: usize) -> IntTensor<Cudnn> {
        expect(
            "int_max_dim",
            math::reduce_dim(tensor, dim, ReduceOp::Max, "int_max_dim"),
        )
    }

    fn int_min(tensor: IntTensor<Cudnn>) -> IntTensor<Cudnn> {
        expect("int_min", math::reduce_all(tensor, ReduceOp::Min, "int_min"))
    }

    fn int_min_dim(tensor: IntTensor<Cudnn>, dim: usize) -> IntTensor<Cudnn> {
        expect(
            "int_min_dim",
            math::reduce_dim(tensor, dim, ReduceOp::Min, "int_min_dim"),
        )
    }

    fn int_max_abs(tensor: IntTensor<Cudnn>) -> IntTensor<Cudnn> {
        expect("int_max_abs", math::max_abs(tensor, "int_max_abs"))
    }

    fn int_max_abs_dim(tensor: IntTensor<Cudnn>, dim: usize) -> IntTensor<Cudnn> {
        expect("int_max_abs_dim", math::max_abs_dim(tensor, dim, "int_max_abs_dim"))
    }

    fn int_max_dim_with_indices(tensor: IntTensor<Cudnn>, dim: usize) -> (IntTensor<Cudnn>, IntTensor<Cudnn>) {
        expect(
            "int_max_dim_with_indices",
            math::arg_reduce_with_values(tensor, dim, ArgOp::ArgMax, DType::I64, "int_max_dim_with_indices"),
        )
    }

    fn int_min_dim_with_indices(tensor: IntTensor<Cudnn>, dim: usize) -> (IntTensor<Cudnn>, IntTensor<Cudnn>) {
        expect(
            "int_min_dim_with_indices",
            math::arg_reduce_with_values(tensor, dim, ArgOp::ArgMin, DType::I64, "int_min_dim_with_indices"),
        )
    }

    fn int_any(tensor: IntTensor<Cudnn>, out_dtype: BoolDType) -> BoolTensor<Cudnn> {
        expect(
            "int_any",
            math::logical_all(tensor, ReduceOp::Any, out_dtype, "int_any"),
        )
    }

    fn int_any_dim(tensor: IntTensor<Cudnn>, dim: usize, out_dtype: BoolDType) -> BoolTensor<Cudnn> {
        expect(
            "int_any_dim",
            math::logical_dim(tensor, dim, ReduceOp::Any, out_dtype, "int_any_dim"),
        )
    }

    fn int_all(tensor: IntTensor<Cudnn>, out_dtype: BoolDType) -> BoolTensor<Cudnn> {
        expect(
            "int_all",
            math::logical_all(tensor, ReduceOp::All, out_dtype, "int_all"),
        )
    }

    fn int_all_dim(tensor: IntTensor<Cudnn>, dim: usize, out_dtype: BoolDType) -> BoolTensor<Cudnn> {
        expect(
            "int_all_dim",
            math::logical_dim(tensor, dim, ReduceOp::All, out_dtype, "int_all_dim"),
        )
    }

    fn int_sort(tensor: IntTensor<Cudnn>, dim: usize, descending: bool) -> IntTensor<Cudnn> {
        expect("int_sort", math::sort(tensor, dim, descending, "int_sort"))
    }

    fn int_sort_with_indices(
        tensor: IntTensor<Cudnn>,
        dim: usize,
        descending: bool,
    ) -> (IntTensor<Cudnn>, IntTensor<Cudnn>) {
        let dtype = tensor.dtype;
        expect(
            "int_sort_with_indices",
            math::sort_with_indices(tensor, dim, descending, dtype, "int_sort_with_indices"),
        )
    }

    fn int_argsort(tensor: IntTensor<Cudnn>, dim: usize, descending: bool) -> IntTensor<Cudnn> {
        let dtype = tensor.dtype;
        expect(
            "int_argsort",
            math::argsort(tensor, dim, descending, dtype, "int_argsort"),
        )
    }

    fn int_topk(tensor: IntTensor<Cudnn>, dim: usize, k: usize) -> IntTensor<Cudnn> {
        expect("int_topk", math::topk(tensor, dim, k, "int_topk"))
    }

    fn int_swap_dims(tensor: IntTensor<Cudnn>, dim1: usize, dim2: usize) -> IntTensor<Cudnn> {
        expect("int_swap_dims", st::swap_dims(tensor, dim1, dim2, "int_swap_dims"))
    }

    fn int_permute(tensor: IntTensor<Cudnn>, axes: &[usize]) -> IntTensor<Cudnn> {
        expect("int_permute", st::permute(tensor, axes, "int_permute"))
    }

    fn int_flip(tensor: IntTensor<Cudnn>, axes: &[usize]) -> IntTensor<Cudnn> {
        expect("int_flip", st::flip(tensor, axes, "int_flip"))
    }

    fn int_random(shape: Shape, distribution: Distribution, device: &CudnnDevice, dtype: IntDType) -> IntTensor<Cudnn> {
        expect(
            "int_random",
            math::random(&shape, distribution, device, dtype.into(), "int_random"),
        )
    }

    fn int_expand(tensor: IntTensor<Cudnn>, shape: Shape) -> IntTensor<Cudnn> {
        expect("int_expand", st::expand(tensor, &shape, "int_expand"))
    }

    fn bitwise_and(lhs: IntTensor<Cudnn>, rhs: IntTensor<Cudnn>) -> IntTensor<Cudnn> {
        expect("bitwise_and", exec::binary(lhs, rhs, BinaryOp::BitAnd, "bitwise_and"))
    }

    fn bitwise_and_scalar(lhs: IntTensor<Cudnn>, rhs: Scalar) -> IntTensor<Cudnn> {
        expect(
            "bitwise_and_scalar",
            exec::binary_scalar(lhs, exec::scalar_f64(rhs), BinaryOp::BitAnd, "bitwise_and_scalar"),
        )
    }

    fn bitwise_or(lhs: IntTensor<Cudnn>, rhs: IntTensor<Cudnn>) -> IntTensor<Cudnn> {
        expect("bitwise_or", exec::binary(lhs, rhs, BinaryOp::BitOr, "bitwise_or"))
    }

    fn bitwise_or_scalar(lhs: IntTensor<Cudnn>, rhs: Scalar) -> IntTensor<Cudnn> {
        expect(
            "bitwise_or_scalar",
            exec::binary_scalar(lhs, exec::scalar_f64(rhs), BinaryOp::BitOr, "bitwise_or_scalar"),
        )
    }

    fn bitwise_xor(lhs: IntTensor<Cudnn>, rhs: IntTensor<Cudnn>) -> IntTensor<Cudnn> {
        expect("bitwise_xor", exec::binary(lhs, rhs, BinaryOp::BitXor, "bitwise_xor"))
    }

    fn bitwise_xor_scalar(lhs: IntTensor<Cudnn>, rhs: Scalar) -> IntTensor<Cudnn> {
        expect(
            "bitwise_xor_scalar",
            exec::binary_scalar(lhs, exec::scalar_f64(rhs), BinaryOp::BitXor, "bitwise_xor_scalar"),
        )
    }

    fn bitwise_not(tensor: IntTensor<Cudnn>) -> IntTensor<Cudnn> {
        expect("bitwise_not", math::not(tensor, "bitwise_not"))
    }

    fn bitwise_left_shift(lhs: IntTensor<Cudnn>, rhs: IntTensor<Cudnn>) -> IntTensor<Cudnn> {
        expect("bitwise_left_shift", math::shift_left(lhs, rhs, "bitwise_left_shift"))
    }

    fn bitwise_left_shift_scalar(lhs: IntTensor<Cudnn>, rhs: Scalar) -> IntTensor<Cudnn> {
        expect(
            "bitwise_left_shift_scalar",
            math::shift_scalar(lhs, rhs, true, "bitwise_left_shift_scalar"),
        )
    }

    fn bitwise_right_shift(lhs: IntTensor<Cudnn>, rhs: IntTensor<Cudnn>) -> IntTensor<Cudnn> {
        expect(
            "bitwise_right_shift",
            math::shift_right(lhs, rhs, "bitwise_right_shift"),
        )
    }

    fn bitwise_right_shift_scalar(lhs: IntTensor<Cudnn>, rhs: Scalar) -> IntTensor<Cudnn> {
        expect(
            "bitwise_right_shift_scalar",
            math::shift_scalar(lhs, rhs, false, "bitwise_right_shift_scalar"),
        )
    }

    fn int_cast(tensor: IntTensor<Cudnn>, dtype: IntDType) -> IntTensor<Cudnn> {
        expect("int_cast", st::cast(tensor, dtype.into(), "int_cast"))
    }

    fn int_unfold(tensor: IntTensor<Cudnn>, dim: usize, size: usize, step: usize) -> IntTensor<Cudnn> {
        expect("int_unfold", st::unfold(tensor, dim, size, step, "int_unfold"))
    }
}
