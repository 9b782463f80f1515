//! Typed launch of the generated fused elementwise kernels (`kernels::fused`).

use cudarc::driver::{CudaFunction, CudaStream, PushKernelArg};

use crate::error::Result;
use crate::ffi::launch::{grid_for, CountedLaunch, KernelLayout};

/// Most inputs of one fused program.
pub const MAX_INPUTS: usize = 16;
/// Most outputs of one fused program.
pub const MAX_OUTPUTS: usize = 8;
/// Most scalar operands of one fused program.
pub const MAX_SCALARS: usize = 32;

/// The by-value argument of `fused_elementwise` (`struct FusedArgs` of the generated source):
/// input then output addresses, input layouts broadcast to the output's, the output layout,
/// the scalars and the element count.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub(crate) struct FusedArgs {
    pub ptr: [u64; MAX_INPUTS + MAX_OUTPUTS],
    pub in_layout: [KernelLayout; MAX_INPUTS],
    pub out_layout: KernelLayout,
    pub s: [f32; MAX_SCALARS],
    pub n: i64,
}

// SAFETY: `#[repr(C)]` with the field order and types of the generated `struct FusedArgs`
// (u64[24], Layout[16], Layout, float[32], long long: the same alignment and padding in both
// compilers); any bit pattern is a valid value.
unsafe impl cudarc::driver::DeviceRepr for FusedArgs {}

/// Launches a generated `fused_elementwise(const FusedArgs)` over `args.n` elements.
pub(crate) fn fused(stream: &CudaStream, f: &CudaFunction, args: &FusedArgs) -> Result<()> {
    let mut b = stream.launch_builder(f);
    b.arg(args);
    // SAFETY: the one argument matches the kernel's signature; the caller (`kernels::fused::run`)
    // validated that every input view, broadcast by its layout, and every output view is in
    // bounds for each index < n, and that the pointers' dtypes are the program's.
    unsafe { b.launch_counted(grid_for(args.n as u64)) }?;
    Ok(())
}
