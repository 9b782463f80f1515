//! Write access to Candle storages for the ops that update tensors in place: the batch-norm
//! running statistics and the fused optimizer's parameters and moments.
//!
//! Candle guards every storage with a read-write lock and lends it mutably only to an in-place
//! op (`InplaceOp1`), one storage per call. [`with_written`] nests such calls, so that the
//! storages of all the tensors one kernel launch updates are write-locked together while the
//! launch is enqueued (on the storages' stream: the lock orders host access, the stream
//! orders the kernels). Locking a storage that this thread already holds would never return,
//! so callers first check with [`check_distinct`] that the written tensors share no storage
//! with each other or with the tensors they read.

#[cfg(feature = "candle-cuda")]
pub(crate) use nest::with_written;

use candle_core::{Result, Storage, Tensor};

use super::arg_err;

/// The identity of a device storage an op received (`&CpuStorage` in `cpu_fwd`, `&CudaStorage`
/// in `cuda_fwd`): its address, the same as [`storage_id`] of its tensors.
pub(crate) fn addr<T>(s: &T) -> usize {
    s as *const T as usize
}

/// The identity of a storage object (what [`storage_id`] returns for its tensors).
fn id_of(s: &Storage) -> usize {
    match s {
        Storage::Cpu(c) => addr(c),
        Storage::Cuda(c) => addr(c),
        Storage::Metal(m) => addr(m),
    }
}

/// The identity of the storage behind `t`: the address of Candle's storage object, the same
/// for every view of one storage and distinct between live storages.
pub(crate) fn storage_id(t: &Tensor) -> usize {
    let (s, _) = t.storage_and_layout();
    id_of(&s)
}

/// Refuses `written` tensors (named) that share a storage with one another or with a storage
/// of `read` (identities from [`storage_id`]).
pub(crate) fn check_distinct(op: &'static str, written: &[(&'static str, usize)], read: &[usize]) -> Result<()> {
    for (i, &(name, id)) in written.iter().enumerate() {
        let clash = written[..i].iter().any(|&(_, other)| other == id) || read.contains(&id);
        if clash {
            return Err(arg_err(
                op,
                name,
                "shares its storage with another operand of the op: pass a separate tensor",
            ));
        }
    }
    Ok(())
}

#[cfg(feature = "candle-cuda")]
mod nest {
    use std::cell::RefCell;

    use candle_core::{CpuStorage, CudaStorage, InplaceOp1, Layout, Result, Tensor};

    use crate::candle::{arg_err, cuda};
    use crate::types::TensorMut;

    /// The body run with the written tensors' views.
    type Body<'f> = RefCell<&'f mut dyn FnMut(&[&TensorMut]) -> Result<()>>;

    /// One level of the nest: lends the next tensor's storage mutably and descends, with the
    /// views of the levels above.
    struct Lock<'a, 'f> {
        op: &'static str,
        rest: &'a [&'a Tensor],
        views: &'a [&'a TensorMut<'a>],
        body: &'a Body<'f>,
    }

    fn descend(op: &'static str, rest: &[&Tensor], views: &[&TensorMut], body: &Body<'_>) -> Result<()> {
        match rest.split_first() {
            None => {
                let mut f = body.borrow_mut();
                (*f)(views)
            }
            Some((t, rest)) => t.inplace_op1(&Lock { op, rest, views, body }),
        }
    }

    impl InplaceOp1 for Lock<'_, '_> {
        fn name(&self) -> &'static str {
            "cudnn-write-access"
        }

        fn cpu_fwd(&self, _: &mut CpuStorage, _: &Layout) -> Result<()> {
            Err(arg_err(
                self.op,
                "tensor",
                "is on the CPU: kernels write CUDA tensors only",
            ))
        }

        fn cuda_fwd(&self, s: &mut CudaStorage, l: &Layout) -> Result<()> {
            let stream = cuda::stream(s);
            // The view borrows the storage (and records the write when it drops) until this
            // level returns, after the innermost level has enqueued the kernels.
            let view = cuda::output_of(self.op, "tensor", s, l, &stream)?;
            let mut views = self.views.to_vec();
            views.push(&view);
            descend(self.op, self.rest, &views, self.body)
        }
    }

    /// Runs `body` with the views of `written` (CUDA tensors of f32/f16/bf16, in order) while
    /// their storages are write-locked. `body` runs once; its kernels must be enqueued on the
    /// storages' stream (Candle's stream of their device). The caller has checked with
    /// [`check_distinct`](super::check_distinct) that no two written tensors, and no tensor this thread holds a lock on,
    /// share a storage.
    pub(crate) fn with_written(
        op: &'static str,
        written: &[&Tensor],
        body: &mut dyn FnMut(&[&TensorMut]) -> Result<()>,
    ) -> Result<()> {
        let body = RefCell::new(body);
        descend(op, written, &[], &body)
    }
}
