//! Typed launches of the reduction and scan kernels (`kernels/reduce.cu`).
