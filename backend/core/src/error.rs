//! The crate's one error type.

use std::fmt;

/// Result alias used throughout the crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// A cuDNN status code with its symbolic name (kept as a raw number so that codes
/// newer than our bindings are reported rather than misread).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CudnnStatus(pub u32);

impl CudnnStatus {
    /// True when the status belongs to the `CUDNN_STATUS_NOT_SUPPORTED*` family.
    pub fn is_not_supported(self) -> bool {
        (3000..4000).contains(&self.0)
    }

    /// True when the status reports a failed device allocation.
    pub fn is_alloc_failure(self) -> bool {
        self.0 == 4004 || self.0 == 2
    }

    /// The symbolic name of the status, or `"CUDNN_STATUS_<code>"` when unknown.
    pub fn name(self) -> String {
        let known = match self.0 {
            0 => "CUDNN_STATUS_SUCCESS",
            1001 => "CUDNN_STATUS_NOT_INITIALIZED",
            1002 => "CUDNN_STATUS_SUBLIBRARY_VERSION_MISMATCH",
            1008 => "CUDNN_STATUS_SUBLIBRARY_LOADING_FAILED",
            2000 => "CUDNN_STATUS_BAD_PARAM",
            2001 => "CUDNN_STATUS_INVALID_VALUE",
            2002 => "CUDNN_STATUS_BAD_PARAM_NULL_POINTER",
            2003 => "CUDNN_STATUS_BAD_PARAM_MISALIGNED_POINTER",
            2004 => "CUDNN_STATUS_BAD_PARAM_NOT_FINALIZED",
            2005 => "CUDNN_STATUS_BAD_PARAM_OUT_OF_BOUND",
            2006 => "CUDNN_STATUS_BAD_PARAM_SIZE_INSUFFICIENT",
            2007 => "CUDNN_STATUS_BAD_PARAM_STREAM_MISMATCH",
            2008 => "CUDNN_STATUS_BAD_PARAM_SHAPE_MISMATCH",
            2009 => "CUDNN_STATUS_BAD_PARAM_DUPLICATED_ENTRIES",
            2010 => "CUDNN_STATUS_BAD_PARAM_ATTRIBUTE_TYPE",
            2012 => "CUDNN_STATUS_BAD_PARAM_DESCRIPTOR_TYPE",
            3000 => "CUDNN_STATUS_NOT_SUPPORTED",
            3001 => "CUDNN_STATUS_NOT_SUPPORTED_GRAPH_PATTERN",
            3002 => "CUDNN_STATUS_NOT_SUPPORTED_SHAPE",
            3003 => "CUDNN_STATUS_NOT_SUPPORTED_DATA_TYPE",
            3004 => "CUDNN_STATUS_NOT_SUPPORTED_LAYOUT",
            3005 => "CUDNN_STATUS_NOT_SUPPORTED_INCOMPATIBLE_CUDA_DRIVER",
            3007 => "CUDNN_STATUS_NOT_SUPPORTED_ARCH_MISMATCH",
            3010 => "CUDNN_STATUS_NOT_SUPPORTED_SHARED_MEMORY_INSUFFICIENT",
            3011 => "CUDNN_STATUS_NOT_SUPPORTED_PADDING",
            4000 => "CUDNN_STATUS_INTERNAL_ERROR",
            4001 => "CUDNN_STATUS_INTERNAL_ERROR_COMPILATION_FAILED",
            4004 => "CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED",
            5000 => "CUDNN_STATUS_EXECUTION_FAILED",
            5001 => "CUDNN_STATUS_EXECUTION_FAILED_CUDA_DRIVER",
            _ => "",
        };
        if known.is_empty() {
            format!("CUDNN_STATUS_{}", self.0)
        } else {
            known.to_string()
        }
    }
}

impl fmt::Display for CudnnStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.name(), self.0)
    }
}

