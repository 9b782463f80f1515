//! Strided views of device memory: what the ops and kernels read ([`TensorRef`]) and write
//! ([`TensorMut`]).
//!
//! A view is only as safe as the memory behind it, so views are made three ways:
//! - from cudarc device memory (`CudaSlice`, `CudaView`, `CudaViewMut`), borrowed for the
//!   view's lifetime and checked to hold every element the dims and strides reach; the
//!   borrow follows cudarc's stream synchronization (a read or write is recorded on the
//!   stream the view was made for when the last copy of the view drops, so freeing or
//!   writing the memory from another stream waits for the work enqueued here);
//! - as a part of another view ([`TensorRef::view`]), checked to stay inside it;
//! - from a raw device address ([`TensorRef::from_raw`], [`TensorMut::from_raw`]), which is
//!   `unsafe`: the caller vouches for the memory.
//!
//! Writing needs a [`TensorMut`], which only mutably borrowed memory or `unsafe` code gives.
//! A `TensorMut` is also a `TensorRef` (it dereferences to one), so a buffer updated in
//! place is passed as both input and output.

use std::fmt;
use std::marker::PhantomData;
use std::ops::Deref;
use std::sync::Arc;

use cudarc::driver::{CudaStream, DevicePtr, DevicePtrMut, SyncOnDrop};

use super::dtype::{DataType, DeviceElement};
use super::layout::{row_major_strides, Shape};
use crate::error::{Error, Result};

/// A strided tensor in device memory that ops read: dims and strides in elements (layout is
/// just strides: NCHW and NHWC alike), a dtype and the address of element `(0, …, 0)`.
#[derive(Clone)]
pub struct TensorRef<'a> {
    pub(crate) dims: Shape,
    pub(crate) strides: Shape,
    pub(crate) dtype: DataType,
    pub(crate) ptr: u64,
    lender: Lender<'a>,
}

/// How the memory of a view is lent.
#[derive(Clone, Default)]
struct Lender<'a> {
    /// The stream (raw `CUstream`) a cudarc slice was lent to: the view is used on it only.
    stream: Option<usize>,
    /// cudarc's record-on-drop guard of that loan, shared by the copies of the view (held
    /// for its drop).
    _guard: Option<Arc<SyncOnDrop<'a>>>,
    borrow: PhantomData<&'a ()>,
}

/// The device address a kernel launcher passes for a pointer argument: the first element of a
/// checked view ([`TensorRef::address`]) or an allocation the engine made (workspace, scratch).
/// Launchers take these rather than bare integers, so an address reaches a kernel only from
/// a view or an allocation; [`DeviceAddress::NULL`] stands for an absent optional operand.
#[repr(transparent)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub(crate) struct DeviceAddress(u64);

impl DeviceAddress {
    /// No operand (the kernels test optional pointers against 0).
    pub(crate) const NULL: Self = Self(0);

    /// The address of memory the engine allocated (a workspace, a scratch buffer).
    pub(crate) fn of_allocation(ptr: u64) -> Self {
        Self(ptr)
    }

    /// The address of an optional view's first element, or [`DeviceAddress::NULL`].
    pub(crate) fn of(t: Option<&TensorRef>) -> Self {
        t.map_or(Self::NULL, TensorRef::address)
    }

    /// The address `bytes` further into the same allocation.
    pub(crate) fn offset_bytes(self, bytes: u64) -> Self {
        Self(self.0 + bytes)
    }

    /// The raw value (for the driver's own calls, e.g. a memset).
    pub(crate) fn get(self) -> u64 {
        self.0
    }
}

/// A strided tensor in device memory that ops write (and may read: in-place updates pass
/// the same `TensorMut` as input and output). Dereferences to its [`TensorRef`].
pub struct TensorMut<'a>(TensorRef<'a>);

impl fmt::Debug for TensorRef<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TensorRef")
            .field("dims", &self.dims)
            .field("strides", &self.strides)
            .field("dtype", &self.dtype)
            .field("ptr", &format_args!("{:#x}", self.ptr))
            .finish()
    }
}

impl fmt::Debug for TensorMut<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("TensorMut").field(&self.0).finish()
    }
}

/// Views are equal when they describe the same elements at the same address.
impl PartialEq for TensorRef<'_> {
    fn eq(&self, other: &Self) -> bool {
        self.dims == other.dims && self.strides == other.strides && self.dtype == other.dtype && self.ptr == other.ptr
    }
}

