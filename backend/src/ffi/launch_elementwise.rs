//! Typed launches of the elementwise kernels (`kernels/elementwise.cu`).
