//! Conformance harness for the Burn backend: runs the same op on a tested backend (`Cudnn`) and on
//! the CPU reference `burn-ndarray` 0.21 with identical seeded inputs, and compares the results.
//!
//! A case is a list of input [`Spec`]s (logical shape, value generator, kind), a [`Run`] (the
//! dtypes of both sides and a [`View`] through which the inputs reach the op: contiguous,
//! permuted, stepped slice, expanded or channels-last), a [`Tol`]erance and one closure body that
//! is instantiated for both backends (see the `case!` macro of `tests/burn_conformance.rs`).
//! Views are created with the backends' own ops (`*_permute`, `*_slice` with steps, `*_expand`),
//! so both sides see the same logical values. Panics inside a case are caught and recorded as
//! that case's failure; [`Group::finish`] prints `burn conformance <group>: <ops> ops, <cases>
//! cases, <failed> failed` to the (uncaptured) stderr and then asserts that nothing failed.

use std::cell::{Cell, RefCell};
use std::collections::BTreeSet;
use std::io::Write;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Once;

use burn_backend::ops::FloatTensorOps;
use burn_backend::tensor::{BoolTensor, FloatTensor, IntTensor};
use burn_backend::{
    read_sync, Backend, BoolDType, BoolStore, DType, FloatDType, IntDType, Shape, Slice, TensorData, TensorMetadata,
};
use half::{bf16, f16};

/// The CPU reference backend.
pub type Nd = burn_ndarray::NdArray<f32, i64, i8>;