impl Eq for TensorRef<'_> {}

impl<'a> TensorRef<'a> {
    /// A view of the device memory at `ptr`.
    ///
    /// # Safety
    ///
    /// For as long as any work an op enqueues with this view (or a view made from it) may
    /// run:
    /// - `ptr` is the address of element `(0, …, 0)`, aligned to the dtype's size, and the
    ///   memory from the lowest to the highest element address the dims and strides reach
    ///   (`ptr + Σ iₖ·strides[k]·size`, `0 ≤ iₖ < dims[k]`) lies in one allocation the
    ///   stream's GPU can read;
    /// - the memory is not freed, and not written by other work unless that work is ordered
    ///   with the stream (the ops enqueue work and return without waiting).
    pub unsafe fn from_raw(dims: &[i64], strides: &[i64], dtype: DataType, ptr: u64) -> Self {
        Self::from_parts(dims, strides, dtype, ptr, Lender::default())
    }

    /// A view of a cudarc device slice (or view) with `dims` and element `strides`, borrowed
    /// for reading by work on `stream`. Fails when the strides are negative, `dims` and
    /// `strides` differ in length, some element lies outside the slice, or the slice lives
    /// on another GPU than `stream`. The view may only be used with ops on `stream`.
    pub fn from_slice<T: DeviceElement>(
        slice: &'a (impl DevicePtr<T> + ?Sized),
        stream: &'a CudaStream,
        dims: &[i64],
        strides: &[i64],
    ) -> Result<Self> {
        check_lent(dims, strides, T::DTYPE, slice.len(), slice.stream(), stream)?;
        let (ptr, guard) = slice.device_ptr(stream);
        Ok(Self::from_parts(
            dims,
            strides,
            T::DTYPE,
            ptr,
            Lender::of(stream, guard),
        ))
    }

    /// A view of `dtype` elements in a cudarc byte slice (memory that holds any dtype), with
    /// the checks of [`from_slice`](Self::from_slice) in bytes, and the slice's address
    /// aligned to the element size.
    pub fn from_bytes(
        slice: &'a (impl DevicePtr<u8> + ?Sized),
        stream: &'a CudaStream,
        dtype: DataType,
        dims: &[i64],
        strides: &[i64],
    ) -> Result<Self> {
        check_lent(dims, strides, dtype, slice.len() / dtype.size(), slice.stream(), stream)?;
        let (ptr, guard) = slice.device_ptr(stream);
        let view = Self::from_parts(dims, strides, dtype, ptr, Lender::of(stream, guard));
        view.check("TensorRef::from_bytes", "slice")?;
        Ok(view)
    }

    /// [`from_slice`](Self::from_slice) with packed row-major strides.
    pub fn packed<T: DeviceElement>(
        slice: &'a (impl DevicePtr<T> + ?Sized),
        stream: &'a CudaStream,
        dims: &[i64],
    ) -> Result<Self> {
        Self::from_slice(slice, stream, dims, &row_major_strides(dims))
    }

    fn from_parts(dims: &[i64], strides: &[i64], dtype: DataType, ptr: u64, lender: Lender<'a>) -> Self {
        Self {
            dims: Shape::from_slice(dims),
            strides: Shape::from_slice(strides),
            dtype,
            ptr,
            lender,
        }
    }

