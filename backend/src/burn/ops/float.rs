//! Float tensor ops (`FloatTensorOps`).

use burn_backend::ops::*;
use burn_backend::tensor::{BoolTensor, FloatTensor, IntTensor};
use burn_backend::*;
use std::future::Future;

use crate::burn::math::{self, ArgOp, BinaryOp, CompareOp, ReduceOp, ScanOp, UnaryOp};
use crate::burn::structure as st;
use crate::burn::tensor::expect;
use crate::burn::{data, exec};
use crate::burn::{Cudnn, CudnnDevice};

impl FloatTensorOps<Cudnn> for Cudnn {
    fn float_from_data(data: TensorData, device: &CudnnDevice) -> FloatTensor<Cudnn> {
        expect(
            "float_from_data",
            data::from_data(data, device, DType::F32, "float_from_data"),
        )
    }

    fn float_random(
        shape: Shape,
        distribution: Distribution,
        device: &CudnnDevice,
        dtype: FloatDType,
    ) -> FloatTensor<Cudnn> {
        expect(
            "float_random",
            math::random(&shape, distribution, device, dtype.into(), "float_random"),
        )
    }

    fn float_into_data(tensor: FloatTensor<Cudnn>) -> impl Future<Output = Result<TensorData, ExecutionError>> + Send {
        data::into_data(tensor)
    }

    fn float_device(tensor: &FloatTensor<Cudnn>) -> CudnnDevice {
        tensor.burn_device()
    }

    fn float_to_device(tensor: FloatTensor<Cudnn>, device: &CudnnDevice) -> FloatTensor<Cudnn> {
        expect("float_to_device", data::to_device(tensor, device))
    }

    fn float_into_int(tensor: FloatTensor<Cudnn>, out_dtype: IntDType) -> IntTensor<Cudnn> {
        expect("float_into_int", st::cast(tensor, out_dtype.into(), "float_into_int"))
    }

    fn float_zeros(shape: Shape, device: &CudnnDevice, dtype: FloatDType) -> FloatTensor<Cudnn> {
        expect(
            "float_zeros",
            st::constant(device, &shape, dtype.into(), Scalar::Float(0.0), "float_zeros"),
        )
    }

    fn float_ones(shape: Shape, device: &CudnnDevice, dtype: FloatDType) -> FloatTensor<Cudnn> {
        expect(
            "float_ones",
            st::constant(device, &shape, dtype.into(), Scalar::Float(1.0), "float_ones"),
        )
    }

    fn float_full(shape: Shape, fill_value: Scalar, device: &CudnnDevice, dtype: FloatDType) -> FloatTensor<Cudnn> {
        expect(
            "float_full",
            st::constant(device, &shape, dtype.into(), fill_value, "float_full"),
        )
    }

    fn float_repeat_dim(tensor: FloatTensor<Cudnn>, dim: usize, times: usize) -> FloatTensor<Cudnn> {
        expect(
            "float_repeat_dim",
            st::repeat_dim(tensor, dim, times, "float_repeat_dim"),
        )
    }

    fn float_cat(tensors: Vec<FloatTensor<Cudnn>>, dim: usize) -> FloatTensor<Cudnn> {
        expect("float_cat", st::cat(tensors, dim, "float_cat"))
    }

    fn float_transpose(tensor: FloatTensor<Cudnn>) -> FloatTensor<Cudnn> {
        expect("float_transpose", st::transpose(tensor, "float_transpose"))
    }

    fn float_gather_nd(data: FloatTensor<Cudnn>, indices: IntTensor<Cudnn>) -> FloatTensor<Cudnn> {
        expect("float_gather_nd", st::gather_nd(data, indices, "float_gather_nd"))
    }

    fn float_scatter_nd(
        data: FloatTensor<Cudnn>,
        indices: IntTensor<Cudnn>,
        values: FloatTensor<Cudnn>,
        reduction: burn_backend::tensor::IndexingUpdateOp,
    ) -> FloatTensor<Cudnn> {
        expect(
            "float_scatter_nd",
            st::scatter_nd(data, indices, values, reduction, "float_scatter_nd"),
        )
    }

