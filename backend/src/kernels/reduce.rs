//! Reductions (sum, prod, mean, max, min, argmax, argmin, any, all) and scans along one axis.
