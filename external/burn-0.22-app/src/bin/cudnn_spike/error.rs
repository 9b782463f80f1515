//! The spike's error type: every failure on a CUDA path is a value that reaches `main`.

use std::fmt;

/// Why the spike stopped.
#[derive(Debug)]
pub enum SpikeError {
    /// The command line is wrong: `main` prints the usage and exits with status 2.
    Usage(String),
    /// The machine lacks something the program needs (driver, GPU, cuDNN, NVRTC, CUDA headers):
    /// `main` exits with status 2.
    Setup(String),
    /// A failure of the engine, the driver, CubeCL or Burn, with where it happened.
    Run(String),
}

/// The spike's result type.
pub type Result<T, E = SpikeError> = std::result::Result<T, E>;

impl SpikeError {
    /// A run failure: `context` names the step, `err` is its cause.
    pub fn run(context: &str, err: impl fmt::Display) -> Self {
        SpikeError::Run(format!("{context}: {err}"))
    }
}

impl fmt::Display for SpikeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SpikeError::Usage(msg) => write!(f, "{msg}"),
            SpikeError::Setup(msg) => write!(f, "setup: {msg}"),
            SpikeError::Run(msg) => write!(f, "{msg}"),
        }
    }
}

impl std::error::Error for SpikeError {}

impl From<cudnn_backend_core::Error> for SpikeError {
    fn from(e: cudnn_backend_core::Error) -> Self {
        SpikeError::run("cudnn-backend-core", e)
    }
}