    fn float_grid_sample_2d(
        tensor: FloatTensor<Cudnn>,
        grid: FloatTensor<Cudnn>,
        options: GridSampleOptions,
    ) -> FloatTensor<Cudnn> {
        expect(
            "float_grid_sample_2d",
            st::grid_sample_2d(tensor, grid, options, "float_grid_sample_2d"),
        )
    }

    fn float_empty(shape: Shape, device: &CudnnDevice, dtype: FloatDType) -> FloatTensor<Cudnn> {
        expect("float_empty", exec::empty(device, &shape, dtype.into(), "float_empty"))
    }

    fn float_add(lhs: FloatTensor<Cudnn>, rhs: FloatTensor<Cudnn>) -> FloatTensor<Cudnn> {
        expect("float_add", exec::binary(lhs, rhs, BinaryOp::Add, "float_add"))
    }

    fn float_add_scalar(lhs: FloatTensor<Cudnn>, rhs: Scalar) -> FloatTensor<Cudnn> {
        expect("float_add_scalar", math::add_scalar(lhs, rhs, "float_add_scalar"))
    }

    fn float_sub(lhs: FloatTensor<Cudnn>, rhs: FloatTensor<Cudnn>) -> FloatTensor<Cudnn> {
        expect("float_sub", exec::binary(lhs, rhs, BinaryOp::Sub, "float_sub"))
    }

    fn float_sub_scalar(lhs: FloatTensor<Cudnn>, rhs: Scalar) -> FloatTensor<Cudnn> {
        expect("float_sub_scalar", math::sub_scalar(lhs, rhs, "float_sub_scalar"))
    }

    fn float_mul(lhs: FloatTensor<Cudnn>, rhs: FloatTensor<Cudnn>) -> FloatTensor<Cudnn> {
        expect("float_mul", exec::binary(lhs, rhs, BinaryOp::Mul, "float_mul"))
    }

    fn float_mul_scalar(lhs: FloatTensor<Cudnn>, rhs: Scalar) -> FloatTensor<Cudnn> {
        expect("float_mul_scalar", math::mul_scalar(lhs, rhs, "float_mul_scalar"))
    }

    fn float_div(lhs: FloatTensor<Cudnn>, rhs: FloatTensor<Cudnn>) -> FloatTensor<Cudnn> {
        expect("float_div", exec::binary(lhs, rhs, BinaryOp::Div, "float_div"))
    }

    fn float_div_scalar(lhs: FloatTensor<Cudnn>, rhs: Scalar) -> FloatTensor<Cudnn> {
        expect("float_div_scalar", math::div_scalar(lhs, rhs, "float_div_scalar"))
    }

    fn float_remainder(lhs: FloatTensor<Cudnn>, rhs: FloatTensor<Cudnn>) -> FloatTensor<Cudnn> {
        expect(
            "float_remainder",
            exec::binary(lhs, rhs, BinaryOp::Rem, "float_remainder"),
        )
    }

    fn float_remainder_scalar(lhs: FloatTensor<Cudnn>, rhs: Scalar) -> FloatTensor<Cudnn> {
        expect(
            "float_remainder_scalar",
            math::rem_scalar(lhs, rhs, "float_remainder_scalar"),
        )
    }

    fn float_matmul(lhs: FloatTensor<Cudnn>, rhs: FloatTensor<Cudnn>) -> FloatTensor<Cudnn> {
        expect("float_matmul", math::float_matmul(lhs, rhs, "float_matmul"))
    }

    fn float_cross(lhs: FloatTensor<Cudnn>, rhs: FloatTensor<Cudnn>, dim: usize) -> FloatTensor<Cudnn> {
        expect("float_cross", math::cross(lhs, rhs, dim, "float_cross"))
    }

    fn float_recip(tensor: FloatTensor<Cudnn>) -> FloatTensor<Cudnn> {
        expect("float_recip", exec::unary(tensor, UnaryOp::Recip, "float_recip"))
    }

