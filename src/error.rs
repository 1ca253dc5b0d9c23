//! The one error type of the crate. `python.rs` maps it to Python exceptions in one place.

use std::fmt;

#[derive(Debug, Clone, PartialEq)]
pub enum VikingError {
    /// The caller passed something unusable; the message says what to change.
    InvalidInput(String),
    /// A backend cannot run on this machine (no libcuda, no GPU, not Unix...).
    BackendUnavailable { backend: &'static str, reason: String },
    /// A CUDA driver call failed. `code` is the CUresult number (712: already registered).
    Cuda { call: &'static str, code: i32, name: String },
    /// An operating-system call failed. `errno` as reported by the OS.
    Os { call: &'static str, errno: i32, message: String },
    /// A bug in Viking (a caught panic, a broken invariant). Never the user's fault.
    Internal(String),
}

pub type Result<T> = std::result::Result<T, VikingError>;

impl VikingError {
    pub fn invalid(message: impl Into<String>) -> Self {
        VikingError::InvalidInput(message.into())
    }
}

impl fmt::Display for VikingError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            VikingError::InvalidInput(message) => write!(f, "{message}"),
            VikingError::BackendUnavailable { backend, reason } => {
                write!(f, "the {backend} backend is unavailable: {reason}")
            }
            VikingError::Cuda { call, code, name } => write!(f, "{call} failed with CUDA error {code} ({name})"),
            VikingError::Os { call, errno, message } => write!(f, "{call} failed: {message} (errno {errno})"),
            VikingError::Internal(message) => write!(f, "internal error in Viking Engine (please report): {message}"),
        }
    }
}

impl std::error::Error for VikingError {}
