//! Typed launch of the generated fused elementwise kernels (`kernels::fused`).

use cudarc::driver::{CudaFunction, CudaStream, LaunchConfig, PushKernelArg};

use crate::error::Result;
use crate::ffi::launch::{CountedLaunch, KernelLayout};
use crate::types::DeviceAddress;

/// Most inputs of one fused program.
pub const MAX_INPUTS: usize = 16;
/// Most outputs of one fused program.
pub const MAX_OUTPUTS: usize = 8;
/// Most scalar operands of one fused program.
pub const MAX_SCALARS: usize = 32;

/// The by-value argument of `fused_elementwise` (`struct FusedArgs` of the generated source):
/// input then output addresses, input layouts broadcast to the output's, the output layout,
/// the layout of the outputs of the small shape (broadcast to the output's), the scalars and
/// the element count.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub(crate) struct FusedArgs {
    pub ptr: [DeviceAddress; MAX_INPUTS + MAX_OUTPUTS],
    pub in_layout: [KernelLayout; MAX_INPUTS],
    pub out_layout: KernelLayout,
    pub small_layout: KernelLayout,
    pub s: [f32; MAX_SCALARS],
    pub n: i64,
}

// SAFETY: `#[repr(C)]` with the field order and types of the generated `struct FusedArgs`
// (u64[24], Layout[16], Layout, Layout, float[32], long long: the same alignment and padding in both
// compilers); any bit pattern is a valid value.
unsafe impl cudarc::driver::DeviceRepr for FusedArgs {}

/// Most blocks of a fused launch (16 per SM of a 132-SM GPU); larger tensors take more
/// grid-stride steps per thread.
const MAX_BLOCKS: u64 = 2048;

/// Threads per block of a fused launch.
const THREADS: u32 = 256;

/// Launches a generated `fused_elementwise(const FusedArgs)` over `groups` thread steps (the
/// elements divided by the kernel's vector width); nothing when `groups` is 0.
pub(crate) fn fused(stream: &CudaStream, f: &CudaFunction, args: &FusedArgs, groups: u64) -> Result<()> {
    if groups == 0 {
        return Ok(());
    }
    let cfg = LaunchConfig {
        grid_dim: (fused_grid(groups), 1, 1),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: 0,
    };
    let mut b = stream.launch_builder(f);
    b.arg(args);
    // SAFETY: the one argument matches the kernel's signature; the caller
    // (`kernels::fused::FusedLaunch::new`) validated that every input view, broadcast by its
    // layout, and every output view is in bounds for each element index < n, that the
    // pointers' dtypes are the program's, and that the kernel variant's vector accesses
    // (`groups` steps of its width, which divides the innermost dim) are aligned.
    unsafe { b.launch_counted(cfg) }?;
    Ok(())
}

/// Blocks of a fused element-wise launch of `groups` thread steps (a grid-stride loop over at
/// most `MAX_BLOCKS` blocks).
pub(crate) fn fused_grid(groups: u64) -> u32 {
    groups.div_ceil(u64::from(THREADS)).min(MAX_BLOCKS) as u32
}

/// Most values one fused reduction sums (each into its own result, over the same dims).
pub const MAX_TARGETS: usize = 4;

/// The slots of [`ReduceArgs::ptr`] after the inputs' and the stored outputs': the results'
/// addresses ([`MAX_TARGETS`] slots), the partial sums', the arrival counters'.
pub(crate) const RESULT_SLOT: usize = MAX_INPUTS + MAX_OUTPUTS;
/// See [`RESULT_SLOT`].
pub(crate) const SCRATCH_SLOT: usize = RESULT_SLOT + MAX_TARGETS;
/// See [`RESULT_SLOT`].
pub(crate) const ARRIVALS_SLOT: usize = SCRATCH_SLOT + 1;