    fn float_swap_dims(tensor: FloatTensor<Cudnn>, dim1: usize, dim2: usize) -> FloatTensor<Cudnn> {
        expect("float_swap_dims", st::swap_dims(tensor, dim1, dim2, "float_swap_dims"))
    }

    fn float_permute(tensor: FloatTensor<Cudnn>, axes: &[usize]) -> FloatTensor<Cudnn> {
        expect("float_permute", st::permute(tensor, axes, "float_permute"))
    }

    fn float_flip(tensor: FloatTensor<Cudnn>, axes: &[usize]) -> FloatTensor<Cudnn> {
        expect("float_flip", st::flip(tensor, axes, "float_flip"))
    }

    fn float_reshape(tensor: FloatTensor<Cudnn>, shape: Shape) -> FloatTensor<Cudnn> {
        expect("float_reshape", st::reshape(tensor, &shape))
    }

    fn float_gather(dim: usize, tensor: FloatTensor<Cudnn>, indices: IntTensor<Cudnn>) -> FloatTensor<Cudnn> {
        expect("float_gather", st::gather(dim, tensor, indices, "float_gather"))
    }

    fn float_scatter_add(
        dim: usize,
        tensor: FloatTensor<Cudnn>,
        indices: IntTensor<Cudnn>,
        value: FloatTensor<Cudnn>,
    ) -> FloatTensor<Cudnn> {
        expect(
            "float_scatter_add",
            st::scatter_add(dim, tensor, indices, value, "float_scatter_add"),
        )
    }

    fn float_select(tensor: FloatTensor<Cudnn>, dim: usize, indices: IntTensor<Cudnn>) -> FloatTensor<Cudnn> {
        expect("float_select", st::select(tensor, dim, indices, "float_select"))
    }

    fn float_select_add(
        tensor: FloatTensor<Cudnn>,
        dim: usize,
        indices: IntTensor<Cudnn>,
        value: FloatTensor<Cudnn>,
    ) -> FloatTensor<Cudnn> {
        expect(
            "float_select_add",
            st::select_add(tensor, dim, indices, value, "float_select_add"),
        )
    }

    fn float_slice(tensor: FloatTensor<Cudnn>, slices: &[Slice]) -> FloatTensor<Cudnn> {
        expect("float_slice", st::slice(tensor, slices, "float_slice"))
    }

    fn float_slice_assign(
        tensor: FloatTensor<Cudnn>,
        slices: &[Slice],
        value: FloatTensor<Cudnn>,
    ) -> FloatTensor<Cudnn> {
        expect(
            "float_slice_assign",
            st::slice_assign(tensor, slices, value, "float_slice_assign"),
        )
    }

    fn float_mask_where(
        tensor: FloatTensor<Cudnn>,
        mask: BoolTensor<Cudnn>,
        value: FloatTensor<Cudnn>,
    ) -> FloatTensor<Cudnn> {
        expect(
            "float_mask_where",
            st::mask_where(tensor, mask, value, "float_mask_where"),
        )
    }

    fn float_mask_fill(tensor: FloatTensor<Cudnn>, mask: BoolTensor<Cudnn>, value: Scalar) -> FloatTensor<Cudnn> {
        expect("float_mask_fill", st::mask_fill(tensor, mask, value, "float_mask_fill"))
    }

    fn float_equal(lhs: FloatTensor<Cudnn>, rhs: FloatTensor<Cudnn>, out_dtype: BoolDType) -> BoolTensor<Cudnn> {
        expect(
            "float_equal",
            exec::compare(lhs, rhs, CompareOp::Eq, out_dtype, "float_equal"),
        )
    }

    fn float_equal_elem(lhs: FloatTensor<Cudnn>, rhs: Scalar, out_dtype: BoolDType) -> BoolTensor<Cudnn> {
        expect(
            "float_equal_elem",
            math::compare_scalar(lhs, rhs, CompareOp::Eq, out_dtype, "float_equal_elem"),
        )
    }