/// Every method of the Burn 0.21 ops traits the conformance suite must call, as
/// `(trait, method)` (extracted from `burn-backend-0.21.0/src/backend/ops/*.rs`; QTensorOps is
/// listed separately in [`QTENSOR_METHODS`]).
#[rustfmt::skip]
pub const OPS_METHODS: &[(&str, &str)] = &[
    ("FloatTensorOps", "float_from_data"), ("FloatTensorOps", "float_random"), ("FloatTensorOps", "float_zeros"),
    ("FloatTensorOps", "float_ones"), ("FloatTensorOps", "float_full"), ("FloatTensorOps", "float_into_data"),
    ("FloatTensorOps", "float_device"), ("FloatTensorOps", "float_to_device"), ("FloatTensorOps", "float_into_int"),
    ("FloatTensorOps", "float_empty"), ("FloatTensorOps", "float_repeat_dim"), ("FloatTensorOps", "float_add"),
    ("FloatTensorOps", "float_add_scalar"), ("FloatTensorOps", "float_clamp_min"),
    ("FloatTensorOps", "float_clamp_max"), ("FloatTensorOps", "float_clamp"), ("FloatTensorOps", "float_sub"),
    ("FloatTensorOps", "float_sub_scalar"), ("FloatTensorOps", "float_mul"), ("FloatTensorOps", "float_mul_scalar"),
    ("FloatTensorOps", "float_div"), ("FloatTensorOps", "float_div_scalar"), ("FloatTensorOps", "float_remainder"),
    ("FloatTensorOps", "float_remainder_scalar"), ("FloatTensorOps", "float_matmul"),
    ("FloatTensorOps", "float_cross"), ("FloatTensorOps", "float_neg"), ("FloatTensorOps", "float_recip"),
    ("FloatTensorOps", "float_transpose"), ("FloatTensorOps", "float_swap_dims"),
    ("FloatTensorOps", "float_permute"), ("FloatTensorOps", "float_flip"), ("FloatTensorOps", "float_reshape"),
    ("FloatTensorOps", "float_gather"), ("FloatTensorOps", "float_scatter_add"),
    ("FloatTensorOps", "float_scatter_nd"), ("FloatTensorOps", "float_gather_nd"),
    ("FloatTensorOps", "float_select"), ("FloatTensorOps", "float_select_add"), ("FloatTensorOps", "float_slice"),
    ("FloatTensorOps", "float_slice_assign"), ("FloatTensorOps", "float_mask_where"),
    ("FloatTensorOps", "float_mask_fill"), ("FloatTensorOps", "float_equal"), ("FloatTensorOps", "float_not_equal"),
    ("FloatTensorOps", "float_equal_elem"), ("FloatTensorOps", "float_not_equal_elem"),
    ("FloatTensorOps", "float_greater"), ("FloatTensorOps", "float_greater_elem"),
    ("FloatTensorOps", "float_greater_equal"), ("FloatTensorOps", "float_greater_equal_elem"),
    ("FloatTensorOps", "float_lower"), ("FloatTensorOps", "float_lower_elem"),
    ("FloatTensorOps", "float_lower_equal"), ("FloatTensorOps", "float_lower_equal_elem"),
    ("FloatTensorOps", "float_detach"), ("FloatTensorOps", "float_set_require_grad"),
    ("FloatTensorOps", "float_is_require_grad"), ("FloatTensorOps", "float_sum"),
    ("FloatTensorOps", "float_sum_dim"), ("FloatTensorOps", "float_prod"), ("FloatTensorOps", "float_prod_dim"),
    ("FloatTensorOps", "float_mean"), ("FloatTensorOps", "float_mean_dim"), ("FloatTensorOps", "float_cumsum"),
    ("FloatTensorOps", "float_cumprod"), ("FloatTensorOps", "float_cummin"), ("FloatTensorOps", "float_cummax"),
    ("FloatTensorOps", "float_cast"), ("FloatTensorOps", "float_exp"), ("FloatTensorOps", "float_log"),
    ("FloatTensorOps", "float_log1p"), ("FloatTensorOps", "float_powf"), ("FloatTensorOps", "float_powi"),
    ("FloatTensorOps", "float_powi_scalar"), ("FloatTensorOps", "float_powi_scalar_impl"),
    ("FloatTensorOps", "float_powf_scalar"), ("FloatTensorOps", "float_powf_scalar_impl"),
    ("FloatTensorOps", "float_sqrt"), ("FloatTensorOps", "float_abs"), ("FloatTensorOps", "float_cos"),
    ("FloatTensorOps", "float_sin"), ("FloatTensorOps", "float_tan"), ("FloatTensorOps", "float_cosh"),
    ("FloatTensorOps", "float_sinh"), ("FloatTensorOps", "float_tanh"), ("FloatTensorOps", "float_acos"),
    ("FloatTensorOps", "float_acosh"), ("FloatTensorOps", "float_asin"), ("FloatTensorOps", "float_asinh"),
    ("FloatTensorOps", "float_atan"), ("FloatTensorOps", "float_atanh"), ("FloatTensorOps", "float_atan2"),
    ("FloatTensorOps", "float_round"), ("FloatTensorOps", "float_floor"), ("FloatTensorOps", "float_ceil"),
    ("FloatTensorOps", "float_trunc"), ("FloatTensorOps", "float_erf"), ("FloatTensorOps", "float_cat"),
    ("FloatTensorOps", "float_argmax"), ("FloatTensorOps", "float_argtopk"), ("FloatTensorOps", "float_topk"),
    ("FloatTensorOps", "float_argmin"), ("FloatTensorOps", "float_max"), ("FloatTensorOps", "float_max_dim"),
    ("FloatTensorOps", "float_max_dim_with_indices"), ("FloatTensorOps", "float_min"),
    ("FloatTensorOps", "float_min_dim"), ("FloatTensorOps", "float_min_dim_with_indices"),
    ("FloatTensorOps", "float_max_abs"), ("FloatTensorOps", "float_max_abs_dim"), ("FloatTensorOps", "float_any"),
    ("FloatTensorOps", "float_any_dim"), ("FloatTensorOps", "float_all"), ("FloatTensorOps", "float_all_dim"),
    ("FloatTensorOps", "float_sign"), ("FloatTensorOps", "float_expand"), ("FloatTensorOps", "float_sort"),
    ("FloatTensorOps", "float_sort_with_indices"), ("FloatTensorOps", "float_argsort"),
    ("FloatTensorOps", "float_grid_sample_2d"), ("FloatTensorOps", "float_unfold"),
    ("FloatTensorOps", "float_is_nan"), ("FloatTensorOps", "float_is_inf"), ("IntTensorOps", "int_empty"),
    ("IntTensorOps", "int_into_data"), ("IntTensorOps", "int_from_data"), ("IntTensorOps", "int_device"),
    ("IntTensorOps", "int_to_device"), ("IntTensorOps", "int_reshape"), ("IntTensorOps", "int_slice"),
    ("IntTensorOps", "int_slice_assign"), ("IntTensorOps", "int_into_float"), ("IntTensorOps", "int_mask_where"),
    ("IntTensorOps", "int_mask_fill"), ("IntTensorOps", "int_gather"), ("IntTensorOps", "int_scatter_add"),
    ("IntTensorOps", "int_scatter_nd"), ("IntTensorOps", "int_gather_nd"), ("IntTensorOps", "int_select"),
    ("IntTensorOps", "int_select_add"), ("IntTensorOps", "int_repeat_dim"), ("IntTensorOps", "int_cat"),
    ("IntTensorOps", "int_equal"), ("IntTensorOps", "int_not_equal"), ("IntTensorOps", "int_equal_elem"),
    ("IntTensorOps", "int_not_equal_elem"), ("IntTensorOps", "int_greater"), ("IntTensorOps", "int_greater_elem"),
    ("IntTensorOps", "int_greater_equal"), ("IntTensorOps", "int_greater_equal_elem"),
    ("IntTensorOps", "int_lower"), ("IntTensorOps", "int_lower_elem"), ("IntTensorOps", "int_lower_equal"),
    ("IntTensorOps", "int_lower_equal_elem"), ("IntTensorOps", "int_add"), ("IntTensorOps", "int_add_scalar"),
    ("IntTensorOps", "int_powi"), ("IntTensorOps", "int_powi_scalar"), ("IntTensorOps", "int_powi_scalar_impl"),
    ("IntTensorOps", "int_clamp_min"), ("IntTensorOps", "int_clamp_max"), ("IntTensorOps", "int_clamp"),
    ("IntTensorOps", "int_sub"), ("IntTensorOps", "int_sub_scalar"), ("IntTensorOps", "int_mul"),
    ("IntTensorOps", "int_mul_scalar"), ("IntTensorOps", "int_div"), ("IntTensorOps", "int_div_scalar"),
    ("IntTensorOps", "int_remainder"), ("IntTensorOps", "int_remainder_scalar"), ("IntTensorOps", "int_matmul"),
    ("IntTensorOps", "int_neg"), ("IntTensorOps", "int_zeros"), ("IntTensorOps", "int_ones"),
    ("IntTensorOps", "int_full"), ("IntTensorOps", "int_sum"), ("IntTensorOps", "int_sum_dim"),
    ("IntTensorOps", "int_prod"), ("IntTensorOps", "int_prod_dim"), ("IntTensorOps", "int_mean"),
    ("IntTensorOps", "int_mean_dim"), ("IntTensorOps", "int_cumsum"), ("IntTensorOps", "int_cumprod"),
    ("IntTensorOps", "int_cummin"), ("IntTensorOps", "int_cummax"), ("IntTensorOps", "int_argmax"),
    ("IntTensorOps", "int_argtopk"), ("IntTensorOps", "int_topk"), ("IntTensorOps", "int_argmin"),
    ("IntTensorOps", "int_max"), ("IntTensorOps", "int_max_dim"), ("IntTensorOps", "int_max_dim_with_indices"),
    ("IntTensorOps", "int_max_abs"), ("IntTensorOps", "int_max_abs_dim"), ("IntTensorOps", "int_min"),
    ("IntTensorOps", "int_min_dim"), ("IntTensorOps", "int_min_dim_with_indices"), ("IntTensorOps", "int_abs"),
    ("IntTensorOps", "int_transpose"), ("IntTensorOps", "int_swap_dims"), ("IntTensorOps", "int_permute"),
    ("IntTensorOps", "int_flip"), ("IntTensorOps", "int_random"), ("IntTensorOps", "int_arange_step"),
    ("IntTensorOps", "int_arange"), ("IntTensorOps", "int_any"), ("IntTensorOps", "int_any_dim"),
    ("IntTensorOps", "int_all"), ("IntTensorOps", "int_all_dim"), ("IntTensorOps", "int_sign"),
    ("IntTensorOps", "int_expand"), ("IntTensorOps", "int_sort"), ("IntTensorOps", "int_sort_with_indices"),
    ("IntTensorOps", "int_argsort"), ("IntTensorOps", "bitwise_and"), ("IntTensorOps", "bitwise_and_scalar"),
    ("IntTensorOps", "bitwise_or"), ("IntTensorOps", "bitwise_or_scalar"), ("IntTensorOps", "bitwise_xor"),
    ("IntTensorOps", "bitwise_xor_scalar"), ("IntTensorOps", "bitwise_not"), ("IntTensorOps", "bitwise_left_shift"),
    ("IntTensorOps", "bitwise_left_shift_scalar"), ("IntTensorOps", "bitwise_right_shift"),
    ("IntTensorOps", "bitwise_right_shift_scalar"), ("IntTensorOps", "int_cast"), ("IntTensorOps", "int_unfold"),
    ("BoolTensorOps", "bool_empty"), ("BoolTensorOps", "bool_zeros"), ("BoolTensorOps", "bool_ones"),
    ("BoolTensorOps", "bool_into_data"), ("BoolTensorOps", "bool_from_data"), ("BoolTensorOps", "bool_into_int"),
    ("BoolTensorOps", "bool_into_float"), ("BoolTensorOps", "bool_device"), ("BoolTensorOps", "bool_to_device"),
    ("BoolTensorOps", "bool_reshape"), ("BoolTensorOps", "bool_slice"), ("BoolTensorOps", "bool_slice_assign"),
    ("BoolTensorOps", "bool_mask_where"), ("BoolTensorOps", "bool_mask_fill"), ("BoolTensorOps", "bool_gather"),
    ("BoolTensorOps", "bool_scatter_or"), ("BoolTensorOps", "bool_select"), ("BoolTensorOps", "bool_select_or"),
    ("BoolTensorOps", "bool_repeat_dim"), ("BoolTensorOps", "bool_cat"), ("BoolTensorOps", "bool_equal"),
    ("BoolTensorOps", "bool_not_equal"), ("BoolTensorOps", "bool_equal_elem"),
    ("BoolTensorOps", "bool_not_equal_elem"), ("BoolTensorOps", "bool_not"), ("BoolTensorOps", "bool_and"),
    ("BoolTensorOps", "bool_or"), ("BoolTensorOps", "bool_xor"), ("BoolTensorOps", "bool_transpose"),
    ("BoolTensorOps", "bool_swap_dims"), ("BoolTensorOps", "bool_permute"), ("BoolTensorOps", "bool_flip"),
    ("BoolTensorOps", "bool_any"), ("BoolTensorOps", "bool_any_dim"), ("BoolTensorOps", "bool_all"),
    ("BoolTensorOps", "bool_all_dim"), ("BoolTensorOps", "bool_argwhere"), ("BoolTensorOps", "bool_expand"),
    ("BoolTensorOps", "bool_unfold"), ("ModuleOps", "embedding"), ("ModuleOps", "embedding_backward"),
    ("ModuleOps", "linear"), ("ModuleOps", "linear_x_backward"), ("ModuleOps", "linear_weight_backward"),
    ("ModuleOps", "linear_bias_backward"), ("ModuleOps", "conv1d"), ("ModuleOps", "conv1d_x_backward"),
    ("ModuleOps", "conv1d_weight_backward"), ("ModuleOps", "conv1d_bias_backward"), ("ModuleOps", "conv2d"),
    ("ModuleOps", "conv2d_x_backward"), ("ModuleOps", "conv2d_weight_backward"),
    ("ModuleOps", "conv2d_bias_backward"), ("ModuleOps", "deform_conv2d"), ("ModuleOps", "deform_conv2d_backward"),
    ("ModuleOps", "conv3d"), ("ModuleOps", "conv3d_x_backward"), ("ModuleOps", "conv3d_weight_backward"),
    ("ModuleOps", "conv3d_bias_backward"), ("ModuleOps", "conv_transpose1d"),
    ("ModuleOps", "conv_transpose1d_x_backward"), ("ModuleOps", "conv_transpose1d_weight_backward"),
    ("ModuleOps", "conv_transpose1d_bias_backward"), ("ModuleOps", "conv_transpose2d"),
    ("ModuleOps", "conv_transpose2d_x_backward"), ("ModuleOps", "conv_transpose2d_weight_backward"),
    ("ModuleOps", "conv_transpose2d_bias_backward"), ("ModuleOps", "conv_transpose3d"),
    ("ModuleOps", "conv_transpose3d_x_backward"), ("ModuleOps", "conv_transpose3d_weight_backward"),
    ("ModuleOps", "conv_transpose3d_bias_backward"), ("ModuleOps", "unfold4d"), ("ModuleOps", "avg_pool1d"),
    ("ModuleOps", "avg_pool1d_backward"), ("ModuleOps", "avg_pool2d"), ("ModuleOps", "avg_pool2d_backward"),
    ("ModuleOps", "adaptive_avg_pool2d"), ("ModuleOps", "adaptive_avg_pool2d_backward"),
    ("ModuleOps", "adaptive_avg_pool1d"), ("ModuleOps", "adaptive_avg_pool1d_backward"),
    ("ModuleOps", "max_pool1d"), ("ModuleOps", "max_pool1d_with_indices"),
    ("ModuleOps", "max_pool1d_with_indices_backward"), ("ModuleOps", "max_pool2d"),
    ("ModuleOps", "max_pool2d_with_indices"), ("ModuleOps", "max_pool2d_with_indices_backward"),
    ("ModuleOps", "interpolate"), ("ModuleOps", "interpolate_backward"), ("ModuleOps", "attention"),
    ("ModuleOps", "layer_norm"), ("ModuleOps", "ctc_loss"), ("ModuleOps", "has_ctc_loss_backward"),
    ("ModuleOps", "ctc_loss_backward"), ("ModuleOps", "rfft"), ("ModuleOps", "irfft"),
    ("ActivationOps", "leaky_relu"), ("ActivationOps", "relu"), ("ActivationOps", "relu_backward"),
    ("ActivationOps", "gelu"), ("ActivationOps", "prelu"), ("ActivationOps", "gelu_backward"),
    ("ActivationOps", "sigmoid"), ("ActivationOps", "sigmoid_backward"), ("ActivationOps", "hard_sigmoid"),
    ("ActivationOps", "log_sigmoid"), ("ActivationOps", "softmax"), ("ActivationOps", "log_softmax"),
    ("ActivationOps", "softmin"), ("ActivationOps", "log_sigmoid_backward"), ("TransactionOps", "tr_execute"),
];

