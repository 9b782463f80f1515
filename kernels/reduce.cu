// Reductions and scans along one axis (see backend/src/kernels/reduce.rs).