    fn float_greater(lhs: FloatTensor<Cudnn>, rhs: FloatTensor<Cudnn>, out_dtype: BoolDType) -> BoolTensor<Cudnn> {
        expect(
            "float_greater",
            exec::compare(lhs, rhs, CompareOp::Gt, out_dtype, "float_greater"),
        )
    }

    fn float_greater_elem(lhs: FloatTensor<Cudnn>, rhs: Scalar, out_dtype: BoolDType) -> BoolTensor<Cudnn> {
        expect(
            "float_greater_elem",
            math::compare_scalar(lhs, rhs, CompareOp::Gt, out_dtype, "float_greater_elem"),
        )
    }

    fn float_greater_equal(
        lhs: FloatTensor<Cudnn>,
        rhs: FloatTensor<Cudnn>,
        out_dtype: BoolDType,
    ) -> BoolTensor<Cudnn> {
        expect(
            "float_greater_equal",
            exec::compare(lhs, rhs, CompareOp::Ge, out_dtype, "float_greater_equal"),
        )
    }

    fn float_greater_equal_elem(lhs: FloatTensor<Cudnn>, rhs: Scalar, out_dtype: BoolDType) -> BoolTensor<Cudnn> {
        expect(
            "float_greater_equal_elem",
            math::compare_scalar(lhs, rhs, CompareOp::Ge, out_dtype, "float_greater_equal_elem"),
        )
    }

    fn float_lower(lhs: FloatTensor<Cudnn>, rhs: FloatTensor<Cudnn>, out_dtype: BoolDType) -> BoolTensor<Cudnn> {
        expect(
            "float_lower",
            exec::compare(lhs, rhs, CompareOp::Lt, out_dtype, "float_lower"),
        )
    }

    fn float_lower_elem(lhs: FloatTensor<Cudnn>, rhs: Scalar, out_dtype: BoolDType) -> BoolTensor<Cudnn> {
        expect(
            "float_lower_elem",
            math::compare_scalar(lhs, rhs, CompareOp::Lt, out_dtype, "float_lower_elem"),
        )
    }

    fn float_lower_equal(lhs: FloatTensor<Cudnn>, rhs: FloatTensor<Cudnn>, out_dtype: BoolDType) -> BoolTensor<Cudnn> {
        expect(
            "float_lower_equal",
            exec::compare(lhs, rhs, CompareOp::Le, out_dtype, "float_lower_equal"),
        )
    }

    fn float_lower_equal_elem(lhs: FloatTensor<Cudnn>, rhs: Scalar, out_dtype: BoolDType) -> BoolTensor<Cudnn> {
        expect(
            "float_lower_equal_elem",
            math::compare_scalar(lhs, rhs, CompareOp::Le, out_dtype, "float_lower_equal_elem"),
        )
    }

    fn float_sum(tensor: FloatTensor<Cudnn>) -> FloatTensor<Cudnn> {
        expect("float_sum", math::reduce_all(tensor, ReduceOp::Sum, "float_sum"))
    }

    fn float_sum_dim(tensor: FloatTensor<Cudnn>, dim: usize) -> FloatTensor<Cudnn> {
        expect(
            "float_sum_dim",
            math::reduce_dim(tensor, dim, ReduceOp::Sum, "float_sum_dim"),
        )
    }

    fn float_mean_dim(tensor: FloatTensor<Cudnn>, dim: usize) -> FloatTensor<Cudnn> {
        expect("float_mean_dim", math::mean_dim(tensor, dim, "float_mean_dim"))
    }

    fn float_cumsum(tensor: FloatTensor<Cudnn>, dim: usize) -> FloatTensor<Cudnn> {
        expect("float_cumsum", math::scan(tensor, dim, ScanOp::CumSum, "float_cumsum"))
    }

    fn float_cumprod(tensor: FloatTensor<Cudnn>, dim: usize) -> FloatTensor<Cudnn> {
        expect(
            "float_cumprod",
            math::scan(tensor, dim, ScanOp::CumProd, "float_cumprod"),
        )
    }

