//! Strided views of device memory: the layout algebra (permute, slice, expand, reshape,
//! unfold …) a framework tensor needs so that views cost no copy. Pure metadata, no device
//! access: a view's offset, dims and strides cut the [`TensorRef`](crate::types::TensorRef)
//! the ops take out of its buffer's view ([`TensorRef::view`](crate::types::TensorRef::view)).

use crate::error::{Error, Result};
use crate::types::Shape;

/// Dims, strides (elements; 0 = broadcast) and the element offset of a view into a buffer.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ViewLayout {
    /// Logical dims.
    pub dims: Shape,
    /// Strides in elements (never negative; 0 for broadcast dims).
    pub strides: Shape,
    /// Offset of element (0, …, 0) from the buffer start, in elements.
    pub offset: i64,
}

fn err(op: &'static str, reason: String) -> Error {
    Error::invalid_arg(op, "view", reason)
}

impl ViewLayout {
    /// Row-major packed dims at offset 0.
    pub fn contiguous(dims: &[i64]) -> Self {
        Self {
            dims: Shape::from_slice(dims),
            strides: crate::types::row_major_strides(dims),
            offset: 0,
        }
    }

    /// `dims` with `strides` at offset 0 (tests build views with it).
    #[doc(hidden)]
    pub fn strided(dims: &[i64], strides: &[i64]) -> Self {
        Self {
            dims: Shape::from_slice(dims),
            strides: Shape::from_slice(strides),
            offset: 0,
        }
    }

    /// The dim order (outermost first, size-1 dims in place) in which the strides pack the
    /// dims, or `None` when they do not (a broadcast, a gap, an overlap).
    #[doc(hidden)]
    pub fn packed_order(&self) -> Option<Vec<usize>> {
        let (dims, strides) = (&self.dims, &self.strides);
        let mut moving: Vec<usize> = (0..dims.len()).filter(|&d| dims[d] != 1).collect();
        moving.sort_by_key(|&d| std::cmp::Reverse(strides[d].unsigned_abs()));
        // Packed in that order: each stride spans exactly the dims inside it.
        let mut next = 1i64;
        for &d in moving.iter().rev() {
            if strides[d] != next {
                return None;
            }
            next *= dims[d];
        }
        let mut sorted = moving.into_iter();
        Some(
            (0..dims.len())
                .map(|d| if dims[d] == 1 { d } else { sorted.next().unwrap_or(d) })
                .collect(),
        )
    }

    /// Number of elements.
    pub fn numel(&self) -> i64 {
        self.dims.iter().product()
    }

    /// True when the view is row-major packed (size-1 dims may have any stride).
    pub fn is_contiguous(&self) -> bool {
        let mut expect = 1i64;
        for (&d, &s) in self.dims.iter().zip(&self.strides).rev() {
            if d != 1 && s != expect {
                return false;
            }
            expect *= d;
        }
        true
    }

    fn axis(&self, op: &'static str, axis: usize) -> Result<()> {
        if axis >= self.dims.len() {
            return Err(err(
                op,
                format!("axis {axis} out of range for rank {}", self.dims.len()),
            ));
        }
        Ok(())
    }

    /// Reorders the dims: dim `i` of the result is dim `axes[i]` of `self`.
    pub fn permute(&self, axes: &[usize]) -> Result<Self> {
        let mut seen = vec![false; self.dims.len()];
        if axes.len() != self.dims.len()
            || axes
                .iter()
                .any(|&a| a >= seen.len() || std::mem::replace(&mut seen[a], true))
        {
            return Err(err(
                "permute",
                format!("{axes:?} is not a permutation of 0..{}", self.dims.len()),
            ));
        }
        Ok(Self {
            dims: axes.iter().map(|&a| self.dims[a]).collect(),
            strides: axes.iter().map(|&a| self.strides[a]).collect(),
            offset: self.offset,
        })
    }

    /// Swaps two dims.
    pub fn transpose(&self, a: usize, b: usize) -> Result<Self> {
        self.axis("transpose", a)?;
        self.axis("transpose", b)?;
        let mut v = self.clone();
        v.dims.swap(a, b);
        v.strides.swap(a, b);
        Ok(v)
    }

    /// Elements `start, start + step, …` below `end` of `axis` (`step` ≥ 1).
    pub fn slice(&self, axis: usize, start: i64, end: i64, step: i64) -> Result<Self> {
        self.axis("slice", axis)?;
        let n = self.dims[axis];
        if step < 1 || start < 0 || end < start || end > n {
            return Err(err(
                "slice",
                format!("range {start}..{end} step {step} invalid for dim {axis} of size {n}"),
            ));
        }
        let mut v = self.clone();
        v.offset += start * self.strides[axis];
        v.dims[axis] = (end - start + step - 1) / step;
        v.strides[axis] *= step;
        Ok(v)
    }

