//! Groups of kernels that usually run together (per dtype: the elementwise, reduction,
//! indexing, random and pooling kernels of a training step). When the loader has to compile a
//! kernel of a group, it compiles the group's other kernels at the same time on the other CPU
//! cores (see [`super::load`]), so a fresh process pays about one compile's wall time per group
//! rather than one per kernel. Only a hint: a name that no caller asks for costs CPU time,
//! never correctness; a kernel in no group is simply compiled alone.

use super::{
    KernelSource, BATCH_NORM, BIAS_ACT, CONV, CROSS_ENTROPY, ELEMENTWISE, INDEX, NORM, OPTIM, POOL, RANDOM, REDUCE,
};

type Group = &'static [(KernelSource, &'static str)];

// In the order a training program first needs them (parameter initialization, then the
// forward and backward passes): siblings and the warm-up compile in this order, a few at once.
macro_rules! float_group {
    ($s:literal, $b:literal $(, $extra:expr)*) => {
        &[
            (RANDOM, concat!("uniform_", $s)),
            (RANDOM, concat!("normal_", $s)),
            (ELEMENTWISE, concat!("fill_b", $b)),
            (ELEMENTWISE, "cast"),
            (ELEMENTWISE, concat!("binary_vec_", $s)),
            (ELEMENTWISE, concat!("unary_vec_", $s)),
            (ELEMENTWISE, concat!("binary_scalar_vec_", $s)),
            (ELEMENTWISE, concat!("binary_", $s)),
            (ELEMENTWISE, concat!("unary_", $s)),
            (ELEMENTWISE, concat!("copy_b", $b)),
            (ELEMENTWISE, concat!("compare_", $s)),
            (ELEMENTWISE, concat!("where_b", $b)),
            (ELEMENTWISE, concat!("binary_scalar_", $s)),
            (ELEMENTWISE, concat!("compare_scalar_", $s)),
            (REDUCE, concat!("reduce_", $s)),
            (REDUCE, concat!("reduce_split_", $s)),
            (REDUCE, concat!("reduce_cols_", $s)),
            (REDUCE, concat!("reduce_finish_", $s)),
            (REDUCE, concat!("argreduce_", $s)),
            (INDEX, concat!("gather_b", $b)),
            (INDEX, concat!("scatter_add_", $s)),
            (POOL, concat!("adaptive_avgpool2d_fwd_", $s)),
            (POOL, concat!("adaptive_avgpool2d_bwd_", $s)),
            (POOL, concat!("maxpool2d_fwd_", $s)),
            (POOL, concat!("maxpool2d_bwd_", $s)),
            $($extra,)*
        ]
    };
}

/// A float group with the training kernels (batch norm, layer/RMS norm, Adam) of its dtype,
/// and any extra kernels given.
macro_rules! training_group {
    ($s:literal, $b:literal $(, $extra:expr)*) => {
        float_group!(
            $s,
            $b,
            $($extra,)*
            (BATCH_NORM, concat!("bn_stats_", $s)),
            (BATCH_NORM, concat!("bn_apply_", $s)),
            (BATCH_NORM, concat!("bn_grad_stats_", $s)),
            (BATCH_NORM, concat!("bn_grad_apply_", $s)),
            (BATCH_NORM, concat!("bn_stats_planes_", $s)),
            (BATCH_NORM, concat!("bn_apply_planes_", $s)),
            (BATCH_NORM, concat!("bn_grad_stats_planes_", $s)),
            (BATCH_NORM, concat!("bn_grad_apply_planes_", $s)),
            (OPTIM, concat!("adam_", $s)),
            (NORM, concat!("norm_fwd_", $s)),
            (NORM, concat!("norm_bwd_dx_", $s)),
            (NORM, concat!("norm_bwd_params_", $s)),
            (BATCH_NORM, "bn_finalize"),
            (BATCH_NORM, "bn_grad_finalize"),
            (BATCH_NORM, "bn_inference_coef"),
            (NORM, "norm_bwd_params_finalize")
        )
    };
}

/// The three direct convolution passes of one dtype.
macro_rules! conv_group {
    ($s:literal) => {
        &[
            (CONV, concat!("conv_fwd_", $s)),
            (CONV, concat!("conv_bwd_data_", $s)),
            (CONV, concat!("conv_bwd_filter_", $s)),
        ]
    };
}

/// A cross-entropy forward, its backward and the mean's reductions (`$v`: `""` for a block per
/// row, `"warp_"` for a warp per row).
macro_rules! cross_entropy_group {
    ($v:literal, $s:literal) => {
        &[
            (CROSS_ENTROPY, concat!("xent_fwd_", $v, $s)),
            (CROSS_ENTROPY, concat!("xent_bwd_", $v, $s)),
            (CROSS_ENTROPY, "xent_mean"),
            (CROSS_ENTROPY, "xent_scale"),
        ]
    };
}

/// See the two-byte entry of [`GROUPS`].
pub(super) const TWO_BYTE_MOVES: Group = &[
    (ELEMENTWISE, "fill_b2"),
    (ELEMENTWISE, "copy_b2"),
    (ELEMENTWISE, "where_b2"),
    (INDEX, "gather_b2"),
];