    fn float_cummin(tensor: FloatTensor<Cudnn>, dim: usize) -> FloatTensor<Cudnn> {
        expect("float_cummin", math::scan(tensor, dim, ScanOp::CumMin, "float_cummin"))
    }

    fn float_cummax(tensor: FloatTensor<Cudnn>, dim: usize) -> FloatTensor<Cudnn> {
        expect("float_cummax", math::scan(tensor, dim, ScanOp::CumMax, "float_cummax"))
    }

    fn float_cast(tensor: FloatTensor<Cudnn>, dtype: FloatDType) -> FloatTensor<Cudnn> {
        expect("float_cast", st::cast(tensor, dtype.into(), "float_cast"))
    }

    fn float_exp(tensor: FloatTensor<Cudnn>) -> FloatTensor<Cudnn> {
        expect("float_exp", exec::unary(tensor, UnaryOp::Exp, "float_exp"))
    }

    fn float_log(tensor: FloatTensor<Cudnn>) -> FloatTensor<Cudnn> {
        expect("float_log", exec::unary(tensor, UnaryOp::Log, "float_log"))
    }

    fn float_log1p(tensor: FloatTensor<Cudnn>) -> FloatTensor<Cudnn> {
        expect("float_log1p", exec::unary(tensor, UnaryOp::Log1p, "float_log1p"))
    }

    fn float_powf(lhs: FloatTensor<Cudnn>, rhs: FloatTensor<Cudnn>) -> FloatTensor<Cudnn> {
        expect("float_powf", math::pow(lhs, rhs, "float_powf"))
    }

    fn float_powf_scalar_impl(tensor: FloatTensor<Cudnn>, value: Scalar) -> FloatTensor<Cudnn> {
        expect(
            "float_powf_scalar_impl",
            math::pow_scalar(tensor, value, "float_powf_scalar_impl"),
        )
    }

    fn float_sqrt(tensor: FloatTensor<Cudnn>) -> FloatTensor<Cudnn> {
        expect("float_sqrt", exec::unary(tensor, UnaryOp::Sqrt, "float_sqrt"))
    }

    fn float_abs(tensor: FloatTensor<Cudnn>) -> FloatTensor<Cudnn> {
        expect("float_abs", math::abs(tensor, "float_abs"))
    }

    fn float_cos(tensor: FloatTensor<Cudnn>) -> FloatTensor<Cudnn> {
        expect("float_cos", exec::unary(tensor, UnaryOp::Cos, "float_cos"))
    }

    fn float_sin(tensor: FloatTensor<Cudnn>) -> FloatTensor<Cudnn> {
        expect("float_sin", exec::unary(tensor, UnaryOp::Sin, "float_sin"))
    }

    fn float_tan(tensor: FloatTensor<Cudnn>) -> FloatTensor<Cudnn> {
        expect("float_tan", exec::unary(tensor, UnaryOp::Tan, "float_tan"))
    }

    fn float_cosh(tensor: FloatTensor<Cudnn>) -> FloatTensor<Cudnn> {
        expect("float_cosh", math::cosh(tensor, "float_cosh"))
    }

    fn float_sinh(tensor: FloatTensor<Cudnn>) -> FloatTensor<Cudnn> {
        expect("float_sinh", math::sinh(tensor, "float_sinh"))
    }

    fn float_tanh(tensor: FloatTensor<Cudnn>) -> FloatTensor<Cudnn> {
        expect("float_tanh", exec::unary(tensor, UnaryOp::Tanh, "float_tanh"))
    }

    fn float_acos(tensor: FloatTensor<Cudnn>) -> FloatTensor<Cudnn> {
        expect("float_acos", math::acos(tensor, "float_acos"))
    }

    fn float_acosh(tensor: FloatTensor<Cudnn>) -> FloatTensor<Cudnn> {
        expect("float_acosh", math::acosh(tensor, "float_acosh"))
    }