/// The methods of `QTensorOps` (quantized tensors).
#[rustfmt::skip]
pub const QTENSOR_METHODS: &[&str] = &[
    "q_from_data", "quantize", "quantize_dynamic", "dequantize", "q_device", "q_to_device", "q_reshape",
    "q_into_data", "q_detach", "q_set_require_grad", "q_is_require_grad", "q_expand", "q_transpose", "q_swap_dims",
    "q_permute", "q_flip", "q_select", "q_slice", "q_gather", "q_repeat_dim", "q_add", "q_add_scalar",
    "q_clamp_min", "q_clamp_max", "q_clamp", "q_sub", "q_sub_scalar", "q_mul", "q_mul_scalar", "q_div",
    "q_div_scalar", "q_matmul", "q_neg", "q_recip", "q_sum", "q_sum_dim", "q_prod", "q_prod_dim", "q_mean",
    "q_mean_dim", "q_cumsum", "q_cumprod", "q_cummin", "q_cummax", "q_exp", "q_log", "q_log1p", "q_powf", "q_powi",
    "q_powi_scalar", "q_powf_scalar", "q_sqrt", "q_abs", "q_cos", "q_sin", "q_tan", "q_cosh", "q_sinh", "q_tanh",
    "q_erf", "q_cat", "q_argmax", "q_argtopk", "q_topk", "q_argmin", "q_max", "q_max_dim", "q_max_dim_with_indices",
    "q_min", "q_min_dim", "q_min_dim_with_indices", "q_max_abs", "q_max_abs_dim", "q_any", "q_any_dim", "q_all",
    "q_all_dim", "q_sort", "q_sort_with_indices", "q_argsort",
];

// ---------------------------------------------------------------------------------------------
// Random values
// ---------------------------------------------------------------------------------------------

/// SplitMix64: small, seedable, reproducible.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// A generator seeded with `seed`.
    pub fn new(seed: u64) -> Self {
        Self(seed ^ 0x5DEE_CE66_D1CE_4E5B)
    }

    /// Next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `[0, 1)`.
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Uniform integer in `lo..=hi`.
    pub fn int(&mut self, lo: i64, hi: i64) -> i64 {
        assert!(lo <= hi, "Rng::int: empty range {lo}..={hi}");
        lo + (self.next_u64() % ((hi - lo) as u64 + 1)) as i64
    }

    /// Fisher-Yates shuffle.
    pub fn shuffle<T>(&mut self, v: &mut [T]) {
        for i in (1..v.len()).rev() {
            let j = (self.next_u64() % (i as u64 + 1)) as usize;
            v.swap(i, j);
        }
    }
}

/// How the values of an input are drawn.
#[derive(Clone, Debug)]
pub enum Gen {
    /// Uniform floats in `[lo, hi)`.
    Uniform(f64, f64),
    /// Uniform integers in `lo..=hi`.
    Ints(i64, i64),
    /// Uniform integers in `lo..=hi` without 0 (divisors).
    NonZero(i64, i64),
    /// `1` with probability `p`, else `0`.
    Bools(f64),
    /// Uniformly chosen from a list (ties, special values).
    Choice(Vec<f64>),
    /// A random permutation of `0..n` shifted by `-n/2` and scaled: distinct values, exactly
    /// representable in every float dtype for `n <= 256` and scale 1.
    Distinct(f64),
    /// Index tuples for `*_gather_nd`/`*_scatter_nd`: the last dim cycles through columns whose
    /// values are `< bound[col]`.
    Tuples(Vec<usize>),
    /// Like [`Gen::Tuples`] but no tuple repeats (scatter with `Assign`).
    UniqueTuples(Vec<usize>),
    /// Each lane of length `n` along the last dim is a random selection of distinct values
    /// in `0..bound` (unique indices per row, e.g. `scatter` without duplicates).
    UniqueRows(usize),
    /// Exactly these values (row-major over the logical shape); disables views.
    Values(Vec<f64>),
}

impl Gen {
    /// `n` values for a tensor of `shape`.
    fn sample(&self, shape: &[usize], rng: &mut Rng) -> Vec<f64> {
        let n: usize = shape.iter().product();
        match self {
            Gen::Uniform(lo, hi) => (0..n).map(|_| lo + (hi - lo) * rng.unit()).collect(),
            Gen::Ints(lo, hi) => (0..n).map(|_| rng.int(*lo, *hi) as f64).collect(),
            Gen::NonZero(lo, hi) => (0..n)
                .map(|_| loop {
                    let v = rng.int(*lo, *hi);
                    if v != 0 {
                        break v as f64;
                    }
                })
                .collect(),
            Gen::Bools(p) => (0..n).map(|_| if rng.unit() < *p { 1.0 } else { 0.0 }).collect(),
            Gen::Choice(vals) => (0..n)
                .map(|_| vals[rng.int(0, vals.len() as i64 - 1) as usize])
                .collect(),
            Gen::Distinct(scale) => {
                let mut v: Vec<f64> = (0..n).map(|i| (i as f64 - (n / 2) as f64) * scale).collect();
                rng.shuffle(&mut v);
                v
            }
            Gen::Tuples(bounds) => (0..n)
                .map(|i| rng.int(0, bounds[i % bounds.len()] as i64 - 1) as f64)
                .collect(),
            Gen::UniqueTuples(bounds) => {
                let k = bounds.len();
                let total: usize = bounds.iter().product();
                let m = n / k;
                assert!(
                    m <= total,
                    "Gen::UniqueTuples: {m} tuples requested, only {total} exist"
                );
                let mut all: Vec<usize> = (0..total).collect();
                rng.shuffle(&mut all);
                let mut out = Vec::with_capacity(n);
                for &flat in &all[..m] {
                    let mut rem = flat;
                    let mut tuple = vec![0usize; k];
                    for c in (0..k).rev() {
                        tuple[c] = rem % bounds[c];
                        rem /= bounds[c];
                    }
                    out.extend(tuple.iter().map(|&t| t as f64));
                }
                out
            }
            Gen::UniqueRows(bound) => {
                let len = *shape.last().unwrap_or(&1);
                assert!(len <= *bound, "Gen::UniqueRows: rows of {len} from 0..{bound}");
                let mut out = Vec::with_capacity(n);
                for _ in 0..n / len.max(1) {
                    let mut all: Vec<usize> = (0..*bound).collect();
                    rng.shuffle(&mut all);
                    out.extend(all[..len].iter().map(|&v| v as f64));
                }
                out
            }
            Gen::Values(v) => {
                assert_eq!(v.len(), n, "Gen::Values: {} values for shape {shape:?}", v.len());
                v.clone()
            }
        }
    }

    /// Whether the values may be re-laid-out through a view (explicit values, index tuples and
    /// unique rows keep their exact layout).
    fn viewable(&self) -> bool {
        !matches!(
            self,
            Gen::Values(_) | Gen::Tuples(_) | Gen::UniqueTuples(_) | Gen::UniqueRows(_)
        )
    }
}

/// Tensor kind of an input: float/int/bool in the run's dtype, or a fixed dtype.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Kind {
    /// Float tensor in the run's float dtype.
    F,
    /// Int tensor in the run's int dtype.
    I,
    /// Bool tensor in the run's bool store.
    B,
    /// A tensor of exactly this dtype (e.g. `I64` indices).
    D(DType),
}

/// One input of a case.
#[derive(Clone, Debug)]
pub struct Spec {
    /// Float, int, bool or fixed dtype.
    pub kind: Kind,
    /// Logical shape (what the op sees).
    pub shape: Vec<usize>,
    /// Value generator.
    pub gen: Gen,
    /// Whether the run's view applies to this input.
    pub viewable: bool,
}

impl Spec {
    /// This input always reaches the op contiguous.
    pub fn contig(mut self) -> Self {
        self.viewable = false;
        self
    }

    /// Replaces the generator.
    pub fn gen(mut self, gen: Gen) -> Self {
        self.gen = gen;
        self
    }
}

fn spec(kind: Kind, shape: &[usize], gen: Gen) -> Spec {
    Spec {
        kind,
        shape: shape.to_vec(),
        gen,
        viewable: true,
    }
}

/// Float input, uniform in `[lo, hi)`.
pub fn fl(shape: &[usize], lo: f64, hi: f64) -> Spec {
    spec(Kind::F, shape, Gen::Uniform(lo, hi))
}

/// Float input with an explicit generator.
pub fn fg(shape: &[usize], gen: Gen) -> Spec {
    spec(Kind::F, shape, gen)
}

/// Int input (run's int dtype), uniform in `lo..=hi`.
pub fn it(shape: &[usize], lo: i64, hi: i64) -> Spec {
    spec(Kind::I, shape, Gen::Ints(lo, hi))
}

/// Int input without zeros (divisors).
pub fn nz(shape: &[usize], lo: i64, hi: i64) -> Spec {
    spec(Kind::I, shape, Gen::NonZero(lo, hi))
}

/// Int input with an explicit generator.
pub fn ig(shape: &[usize], gen: Gen) -> Spec {
    spec(Kind::I, shape, gen)
}

/// Bool input (run's bool store), true with probability 1/2.
pub fn bo(shape: &[usize]) -> Spec {
    spec(Kind::B, shape, Gen::Bools(0.5))
}

/// `I64` index input with values in `0..n`.
pub fn ix(shape: &[usize], n: usize) -> Spec {
    spec(Kind::D(DType::I64), shape, Gen::Ints(0, n as i64 - 1))
}

/// Input of a fixed dtype.
pub fn dg(dtype: DType, shape: &[usize], gen: Gen) -> Spec {
    spec(Kind::D(dtype), shape, gen)
}

// ---------------------------------------------------------------------------------------------
// Runs, dtypes and views
// ---------------------------------------------------------------------------------------------

/// Dtypes used for [`Kind::F`], [`Kind::I`] and [`Kind::B`] inputs (and passed as `out_dtype`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Dt {
    /// Float dtype.
    pub f: DType,
    /// Int dtype.
    pub i: DType,
    /// Bool dtype.
    pub b: DType,
}

impl Dt {
    /// f32 / i64 / native bool.
    pub const DEFAULT: Dt = Dt {
        f: DType::F32,
        i: DType::I64,
        b: DType::Bool(BoolStore::Native),
    };
}

