//! The crate's one error type.

use burn_cubecl::fusion::RegistryError;

/// Result alias of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Every failure this crate reports. Inside a claimed operation an error never reaches the
/// caller: the operation runs Burn's own implementation instead (see [`crate::stats`]).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// [`register`](crate::register) ran before in this process.
    #[error("cudnn-burn's fusion provider is already registered in this process")]
    AlreadyRegistered,
    /// [`register`](crate::register) ran after Burn's fusion service started: register before
    /// the first tensor operation on a CUDA device.
    #[error("Burn's fusion service already runs: call cudnn_burn::register() before the first tensor operation")]
    FusionStarted,
    /// The engine (cuDNN, NVRTC kernels, the CUDA driver through it) failed.
    #[error(transparent)]
    Core(#[from] cudnn_backend_core::Error),
    /// A CUDA driver call made by this crate failed.
    #[error("CUDA driver error during {op}: {message}")]
    Cuda {
        /// What this crate was doing.
        op: &'static str,
        /// The driver's message.
        message: String,
    },
    /// CubeCL's client (allocation, resource lookup, flush, sync) failed.
    #[error("CubeCL client error during {op}: {message}")]
    CubeCl {
        /// What this crate was doing.
        op: &'static str,
        /// CubeCL's message.
        message: String,
    },
    /// A claimed operation's tensors are not in the form this crate runs (e.g. a missing or
    /// tiled handle); Burn runs the operation instead.
    #[error("cannot run {op} here: {reason}")]
    Unsupported {
        /// The operation.
        op: &'static str,
        /// Why.
        reason: String,
    },
    /// The GPU-side ordering with CubeCL's stream did not come up (e.g. CubeCL refused the
    /// ordering kernels).
    #[error("stream ordering: {0}")]
    Ordering(String),
}

impl From<RegistryError> for Error {
    fn from(e: RegistryError) -> Self {
        match e {
            RegistryError::ServiceRunning => Error::FusionStarted,
            RegistryError::DuplicateOptimization { .. } => Error::AlreadyRegistered,
        }
    }
}

impl Error {
    /// A CUDA driver failure during `op`.
    pub(crate) fn cuda(op: &'static str, e: impl std::fmt::Display) -> Self {
        Error::Cuda {
            op,
            message: e.to_string(),
        }
    }

    /// A CubeCL client failure during `op`.
    pub(crate) fn cubecl(op: &'static str, e: impl std::fmt::Display) -> Self {
        Error::CubeCl {
            op,
            message: e.to_string(),
        }
    }

    /// An operation this crate leaves to Burn, with the reason.
    pub(crate) fn unsupported(op: &'static str, reason: impl Into<String>) -> Self {
        Error::Unsupported {
            op,
            reason: reason.into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registry_errors_map_to_typed_variants() {
        assert!(matches!(
            Error::from(RegistryError::ServiceRunning),
            Error::FusionStarted
        ));
        let dup = RegistryError::DuplicateOptimization { name: "x".into() };
        assert!(matches!(Error::from(dup), Error::AlreadyRegistered));
    }

    #[test]
    fn core_errors_keep_their_message() {
        let core = cudnn_backend_core::Error::NoDevice("none".into());
        let want = core.to_string();
        let e = Error::from(core);
        assert!(matches!(e, Error::Core(_)));
        assert_eq!(e.to_string(), want);
    }

    #[test]
    fn messages_name_the_step() {
        assert!(Error::cuda("cuStreamWaitValue32", "boom")
            .to_string()
            .contains("cuStreamWaitValue32"));
        assert!(Error::cubecl("client.flush", "x").to_string().contains("client.flush"));
        assert!(Error::unsupported("conv2d", "tiled").to_string().contains("tiled"));
    }
}