    fn float_asin(tensor: FloatTensor<Cudnn>) -> FloatTensor<Cudnn> {
        expect("float_asin", math::asin(tensor, "float_asin"))
    }

    fn float_asinh(tensor: FloatTensor<Cudnn>) -> FloatTensor<Cudnn> {
        expect("float_asinh", math::asinh(tensor, "float_asinh"))
    }

    fn float_atan(tensor: FloatTensor<Cudnn>) -> FloatTensor<Cudnn> {
        expect("float_atan", math::atan(tensor, "float_atan"))
    }

    fn float_atanh(tensor: FloatTensor<Cudnn>) -> FloatTensor<Cudnn> {
        expect("float_atanh", math::atanh(tensor, "float_atanh"))
    }

    fn float_atan2(lhs: FloatTensor<Cudnn>, rhs: FloatTensor<Cudnn>) -> FloatTensor<Cudnn> {
        expect("float_atan2", exec::binary(lhs, rhs, BinaryOp::Atan2, "float_atan2"))
    }

    fn float_round(tensor: FloatTensor<Cudnn>) -> FloatTensor<Cudnn> {
        expect("float_round", exec::unary(tensor, UnaryOp::Round, "float_round"))
    }

    fn float_floor(tensor: FloatTensor<Cudnn>) -> FloatTensor<Cudnn> {
        expect("float_floor", exec::unary(tensor, UnaryOp::Floor, "float_floor"))
    }

    fn float_ceil(tensor: FloatTensor<Cudnn>) -> FloatTensor<Cudnn> {
        expect("float_ceil", exec::unary(tensor, UnaryOp::Ceil, "float_ceil"))
    }

    fn float_trunc(tensor: FloatTensor<Cudnn>) -> FloatTensor<Cudnn> {
        expect("float_trunc", exec::unary(tensor, UnaryOp::Trunc, "float_trunc"))
    }

    fn float_erf(tensor: FloatTensor<Cudnn>) -> FloatTensor<Cudnn> {
        expect("float_erf", exec::unary(tensor, UnaryOp::Erf, "float_erf"))
    }

    fn float_neg(tensor: FloatTensor<Cudnn>) -> FloatTensor<Cudnn> {
        expect("float_neg", exec::unary(tensor, UnaryOp::Neg, "float_neg"))
    }

    fn float_sign(tensor: FloatTensor<Cudnn>) -> FloatTensor<Cudnn> {
        expect("float_sign", exec::unary(tensor, UnaryOp::Sign, "float_sign"))
    }

    fn float_clamp_min(tensor: FloatTensor<Cudnn>, min: Scalar) -> FloatTensor<Cudnn> {
        expect(
            "float_clamp_min",
            math::clamp(tensor, Some(min), None, "float_clamp_min"),
        )
    }

    fn float_clamp_max(tensor: FloatTensor<Cudnn>, max: Scalar) -> FloatTensor<Cudnn> {
        expect(
            "float_clamp_max",
            math::clamp(tensor, None, Some(max), "float_clamp_max"),
        )
    }

    fn float_clamp(tensor: FloatTensor<Cudnn>, min: Scalar, max: Scalar) -> FloatTensor<Cudnn> {
        expect("float_clamp", math::clamp(tensor, Some(min), Some(max), "float_clamp"))
    }

    fn float_powi(lhs: FloatTensor<Cudnn>, rhs: IntTensor<Cudnn>) -> FloatTensor<Cudnn> {
        expect("float_powi", math::pow(lhs, rhs, "float_powi"))
    }

    fn float_powi_scalar(lhs: FloatTensor<Cudnn>, rhs: Scalar) -> FloatTensor<Cudnn> {
        expect("float_powi_scalar", math::powi_scalar(lhs, rhs, "float_powi_scalar"))
    }

    fn float_powi_scalar_impl(lhs: FloatTensor<Cudnn>, rhs: Scalar) -> FloatTensor<Cudnn> {
        expect(
            "float_powi_scalar_impl",
            math::pow_scalar(lhs, rhs, "float_powi_scalar_impl"),
        )
    }