/// How inputs reach the op.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum View {
    /// Fresh contiguous tensor.
    Contig,
    /// Stored with all dims reversed, then `*_permute` with reversed axes (transposed view).
    Permuted,
    /// Stored larger, then `*_slice`: dim 0 from 1 and the last dim with step 2.
    Stepped,
    /// Stored with size 1 in the first non-trivial dim, then `*_expand` (stride-0 broadcast).
    Expanded,
    /// Stored `[N, spatial.., C]`, then `*_permute([0, r-1, 1, .., r-2])` (NHWC as NCHW view).
    ChannelsLast,
}

/// The four generic views.
pub const VIEWS: [View; 4] = [View::Contig, View::Permuted, View::Stepped, View::Expanded];

/// Dtypes and view of one execution of a case.
#[derive(Clone, Copy, Debug)]
pub struct Run {
    /// Dtypes on the tested backend.
    pub t: Dt,
    /// Dtypes on the reference backend.
    pub r: Dt,
    /// Float inputs are rounded to this dtype first (both sides see the same values).
    pub round: DType,
    /// Input view.
    pub view: View,
}

impl Run {
    /// Float run: both sides in `dtype`.
    pub fn f(dtype: DType) -> Run {
        let dt = Dt {
            f: dtype,
            ..Dt::DEFAULT
        };
        Run {
            t: dt,
            r: dt,
            round: dtype,
            view: View::Contig,
        }
    }

    /// Int run: int inputs in `dtype` on both sides.
    pub fn i(dtype: DType) -> Run {
        let dt = Dt {
            i: dtype,
            ..Dt::DEFAULT
        };
        Run {
            t: dt,
            r: dt,
            round: DType::F32,
            view: View::Contig,
        }
    }

    /// Bool run: bool inputs (and `out_dtype`s) in `store` on the tested side, native on the
    /// reference (ndarray only stores native bools).
    pub fn b(store: BoolStore) -> Run {
        Run {
            t: Dt {
                b: DType::Bool(store),
                ..Dt::DEFAULT
            },
            r: Dt::DEFAULT,
            round: DType::F32,
            view: View::Contig,
        }
    }

    /// Mixed-precision run: the tested side computes in `tested` (f16/bf16), the reference in
    /// `reference` (f32), both on inputs rounded to `round`.
    pub fn mixed(tested: DType, reference: DType, round: DType) -> Run {
        Run {
            t: Dt {
                f: tested,
                ..Dt::DEFAULT
            },
            r: Dt {
                f: reference,
                ..Dt::DEFAULT
            },
            round,
            view: View::Contig,
        }
    }

    /// The same run through `view`.
    pub fn view(mut self, view: View) -> Run {
        self.view = view;
        self
    }

    /// Short description, e.g. `f32/permuted` or `f16 vs f32/contig`.
    pub fn label(&self) -> String {
        let mut s = String::new();
        let side = |d: &Dt| format!("{}/{}/{}", d.f.name(), d.i.name(), d.b.name());
        if self.t == self.r {
            s.push_str(&side(&self.t));
        } else {
            s.push_str(&format!("{} vs {}", side(&self.t), side(&self.r)));
        }
        if self.round != self.t.f {
            s.push_str(&format!(" (inputs rounded to {})", self.round.name()));
        }
        s.push_str(&format!(" {:?}", self.view).to_lowercase());
        s
    }
}

/// All float `dtypes` × `views`.
pub fn float_runs(dtypes: &[DType], views: &[View]) -> Vec<Run> {
    dtypes
        .iter()
        .flat_map(|&d| views.iter().map(move |&v| Run::f(d).view(v)))
        .collect()
}

/// All int `dtypes` × `views`.
pub fn int_runs(dtypes: &[DType], views: &[View]) -> Vec<Run> {
    dtypes
        .iter()
        .flat_map(|&d| views.iter().map(move |&v| Run::i(d).view(v)))
        .collect()
}

/// All bool `stores` × `views`.
pub fn bool_runs(stores: &[BoolStore], views: &[View]) -> Vec<Run> {
    stores
        .iter()
        .flat_map(|&s| views.iter().map(move |&v| Run::b(s).view(v)))
        .collect()
}

// ---------------------------------------------------------------------------------------------
// Tensor data helpers
// ---------------------------------------------------------------------------------------------

/// Rounds `v` to the nearest value of `dtype` (identity for non-float dtypes).
pub fn round_to(dtype: DType, v: f64) -> f64 {
    match dtype {
        DType::F32 | DType::Flex32 => v as f32 as f64,
        DType::F16 => f16::from_f64(v).to_f64(),
        DType::BF16 => bf16::from_f64(v).to_f64(),
        _ => v,
    }
}

/// `TensorData` of `dtype` holding `values` (converted with `as`; bools are `v != 0`).
pub fn make_data(values: &[f64], shape: &[usize], dtype: DType) -> TensorData {
    let shape = shape.to_vec();
    match dtype {
        DType::F64 => TensorData::new(values.to_vec(), shape),
        DType::F32 => TensorData::new(values.iter().map(|&v| v as f32).collect::<Vec<_>>(), shape),
        DType::Flex32 => TensorData::from_bytes_vec(
            values.iter().flat_map(|&v| (v as f32).to_le_bytes()).collect(),
            shape,
            DType::Flex32,
        ),
        DType::F16 => TensorData::new(values.iter().map(|&v| f16::from_f64(v)).collect::<Vec<_>>(), shape),
        DType::BF16 => TensorData::new(values.iter().map(|&v| bf16::from_f64(v)).collect::<Vec<_>>(), shape),
        DType::I64 => TensorData::new(values.iter().map(|&v| v as i64).collect::<Vec<_>>(), shape),
        DType::I32 => TensorData::new(values.iter().map(|&v| v as i32).collect::<Vec<_>>(), shape),
        DType::I16 => TensorData::new(values.iter().map(|&v| v as i16).collect::<Vec<_>>(), shape),
        DType::I8 => TensorData::new(values.iter().map(|&v| v as i8).collect::<Vec<_>>(), shape),
        DType::U64 => TensorData::new(values.iter().map(|&v| v as u64).collect::<Vec<_>>(), shape),
        DType::U32 => TensorData::new(values.iter().map(|&v| v as u32).collect::<Vec<_>>(), shape),
        DType::U16 => TensorData::new(values.iter().map(|&v| v as u16).collect::<Vec<_>>(), shape),
        DType::U8 => TensorData::new(values.iter().map(|&v| v as u8).collect::<Vec<_>>(), shape),
        DType::Bool(BoolStore::Native) => TensorData::new(values.iter().map(|&v| v != 0.0).collect::<Vec<_>>(), shape),
        DType::Bool(BoolStore::U8) => TensorData::from_bytes_vec(
            values.iter().map(|&v| (v != 0.0) as u8).collect(),
            shape,
            DType::Bool(BoolStore::U8),
        ),
        DType::Bool(BoolStore::U32) => TensorData::from_bytes_vec(
            values.iter().flat_map(|&v| ((v != 0.0) as u32).to_le_bytes()).collect(),
            shape,
            DType::Bool(BoolStore::U32),
        ),
        DType::QFloat(_) => panic!("make_data: quantized dtypes are built with TensorData::quantized"),
    }
}

/// The values of `data` as f64 (bools as 0/1).
pub fn values(data: &TensorData) -> Vec<f64> {
    data.iter::<f64>().collect()
}

/// `Shape` from dims.
pub fn shape(dims: &[usize]) -> Shape {
    Shape::from(dims.to_vec())
}

fn numel(shape: &[usize]) -> usize {
    shape.iter().product()
}

/// Row-major multi-index of flat index `i`.
pub fn unravel(mut i: usize, shape: &[usize]) -> Vec<usize> {
    let mut idx = vec![0; shape.len()];
    for d in (0..shape.len()).rev() {
        let s = shape[d].max(1);
        idx[d] = i % s;
        i /= s;
    }
    idx
}

fn ravel(idx: &[usize], shape: &[usize]) -> usize {
    idx.iter().zip(shape).fold(0, |acc, (&i, &s)| acc * s + i)
}

/// `(outer, len, inner)` of `dim`: lane `(o, i)` holds elements `o*len*inner + j*inner + i`.
pub fn lanes(shape: &[usize], dim: usize) -> (usize, usize, usize) {
    (numel(&shape[..dim]), shape[dim], numel(&shape[dim + 1..]))
}

// ---------------------------------------------------------------------------------------------
// Materialised inputs and the per-backend context
// ---------------------------------------------------------------------------------------------

/// One generated input: its logical values and how it is stored before the view.
#[derive(Clone, Debug)]
pub struct Input {
    /// Kind of tensor.
    pub kind: Kind,
    /// Logical shape.
    pub shape: Vec<usize>,
    /// Logical values, row-major (what the op sees), already rounded.
    pub values: Vec<f64>,
    /// The view actually applied.
    pub view: View,
    storage_shape: Vec<usize>,
    storage_values: Vec<f64>,
}