    /// Broadcasts to `dims` (numpy rules; new leading dims allowed): size-1 dims get stride 0.
    pub fn expand(&self, dims: &[i64]) -> Result<Self> {
        if dims.len() < self.dims.len() {
            return Err(err(
                "expand",
                format!("cannot expand {:?} to fewer dims {dims:?}", self.dims),
            ));
        }
        let lead = dims.len() - self.dims.len();
        let mut strides = Shape::from_elem(0, dims.len());
        for (i, (&d, &s)) in self.dims.iter().zip(&self.strides).enumerate() {
            strides[lead + i] = match d {
                _ if d == dims[lead + i] => s,
                1 => 0,
                _ => return Err(err("expand", format!("{:?} does not broadcast to {dims:?}", self.dims))),
            };
        }
        Ok(Self {
            dims: Shape::from_slice(dims),
            strides,
            offset: self.offset,
        })
    }

    /// Inserts a size-1 dim at `axis`.
    pub fn unsqueeze(&self, axis: usize) -> Result<Self> {
        if axis > self.dims.len() {
            return Err(err(
                "unsqueeze",
                format!("axis {axis} out of range for rank {}", self.dims.len()),
            ));
        }
        let mut v = self.clone();
        let s = if axis < self.dims.len() {
            self.strides[axis] * self.dims[axis]
        } else {
            1
        };
        v.dims.insert(axis, 1);
        v.strides.insert(axis, s.max(1));
        Ok(v)
    }

    /// Removes the size-1 dim `axis`.
    pub fn squeeze(&self, axis: usize) -> Result<Self> {
        self.axis("squeeze", axis)?;
        if self.dims[axis] != 1 {
            return Err(err(
                "squeeze",
                format!("dim {axis} has size {}, not 1", self.dims[axis]),
            ));
        }
        let mut v = self.clone();
        v.dims.remove(axis);
        v.strides.remove(axis);
        Ok(v)
    }

    /// Sliding windows of `size` with `step` along `axis`: that dim becomes the window count
    /// and a trailing dim of `size` is appended (no copy).
    pub fn unfold(&self, axis: usize, size: i64, step: i64) -> Result<Self> {
        self.axis("unfold", axis)?;
        let n = self.dims[axis];
        if size < 1 || step < 1 || size > n {
            return Err(err(
                "unfold",
                format!("window {size} step {step} invalid for dim {axis} of size {n}"),
            ));
        }
        let mut v = self.clone();
        v.dims[axis] = (n - size) / step + 1;
        v.strides[axis] = self.strides[axis] * step;
        v.dims.push(size);
        v.strides.push(self.strides[axis]);
        Ok(v)
    }

    /// The same elements in row-major order under `dims`, as a view when the strides allow
    /// it (as PyTorch's `view`), or `None` when a copy is needed.
    pub fn reshape(&self, dims: &[i64]) -> Option<Self> {
        if dims.iter().any(|&d| d < 0) || dims.iter().product::<i64>() != self.numel() {
            return None;
        }
        if self.numel() == 0 || self.dims.is_empty() {
            return Some(Self {
                offset: self.offset,
                ..Self::contiguous(dims)
            });
        }
        let mut strides = Shape::from_elem(0, dims.len());
        let mut view_d = dims.len() as isize - 1;
        let mut chunk_stride = *self.strides.last()?;
        let (mut tensor_numel, mut view_numel) = (1i64, 1i64);
        for d in (0..self.dims.len()).rev() {
            tensor_numel *= self.dims[d];
            let chunk_ends = d == 0 || (self.dims[d - 1] != 1 && self.strides[d - 1] != tensor_numel * chunk_stride);
            if chunk_ends {
                while view_d >= 0 && (view_numel < tensor_numel || dims[view_d as usize] == 1) {
                    strides[view_d as usize] = view_numel * chunk_stride;
                    view_numel *= dims[view_d as usize];
                    view_d -= 1;
                }
                if view_numel != tensor_numel {
                    return None;
                }
                if d > 0 {
                    chunk_stride = self.strides[d - 1];
                    tensor_numel = 1;
                    view_numel = 1;
                }
            }
        }
        if view_d != -1 {
            return None;
        }
        Some(Self {
            dims: Shape::from_slice(dims),
            strides,
            offset: self.offset,
        })
    }

