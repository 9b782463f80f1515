//! Batched reads (`TransactionOps`).

use burn_backend::ops::*;
use burn_backend::tensor::{BoolTensor, FloatTensor, IntTensor, QuantizedTensor};
use burn_backend::*;

use crate::burn::{Cudnn, CudnnDevice};

impl TransactionOps<Cudnn> for Cudnn {}