impl Input {
    fn generate(spec: &Spec, run: &Run, rng: &mut Rng) -> Input {
        let shape = spec.shape.clone();
        let rank = shape.len();
        let mut view = if spec.viewable && spec.gen.viewable() {
            run.view
        } else {
            View::Contig
        };
        if view == View::ChannelsLast && rank < 3 {
            view = View::Permuted;
        }
        let round = match spec.kind {
            Kind::F => run.round,
            Kind::D(d) if d.is_float() => d,
            _ => DType::I64,
        };
        let draw = |rng: &mut Rng, dims: &[usize]| -> Vec<f64> {
            spec.gen
                .sample(dims, rng)
                .into_iter()
                .map(|v| round_to(round, v))
                .collect()
        };
        let (storage_shape, storage_values, values) = match view {
            View::Contig => {
                let v = draw(rng, &shape);
                (shape.clone(), v.clone(), v)
            }
            View::Permuted => {
                let v = draw(rng, &shape);
                let st: Vec<usize> = shape.iter().rev().copied().collect();
                let mut sv = vec![0.0; v.len()];
                for (flat, &x) in v.iter().enumerate() {
                    let mut idx = unravel(flat, &shape);
                    idx.reverse();
                    sv[ravel(&idx, &st)] = x;
                }
                (st, sv, v)
            }
            View::ChannelsLast => {
                let v = draw(rng, &shape);
                // storage [N, s1.., C]; logical [N, C, s1..] = storage.permute([0, r-1, 1, .., r-2])
                let mut st = vec![shape[0]];
                st.extend_from_slice(&shape[2..]);
                st.push(shape[1]);
                let mut sv = vec![0.0; v.len()];
                for (flat, &x) in v.iter().enumerate() {
                    let idx = unravel(flat, &shape);
                    let mut sidx = vec![idx[0]];
                    sidx.extend_from_slice(&idx[2..]);
                    sidx.push(idx[1]);
                    sv[ravel(&sidx, &st)] = x;
                }
                (st, sv, v)
            }
            View::Stepped => {
                let v = draw(rng, &shape);
                let mut st = shape.clone();
                if rank == 1 {
                    st[0] = 2 * shape[0] + 1;
                } else if rank > 1 {
                    st[0] += 1;
                    st[rank - 1] *= 2;
                }
                let mut sv = draw(rng, &st); // filler: valid values the op must not see
                for (flat, &x) in v.iter().enumerate() {
                    let mut idx = unravel(flat, &shape);
                    if rank == 1 {
                        idx[0] = 1 + 2 * idx[0];
                    } else if rank > 1 {
                        idx[0] += 1;
                        idx[rank - 1] *= 2;
                    }
                    sv[ravel(&idx, &st)] = x;
                }
                (st, sv, v)
            }
            View::Expanded => {
                let axis = shape.iter().position(|&s| s > 1);
                let mut st = shape.clone();
                if let Some(a) = axis {
                    st[a] = 1;
                }
                let sv = draw(rng, &st);
                let v: Vec<f64> = (0..numel(&shape))
                    .map(|flat| {
                        let mut idx = unravel(flat, &shape);
                        if let Some(a) = axis {
                            idx[a] = 0;
                        }
                        sv[ravel(&idx, &st)]
                    })
                    .collect();
                (st, sv, v)
            }
        };
        Input {
            kind: spec.kind,
            shape,
            values,
            view,
            storage_shape,
            storage_values,
        }
    }

    fn dtype(&self, dt: &Dt) -> DType {
        match self.kind {
            Kind::F => dt.f,
            Kind::I => dt.i,
            Kind::B => dt.b,
            Kind::D(d) => d,
        }
    }

    fn slices(&self) -> Vec<Slice> {
        let rank = self.shape.len();
        (0..rank)
            .map(|d| {
                if rank == 1 {
                    Slice::new(1, None, 2)
                } else if d == 0 {
                    Slice::new(1, None, 1)
                } else if d == rank - 1 {
                    Slice::new(0, None, 2)
                } else {
                    Slice::new(0, None, 1)
                }
            })
            .collect()
    }

    fn permutation(&self) -> Vec<usize> {
        let rank = self.shape.len();
        match self.view {
            View::Permuted => (0..rank).rev().collect(),
            View::ChannelsLast => {
                let mut p = vec![0, rank - 1];
                p.extend(1..rank - 1);
                p
            }
            _ => (0..rank).collect(),
        }
    }
}

/// What a case body sees on one backend: the inputs (as tensors of that backend, through the
/// run's view), the device and the run's dtypes.
pub struct Cx<'a, B: Backend> {
    /// Generated inputs (logical values and shapes).
    pub inputs: &'a [Input],
    /// Device of this backend.
    pub dev: B::Device,
    /// Dtypes on this side.
    pub dt: Dt,
    /// Explicit float values ([`Cx::fvals`]) are rounded to this dtype first, as generated
    /// inputs are ([`Run::round`]): both sides see the same values.
    pub round: DType,
}

impl<'a, B: Backend> Cx<'a, B> {
    fn data(&self, k: usize) -> TensorData {
        let inp = &self.inputs[k];
        make_data(&inp.storage_values, &inp.storage_shape, inp.dtype(&self.dt))
    }

    fn check_shape(&self, k: usize, got: Shape) {
        let want = &self.inputs[k].shape;
        if got.as_slice() != want.as_slice() {
            panic!(
                "harness: {:?} view of input {k} has shape {:?}, expected {want:?}",
                self.inputs[k].view,
                got.as_slice()
            );
        }
    }

    /// Input `k` as a float tensor (through the run's view).
    pub fn f(&self, k: usize) -> FloatTensor<B> {
        let inp = &self.inputs[k];
        let mut t = B::float_from_data(self.data(k), &self.dev);
        t = match inp.view {
            View::Contig => t,
            View::Permuted | View::ChannelsLast => B::float_permute(t, &inp.permutation()),
            View::Stepped => B::float_slice(t, &inp.slices()),
            View::Expanded => B::float_expand(t, shape(&inp.shape)),
        };
        self.check_shape(k, t.shape());
        t
    }

    /// Input `k` as an int tensor (through the run's view).
    pub fn i(&self, k: usize) -> IntTensor<B> {
        let inp = &self.inputs[k];
        let mut t = B::int_from_data(self.data(k), &self.dev);
        t = match inp.view {
            View::Contig => t,
            View::Permuted | View::ChannelsLast => B::int_permute(t, &inp.permutation()),
            View::Stepped => B::int_slice(t, &inp.slices()),
            View::Expanded => B::int_expand(t, shape(&inp.shape)),
        };
        self.check_shape(k, t.shape());
        t
    }

    /// Input `k` as a bool tensor (through the run's view).
    pub fn b(&self, k: usize) -> BoolTensor<B> {
        let inp = &self.inputs[k];
        let mut t = B::bool_from_data(self.data(k), &self.dev);
        t = match inp.view {
            View::Contig => t,
            View::Permuted | View::ChannelsLast => B::bool_permute(t, &inp.permutation()),
            View::Stepped => B::bool_slice(t, &inp.slices()),
            View::Expanded => B::bool_expand(t, shape(&inp.shape)),
        };
        self.check_shape(k, t.shape());
        t
    }

    /// Logical shape of input `k`.
    pub fn shape(&self, k: usize) -> Shape {
        shape(&self.inputs[k].shape)
    }

    /// The run's float dtype on this side.
    pub fn fdt(&self) -> FloatDType {
        self.dt.f.into()
    }

    /// The run's int dtype on this side.
    pub fn idt(&self) -> IntDType {
        self.dt.i.into()
    }

    /// The run's bool dtype on this side.
    pub fn bdt(&self) -> BoolDType {
        self.dt.b.into()
    }

    /// Reads a float tensor.
    pub fn rf(&self, t: FloatTensor<B>) -> TensorData {
        read_sync(B::float_into_data(t)).unwrap_or_else(|e| panic!("float_into_data failed: {e:?}"))
    }

    /// Reads an int tensor.
    pub fn ri(&self, t: IntTensor<B>) -> TensorData {
        read_sync(B::int_into_data(t)).unwrap_or_else(|e| panic!("int_into_data failed: {e:?}"))
    }

    /// Reads a bool tensor.
    pub fn rb(&self, t: BoolTensor<B>) -> TensorData {
        read_sync(B::bool_into_data(t)).unwrap_or_else(|e| panic!("bool_into_data failed: {e:?}"))
    }

    /// A float tensor of this side's float dtype from explicit values (rounded to
    /// [`Cx::round`] first, so a half run's reference sees the tested side's values).
    pub fn fvals(&self, values: &[f64], dims: &[usize]) -> FloatTensor<B> {
        let rounded: Vec<f64> = values.iter().map(|&v| round_to(self.round, v)).collect();
        B::float_from_data(make_data(&rounded, dims, self.dt.f), &self.dev)
    }

    /// An `I64` int tensor from explicit values.
    pub fn ivals(&self, values: &[i64], dims: &[usize]) -> IntTensor<B> {
        B::int_from_data(TensorData::new(values.to_vec(), dims.to_vec()), &self.dev)
    }
}

// ---------------------------------------------------------------------------------------------
// Comparison
// ---------------------------------------------------------------------------------------------

/// Tolerance of a case (for float outputs; int and bool outputs are always compared exactly).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Tol {
    /// Bit-for-bit equal values (NaN equals NaN, -0 equals +0).
    Exact,
    /// Relative L2 error `|got - want| / |want|` at most this, stated for f32; scaled for the
    /// run's float dtype (f64: ×1e-5 but at least 1e-11; f16: at least 1e-2; bf16: at least 3e-2).
    Rel(f64),
    /// Like [`Tol::Rel`], but for ops whose reference computes in f32 whatever the input dtype
    /// (Burn's default `sigmoid` and `hard_sigmoid`, which burn-ndarray uses, cast to f32 and
    /// back): f64 runs are held to f32 rounding ([`F32_ROUNDING`]) instead of `t × 1e-5`,
    /// because the reference itself carries f32 rounding errors (~3e-8 relative L2).
    RefF32(f64),
    /// Only shape and dtype are compared (uninitialised `*_empty`).
    Meta,
}

/// Relative L2 error of a correctly rounded f32 result (a few units of f32's 6e-8 unit
/// roundoff, with margin): the f64 tolerance of [`Tol::RefF32`] ops.
pub const F32_ROUNDING: f64 = 1e-6;

