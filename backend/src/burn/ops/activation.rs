//! Activation ops (`ActivationOps`).

use burn_backend::ops::*;
use burn_backend::tensor::{BoolTensor, FloatTensor, IntTensor, QuantizedTensor};
use burn_backend::*;

use crate::burn::{Cudnn, CudnnDevice};

impl ActivationOps<Cudnn> for Cudnn {}
