//! Host-side preparation of strided operands for our kernels: broadcasting to a common
//! shape, merging dims whose strides chain in every operand, and packing into the
//! fixed-size [`KernelLayout`] the kernels take by value.

use crate::error::{Error, Result};
use crate::ffi::launch::{KernelLayout, MAX_KERNEL_RANK};

/// Strides of `dims`/`strides` broadcast to `shape` (size-1 or missing leading dims get
/// stride 0), or an error naming `op` when they do not broadcast.
pub(crate) fn broadcast_strides(op: &'static str, dims: &[i64], strides: &[i64], shape: &[i64]) -> Result<Vec<i64>> {
    if dims.len() > shape.len() {
        return Err(Error::invalid_arg(
            op,
            "shape",
            format!("{dims:?} has more dims than {shape:?}"),
        ));
    }
    let lead = shape.len() - dims.len();
    let mut out = vec![0i64; shape.len()];
    for (i, (&d, &s)) in dims.iter().zip(strides).enumerate() {
        let target = shape[lead + i];
        out[lead + i] = match d {
            _ if d == target => s,
            1 => 0,
            _ => {
                return Err(Error::invalid_arg(
                    op,
                    "shape",
                    format!("{dims:?} does not broadcast to {shape:?}"),
                ))
            }
        };
    }
    Ok(out)
}

/// `shape` and every operand's `strides` with their dims reordered so that operand `lead`'s
/// strides descend (by magnitude; ties keep their order): a launch then walks `lead` in
/// memory order, so a channels-last output is written with consecutive addresses instead of
/// one element per channel stride. The identity for a row-major `lead`, and always the
/// same elements: every operand's dims move together.
pub(crate) fn in_memory_order(shape: &[i64], strides: &[Vec<i64>], lead: usize) -> (Vec<i64>, Vec<Vec<i64>>) {
    let key = &strides[lead];
    // Size-1 dims carry no order (their strides are arbitrary): they keep their places, and
    // the other dims are sorted among the remaining ones (`coalesce` drops size-1 dims).
    let mut moving: Vec<usize> = (0..shape.len()).filter(|&d| shape[d] != 1).collect();
    moving.sort_by_key(|&d| std::cmp::Reverse(key[d].unsigned_abs()));
    let mut sorted = moving.into_iter();
    let order: Vec<usize> = (0..shape.len())
        .map(|d| if shape[d] == 1 { d } else { sorted.next().unwrap_or(d) })
        .collect();
    if order.iter().enumerate().all(|(i, &d)| i == d) {
        return (shape.to_vec(), strides.to_vec());
    }
    (
        order.iter().map(|&d| shape[d]).collect(),
        strides.iter().map(|s| order.iter().map(|&d| s[d]).collect()).collect(),
    )
}

/// Merges adjacent dims of `shape` whose strides chain in every operand and drops size-1
/// dims: the same elements in the same order, in as few dims as possible.
pub(crate) fn coalesce(shape: &[i64], strides: &[Vec<i64>]) -> (Vec<i64>, Vec<Vec<i64>>) {
    let mut out_shape: Vec<i64> = Vec::with_capacity(shape.len());
    let mut out_strides: Vec<Vec<i64>> = vec![Vec::with_capacity(shape.len()); strides.len()];
    for (d, &n) in shape.iter().enumerate() {
        if n == 1 {
            continue;
        }
        let mergeable = !out_shape.is_empty()
            && strides
                .iter()
                .zip(&out_strides)
                .all(|(s, o)| o.last().is_some_and(|&prev| prev == s[d] * n));
        if mergeable {
            if let Some(last) = out_shape.last_mut() {
                *last *= n;
            }
            for (s, o) in strides.iter().zip(out_strides.iter_mut()) {
                if let Some(last) = o.last_mut() {
                    *last = s[d];
                }
            }
        } else {
            out_shape.push(n);
            for (s, o) in strides.iter().zip(out_strides.iter_mut()) {
                o.push(s[d]);
            }
        }
    }
    (out_shape, out_strides)
}

/// Packs one operand into a [`KernelLayout`] (offset 0: the pointer carries the offset).
pub(crate) fn kernel_layout(op: &'static str, shape: &[i64], strides: &[i64]) -> Result<KernelLayout> {
    if shape.len() > MAX_KERNEL_RANK {
        return Err(Error::invalid_arg(
            op,
            "shape",
            format!(
                "{} dims remain after merging ({shape:?}); kernels take at most {MAX_KERNEL_RANK}",
                shape.len()
            ),
        ));
    }
    let small = shape
        .iter()
        .try_fold(1i64, |acc, &d| acc.checked_mul(d))
        .is_some_and(|n| n < 1 << 31);
    let mut l = KernelLayout {
        rank: shape.len() as i32,
        index32: small as i32,
        ..Default::default()
    };
    l.shape[..shape.len()].copy_from_slice(shape);
    l.strides[..strides.len()].copy_from_slice(strides);
    Ok(l)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn coalesce_merges_packed_dims_and_drops_ones() {
        let (s, st) = coalesce(&[2, 1, 3, 4], &[vec![12, 12, 4, 1], vec![0, 0, 4, 1]]);
        assert_eq!(s, vec![2, 12]);
        assert_eq!(st, vec![vec![12, 1], vec![0, 1]]);
    }

    #[test]
    fn memory_order_follows_the_lead_operand() {
        // A channels-last [N, C, H, W] = [2, 3, 4, 5] output, a row-major input: walked as
        // (N, H, W, C), the output packed, then merged to [2, 60].
        let out = vec![60, 1, 15, 3];
        let inp = vec![60, 20, 5, 1];
        let (s, st) = in_memory_order(&[2, 3, 4, 5], &[inp.clone(), out.clone()], 1);
        assert_eq!(s, vec![2, 4, 5, 3]);
        assert_eq!(st, vec![vec![60, 5, 1, 20], vec![60, 15, 3, 1]]);
        let (s, st) = coalesce(&s, &[st[1].clone()]);
        assert_eq!((s, st), (vec![120], vec![vec![1]]));
        // Row-major lead: unchanged; size-1 dims keep their place.
        let rm = vec![20, 20, 5, 1];
        let (s, st) = in_memory_order(&[2, 1, 4, 5], std::slice::from_ref(&rm), 0);
        assert_eq!((s, st), (vec![2, 1, 4, 5], vec![rm]));
    }

    #[test]
    fn coalesce_keeps_transposed_dims_apart() {
        let (s, st) = coalesce(&[3, 4], &[vec![1, 3]]);
        assert_eq!((s, st), (vec![3, 4], vec![vec![1, 3]]));
    }

    #[test]
    fn broadcast_rules() {
        assert_eq!(
            broadcast_strides("t", &[3, 1], &[1, 1], &[2, 3, 4]).unwrap(),
            vec![0, 1, 0]
        );
        assert!(broadcast_strides("t", &[3], &[1], &[4]).is_err());
    }

    #[test]
    fn too_many_dims_is_an_error() {
        assert!(kernel_layout("t", &[2; 9], &[1; 9]).is_err());
        let l = kernel_layout("t", &[5, 6], &[6, 1]).unwrap();
        assert_eq!(
            (l.rank, &l.shape[..2], &l.strides[..2]),
            (2, &[5i64, 6][..], &[6i64, 1][..])
        );
    }
}