impl Tol {
    fn for_dtype(self, dtype: DType) -> Tol {
        match (self, dtype) {
            (Tol::Rel(t), DType::F64) => Tol::Rel((t * 1e-5).max(1e-11)),
            (Tol::Rel(t), DType::F16) => Tol::Rel(t.max(1e-2)),
            (Tol::Rel(t), DType::BF16) => Tol::Rel(t.max(3e-2)),
            (Tol::RefF32(_), DType::F64) => Tol::Rel(F32_ROUNDING),
            (Tol::RefF32(t), d) => Tol::Rel(t).for_dtype(d),
            (t, _) => t,
        }
    }
}

/// Elementwise ops (f32).
pub const EW: Tol = Tol::Rel(1e-5);
/// Reductions, scans, softmax-like ops (f32).
pub const RED: Tol = Tol::Rel(1e-4);
/// Convolutions and pooling (f32, no TF32).
pub const CONV: Tol = Tol::Rel(1e-4);
/// Matmuls (cuDNN may use TF32 for f32 GEMMs).
pub const MM: Tol = Tol::Rel(2e-3);
/// Matmuls with a tiny inner dimension (K < 16) under TF32: each output is a sum of only a
/// few TF32 products (inputs rounded to 10 mantissa bits, relative error up to ~1e-3 each), so
/// the errors do not average out and cancellation between the few terms can amplify them
/// (observed: rel L2 2.02e-3 for `[4, 5] x [5, 3]`).
pub const MM_SMALL_K: Tol = Tol::Rel(5e-3);

/// Tolerance of an f32 matmul (or a cuDNN-matmul-based op) whose inner dimension is `k`:
/// [`MM_SMALL_K`] when `k < 16`, else [`MM`].
pub fn mm_tol(k: usize) -> Tol {
    if k < 16 {
        MM_SMALL_K
    } else {
        MM
    }
}

/// Tolerance of f32 convolutions: [`CONV`], or [`MM`] when `CUDNN_BACKEND_ALLOW_TF32` lets
/// them run in TF32 (it is off by default).
pub fn conv_tol() -> Tol {
    if cudnn_backend::config::config().allow_tf32 {
        MM
    } else {
        CONV
    }
}

fn fmt_idx(flat: usize, shape: &[usize]) -> String {
    format!("{:?}", unravel(flat, shape))
}

/// Floor of the per-element rms of the reference in relative L2 errors (see [`compare`]).
pub const REL_FLOOR: f64 = 1e-4;

/// Compares `got` with `want` (whose dtype must be `want_dtype`); `Err` describes the first
/// problem precisely: shape, dtype, or the error statistics and the first mismatching index.
pub fn compare(got: &TensorData, want: &TensorData, want_dtype: DType, tol: Tol) -> Result<(), String> {
    if got.shape.as_slice() != want.shape.as_slice() {
        return Err(format!(
            "shape {:?} != expected {:?}",
            got.shape.as_slice(),
            want.shape.as_slice()
        ));
    }
    if got.dtype != want_dtype {
        return Err(format!("dtype {:?} != expected {:?}", got.dtype, want_dtype));
    }
    if tol == Tol::Meta {
        return Ok(());
    }
    let shape = want.shape.as_slice();
    let g = values(got);
    let w = values(want);
    if g.len() != w.len() {
        return Err(format!("{} values read, expected {}", g.len(), w.len()));
    }
    let float = want_dtype.is_float();
    let tol = if float { tol } else { Tol::Exact };
    match tol {
        Tol::Meta => Ok(()),
        Tol::Exact => {
            let same = |a: f64, b: f64| a == b || (a.is_nan() && b.is_nan());
            let bad: Vec<usize> = (0..w.len()).filter(|&i| !same(g[i], w[i])).collect();
            match bad.first() {
                None => Ok(()),
                Some(&i) => Err(format!(
                    "{} of {} values differ (exact comparison); first at {} : got {:?}, want {:?}",
                    bad.len(),
                    w.len(),
                    fmt_idx(i, shape),
                    g[i],
                    w[i]
                )),
            }
        }
        Tol::Rel(t) | Tol::RefF32(t) => {
            let n = w.len();
            if n == 0 {
                return Ok(());
            }
            let mut num = 0.0f64;
            let mut den = 0.0f64;
            let mut nonfinite_mismatch = None;
            for i in 0..n {
                let (a, b) = (g[i], w[i]);
                if a.is_finite() && b.is_finite() {
                    num += (a - b) * (a - b);
                    den += b * b;
                } else if !(a == b || (a.is_nan() && b.is_nan())) && nonfinite_mismatch.is_none() {
                    nonfinite_mismatch = Some(i);
                }
            }
            let rms = (den / n as f64).sqrt();
            // The denominator has an absolute floor of REL_FLOOR per element (the suite's
            // inputs are O(1)): for an all-zero or near-zero reference (e.g. the cross product
            // of a vector with itself) the relative error is meaningless and rounding-level
            // absolute errors must pass (f64: |err| rms <= 1e-14; f32: <= 1e-9).
            let rel_l2 = num.sqrt() / den.sqrt().max(REL_FLOOR * (n as f64).sqrt());
            let mut max_abs = (0.0f64, 0usize);
            let mut max_rel = (0.0f64, 0usize);
            let mut first_bad = nonfinite_mismatch;
            for i in 0..n {
                let (a, b) = (g[i], w[i]);
                if !(a.is_finite() && b.is_finite()) {
                    continue;
                }
                let e = (a - b).abs();
                let r = e / b.abs().max(rms).max(1e-30);
                if e > max_abs.0 {
                    max_abs = (e, i);
                }
                if r > max_rel.0 {
                    max_rel = (r, i);
                }
                if r > t && first_bad.is_none_or(|f| i < f) {
                    first_bad = Some(i);
                }
            }
            if rel_l2 <= t && nonfinite_mismatch.is_none() {
                return Ok(());
            }
            let mut msg = format!(
                "rel L2 err {rel_l2:.3e} > tol {t:.1e}; max abs err {:.3e} at {} (got {:?}, want {:?}); \
                 max rel err {:.3e} at {}",
                max_abs.0,
                fmt_idx(max_abs.1, shape),
                g[max_abs.1],
                w[max_abs.1],
                max_rel.0,
                fmt_idx(max_rel.1, shape)
            );
            if let Some(i) = nonfinite_mismatch {
                msg.push_str(&format!(
                    "; non-finite mismatch at {} (got {:?}, want {:?})",
                    fmt_idx(i, shape),
                    g[i],
                    w[i]
                ));
            }
            if let Some(i) = first_bad {
                msg.push_str(&format!(
                    "; first mismatch at {} (got {:?}, want {:?})",
                    fmt_idx(i, shape),
                    g[i],
                    w[i]
                ));
            }
            Err(msg)
        }
    }
}

/// The dtype the tested side must produce for a reference output of dtype `d`.
fn expected_dtype(d: DType, run: &Run) -> DType {
    if d == run.r.f {
        run.t.f
    } else if d == run.r.b {
        run.t.b
    } else {
        d
    }
}

// ---------------------------------------------------------------------------------------------
// Panic capture
// ---------------------------------------------------------------------------------------------

thread_local! {
    static IN_CASE: Cell<bool> = const { Cell::new(false) };
    static LAST_PANIC_AT: RefCell<String> = const { RefCell::new(String::new()) };
}

static HOOK: Once = Once::new();

/// Installs (once) a panic hook that stays quiet for panics inside cases (they are recorded as
/// failures with their location) and defers to the previous hook otherwise.
fn install_hook() {
    HOOK.call_once(|| {
        let prev = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if IN_CASE.with(|c| c.get()) {
                let at = info
                    .location()
                    .map(|l| format!("{}:{}", l.file(), l.line()))
                    .unwrap_or_default();
                LAST_PANIC_AT.with(|s| *s.borrow_mut() = at);
            } else {
                prev(info);
            }
        }));
    });
}

/// Runs `f`, turning a panic into `Err("panicked at <file:line>: <message>")`.
pub fn guarded<T>(f: impl FnOnce() -> T) -> Result<T, String> {
    install_hook();
    let was = IN_CASE.with(|c| c.replace(true));
    let r = catch_unwind(AssertUnwindSafe(f));
    IN_CASE.with(|c| c.set(was));
    r.map_err(|p| {
        let msg = if let Some(s) = p.downcast_ref::<&str>() {
            (*s).to_string()
        } else if let Some(s) = p.downcast_ref::<String>() {
            s.clone()
        } else {
            "non-string panic payload".to_string()
        };
        let at = LAST_PANIC_AT.with(|s| s.borrow().clone());
        format!("panicked at {at}: {msg}")
    })
}

// ---------------------------------------------------------------------------------------------
// Groups of cases
// ---------------------------------------------------------------------------------------------

/// `s` on one line (multi-line panic and error messages would break the one-failure-per-line
/// report).
fn one_line(s: &str) -> String {
    s.split('\n')
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join(" | ")
}

fn fnv(parts: &[&str]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for p in parts {
        for b in p.bytes().chain(std::iter::once(0xff)) {
            h ^= b as u64;
            h = h.wrapping_mul(0x100_0000_01b3);
        }
    }
    h
}

/// A group of conformance cases that collects every failure and reports at the end.
pub struct Group {
    name: String,
    ops: BTreeSet<String>,
    cases: usize,
    failures: Vec<String>,
}

impl Group {
    /// A new, empty group.
    pub fn new(name: &str) -> Self {
        install_hook();
        Self {
            name: name.to_string(),
            ops: BTreeSet::new(),
            cases: 0,
            failures: Vec::new(),
        }
    }