    fn float_not_equal(lhs: FloatTensor<Cudnn>, rhs: FloatTensor<Cudnn>, out_dtype: BoolDType) -> BoolTensor<Cudnn> {
        expect(
            "float_not_equal",
            exec::compare(lhs, rhs, CompareOp::Ne, out_dtype, "float_not_equal"),
        )
    }

    fn float_not_equal_elem(lhs: FloatTensor<Cudnn>, rhs: Scalar, out_dtype: BoolDType) -> BoolTensor<Cudnn> {
        expect(
            "float_not_equal_elem",
            math::compare_scalar(lhs, rhs, CompareOp::Ne, out_dtype, "float_not_equal_elem"),
        )
    }

    fn float_is_nan(tensor: FloatTensor<Cudnn>, out_dtype: BoolDType) -> BoolTensor<Cudnn> {
        expect("float_is_nan", math::is_nan(tensor, out_dtype, "float_is_nan"))
    }

    fn float_is_inf(tensor: FloatTensor<Cudnn>, out_dtype: BoolDType) -> BoolTensor<Cudnn> {
        expect("float_is_inf", math::is_inf(tensor, out_dtype, "float_is_inf"))
    }

    fn float_prod(tensor: FloatTensor<Cudnn>) -> FloatTensor<Cudnn> {
        expect("float_prod", math::reduce_all(tensor, ReduceOp::Prod, "float_prod"))
    }

    fn float_prod_dim(tensor: FloatTensor<Cudnn>, dim: usize) -> FloatTensor<Cudnn> {
        expect(
            "float_prod_dim",
            math::reduce_dim(tensor, dim, ReduceOp::Prod, "float_prod_dim"),
        )
    }

    fn float_mean(tensor: FloatTensor<Cudnn>) -> FloatTensor<Cudnn> {
        expect("float_mean", math::mean(tensor, "float_mean"))
    }

    fn float_max(tensor: FloatTensor<Cudnn>) -> FloatTensor<Cudnn> {
        expect("float_max", math::reduce_all(tensor, ReduceOp::Max, "float_max"))
    }

    fn float_max_dim(tensor: FloatTensor<Cudnn>, dim: usize) -> FloatTensor<Cudnn> {
        expect(
            "float_max_dim",
            math::reduce_dim(tensor, dim, ReduceOp::Max, "float_max_dim"),
        )
    }

    fn float_min(tensor: FloatTensor<Cudnn>) -> FloatTensor<Cudnn> {
        expect("float_min", math::reduce_all(tensor, ReduceOp::Min, "float_min"))
    }

    fn float_min_dim(tensor: FloatTensor<Cudnn>, dim: usize) -> FloatTensor<Cudnn> {
        expect(
            "float_min_dim",
            math::reduce_dim(tensor, dim, ReduceOp::Min, "float_min_dim"),
        )
    }

    fn float_max_abs(tensor: FloatTensor<Cudnn>) -> FloatTensor<Cudnn> {
        expect("float_max_abs", math::max_abs(tensor, "float_max_abs"))
    }

    fn float_max_abs_dim(tensor: FloatTensor<Cudnn>, dim: usize) -> FloatTensor<Cudnn> {
        expect("float_max_abs_dim", math::max_abs_dim(tensor, dim, "float_max_abs_dim"))
    }

    fn float_max_dim_with_indices(
        tensor: FloatTensor<Cudnn>,
        dim: usize,
        indices_dtype: IntDType,
    ) -> (FloatTensor<Cudnn>, IntTensor<Cudnn>) {
        expect(
            "float_max_dim_with_indices",
            math::arg_reduce_with_values(
                tensor,
                dim,
                ArgOp::ArgMax,
                indices_dtype.into(),
                "float_max_dim_with_indices",
            ),
        )
    }

    fn float_min_dim_with_indices(
        tensor: FloatTensor<Cudnn>,
        dim: usize,
        indices_dtype: IntDType,
    ) -> (FloatTensor<Cudnn>, IntTensor<Cudnn>) {
        expect(
            "float_min_dim_with_indices",
            math::arg_reduce_with_values(
                tensor,
                dim,
                ArgOp::ArgMin,
                indices_dtype.into(),
                "float_min_dim_with_indices",
            ),
        )
    }

