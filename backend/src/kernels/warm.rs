//! Groups of kernels that usually run together (per dtype: the elementwise, reduction,
//! indexing, random and pooling kernels of a training step). When the loader has to compile a
//! kernel of a group, it compiles the group's other kernels at the same time on the other CPU
//! cores (see [`super::load`]), so a fresh process pays about one compile's wall time per group
//! rather than one per kernel. Only a hint: a name that no caller asks for costs CPU time,
//! never correctness; a kernel in no group is simply compiled alone.

use super::{KernelSource, BIAS_ACT, ELEMENTWISE, INDEX, POOL, RANDOM, REDUCE};

type Group = &'static [(KernelSource, &'static str)];

macro_rules! float_group {
    ($s:literal, $b:literal) => {
        &[
            (ELEMENTWISE, concat!("binary_", $s)),
            (ELEMENTWISE, concat!("unary_", $s)),
            (ELEMENTWISE, concat!("fill_b", $b)),
            (ELEMENTWISE, concat!("copy_b", $b)),
            (ELEMENTWISE, concat!("compare_", $s)),
            (ELEMENTWISE, concat!("where_b", $b)),
            (REDUCE, concat!("reduce_", $s)),
            (REDUCE, concat!("argreduce_", $s)),
            (INDEX, concat!("gather_b", $b)),
            (INDEX, concat!("scatter_add_", $s)),
            (RANDOM, concat!("uniform_", $s)),
            (RANDOM, concat!("normal_", $s)),
            (POOL, concat!("adaptive_avgpool2d_fwd_", $s)),
            (POOL, concat!("adaptive_avgpool2d_bwd_", $s)),
            (ELEMENTWISE, "cast"),
        ]
    };
}

/// The groups, most common first (a kernel listed in several belongs to the first).
pub(crate) const GROUPS: &[Group] = &[
    float_group!("f32", "4"),
    &[
        (BIAS_ACT, "bias_act_f32"),
        (BIAS_ACT, "bias_act_f16"),
        (BIAS_ACT, "bias_act_bf16"),
    ],
    // Integer labels, indices, counts (i64) and masks (bool, stored as u8).
    &[
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
    float_group!("f16", "2"),
    float_group!("bf16", "2"),
    float_group!("f64", "8"),
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
        assert_eq!(s.len(), 14);
        assert!(s.contains(&"reduce_f32") && s.contains(&"cast") && !s.contains(&"binary_f32"));
        // `cast` is in every float group: the f32 one wins.
        assert!(siblings(ELEMENTWISE, "cast").any(|(_, n)| n == "binary_f32"));
        // `fill_b8` is in the i64 group before the f64 one.
        assert!(siblings(ELEMENTWISE, "fill_b8").any(|(_, n)| n == "binary_i64"));
        assert_eq!(siblings(SORT_LIKE, "binary_f32").count(), 0, "matched by source too");
        assert_eq!(siblings(ELEMENTWISE, "no_such_kernel").count(), 0);
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
