//! Batched reads (`TransactionOps`): one staging transfer per device (see `burn::data`).

use burn_backend::ops::*;
use burn_backend::{ExecutionError, TensorData, TensorMetadata};

use crate::burn::data::{execution_error, q_data, read_batch};
use crate::burn::tensor::CudnnTensor;
use crate::burn::Cudnn;
use crate::error::Error;

/// The data of a float/int/bool tensor from its packed bytes (as `data::into_data` builds it).
fn tensor_data(t: &CudnnTensor, bytes: Vec<u8>) -> TensorData {
    TensorData::from_bytes_vec(bytes, t.shape(), t.dtype)
}

/// Reads every tensor of the transaction in one batch (see the module docs).
fn execute(tr: TransactionPrimitive<Cudnn>) -> Result<TransactionPrimitiveData, Error> {
    const OP: &str = "tr_execute";
    let (n_floats, n_ints, n_bools) = (tr.read_floats.len(), tr.read_ints.len(), tr.read_bools.len());
    let mut tensors: Vec<CudnnTensor> = Vec::with_capacity(n_floats + n_ints + n_bools + 2 * tr.read_qfloats.len());
    tensors.extend(tr.read_floats);
    tensors.extend(tr.read_ints);
    tensors.extend(tr.read_bools);
    let mut qmeta = Vec::with_capacity(tr.read_qfloats.len());
    for q in tr.read_qfloats {
        qmeta.push((q.shape(), q.scheme));
        tensors.push(q.values);
        tensors.push(q.scales);
    }
    let n_plain = n_floats + n_ints + n_bools;
    let mut bytes = read_batch(&tensors, OP)?;
    let q_bytes = bytes.split_off(n_plain);
    let mut read_floats: Vec<TensorData> = tensors.iter().zip(bytes).map(|(t, b)| tensor_data(t, b)).collect();
    let mut read_ints = read_floats.split_off(n_floats);
    let read_bools = read_ints.split_off(n_ints);
    let mut q_bytes = q_bytes.into_iter();
    let read_qfloats = qmeta
        .into_iter()
        .map(|(shape, scheme)| {
            let values = q_bytes.next().unwrap_or_default();
            let scales = q_bytes.next().unwrap_or_default();
            q_data(shape, scheme, values, scales)
        })
        .collect();
    Ok(TransactionPrimitiveData {
        read_floats,
        read_qfloats,
        read_ints,
        read_bools,
    })
}

impl TransactionOps<Cudnn> for Cudnn {
    /// All reads of the transaction share one staging transfer and one synchronisation per
    /// device; the returned future is already complete.
    fn tr_execute(
        transaction: TransactionPrimitive<Cudnn>,
    ) -> impl std::future::Future<Output = Result<TransactionPrimitiveData, ExecutionError>> + Send {
        std::future::ready(execute(transaction).map_err(|e| execution_error("tr_execute", e)))
    }
}