    /// A view that only describes a tensor (dims, strides, dtype, the alignment of
    /// `address`) for plan keys and graphs built ahead of time: it must never reach an op that
    /// runs, as `address` is not memory.
    pub(crate) fn placeholder(dims: &[i64], strides: &[i64], dtype: DataType, address: u64) -> TensorRef<'static> {
        TensorRef::from_parts(dims, strides, dtype, address, Lender::default())
    }

    /// A view for tests that plan launches without running them: the address is never
    /// dereferenced.
    #[cfg(test)]
    pub(crate) fn fake(dims: &[i64], strides: &[i64], dtype: DataType, ptr: u64) -> TensorRef<'static> {
        TensorRef::placeholder(dims, strides, dtype, ptr)
    }

    /// [`fake`](Self::fake) with packed row-major strides.
    #[cfg(test)]
    pub(crate) fn fake_packed(dims: &[i64], dtype: DataType, ptr: u64) -> TensorRef<'static> {
        TensorRef::fake(dims, &row_major_strides(dims), dtype, ptr)
    }

    /// [`fake`](Self::fake) with packed channels-last strides.
    #[cfg(test)]
    pub(crate) fn fake_channels_last(dims: &[i64], dtype: DataType, ptr: u64) -> TensorRef<'static> {
        TensorRef::fake(dims, &super::layout::channels_last_strides(dims), dtype, ptr)
    }

    /// The same dims, strides and dtype at another (fake) address.
    #[cfg(test)]
    pub(crate) fn fake_at(&self, ptr: u64) -> TensorRef<'static> {
        TensorRef::fake(&self.dims, &self.strides, self.dtype, ptr)
    }

    /// Part of this view: `dims` and element `strides` of the same dtype, element
    /// `(0, …, 0)` at `offset_elements` elements from this view's. Strides may be negative
    /// (a reversed walk). Fails unless every element of the part lies within this view's span
    /// (from its lowest to its highest element address).
    pub fn view(&self, offset_elements: i64, dims: &[i64], strides: &[i64]) -> Result<TensorRef<'a>> {
        let inside = span(&self.dims, &self.strides);
        check_part(inside, offset_elements, dims, strides, self.dtype).map_err(|reason| {
            let within = format!("the view's elements ({:?} / {:?})", self.dims, self.strides);
            Error::invalid_arg("view", "dims", reason + &within)
        })?;
        let ptr = (self.ptr as i64).wrapping_add(offset_elements.wrapping_mul(self.dtype.size() as i64)) as u64;
        Ok(Self::from_parts(dims, strides, self.dtype, ptr, self.lender.clone()))
    }

    /// The view with dims `a` and `b` (and their strides) swapped: the same elements.
    ///
    /// # Panics
    ///
    /// When `a` or `b` is not below the rank.
    pub fn transposed(&self, a: usize, b: usize) -> TensorRef<'a> {
        let mut t = self.clone();
        t.dims.swap(a, b);
        t.strides.swap(a, b);
        t
    }

    /// The same elements under other dims and strides (a reshape, broadcast-free): see
    /// [`view`](Self::view) with offset 0.
    pub fn reshaped(&self, dims: &[i64], strides: &[i64]) -> Result<TensorRef<'a>> {
        self.view(0, dims, strides)
    }

    /// Logical dims, e.g. N, C, H, W.
    pub fn dims(&self) -> &[i64] {
        &self.dims
    }

    /// Strides in elements, one per dim.
    pub fn strides(&self) -> &[i64] {
        &self.strides
    }

    /// Element type.
    pub fn dtype(&self) -> DataType {
        self.dtype
    }

    /// The address of element `(0, …, 0)` as a launcher argument.
    pub(crate) fn address(&self) -> DeviceAddress {
        DeviceAddress(self.ptr)
    }

    /// Device address of element `(0, …, 0)`.
    pub fn ptr(&self) -> u64 {
        self.ptr
    }

    /// Number of elements.
    pub fn numel(&self) -> i64 {
        self.dims.iter().product()
    }

    /// True when some dim is 0.
    pub fn is_empty(&self) -> bool {
        self.dims.contains(&0)
    }

    /// Elements spanned in memory by a view with non-negative strides (`1 + Σ (d-1)·s`; 0
    /// when empty; saturates on overflow).
    pub fn extent_elements(&self) -> i64 {
        extent_elements(&self.dims, &self.strides)
    }

    /// True when the elements tile their memory exactly: no gaps and no overlaps
    /// (some ordering of the dims is row-major packed).
    pub fn is_packed(&self) -> bool {
        let mut axes: Vec<usize> = (0..self.dims.len()).filter(|&i| self.dims[i] > 1).collect();
        axes.sort_by_key(|&i| self.strides[i]);
        let mut expect = 1i64;
        for i in axes {
            if self.strides[i] != expect {
                return false;
            }
            expect = expect.saturating_mul(self.dims[i]);
        }
        true
    }

    /// Largest power of two (≤ 16) dividing the pointer: what cuDNN may assume.
    pub fn alignment(&self) -> u32 {
        if self.ptr == 0 {
            return 16;
        }
        (1u64 << self.ptr.trailing_zeros().min(4)) as u32
    }

    /// Checks the view itself: dims/strides lengths, signs, and pointer alignment.
    pub(crate) fn check(&self, op: &'static str, arg: &'static str) -> Result<()> {
        self.check_layout(op, arg)?;
        if !self.is_empty() {
            if self.ptr == 0 {
                return Err(Error::invalid_arg(op, arg, "null device pointer"));
            }
            if !self.ptr.is_multiple_of(self.dtype.size() as u64) {
                return Err(Error::invalid_arg(
                    op,
                    arg,
                    format!(
                        "pointer {:#x} is not aligned to its {:?} element size ({} bytes)",
                        self.ptr,
                        self.dtype,
                        self.dtype.size()
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Dims and strides alone: equal lengths, no negative dims or strides, a byte extent
    /// that fits in 64 bits.
    fn check_layout(&self, op: &'static str, arg: &'static str) -> Result<()> {
        check_layout(&self.dims, &self.strides, self.dtype, op, arg, false)
    }

    /// Checks that the view may be used on `stream`: a view of a cudarc slice only on the
    /// stream it was lent to (its synchronization is recorded there).
    pub(crate) fn check_stream(&self, stream: &CudaStream, op: &'static str, arg: &'static str) -> Result<()> {
        match self.lender.stream {
            Some(lent) if lent != stream.cu_stream() as usize => Err(Error::invalid_arg(
                op,
                arg,
                "was made from a cudarc slice for another stream than the op's: make the view with the stream the \
                 op runs on",
            )),
            _ => Ok(()),
        }
    }
}

impl<'a> TensorMut<'a> {
    /// A writable view of the device memory at `ptr`.
    ///
    /// # Safety
    ///
    /// The contract of [`TensorRef::from_raw`], and the memory may also be written by the
    /// stream's GPU: no host code or other work reads or writes it while work enqueued with
    /// the view may run, unless ordered with the stream.
    pub unsafe fn from_raw(dims: &[i64], strides: &[i64], dtype: DataType, ptr: u64) -> Self {
        Self(TensorRef::from_parts(dims, strides, dtype, ptr, Lender::default()))
    }

    /// A writable view of a mutably borrowed cudarc device slice (or mutable view) with `dims`
    /// and element `strides`, for work on `stream`: the checks of [`TensorRef::from_slice`].
    pub fn from_slice<T: DeviceElement>(
        slice: &'a mut (impl DevicePtrMut<T> + ?Sized),
        stream: &'a CudaStream,
        dims: &[i64],
        strides: &[i64],
    ) -> Result<Self> {
        check_lent(dims, strides, T::DTYPE, slice.len(), slice.stream(), stream)?;
        let (ptr, guard) = slice.device_ptr_mut(stream);
        Ok(Self(TensorRef::from_parts(
            dims,
            strides,
            T::DTYPE,
            ptr,
            Lender::of(stream, guard),
        )))
    }

    /// A writable view of `dtype` elements in a mutably borrowed cudarc byte slice: the checks
    /// of [`TensorRef::from_bytes`].
    pub fn from_bytes(
        slice: &'a mut (impl DevicePtrMut<u8> + ?Sized),
        stream: &'a CudaStream,
        dtype: DataType,
        dims: &[i64],
        strides: &[i64],
    ) -> Result<Self> {
        check_lent(dims, strides, dtype, slice.len() / dtype.size(), slice.stream(), stream)?;
        let (ptr, guard) = slice.device_ptr_mut(stream);
        let view = TensorRef::from_parts(dims, strides, dtype, ptr, Lender::of(stream, guard));
        view.check("TensorMut::from_bytes", "slice")?;
        Ok(Self(view))
    }

    /// [`from_slice`](Self::from_slice) with packed row-major strides.
    pub fn packed<T: DeviceElement>(
        slice: &'a mut (impl DevicePtrMut<T> + ?Sized),
        stream: &'a CudaStream,
        dims: &[i64],
    ) -> Result<Self> {
        Self::from_slice(slice, stream, dims, &row_major_strides(dims))
    }

    /// A writable view for tests that plan launches without running them.
    #[cfg(test)]
    pub(crate) fn fake(dims: &[i64], strides: &[i64], dtype: DataType, ptr: u64) -> TensorMut<'static> {
        TensorMut(TensorRef::fake(dims, strides, dtype, ptr))
    }

    /// [`TensorRef::fake_packed`], writable.
    #[cfg(test)]
    pub(crate) fn fake_packed(dims: &[i64], dtype: DataType, ptr: u64) -> TensorMut<'static> {
        TensorMut(TensorRef::fake_packed(dims, dtype, ptr))
    }

    /// A writable copy of a fake view.
    #[cfg(test)]
    pub(crate) fn fake_of(t: &TensorRef<'_>) -> TensorMut<'static> {
        TensorMut(t.fake_at(t.ptr))
    }

    /// [`TensorRef::placeholder`], writable: never for an op that runs.
    pub(crate) fn placeholder(dims: &[i64], strides: &[i64], dtype: DataType, address: u64) -> TensorMut<'static> {
        TensorMut(TensorRef::placeholder(dims, strides, dtype, address))
    }

    /// Writable part of this view (the checks of [`TensorRef::view`]).
    pub fn view_mut(&self, offset_elements: i64, dims: &[i64], strides: &[i64]) -> Result<TensorMut<'a>> {
        self.0.view(offset_elements, dims, strides).map(TensorMut)
    }

    /// The same elements under other dims and strides, writable.
    pub fn reshaped_mut(&self, dims: &[i64], strides: &[i64]) -> Result<TensorMut<'a>> {
        self.view_mut(0, dims, strides)
    }

    /// The view as an op input (for `Option<&TensorMut>` → `Option<&TensorRef>`:
    /// `.map(TensorMut::as_input)`); `&TensorMut` also dereferences to it.
    pub fn as_input(&self) -> &TensorRef<'a> {
        &self.0
    }
}

