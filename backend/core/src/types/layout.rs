//! Stride helpers: layout is carried by strides (NCHW, NHWC, transposed views ...).

/// Dims or strides of one tensor, stored inline up to rank 8 (no heap allocation for the
/// views and layouts made on every op).
pub type Shape = smallvec::SmallVec<[i64; 8]>;

/// Axes ordered from outermost (largest stride) to innermost. Ties keep the later axis
/// inner, so packed NCHW gives `[0, 1, 2, 3]` and packed NHWC gives `[0, 2, 3, 1]`.
pub fn stride_order(strides: &[i64]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..strides.len()).collect();
    order.sort_by(|&a, &b| strides[b].cmp(&strides[a]).then(a.cmp(&b)));
    order
}

/// Packed strides for `dims` laid out in `order` (outermost first).
pub fn packed_strides(dims: &[i64], order: &[usize]) -> Shape {
    packed_in(dims, order.iter().copied())
}

/// Packed strides for `dims` laid out in `order` (outermost first), from any axis sequence.
fn packed_in(dims: &[i64], order: impl DoubleEndedIterator<Item = usize>) -> Shape {
    let mut strides = Shape::from_elem(0, dims.len());
    let mut acc = 1i64;
    for axis in order.rev() {
        strides[axis] = acc;
        acc = acc.saturating_mul(dims[axis].max(1));
    }
    strides
}

/// Packed row-major strides of `dims` (NCHW for images).
pub fn row_major_strides(dims: &[i64]) -> Shape {
    packed_in(dims, 0..dims.len())
}

/// The dim order, outermost first, of a channels-last tensor of rank `rank` given as N, C,
/// spatial...: N, spatial..., C (row-major below rank 2).
pub fn channels_last_order(rank: usize) -> Vec<usize> {
    let mut order: Vec<usize> = vec![0];
    order.extend(2..rank);
    if rank > 1 {
        order.push(1);
    }
    order.truncate(rank);
    order
}

/// Packed channels-last strides of `dims` given as N, C, spatial...: stored as N,
/// spatial..., C (NHWC, NDHWC); rank 2 and below are row-major.
pub fn channels_last_strides(dims: &[i64]) -> Shape {
    packed_strides(dims, &channels_last_order(dims.len()))
}

/// True when two distinct indices of the view may share an address. Dims are sorted by
/// |stride|; each must step past everything the smaller ones span. Exact for packed,
/// sliced, permuted and flipped views; conservative (true) for exotic ones and on overflow.
pub fn may_overlap(dims: &[i64], strides: &[i64]) -> bool {
    let mut axes: Vec<(i64, i64)> = dims
        .iter()
        .zip(strides)
        .filter(|(&d, _)| d > 1)
        .map(|(&d, &s)| (d, s.saturating_abs()))
        .collect();
    axes.sort_by_key(|&(_, s)| s);
    let mut span = 0i64; // largest offset reachable with the smaller dims
    for (d, s) in axes {
        if s <= span {
            return true;
        }
        span = match (d - 1).checked_mul(s).and_then(|v| v.checked_add(span)) {
            Some(v) => v,
            None => return true,
        };
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packed_layouts() {
        assert_eq!(row_major_strides(&[2, 3, 4, 5]).to_vec(), [60, 20, 5, 1]);
        assert_eq!(channels_last_strides(&[2, 3, 4, 5]).to_vec(), [60, 1, 15, 3]);
        assert_eq!(channels_last_strides(&[4, 3]).to_vec(), [3, 1]);
        assert_eq!(stride_order(&channels_last_strides(&[2, 3, 4, 5])), [0, 2, 3, 1]);
        assert!(!may_overlap(&[2, 3], &[3, 1]));
        assert!(may_overlap(&[2, 3], &[1, 1]));
    }
}