/// The groups, most common first (a kernel listed in several belongs to the first).
pub(crate) const GROUPS: &[Group] = &[
    training_group!("f32", "4"),
    &[
        (BIAS_ACT, "bias_act_f32"),
        (BIAS_ACT, "bias_act_f16"),
        (BIAS_ACT, "bias_act_bf16"),
    ],
    // Integer labels, indices, counts (i64) and masks (bool, stored as u8).
    &[
        (REDUCE, "scan_i64"),
        (ELEMENTWISE, "binary_i64"),
        (ELEMENTWISE, "unary_i64"),
        (ELEMENTWISE, "fill_b8"),
        (ELEMENTWISE, "copy_b8"),
        (ELEMENTWISE, "compare_i64"),
        (ELEMENTWISE, "where_b8"),
        (REDUCE, "reduce_i64"),
        (REDUCE, "argreduce_i64"),
        (INDEX, "gather_b8"),
        (INDEX, "scatter_add_i64"),
    ],
    &[
        (ELEMENTWISE, "binary_u8"),
        (ELEMENTWISE, "unary_u8"),
        (ELEMENTWISE, "fill_b1"),
        (ELEMENTWISE, "copy_b1"),
        (ELEMENTWISE, "compare_u8"),
        (ELEMENTWISE, "where_b1"),
        (REDUCE, "reduce_u8"),
        (REDUCE, "argreduce_u8"),
        (INDEX, "gather_b1"),
    ],
    // The two-byte moves f16 and bf16 share: a group of their own, so that a bf16 program's
    // first fill does not compile the f16 kernels (nor an f16 program's the bf16 ones).
    TWO_BYTE_MOVES,
    // Half-precision training accumulates some gradients (embedding tables) in f32.
    training_group!("f16", "2", (INDEX, "scatter_add_f32")),
    training_group!("bf16", "2", (INDEX, "scatter_add_f32")),
    float_group!("f64", "8"),
    // The direct convolutions (the fallback when cuDNN has no engine): a network that needs
    // one pass usually needs the other two in its backward step.
    conv_group!("f32"),
    conv_group!("f16"),
    conv_group!("bf16"),
    conv_group!("f64"),
    // A training loss: the first forward compiles its backward alongside.
    cross_entropy_group!("", "f32"),
    cross_entropy_group!("", "f16"),
    cross_entropy_group!("", "bf16"),
    cross_entropy_group!("warp_", "f32"),
    cross_entropy_group!("warp_", "f16"),
    cross_entropy_group!("warp_", "bf16"),
];

/// The other kernels of the first group that lists `name` of `source` (none when no group does).
pub(crate) fn siblings(source: KernelSource, name: &str) -> impl Iterator<Item = (KernelSource, &'static str)> + '_ {
    GROUPS
        .iter()
        .find(|g| g.iter().any(|(s, n)| s.name == source.name && *n == name))
        .into_iter()
        .flat_map(|g| g.iter().copied())
        .filter(move |(s, n)| !(s.name == source.name && *n == name))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn siblings_come_from_the_first_group_listing_the_kernel() {
        let s: Vec<_> = siblings(ELEMENTWISE, "binary_f32").map(|(_, n)| n).collect();
        assert!(s.contains(&"bn_apply_planes_f32") && s.contains(&"bn_grad_stats_planes_f32"));
        assert_eq!(s.len(), 40);
        assert!(s.contains(&"reduce_f32") && s.contains(&"cast") && !s.contains(&"binary_f32"));
        assert!(["reduce_split_f32", "reduce_cols_f32", "reduce_finish_f32"]
            .iter()
            .all(|k| s.contains(k)));
        // `cast` is in every float group: the f32 one wins.
        assert!(siblings(ELEMENTWISE, "cast").any(|(_, n)| n == "binary_f32"));
        // `fill_b8` is in the i64 group before the f64 one.
        assert!(siblings(ELEMENTWISE, "fill_b8").any(|(_, n)| n == "binary_i64"));
        assert_eq!(siblings(SORT_LIKE, "binary_f32").count(), 0, "matched by source too");
        // The two-byte moves pull in neither half-precision family.
        let s: Vec<_> = siblings(ELEMENTWISE, "fill_b2").map(|(_, n)| n).collect();
        assert_eq!(s, ["copy_b2", "where_b2", "gather_b2"]);
        assert!(siblings(RANDOM, "normal_bf16").all(|(_, n)| !n.ends_with("f16") || n.ends_with("bf16")));
        assert_eq!(siblings(ELEMENTWISE, "no_such_kernel").count(), 0);
        // A cross-entropy forward brings its own backward and the shared reductions.
        let s: Vec<_> = siblings(CROSS_ENTROPY, "xent_fwd_warp_bf16").map(|(_, n)| n).collect();
        assert_eq!(s, ["xent_bwd_warp_bf16", "xent_mean", "xent_scale"]);
    }

    const SORT_LIKE: KernelSource = super::super::SORT;

    #[test]
    fn no_group_lists_a_kernel_twice() {
        for g in GROUPS {
            let mut seen = std::collections::HashSet::new();
            for (s, n) in g.iter() {
                assert!(seen.insert((s.name, *n)), "{n} twice in a group");
            }
        }
    }
}