impl<'a> Deref for TensorMut<'a> {
    type Target = TensorRef<'a>;

    fn deref(&self) -> &TensorRef<'a> {
        &self.0
    }
}

impl<'a> Lender<'a> {
    fn of(stream: &'a CudaStream, guard: SyncOnDrop<'a>) -> Self {
        Self {
            stream: Some(stream.cu_stream() as usize),
            _guard: Some(Arc::new(guard)),
            borrow: PhantomData,
        }
    }
}

/// `1 + Σ (d-1)·s` elements (0 when empty; saturates on overflow).
fn extent_elements(dims: &[i64], strides: &[i64]) -> i64 {
    if dims.contains(&0) {
        return 0;
    }
    dims.iter()
        .zip(strides)
        .try_fold(1i64, |acc, (&d, &s)| {
            (d - 1).checked_mul(s).and_then(|v| acc.checked_add(v))
        })
        .unwrap_or(i64::MAX)
}

/// The lowest and highest element offsets (from element `(0, …, 0)`) a view reaches, or
/// `None` when it is empty or they overflow.
fn span(dims: &[i64], strides: &[i64]) -> Option<(i64, i64)> {
    if dims.contains(&0) {
        return None;
    }
    dims.iter().zip(strides).try_fold((0i64, 0i64), |(lo, hi), (&d, &s)| {
        let reach = (d - 1).checked_mul(s)?;
        Some(if reach < 0 {
            (lo.checked_add(reach)?, hi)
        } else {
            (lo, hi.checked_add(reach)?)
        })
    })
}

