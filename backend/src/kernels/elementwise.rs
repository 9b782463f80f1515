//! Elementwise kernels on strided views: fill, copy/cast, unary, binary, compare, where.
