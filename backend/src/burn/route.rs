//! Which of our backends a generic `B: Backend` is, found from its `TypeId`, and the
//! conversion of tensors between `B` and that concrete backend: how the drop-in modules
//! and optimizers stay generic over any Burn backend yet take the fused path on ours.

use std::any::{Any, TypeId};

use burn_autodiff::checkpoint::strategy::{BalancedCheckpointing, NoCheckpointing};
use burn_autodiff::Autodiff;
use burn_backend::Backend;
use burn_core::tensor::{Int, Tensor, TensorPrimitive};

use super::{Cudnn, CudnnFusion};

/// The concrete backend behind a generic one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Route {
    /// [`Cudnn`] itself.
    Cudnn,
    /// `Autodiff<Cudnn>` (no checkpointing, Burn's default).
    Autodiff,
    /// `Autodiff<Cudnn, BalancedCheckpointing>`.
    AutodiffBalanced,
    /// [`CudnnFusion`] (`Fusion<Cudnn>`).
    Fusion,
    /// `Autodiff<CudnnFusion>`.
    AutodiffFusion,
    /// `Autodiff<CudnnFusion, BalancedCheckpointing>`.
    AutodiffFusionBalanced,
    /// Any other backend: compose from Burn's ops.
    Other,
}

/// The route of backend `B`.
pub(crate) fn route<B: Backend>() -> Route {
    let id = TypeId::of::<B>();
    if id == TypeId::of::<Cudnn>() {
        Route::Cudnn
    } else if id == TypeId::of::<Autodiff<Cudnn, NoCheckpointing>>() {
        Route::Autodiff
    } else if id == TypeId::of::<Autodiff<Cudnn, BalancedCheckpointing>>() {
        Route::AutodiffBalanced
    } else if id == TypeId::of::<CudnnFusion>() {
        Route::Fusion
    } else if id == TypeId::of::<Autodiff<CudnnFusion, NoCheckpointing>>() {
        Route::AutodiffFusion
    } else if id == TypeId::of::<Autodiff<CudnnFusion, BalancedCheckpointing>>() {
        Route::AutodiffFusionBalanced
    } else {
        Route::Other
    }
}

/// Evaluates `$body` with the type `$T` bound to the concrete backend of ours that `$B` is,
/// or `$other` when `$B` is none of ours.
macro_rules! on_our_backend {
    ($B:ty, $T:ident => $body:expr, else $other:expr) => {{
        use burn_autodiff::checkpoint::strategy::BalancedCheckpointing;
        use burn_autodiff::Autodiff;
        use $crate::burn::route::{route, Route};
        use $crate::burn::{Cudnn, CudnnFusion};
        match route::<$B>() {
            Route::Cudnn => {
                type $T = Cudnn;
                $body
            }
            Route::Autodiff => {
                type $T = Autodiff<Cudnn>;
                $body
            }
            Route::AutodiffBalanced => {
                type $T = Autodiff<Cudnn, BalancedCheckpointing>;
                $body
            }
            Route::Fusion => {
                type $T = CudnnFusion;
                $body
            }
            Route::AutodiffFusion => {
                type $T = Autodiff<CudnnFusion>;
                $body
            }
            Route::AutodiffFusionBalanced => {
                type $T = Autodiff<CudnnFusion, BalancedCheckpointing>;
                $body
            }
            Route::Other => $other,
        }
    }};
}
pub(crate) use on_our_backend;

/// True when `B` is [`Cudnn`] (what an optimizer sees as the inner backend of ours).
pub(crate) fn is_cudnn<B: Backend>() -> bool {
    TypeId::of::<B>() == TypeId::of::<Cudnn>()
}

/// `value` as type `T`, which must be its own type (checked by `TypeId`).
fn same<S: 'static, T: 'static>(value: S) -> T {
    match (Box::new(value) as Box<dyn Any>).downcast::<T>() {
        Ok(t) => *t,
        Err(_) => panic!(
            "cudnn-backend: internal error: {} taken for {}",
            std::any::type_name::<S>(),
            std::any::type_name::<T>()
        ),
    }
}

/// A float tensor of backend `S` as the same tensor of backend `T` (`S` and `T` must be the
/// same type: callers pick `T` from [`route`]).
pub(crate) fn cast<S: Backend, T: Backend, const D: usize>(t: Tensor<S, D>) -> Tensor<T, D> {
    let p: TensorPrimitive<T> = same(t.into_primitive());
    Tensor::from_primitive(p)
}

/// An int tensor of backend `S` as the same tensor of backend `T` (the same type).
pub(crate) fn cast_int<S: Backend, T: Backend, const D: usize>(t: Tensor<S, D, Int>) -> Tensor<T, D, Int> {
    Tensor::from_primitive(same(t.into_primitive()))
}

/// A float primitive of backend `S` as one of backend `T` (the same type).
pub(crate) fn cast_primitive<S: Backend, T: Backend>(p: S::FloatTensorPrimitive) -> T::FloatTensorPrimitive {
    same(p)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_follow_the_backend_type() {
        assert_eq!(route::<Cudnn>(), Route::Cudnn);
        assert_eq!(route::<Autodiff<Cudnn>>(), Route::Autodiff);
        assert_eq!(
            route::<Autodiff<Cudnn, BalancedCheckpointing>>(),
            Route::AutodiffBalanced
        );
        assert_eq!(route::<CudnnFusion>(), Route::Fusion);
        assert_eq!(route::<Autodiff<CudnnFusion>>(), Route::AutodiffFusion);
        assert_eq!(
            route::<Autodiff<CudnnFusion, BalancedCheckpointing>>(),
            Route::AutodiffFusionBalanced
        );
        assert_eq!(route::<Autodiff<Autodiff<Cudnn>>>(), Route::Other);
        assert!(is_cudnn::<Cudnn>() && !is_cudnn::<Autodiff<Cudnn>>());
    }
}