/// Checks a part (`dims` / `strides` of `dtype`, strides may be negative, element
/// `(0, …, 0)` at `offset`) against the element offsets `inside` spans (lowest, highest);
/// the error text ends where the caller names what it had to stay in.
pub(crate) fn check_part(
    inside: Option<(i64, i64)>,
    offset: i64,
    dims: &[i64],
    strides: &[i64],
    dtype: DataType,
) -> std::result::Result<(), String> {
    if let Err(Error::InvalidArgument { reason, .. }) = check_layout(dims, strides, dtype, "view", "dims", true) {
        return Err(reason + ": not a part of ");
    }
    let fits = match (span(dims, strides), inside) {
        (None, _) => true,
        (Some((lo, hi)), Some((plo, phi))) => {
            offset.checked_add(lo).is_some_and(|l| l >= plo) && offset.checked_add(hi).is_some_and(|h| h <= phi)
        }
        (Some(_), None) => false,
    };
    if fits {
        Ok(())
    } else {
        Err(format!(
            "dims {dims:?} / strides {strides:?} at element offset {offset} reach outside "
        ))
    }
}

/// Equal lengths, no negative dims (nor strides unless `signed`), and a byte span that fits
/// in 64 bits.
fn check_layout(
    dims: &[i64],
    strides: &[i64],
    dtype: DataType,
    op: &'static str,
    arg: &'static str,
    signed: bool,
) -> Result<()> {
    if dims.len() != strides.len() {
        return Err(Error::invalid_arg(
            op,
            arg,
            format!("{} dims but {} strides", dims.len(), strides.len()),
        ));
    }
    if let Some(d) = dims.iter().find(|&&d| d < 0) {
        return Err(Error::invalid_arg(op, arg, format!("negative dim {d} in {dims:?}")));
    }
    if let Some(s) = strides.iter().find(|&&s| s < 0).filter(|_| !signed) {
        return Err(Error::invalid_arg(
            op,
            arg,
            format!("negative stride {s} in {strides:?}: pass a copied tensor"),
        ));
    }
    let bytes = |(lo, hi): (i64, i64)| hi.checked_sub(lo)?.checked_add(1)?.checked_mul(dtype.size() as i64);
    if !dims.contains(&0) && span(dims, strides).and_then(bytes).is_none() {
        let msg = format!("dims {dims:?} / strides {strides:?} overflow a 64-bit byte extent");
        return Err(Error::invalid_arg(op, arg, msg));
    }
    Ok(())
}