    fn inputs(&self, op: &str, label: &str, run: &Run, specs: &[Spec]) -> Result<Vec<Input>, String> {
        let seed = fnv(&[&self.name, op, label, &run.label()]);
        guarded(|| {
            let mut rng = Rng::new(seed);
            specs.iter().map(|s| Input::generate(s, run, &mut rng)).collect()
        })
        .map_err(|e| format!("input generation {e}"))
    }

    fn record(&mut self, op: &str, label: &str, run: &Run, result: Result<(), String>) {
        self.ops.insert(op.to_string());
        self.cases += 1;
        if let Err(e) = result {
            self.failures
                .push(format!("{op} [{label}] ({}): {}", run.label(), one_line(&e)));
        }
    }

    fn compare_all(got: &[TensorData], want: &[TensorData], run: &Run, tol: Tol, map: bool) -> Result<(), String> {
        if got.len() != want.len() {
            return Err(format!("{} outputs, reference has {}", got.len(), want.len()));
        }
        let tol = tol.for_dtype(run.t.f);
        let mut errs = Vec::new();
        for (k, (g, w)) in got.iter().zip(want).enumerate() {
            let wd = if map { expected_dtype(w.dtype, run) } else { w.dtype };
            // A half run's reference computes in f32: its float outputs are rounded to the
            // tested dtype (what the same op computed exactly in that dtype returns).
            let rounded;
            let w = if wd != w.dtype && wd.is_float() {
                rounded = w.clone().convert_dtype(wd);
                &rounded
            } else {
                w
            };
            if let Err(e) = compare(g, w, wd, tol) {
                errs.push(format!("output #{k}: {e}"));
            }
        }
        if errs.is_empty() {
            Ok(())
        } else {
            Err(errs.join("; "))
        }
    }

    /// Runs `tested` on `T` and `reference` on `R` (the same body instantiated twice) with the
    /// inputs of `specs` under `run`, and compares all outputs.
    #[allow(clippy::too_many_arguments)]
    pub fn case<T: Backend, R: Backend>(
        &mut self,
        op: &str,
        label: &str,
        run: Run,
        specs: &[Spec],
        tol: Tol,
        tested: impl Fn(&Cx<T>) -> Vec<TensorData>,
        reference: impl Fn(&Cx<R>) -> Vec<TensorData>,
    ) {
        let result = self.inputs(op, label, &run, specs).and_then(|inputs| {
            let want = guarded(|| {
                reference(&Cx {
                    inputs: &inputs,
                    dev: Default::default(),
                    dt: run.r,
                    round: run.round,
                })
            })
            .map_err(|e| format!("REFERENCE (ndarray) {e}"))?;
            let got = guarded(|| {
                tested(&Cx {
                    inputs: &inputs,
                    dev: Default::default(),
                    dt: run.t,
                    round: run.round,
                })
            })?;
            Self::compare_all(&got, &want, &run, tol, true)
        });
        self.record(op, label, &run, result);
    }

    /// Like [`Group::case`] but the expected outputs come from a host function of the inputs
    /// (ops the reference cannot run); the host outputs carry the exact expected dtypes.
    #[allow(clippy::too_many_arguments)]
    pub fn host<T: Backend>(
        &mut self,
        op: &str,
        label: &str,
        run: Run,
        specs: &[Spec],
        tol: Tol,
        tested: impl Fn(&Cx<T>) -> Vec<TensorData>,
        host: impl Fn(&[Input]) -> Vec<TensorData>,
    ) {
        let result = self.inputs(op, label, &run, specs).and_then(|inputs| {
            let want = guarded(|| host(&inputs)).map_err(|e| format!("HOST REFERENCE {e}"))?;
            let got = guarded(|| {
                tested(&Cx {
                    inputs: &inputs,
                    dev: Default::default(),
                    dt: run.t,
                    round: run.round,
                })
            })?;
            Self::compare_all(&got, &want, &run, tol, false)
        });
        self.record(op, label, &run, result);
    }

    /// A property check (random ops, backend metadata): `Err` or a panic is a failure.
    pub fn check(&mut self, op: &str, label: &str, f: impl FnOnce() -> Result<(), String>) {
        let result = guarded(f).and_then(|r| r);
        self.ops.insert(op.to_string());
        self.cases += 1;
        if let Err(e) = result {
            self.failures.push(format!("{op} [{label}]: {}", one_line(&e)));
        }
    }

    /// Number of failures so far.
    pub fn failed(&self) -> usize {
        self.failures.len()
    }