    /// Element offset (from the buffer start) of the row-major linear index `i`.
    pub fn offset_of(&self, mut i: i64) -> i64 {
        let mut off = self.offset;
        for (&d, &s) in self.dims.iter().zip(&self.strides).rev() {
            off += (i % d.max(1)) * s;
            i /= d.max(1);
        }
        off
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn offsets(v: &ViewLayout) -> Vec<i64> {
        (0..v.numel()).map(|i| v.offset_of(i)).collect()
    }

    #[test]
    fn transpose_slice_expand_unfold_address_the_right_elements() {
        let a = ViewLayout::contiguous(&[2, 3]);
        assert_eq!(offsets(&a.transpose(0, 1).unwrap()), vec![0, 3, 1, 4, 2, 5]);
        assert_eq!(offsets(&a.slice(1, 1, 3, 1).unwrap()), vec![1, 2, 4, 5]);
        assert_eq!(
            offsets(&ViewLayout::contiguous(&[7]).slice(0, 1, 7, 3).unwrap()),
            vec![1, 4]
        );
        assert_eq!(
            offsets(&ViewLayout::contiguous(&[3]).expand(&[2, 3]).unwrap()),
            vec![0, 1, 2, 0, 1, 2]
        );
        assert_eq!(
            offsets(&ViewLayout::contiguous(&[5]).unfold(0, 3, 2).unwrap()),
            vec![0, 1, 2, 2, 3, 4]
        );
        assert!(a.permute(&[0, 0]).is_err());
        assert!(a.expand(&[3, 3]).is_err());
        assert!(a.slice(0, 0, 3, 1).is_err());
    }

    #[test]
    fn unsqueeze_squeeze_round_trip() {
        let a = ViewLayout::contiguous(&[2, 3]).transpose(0, 1).unwrap();
        let u = a.unsqueeze(1).unwrap();
        assert_eq!(u.dims.to_vec(), vec![3, 1, 2]);
        assert_eq!(offsets(&u), offsets(&a));
        assert_eq!(u.squeeze(1).unwrap(), a);
        assert!(a.squeeze(0).is_err());
    }

    /// Whenever reshape returns a view, it addresses exactly the elements, in row-major order,
    /// that a copy would; contiguous inputs always reshape as views.
    #[test]
    fn reshape_views_match_a_copy() {
        let mut seed = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = |n: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % n
        };
        let targets = |n: i64| -> Vec<Vec<i64>> {
            let mut t = vec![vec![n], vec![1, n], vec![n, 1]];
            for a in 1..=n {
                if n % a == 0 {
                    t.push(vec![a, n / a]);
                    for b in 1..=(n / a) {
                        if (n / a) % b == 0 {
                            t.push(vec![a, b, n / a / b]);
                        }
                    }
                }
            }
            t
        };
        let (mut views, mut copies) = (0, 0);
        for _ in 0..400 {
            let rank = 1 + next(4) as usize;
            let dims: Vec<i64> = (0..rank).map(|_| 1 + next(4) as i64).collect();
            let mut v = ViewLayout::contiguous(&dims);
            assert!(
                targets(v.numel()).iter().all(|t| v.reshape(t).is_some()),
                "contiguous {dims:?} must view"
            );
            // Random view: permute, then maybe slice.
            let mut axes: Vec<usize> = (0..rank).collect();
            for i in (1..rank).rev() {
                axes.swap(i, next(i as u64 + 1) as usize);
            }
            v = v.permute(&axes).unwrap();
            let ax = next(rank as u64) as usize;
            if v.dims[ax] > 1 && next(2) == 0 {
                v = v.slice(ax, 1, v.dims[ax], 1).unwrap();
            }
            let want = offsets(&v);
            for t in targets(v.numel()) {
                match v.reshape(&t) {
                    Some(r) => {
                        views += 1;
                        assert_eq!(r.dims.to_vec(), t.to_vec());
                        assert_eq!(offsets(&r), want, "reshape {v:?} -> {t:?}");
                    }
                    None => copies += 1,
                }
            }
        }
        assert!(
            views > 100 && copies > 10,
            "both outcomes exercised: {views} views, {copies} copies"
        );
    }

    #[test]
    fn the_buffer_view_applies_the_offset_in_bytes() {
        let v = ViewLayout::contiguous(&[4, 4]).slice(0, 1, 4, 1).unwrap();
        let buffer = crate::types::TensorRef::fake_packed(&[16], crate::graph::DataType::F16, 0x1000);
        let t = buffer.view(v.offset, &v.dims, &v.strides).unwrap();
        assert_eq!(t.ptr, 0x1000 + 4 * 2);
        assert_eq!(t.dims.to_vec(), vec![3, 4]);
        assert!(v.is_contiguous());
        assert!(!v.transpose(0, 1).unwrap().is_contiguous());
    }
}
