//! The thin unsafe layer: raw calls into the CUDA driver (through cudarc's `driver::sys`) and the
//! OS. Each function does one call and turns its status into a `Result`; no policy lives here.

pub mod cuda;
pub mod os;
pub mod pressure;
