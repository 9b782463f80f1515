// Elementwise kernels on strided views (see backend/src/kernels/elementwise.rs).