/// The checks of a view of a cudarc slice of `len` elements owned by `owner`'s device, lent to
/// `stream`.
fn check_lent(
    dims: &[i64],
    strides: &[i64],
    dtype: DataType,
    len: usize,
    owner: &CudaStream,
    stream: &CudaStream,
) -> Result<()> {
    const OP: &str = "TensorRef::from_slice";
    check_layout(dims, strides, dtype, OP, "dims", false)?;
    let extent = extent_elements(dims, strides);
    if extent as u64 > len as u64 {
        return Err(Error::invalid_arg(
            OP,
            "slice",
            format!("dims {dims:?} / strides {strides:?} reach {extent} elements but the slice holds {len}"),
        ));
    }
    let (here, there) = (stream.context().ordinal(), owner.context().ordinal());
    if here != there {
        return Err(Error::invalid_arg(
            OP,
            "slice",
            format!("lives on GPU {there} but the stream runs on GPU {here}: copy it to GPU {here} first"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(dims: &[i64], strides: &[i64]) -> TensorRef<'static> {
        TensorRef::fake(dims, strides, DataType::F32, 0x1000)
    }

    #[test]
    fn parts_stay_inside_their_view() {
        let whole = t(&[4, 6], &[6, 1]);
        let row = whole.view(6, &[6], &[1]).unwrap();
        assert_eq!(row.ptr(), 0x1000 + 24);
        assert_eq!(whole.reshaped(&[24], &[1]).unwrap().numel(), 24);
        let col = whole.view(2, &[4], &[6]).unwrap();
        assert_eq!((col.dims(), col.strides()), (&[4][..], &[6][..]));
        for (offset, dims, strides) in [
            (0i64, vec![25i64], vec![1i64]),
            (1, vec![24], vec![1]),
            (-1, vec![2], vec![1]),
            (0, vec![2, 2], vec![1]),
            (0, vec![3], vec![-1]),
            (23, vec![25], vec![-1]),
            (0, vec![5, 6], vec![6, 1]),
            (i64::MAX, vec![1], vec![1]),
        ] {
            let e = whole.view(offset, &dims, &strides).unwrap_err();
            assert!(
                matches!(e, Error::InvalidArgument { op: "view", .. }),
                "{offset} {dims:?} {strides:?}: {e}"
            );
        }
        assert!(whole.view(24, &[0], &[1]).is_ok());
        // A reversed walk inside the view.
        let reversed = whole.view(23, &[24], &[-1]).unwrap();
        assert_eq!(reversed.ptr(), 0x1000 + 23 * 4);
        assert!(reversed.view(0, &[24], &[-1]).is_ok());
        assert!(reversed.view(0, &[24], &[1]).is_err());
    }

    #[test]
    fn views_keep_their_checks() {
        assert!(t(&[2, 3], &[3, 1]).check("op", "x").is_ok());
        assert!(t(&[2, 3], &[3]).check("op", "x").is_err());
        assert!(TensorRef::fake(&[2], &[1], DataType::F32, 0x1002)
            .check("op", "x")
            .is_err());
        assert!(TensorRef::fake(&[2], &[1], DataType::F32, 0).check("op", "x").is_err());
        assert!(TensorRef::fake(&[0], &[1], DataType::F32, 0).check("op", "x").is_ok());
    }

    #[test]
    fn a_writable_view_reads_as_its_view() {
        let m = TensorMut::fake(&[2, 2], &[2, 1], DataType::F16, 0x2000);
        let r: &TensorRef = &m;
        assert_eq!(r.dims(), [2, 2]);
        let part = m.view_mut(2, &[2], &[1]).unwrap();
        assert_eq!(part.ptr(), 0x2004);
        assert!(m.view_mut(3, &[2], &[1]).is_err());
    }
}