    /// Prints every failure and the summary line
    /// `burn conformance <group>: <ops> ops, <cases> cases, <failed> failed` to stderr (not
    /// captured by the test harness), then panics if anything failed.
    pub fn finish(self) {
        let line = format!(
            "burn conformance {}: {} ops, {} cases, {} failed",
            self.name,
            self.ops.len(),
            self.cases,
            self.failures.len()
        );
        {
            let mut err = std::io::stderr().lock();
            for f in &self.failures {
                let _ = writeln!(err, "  FAIL {}: {f}", self.name);
            }
            let _ = writeln!(err, "{line}");
        }
        if !self.failures.is_empty() {
            let shown: Vec<&str> = self.failures.iter().take(40).map(|s| s.as_str()).collect();
            panic!(
                "{} of {} cases failed in group \"{}\":\n{}{}",
                self.failures.len(),
                self.cases,
                self.name,
                shown.join("\n"),
                if self.failures.len() > 40 {
                    "\n... (all failures are listed on stderr)"
                } else {
                    ""
                }
            );
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Host references
// ---------------------------------------------------------------------------------------------

/// Indices of the `k` largest values of every lane along `dim` (descending; equal values by
/// lowest index, as `float_argtopk` documents), and the output shape.
pub fn host_argtopk(v: &[f64], dims: &[usize], dim: usize, k: usize) -> (Vec<f64>, Vec<usize>) {
    let (outer, len, inner) = lanes(dims, dim);
    let mut out_dims = dims.to_vec();
    out_dims[dim] = k;
    let mut out = vec![0.0; outer * k * inner];
    for o in 0..outer {
        for i in 0..inner {
            let mut idx: Vec<usize> = (0..len).collect();
            let at = |j: usize| v[o * len * inner + j * inner + i];
            idx.sort_by(|&a, &b| at(b).partial_cmp(&at(a)).unwrap().then(a.cmp(&b)));
            for (j, &src) in idx.iter().take(k).enumerate() {
                out[o * k * inner + j * inner + i] = src as f64;
            }
        }
    }
    (out, out_dims)
}

/// Real DFT along `dim` (signal truncated or zero-padded to `n`, default the dim's length):
/// `(re, im, out_dims)` with `n/2 + 1` bins.
pub fn host_rfft(v: &[f64], dims: &[usize], dim: usize, n: Option<usize>) -> (Vec<f64>, Vec<f64>, Vec<usize>) {
    let (outer, len, inner) = lanes(dims, dim);
    let n = n.unwrap_or(len);
    let bins = n / 2 + 1;
    let mut out_dims = dims.to_vec();
    out_dims[dim] = bins;
    let mut re = vec![0.0; outer * bins * inner];
    let mut im = vec![0.0; outer * bins * inner];
    for o in 0..outer {
        for i in 0..inner {
            for k in 0..bins {
                let (mut sr, mut si) = (0.0, 0.0);
                for j in 0..len.min(n) {
                    let x = v[o * len * inner + j * inner + i];
                    let a = -2.0 * std::f64::consts::PI * (j * k) as f64 / n as f64;
                    sr += x * a.cos();
                    si += x * a.sin();
                }
                re[o * bins * inner + k * inner + i] = sr;
                im[o * bins * inner + k * inner + i] = si;
            }
        }
    }
    (re, im, out_dims)
}

/// Inverse real DFT along `dim` (normalised by `1/n`; bins beyond `n/2+1` dropped, missing bins
/// zero; the imaginary parts of the DC and Nyquist bins are ignored).
pub fn host_irfft(re: &[f64], im: &[f64], dims: &[usize], dim: usize, n: Option<usize>) -> (Vec<f64>, Vec<usize>) {
    let (outer, bins, inner) = lanes(dims, dim);
    let n = n.unwrap_or(2 * (bins - 1));
    let mut out_dims = dims.to_vec();
    out_dims[dim] = n;
    let mut out = vec![0.0; outer * n * inner];
    for o in 0..outer {
        for i in 0..inner {
            let bin = |k: usize| -> (f64, f64) {
                if k < bins {
                    let p = o * bins * inner + k * inner + i;
                    (re[p], im[p])
                } else {
                    (0.0, 0.0)
                }
            };
            for t in 0..n {
                let mut s = bin(0).0;
                for k in 1..n.div_ceil(2) {
                    let (r, m) = bin(k);
                    let a = 2.0 * std::f64::consts::PI * (k * t) as f64 / n as f64;
                    s += 2.0 * (r * a.cos() - m * a.sin());
                }
                if n.is_multiple_of(2) && n >= 2 {
                    s += bin(n / 2).0 * if t % 2 == 0 { 1.0 } else { -1.0 };
                }
                out[o * n * inner + t * inner + i] = s / n as f64;
            }
        }
    }
    (out, out_dims)
}

/// Geometry of a deformable 2-D convolution (see [`host_deform_conv2d_backward`]).
#[derive(Clone, Copy, Debug)]
pub struct DeformGeom {
    /// Input dims `[N, C, H, W]`.
    pub x: [usize; 4],
    /// Output channels.
    pub out_channels: usize,
    /// Kernel `[KH, KW]`.
    pub kernel: [usize; 2],
    pub stride: [usize; 2],
    pub padding: [usize; 2],
    pub dilation: [usize; 2],
    pub weight_groups: usize,
    pub offset_groups: usize,
}

impl DeformGeom {
    /// Output spatial dims `[OH, OW]`.
    pub fn out(&self) -> [usize; 2] {
        let size = |a: usize| {
            (self.x[2 + a] + 2 * self.padding[a] - self.dilation[a] * (self.kernel[a] - 1) - 1) / self.stride[a] + 1
        };
        [size(0), size(1)]
    }
}

/// `deform_conv2d(x, offset, weight, mask)` (no bias) in f64, `[N, O, OH, OW]` row-major
/// (layouts as in [`host_deform_conv2d_backward`]); the forward whose finite differences
/// validate that reference.
pub fn host_deform_conv2d(
    geo: &DeformGeom,
    x: &[f64],
    offset: &[f64],
    weight: &[f64],
    mask: Option<&[f64]>,
) -> Vec<f64> {
    let [n_b, n_c, h, w] = geo.x;
    let [kh, kw] = geo.kernel;
    let [oh, ow] = geo.out();
    let n_o = geo.out_channels;
    let n_k = kh * kw;
    let (n_g, wg) = (geo.offset_groups, geo.weight_groups);
    let (cpg, cpw, opw) = (n_c / n_g, n_c / wg, n_o / wg);
    let px = |b: usize, c: usize, yy: f64, xx: f64| -> f64 {
        if yy >= 0.0 && xx >= 0.0 && yy < h as f64 && xx < w as f64 {
            x[((b * n_c + c) * h + yy as usize) * w + xx as usize]
        } else {
            0.0
        }
    };
    let mut out = vec![0.0; n_b * n_o * oh * ow];
    for b in 0..n_b {
        for oy in 0..oh {
            for ox in 0..ow {
                for c in 0..n_c {
                    let g = c / cpg;
                    let (wgi, cl) = (c / cpw, c % cpw);
                    for k in 0..n_k {
                        let (ky, kx) = (k / kw, k % kw);
                        let off_at = |ch: usize| ((b * 2 * n_g * n_k + ch) * oh + oy) * ow + ox;
                        let oc = (g * n_k + k) * 2;
                        let y = (oy * geo.stride[0] + ky * geo.dilation[0]) as f64 - geo.padding[0] as f64
                            + offset[off_at(oc)];
                        let xc = (ox * geo.stride[1] + kx * geo.dilation[1]) as f64 - geo.padding[1] as f64
                            + offset[off_at(oc + 1)];
                        let m = mask.map_or(1.0, |m| m[((b * n_g * n_k + g * n_k + k) * oh + oy) * ow + ox]);
                        let (y0, x0) = (y.floor(), xc.floor());
                        let (ly, lx) = (y - y0, xc - x0);
                        let sample = (1.0 - ly) * (1.0 - lx) * px(b, c, y0, x0)
                            + (1.0 - ly) * lx * px(b, c, y0, x0 + 1.0)
                            + ly * (1.0 - lx) * px(b, c, y0 + 1.0, x0)
                            + ly * lx * px(b, c, y0 + 1.0, x0 + 1.0);
                        for o in wgi * opw..(wgi + 1) * opw {
                            out[((b * n_o + o) * oh + oy) * ow + ox] += weight[(o * cpw + cl) * n_k + k] * m * sample;
                        }
                    }
                }
            }
        }
    }
    out
}

/// Exact (f64) gradients of `deform_conv2d(x, offset, weight, mask)` for the output gradient
/// `dy`: `[x_grad, offset_grad, weight_grad, mask_grad (only with a mask)]`, row-major, with
/// the layouts of burn's `deform_conv2d` (offset `[N, (G, KH, KW, {y, x}), OH, OW]`, mask
/// `[N, (G, KH, KW), OH, OW]`, G offset groups, zero padding outside the input).
///
/// This is the reference where burn-ndarray 0.21 is wrong: its offset and mask gradients use
/// the column gradients of channels `0..C/G` (offset group 0) for every offset group
/// (`compute_offset_and_mask_gradient` indexes `columns[channel]` without the group's channel
/// offset), so they are wrong for offset groups >= 1 whenever `offset_groups > 1`.
pub fn host_deform_conv2d_backward(
    geo: &DeformGeom,
    x: &[f64],
    offset: &[f64],
    weight: &[f64],
    mask: Option<&[f64]>,
    dy: &[f64],
) -> Vec<Vec<f64>> {
    let [n_b, n_c, h, w] = geo.x;
    let [kh, kw] = geo.kernel;
    let [oh, ow] = geo.out();
    let n_o = geo.out_channels;
    let n_k = kh * kw;
    let (n_g, wg) = (geo.offset_groups, geo.weight_groups);
    let (cpg, cpw, opw) = (n_c / n_g, n_c / wg, n_o / wg);
    // pixel (yy, xx) of channel c of image b; zero outside the image
    let px = |b: usize, c: usize, yy: f64, xx: f64| -> f64 {
        if yy >= 0.0 && xx >= 0.0 && yy < h as f64 && xx < w as f64 {
            x[((b * n_c + c) * h + yy as usize) * w + xx as usize]
        } else {
            0.0
        }
    };
    let mut gx = vec![0.0; x.len()];
    let mut goff = vec![0.0; offset.len()];
    let mut gw = vec![0.0; weight.len()];
    let mut gm = vec![0.0; n_b * n_g * n_k * oh * ow];
    for b in 0..n_b {
        for oy in 0..oh {
            for ox in 0..ow {
                let dy_at = |o: usize| dy[((b * n_o + o) * oh + oy) * ow + ox];
                for c in 0..n_c {
                    let g = c / cpg;
                    // weight group of the channel and its index inside the group
                    let (wgi, cl) = (c / cpw, c % cpw);
                    for ky in 0..kh {
                        for kx in 0..kw {
                            let k = ky * kw + kx;
                            let off_at = |ch: usize| ((b * 2 * n_g * n_k + ch) * oh + oy) * ow + ox;
                            let oc = (g * n_k + k) * 2;
                            let y = (oy * geo.stride[0] + ky * geo.dilation[0]) as f64 - geo.padding[0] as f64
                                + offset[off_at(oc)];
                            let xc = (ox * geo.stride[1] + kx * geo.dilation[1]) as f64 - geo.padding[1] as f64
                                + offset[off_at(oc + 1)];
                            let mi = ((b * n_g * n_k + g * n_k + k) * oh + oy) * ow + ox;
                            let m = mask.map_or(1.0, |m| m[mi]);
                            // gradient of the sampled column value: Σ over the group's outputs
                            let col: f64 = (wgi * opw..(wgi + 1) * opw)
                                .map(|o| weight[(o * cpw + cl) * n_k + k] * dy_at(o))
                                .sum();
                            let (y0, x0) = (y.floor(), xc.floor());
                            let (ly, lx) = (y - y0, xc - x0);
                            let v00 = px(b, c, y0, x0);
                            let v01 = px(b, c, y0, x0 + 1.0);
                            let v10 = px(b, c, y0 + 1.0, x0);
                            let v11 = px(b, c, y0 + 1.0, x0 + 1.0);
                            let taps = [
                                (0.0, 0.0, (1.0 - ly) * (1.0 - lx), v00),
                                (0.0, 1.0, (1.0 - ly) * lx, v01),
                                (1.0, 0.0, ly * (1.0 - lx), v10),
                                (1.0, 1.0, ly * lx, v11),
                            ];
                            let sample: f64 = taps.iter().map(|t| t.2 * t.3).sum();
                            // derivatives of the sample along y and x
                            let dsy = (1.0 - lx) * (v10 - v00) + lx * (v11 - v01);
                            let dsx = (1.0 - ly) * (v01 - v00) + ly * (v11 - v10);
                            goff[off_at(oc)] += m * dsy * col;
                            goff[off_at(oc + 1)] += m * dsx * col;
                            gm[mi] += sample * col;
                            for (ty, tx, tw, _) in taps {
                                let (yy, xx) = (y0 + ty, x0 + tx);
                                if yy >= 0.0 && xx >= 0.0 && yy < h as f64 && xx < w as f64 {
                                    gx[((b * n_c + c) * h + yy as usize) * w + xx as usize] += m * tw * col;
                                }
                            }
                            for o in wgi * opw..(wgi + 1) * opw {
                                gw[(o * cpw + cl) * n_k + k] += dy_at(o) * m * sample;
                            }
                        }
                    }
                }
            }
        }
    }
    let mut out = vec![gx, goff, gw];
    if mask.is_some() {
        out.push(gm);
    }
    out
}

/// `Jᵀ·grad` of a linear map `f` computed on the reference backend (in f64) from the images of
/// the basis vectors: the exact reference for the backward pass of a linear op.
pub fn adjoint_nd(in_dims: &[usize], grad: &[f64], f: impl Fn(FloatTensor<Nd>) -> FloatTensor<Nd>) -> Vec<f64> {
    let n = numel(in_dims);
    let dev = Default::default();
    (0..n)
        .map(|i| {
            let mut e = vec![0.0f64; n];
            e[i] = 1.0;
            let y = f(Nd::float_from_data(TensorData::new(e, in_dims.to_vec()), &dev));
            let y = values(&read_sync(Nd::float_into_data(y)).expect("ndarray read"));
            assert_eq!(
                y.len(),
                grad.len(),
                "adjoint_nd: output has {} values, grad {}",
                y.len(),
                grad.len()
            );
            y.iter().zip(grad).map(|(a, b)| a * b).sum()
        })
        .collect()
}

/// Mean and standard deviation.
pub fn moments(v: &[f64]) -> (f64, f64) {
    let n = v.len() as f64;
    let mean = v.iter().sum::<f64>() / n;
    let var = v.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / n;
    (mean, var.sqrt())
}