    fn float_any(tensor: FloatTensor<Cudnn>, out_dtype: BoolDType) -> BoolTensor<Cudnn> {
        expect(
            "float_any",
            math::logical_all(tensor, ReduceOp::Any, out_dtype, "float_any"),
        )
    }

    fn float_any_dim(tensor: FloatTensor<Cudnn>, dim: usize, out_dtype: BoolDType) -> BoolTensor<Cudnn> {
        expect(
            "float_any_dim",
            math::logical_dim(tensor, dim, ReduceOp::Any, out_dtype, "float_any_dim"),
        )
    }

    fn float_all(tensor: FloatTensor<Cudnn>, out_dtype: BoolDType) -> BoolTensor<Cudnn> {
        expect(
            "float_all",
            math::logical_all(tensor, ReduceOp::All, out_dtype, "float_all"),
        )
    }

    fn float_all_dim(tensor: FloatTensor<Cudnn>, dim: usize, out_dtype: BoolDType) -> BoolTensor<Cudnn> {
        expect(
            "float_all_dim",
            math::logical_dim(tensor, dim, ReduceOp::All, out_dtype, "float_all_dim"),
        )
    }

    fn float_sort(tensor: FloatTensor<Cudnn>, dim: usize, descending: bool) -> FloatTensor<Cudnn> {
        expect("float_sort", math::sort(tensor, dim, descending, "float_sort"))
    }

    fn float_sort_with_indices(
        tensor: FloatTensor<Cudnn>,
        dim: usize,
        descending: bool,
        indices_dtype: IntDType,
    ) -> (FloatTensor<Cudnn>, IntTensor<Cudnn>) {
        expect(
            "float_sort_with_indices",
            math::sort_with_indices(tensor, dim, descending, indices_dtype.into(), "float_sort_with_indices"),
        )
    }

    fn float_argsort(
        tensor: FloatTensor<Cudnn>,
        dim: usize,
        descending: bool,
        out_dtype: IntDType,
    ) -> IntTensor<Cudnn> {
        expect(
            "float_argsort",
            math::argsort(tensor, dim, descending, out_dtype.into(), "float_argsort"),
        )
    }

    fn float_topk(tensor: FloatTensor<Cudnn>, dim: usize, k: usize) -> FloatTensor<Cudnn> {
        expect("float_topk", math::topk(tensor, dim, k, "float_topk"))
    }

    fn float_argmax(tensor: FloatTensor<Cudnn>, dim: usize, out_dtype: IntDType) -> IntTensor<Cudnn> {
        expect(
            "float_argmax",
            math::arg_reduce(tensor, dim, ArgOp::ArgMax, out_dtype.into(), "float_argmax"),
        )
    }

    fn float_argtopk(tensor: FloatTensor<Cudnn>, dim: usize, k: usize, out_dtype: IntDType) -> IntTensor<Cudnn> {
        expect(
            "float_argtopk",
            math::argtopk(tensor, dim, k, out_dtype.into(), "float_argtopk"),
        )
    }

    fn float_argmin(tensor: FloatTensor<Cudnn>, dim: usize, out_dtype: IntDType) -> IntTensor<Cudnn> {
        expect(
            "float_argmin",
            math::arg_reduce(tensor, dim, ArgOp::ArgMin, out_dtype.into(), "float_argmin"),
        )
    }

    fn float_expand(tensor: FloatTensor<Cudnn>, shape: Shape) -> FloatTensor<Cudnn> {
        expect("float_expand", st::expand(tensor, &shape, "float_expand"))
    }

    fn float_unfold(tensor: FloatTensor<Cudnn>, dim: usize, size: usize, step: usize) -> FloatTensor<Cudnn> {
        expect("float_unfold", st::unfold(tensor, dim, size, step, "float_unfold"))
    }
}