/// The by-value argument of `fused_reduce` (`struct ReduceArgs` of the generated source):
/// input addresses, the stored outputs', then the results', the partial sums' and the
/// arrival counters' (0: none); input
/// layouts broadcast to the iteration shape (`full`, whose strides are the stored outputs',
/// packed); the scalars; kept and reduced element counts; reduced elements per chunk and
/// the chunk count; the scale applied to each target's sums; the phase (0: partial sums,
/// combined in the same launch when there are arrival counters; 1: combine; 2: an
/// epilogue's second pass); `warp_rows` (1: each warp reduces one kept element, its lanes
/// along the reduced ones).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub(crate) struct ReduceArgs {
    pub ptr: [DeviceAddress; ARRIVALS_SLOT + 1],
    pub in_layout: [KernelLayout; MAX_INPUTS],
    pub full: KernelLayout,
    pub s: [f32; MAX_SCALARS],
    pub kept: i64,
    pub red: i64,
    pub chunk: i64,
    pub chunks: i64,
    pub scale: [f32; MAX_TARGETS],
    pub phase: i32,
    pub warp_rows: i32,
}

// SAFETY: `#[repr(C)]` with the field order and types of the generated `struct ReduceArgs`
// (u64[30], Layout[16], Layout, float[32], four long longs, float[4], two ints: the same
// alignment and padding in both compilers); any bit pattern is a valid value.
unsafe impl cudarc::driver::DeviceRepr for ReduceArgs {}

/// Threads per block of a fused reduction (its shared-memory tree holds one float each).
pub(crate) const REDUCE_THREADS: u32 = 256;

/// Launches a generated `fused_reduce(const ReduceArgs)` (each target's partial sums are
/// `chunks * kept` f32s of the scratch buffer, target after target): phase 0 on a `grid` of
/// `(kept blocks, chunks)` with `block` = (lanes over kept elements, rows over reduced ones,
/// a power of two) threads, or with `args.warp_rows` (32 lanes over reduced elements, one
/// warp per kept element), then, when `args.chunks > 1`, phase 1 combining the partial sums
/// (unless the launch has arrival counters: phase 0 then combines them itself) and, for a
/// program with an `epilogue`, phase 2 (its second pass) on phase 0's grid.
pub(crate) fn fused_reduce(
    stream: &CudaStream,
    f: &CudaFunction,
    args: &ReduceArgs,
    grid: (u32, u32),
    block: (u32, u32),
    epilogue: bool,
) -> Result<()> {
    if args.kept == 0 {
        return Ok(());
    }
    // One launch of phase `phase` on `grid` blocks of `block` threads.
    let launch = |phase: i32, grid: (u32, u32), block: (u32, u32)| -> Result<()> {
        let phase_args = ReduceArgs { phase, ..*args };
        let cfg = LaunchConfig {
            grid_dim: (grid.0, grid.1, 1),
            block_dim: (block.0, block.1, 1),
            shared_mem_bytes: 0,
        };
        let mut b = stream.launch_builder(f);
        b.arg(&phase_args);
        // SAFETY: the one argument matches the kernel's signature; the caller
        // (`kernels::fused_reduce::ReduceLaunch::new`) validated that every input view,
        // broadcast by its layout, and every stored output is in bounds for each index of the
        // iteration shape, that each of the program's results holds `kept` elements and the
        // partial buffer `targets * chunks * kept` f32s, that the arrival counters (when given) are `grid.0` zeroed
        // u32s that no other launch uses meanwhile (each launch leaves them zeroed), that
        // `block.0 * block.1 <= REDUCE_THREADS` with `block.1` a power of two, and that the
        // grid covers `kept` and `chunks`. Phases 0 and 2 run on that grid; phase 1 reads
        // each target's `chunks * kept` partial sums and writes its `kept` results, one per
        // thread index below `kept`, on the grid given below.
        unsafe { b.launch_counted(cfg) }?;
        Ok(())
    };
    launch(0, grid, block)?;
    let (combine, second_pass) = reduce_phases(args, epilogue);
    if combine {
        let blocks = (args.kept as u64).div_ceil(u64::from(REDUCE_THREADS)) as u32;
        launch(1, (blocks, 1), (REDUCE_THREADS, 1))?;
    }
    if second_pass {
        // The second pass of the epilogue, once the results are combined.
        launch(2, grid, block)?;
    }
    Ok(())
}

/// Which launches [`fused_reduce`] makes after phase 0: phase 1 (chunked sums without arrival
/// counters) and phase 2 (chunked sums of a program with an epilogue).
pub(crate) fn reduce_phases(args: &ReduceArgs, epilogue: bool) -> (bool, bool) {
    let chunked = args.chunks > 1;
    (
        chunked && args.ptr[ARRIVALS_SLOT] == DeviceAddress::NULL,
        chunked && epilogue,
    )
}
