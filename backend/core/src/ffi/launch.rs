//! Typed kernel launches (the unsafe part of running our NVRTC kernels).

use cudarc::driver::{CudaFunction, CudaStream, LaunchConfig, PushKernelArg};

use crate::error::Result;
use crate::types::DeviceAddress;

// SAFETY: `DeviceAddress` is a `#[repr(transparent)]` u64: the kernels take it by value as
// a pointer (8 bytes), as they took the bare u64.
unsafe impl cudarc::driver::DeviceRepr for DeviceAddress {}

/// [`cudarc::driver::LaunchArgs::launch`], counted in `runtime::launch_counts`.
pub(crate) trait CountedLaunch {
    /// Launches the kernel with `cfg`.
    ///
    /// # Safety
    /// As for `LaunchArgs::launch`: the pushed arguments must match the kernel's signature
    /// and every address it dereferences must be valid for the launch.
    unsafe fn launch_counted(&mut self, cfg: LaunchConfig) -> std::result::Result<(), cudarc::driver::DriverError>;
}

impl CountedLaunch for cudarc::driver::LaunchArgs<'_> {
    unsafe fn launch_counted(&mut self, cfg: LaunchConfig) -> std::result::Result<(), cudarc::driver::DriverError> {
        super::counters::add(super::counters::Count::Kernels, 1);
        let _timer = super::counters::HostTimer::start(super::counters::Count::LaunchNs);
        // SAFETY: forwarded: the caller upholds `launch`'s contract (see the trait method).
        unsafe { self.launch(cfg) }.map(|_| ())
    }
}

/// The grid of a kernel that gives each row one warp (`block_dim` = 32 lanes × `rows_per_block`
/// rows, one block per `rows_per_block` rows).
pub(crate) fn warp_per_row(rows: i64, rows_per_block: u32) -> LaunchConfig {
    LaunchConfig {
        grid_dim: ((rows as u64).div_ceil(rows_per_block as u64) as u32, 1, 1),
        block_dim: (32, rows_per_block, 1),
        shared_mem_bytes: 0,
    }
}

/// Arguments of `bias_act_*` in `kernels/bias_act.cu`.
pub(crate) struct BiasActArgs {
    pub y: DeviceAddress,
    pub bias: DeviceAddress,
    pub n: i64,
    pub channel_stride: i64,
    pub channels: i64,
    pub activation: i32,
    pub param: f32,
}

/// Launches a `bias_act_*` kernel over `args.n` elements.
pub(crate) fn bias_act(stream: &CudaStream, f: &CudaFunction, a: &BiasActArgs) -> Result<()> {
    let threads = 256u32;
    let blocks = ((a.n as u64).div_ceil(threads as u64)).clamp(1, 65_535 * 8) as u32;
    let cfg = LaunchConfig {
        grid_dim: (blocks, 1, 1),
        block_dim: (threads, 1, 1),
        shared_mem_bytes: 0,
    };
    let mut b = stream.launch_builder(f);
    b.arg(&a.y)
        .arg(&a.bias)
        .arg(&a.n)
        .arg(&a.channel_stride)
        .arg(&a.channels)
        .arg(&a.activation)
        .arg(&a.param);
    // SAFETY: the argument list matches the kernel's C signature (T*, const T*, long long,
    // long long, long long, int, float); `y` points to `n` packed elements of the kernel's
    // type and `bias` (if non-null) to `channels` elements, as the caller checked.
    unsafe { b.launch_counted(cfg) }?;
    Ok(())
}

/// Launches a strided zero-fill kernel, `pool_zero_b{2,4,8}` or `resize_zero_b{2,4,8}`
/// (`T* p, Layout l, i64 n`): zero bits at every element of a rank-4 view.
pub(crate) fn zero_view(
    stream: &CudaStream,
    f: &CudaFunction,
    ptr: DeviceAddress,
    layout: &KernelLayout,
    n: i64,
) -> Result<()> {
    let mut b = stream.launch_builder(f);
    b.arg(&ptr).arg(layout).arg(&n);
    // SAFETY: the arguments match `{pool,resize}_zero_bN(T*, Layout, long long)`; the view is
    // rank 4, of n elements, and in bounds (validated by the caller).
    unsafe { b.launch_counted(grid_for(n as u64)) }?;
    Ok(())
}

/// Zero-fills `bytes` bytes at device address `ptr`, ordered on `stream`.
pub(crate) fn memset_zero(stream: &CudaStream, ptr: DeviceAddress, bytes: usize) -> Result<()> {
    super::counters::add(super::counters::Count::Kernels, 1);
    stream.context().bind_to_thread()?;
    // SAFETY: the caller guarantees `ptr..ptr+bytes` is device memory it owns on this
    // stream's context; the memset is enqueued on `stream`.
    unsafe { cudarc::driver::result::memset_d8_async(ptr.get(), 0, bytes, stream.cu_stream()) }?;
    Ok(())
}

/// Most dims a kernel layout carries (`struct Layout` in `kernels/common.cuh`).
#[doc(hidden)]
pub const MAX_KERNEL_RANK: usize = 8;

/// A strided view of up to [`MAX_KERNEL_RANK`] dims, passed to kernels by value; offsets and
/// strides are in elements. Matches `struct Layout` in `kernels/common.cuh`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct KernelLayout {
    pub rank: i32,
    /// 1 when the view has fewer than 2^31 elements, so kernels may index it in 32 bits.
    pub index32: i32,
    pub shape: [i64; MAX_KERNEL_RANK],
    pub strides: [i64; MAX_KERNEL_RANK],
    pub offset: i64,
}

#[cfg(test)]
impl KernelLayout {
    /// Host model of the kernels' `offset_of`: the element offset of row-major item `i`.
    pub(crate) fn host_offset(&self, mut i: i64) -> i64 {
        let mut off = self.offset;
        for d in (0..self.rank as usize).rev() {
            off += (i % self.shape[d]) * self.strides[d];
            i /= self.shape[d];
        }
        off
    }
}

// SAFETY: `KernelLayout` is plain old data with a `#[repr(C)]` layout identical to the CUDA
// `struct Layout` (two i32, two i64[8], one i64: no padding differences), valid for any bits.
unsafe impl cudarc::driver::DeviceRepr for KernelLayout {}

/// Grid for a grid-stride loop over `n` items with 256 threads per block.
pub(crate) fn grid_for(n: u64) -> LaunchConfig {
    let threads = 256u32;
    let blocks = n.div_ceil(threads as u64).clamp(1, 65_535 * 8) as u32;
    LaunchConfig {
        grid_dim: (blocks, 1, 1),
        block_dim: (threads, 1, 1),
        shared_mem_bytes: 0,
    }
}