/// Every failure the crate reports. Nothing in the crate panics across the FFI boundary;
/// all CUDA, NVRTC and cuDNN statuses end up here. New variants may be added in minor
/// releases, so a `match` outside this crate needs a `_` arm.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A shared library could not be loaded.
    #[error("could not load {library}: tried {searched:?} on the dynamic loader's search path. {hint}")]
    LibraryNotFound {
        /// Which library (e.g. "libcudnn (cuDNN 9)").
        library: &'static str,
        /// File names handed to the dynamic loader, in order.
        searched: Vec<String>,
        /// What to install or set.
        hint: &'static str,
    },
    /// The library loaded but lacks a symbol we need (usually a too-old version).
    #[error("{library} is missing the symbol {symbol}: {hint}")]
    MissingSymbol {
        /// The library that was loaded.
        library: &'static str,
        /// The missing symbol.
        symbol: &'static str,
        /// What to do.
        hint: &'static str,
    },
    /// No usable CUDA device.
    #[error("no CUDA device available: {0}")]
    NoDevice(String),
    /// A CUDA driver call failed.
    #[error("CUDA driver error during {op}: {message}")]
    Cuda {
        /// What we were doing.
        op: &'static str,
        /// The driver's message.
        message: String,
    },
    /// Device memory could not be allocated.
    #[error("out of device memory during {op}: {bytes} bytes requested ({message})")]
    OutOfMemory {
        /// What we were doing.
        op: &'static str,
        /// Size of the failed request.
        bytes: usize,
        /// The driver's message.
        message: String,
    },
    /// NVRTC failed to compile a kernel.
    #[error("NVRTC failed to compile {kernel}: {log}")]
    Nvrtc {
        /// Kernel source name.
        kernel: &'static str,
        /// Compiler log.
        log: String,
    },
    /// A cuDNN call returned a failure status.
    #[error("cuDNN {call} failed with {status}{context}: {message}")]
    Cudnn {
        /// The cuDNN entry point.
        call: &'static str,
        /// Status returned.
        status: CudnnStatus,
        /// cuDNN's own last error string, if any.
        message: String,
        /// Where in our lowering it happened (attribute, op, graph).
        context: String,
    },
    /// A graph was rejected by `validate()`.
    #[error("invalid graph: {0}")]
    InvalidGraph(String),
    /// An argument to an `ops` entry point is inconsistent.
    #[error("invalid argument `{arg}` to {op}: {reason}")]
    InvalidArgument {
        /// The entry point.
        op: &'static str,
        /// The offending argument.
        arg: &'static str,
        /// Why it was rejected.
        reason: String,
    },
    /// No cuDNN engine (and no fallback) can run this graph under the current policy.
    #[error("no cuDNN engine supports {graph}: {reason}")]
    Unsupported {
        /// Short description of the graph.
        graph: String,
        /// What was tried.
        reason: String,
    },
    /// A framework operation (a Burn or Candle op) was given tensors or options it cannot
    /// take.
    #[error("{op}: {reason}")]
    InvalidInput {
        /// The framework operation.
        op: String,
        /// Why the input was rejected.
        reason: String,
    },
    /// An NCCL call returned a failure status.
    #[error("NCCL {call} failed with {status}: {message}")]
    Nccl {
        /// The NCCL entry point.
        call: &'static str,
        /// NCCL's name for the status.
        status: String,
        /// NCCL's last error message, if any.
        message: String,
    },
    /// A collective could not run or finish: a timeout, an aborted communicator, a unique id
    /// that could not be exchanged, buffers that do not match across ranks.
    #[error("collective {op}: {reason}")]
    Collective {
        /// The collective or setup step.
        op: &'static str,
        /// What went wrong and what to do.
        reason: String,
    },
    /// An error raised inside a framework operation, with that operation's name.
    #[error("{op}: {source}")]
    InOp {
        /// The framework operation.
        op: String,
        /// What failed.
        #[source]
        source: Box<Error>,
    },
}

/// [`Error::InOp`] context for results: `engine_call().in_op("float_matmul")?`.
pub trait InOp<T> {
    /// The error, if any, as raised inside the framework operation `op`.
    fn in_op(self, op: &str) -> Result<T>;
}

impl<T> InOp<T> for Result<T> {
    fn in_op(self, op: &str) -> Result<T> {
        self.map_err(|e| e.in_op(op))
    }
}

impl Error {
    /// Shorthand for [`Error::InvalidArgument`].
    pub fn invalid_arg(op: &'static str, arg: &'static str, reason: impl Into<String>) -> Self {
        Error::InvalidArgument {
            op,
            arg,
            reason: reason.into(),
        }
    }

    /// Shorthand for [`Error::InvalidInput`].
    pub fn invalid_input(op: &str, reason: impl Into<String>) -> Self {
        Error::InvalidInput {
            op: op.to_owned(),
            reason: reason.into(),
        }
    }

    /// The error as raised inside the framework operation `op` ([`Error::InOp`]); an error
    /// that already names `op` is returned as it is.
    pub fn in_op(self, op: &str) -> Self {
        match &self {
            Error::InvalidInput { op: o, .. } | Error::InOp { op: o, .. } if o == op => self,
            _ => Error::InOp {
                op: op.to_owned(),
                source: Box::new(self),
            },
        }
    }

    /// The error without the [`Error::InOp`] context around it.
    pub fn root(&self) -> &Error {
        match self {
            Error::InOp { source, .. } => source.root(),
            other => other,
        }
    }

    /// True when the error means "this configuration is not supported" (so a fallback may apply).
    pub fn is_not_supported(&self) -> bool {
        match self.root() {
            Error::Cudnn { status, .. } => status.is_not_supported(),
            Error::Unsupported { .. } => true,
            _ => false,
        }
    }

    /// Adds context to a cuDNN error (other errors pass through).
    pub fn with_context(self, ctx: impl fmt::Display) -> Self {
        match self {
            Error::Cudnn {
                call,
                status,
                message,
                context,
            } => Error::Cudnn {
                call,
                status,
                message,
                context: format!("{context} [{ctx}]"),
            },
            other => other,
        }
    }
}

impl From<cudarc::driver::DriverError> for Error {
    fn from(e: cudarc::driver::DriverError) -> Self {
        Error::Cuda {
            op: "driver call",
            message: e.to_string(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn operation_context_wraps_once_and_keeps_the_cause_visible() {
        let unsupported = Error::Unsupported {
            graph: "conv".into(),
            reason: "no engine".into(),
        };
        let e = unsupported.in_op("float_matmul").in_op("float_matmul");
        assert_eq!(e.to_string(), "float_matmul: no cuDNN engine supports conv: no engine");
        assert!(e.is_not_supported(), "the context does not hide a not-supported cause");
        assert!(matches!(e.root(), Error::Unsupported { .. }));
        let input = Error::invalid_input("reshape", "cannot reshape [2, 3] into [4]");
        assert_eq!(input.to_string(), "reshape: cannot reshape [2, 3] into [4]");
        assert_eq!(
            input.in_op("reshape").to_string(),
            "reshape: cannot reshape [2, 3] into [4]"
        );
        let r: Result<()> = Err(Error::invalid_arg("copy", "dst", "overlaps"));
        let e = r.in_op("float_add").unwrap_err();
        assert_eq!(e.to_string(), "float_add: invalid argument `dst` to copy: overlaps");
        assert!(!e.is_not_supported());
    }
}
