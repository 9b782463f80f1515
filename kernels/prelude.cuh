// Prepended by the crate to every kernel source, before common.cuh (see
// backend/core/src/kernels/mod.rs, "Kernel convention").
//
// Declare every entry point with KERNEL instead of `extern "C" __global__`:
//
//     KERNEL void binary_f32(const float* a, ...) { ... }
//     KERNEL void __launch_bounds__(256) reduce_f32(...) { ... }
//
// KERNEL makes the entry point a function template with one defaulted parameter. A template
// is parsed but generates no code until it is instantiated, and the loader instantiates only
// the kernel it was asked for (the NVRTC name expression `binary_f32<0>`), so compiling one
// kernel of a family costs the family's parse plus that one kernel's code generation, not
// the whole family's. The loader maps the plain name ("binary_f32", what Rust callers ask
// for) to the mangled symbol NVRTC reports, so nothing else changes for callers.
//
// Rules: entry-point names are unique in their source (no overloads); kernels are never
// called from other kernels; nothing may instantiate an entry point explicitly. A source
// that still contains `extern "C"` is compiled whole, as one module (slower, still correct).
#define KERNEL template <int = 0> __global__
