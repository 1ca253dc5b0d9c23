//! The Python module `viking_native`: thin functions over the engine. Plain integers and
//! strings in, JSON strings out; no torch here and no planning in Python.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, OnceLock};

use pyo3::create_exception;
use pyo3::exceptions::{PyRuntimeError, PyTypeError, PyValueError};
use pyo3::prelude::*;

use crate::backend::cuda;
use crate::backend::faults::Faults;
use crate::backend::file_view;
use crate::backend::mapped;
use crate::backend::BackendChoice;
use crate::budget::{self, Policy};
use crate::engine::{Engine, Request};
use crate::error::VikingError;
use crate::ledger::Keepalive;

create_exception!(viking_native, VikingNativeError, PyRuntimeError, "A pin or release failed.");
create_exception!(viking_native, BackendUnavailableError, VikingNativeError, "The requested backend cannot run here.");

/// The one mapping from Rust errors to Python exceptions.
impl From<VikingError> for PyErr {
    fn from(error: VikingError) -> PyErr {
        let message = error.to_string();
        match error {
            VikingError::InvalidInput(_) => PyValueError::new_err(message),
            VikingError::BackendUnavailable { .. } => BackendUnavailableError::new_err(message),
            VikingError::Cuda { .. } | VikingError::Os { .. } | VikingError::Internal(_) => VikingNativeError::new_err(message),
        }
    }
}

fn engine() -> &'static Engine {
    static ENGINE: OnceLock<Engine> = OnceLock::new();
    ENGINE.get_or_init(Engine::new)
}

/// Runs `work` without the GIL and turns a panic into a Python exception: no Rust panic may
/// cross into Python (ComfyUI's loader does not catch PanicException).
fn guarded<T: Send>(py: Python<'_>, work: impl FnOnce() -> Result<T, VikingError> + Send) -> PyResult<T> {
    let outcome = py.detach(|| catch_unwind(AssertUnwindSafe(work)));
    match outcome {
        Ok(result) => result.map_err(PyErr::from),
        Err(panic) => {
            let text = panic.downcast_ref::<&str>().map(|s| s.to_string()).or_else(|| panic.downcast_ref::<String>().cloned()).unwrap_or_default();
            Err(VikingError::Internal(format!("panic: {text}")).into())
        }
    }
}

fn to_json<T: serde::Serialize>(value: &T) -> Result<String, VikingError> {
    serde_json::to_string(value).map_err(|e| VikingError::Internal(format!("json: {e}")))
}

/// An integer argument that must fit in 0..=u64::MAX, with a message naming it.
fn address_like(value: &Bound<'_, PyAny>, what: &str) -> PyResult<u64> {
    let number: i128 = value.extract().map_err(|_| PyTypeError::new_err(format!("{what} must be an int, got {}", value.get_type())))?;
    u64::try_from(number).map_err(|_| PyValueError::new_err(format!("{what} is {number}; it must be between 0 and 2**64-1")))
}

/// The one rule for sizes in GiB (see `budget::gib_to_bytes`), for the node inputs that only
/// Python uses (a VRAM cap): bytes, or ValueError with what to change.
#[pyfunction]
fn gib_to_bytes(name: &str, gib: f64) -> PyResult<u64> {
    Ok(budget::gib_to_bytes(name, gib)?)
}

/// Sets the shared budget. budget_gib: 0 = auto; share: of RAM, 0 = unused; headroom_gib:
/// RAM to keep un-pinned, negative = auto; device: the CUDA device to register with;
/// cuda_devicemap: CUDA registrations also map into the device (PORTABLE|DEVICEMAP, the
/// default; False: PORTABLE only, as ComfyUI's own pinning; None: leave as it is).
#[pyfunction]
#[pyo3(signature = (budget_gib = 0.0, share = 0.0, headroom_gib = -1.0, device = 0, cuda_devicemap = None))]
fn configure(py: Python<'_>, budget_gib: f64, share: f64, headroom_gib: f64, device: i64, cuda_devicemap: Option<bool>) -> PyResult<()> {
    let policy = Policy::from_user(budget_gib, share, headroom_gib)?;
    let device = i32::try_from(device).map_err(|_| PyValueError::new_err(format!("device {device} does not exist")))?;
    guarded(py, || engine().configure(policy, device, cuda_devicemap))
}

/// Sets only the shared headroom (RAM kept un-pinned; negative = auto), not the limit or the
/// device as `configure` does.
#[pyfunction]
fn set_headroom(py: Python<'_>, headroom_gib: f64) -> PyResult<()> {
    let headroom_bytes = if headroom_gib < 0.0 { None } else { Some(budget::gib_to_bytes("headroom_gib", headroom_gib)?) };
    guarded(py, || {
        engine().set_headroom(headroom_bytes);
        Ok(())
    })
}

/// Makes `owner`'s pins match `ranges` (an iterable of (data_ptr, nbytes, keepalive) whose
/// keepalive owns the memory, e.g. the tensor's untyped storage). `model_limit_gib`: this
/// model's own limit (0: none; the shared budget is `configure(budget_gib=...)`). `foreign`:
/// ranges seen pinned (ComfyUI's, or any `is_pinned()` storage: Viking's own are taken out).
/// Returns the report as JSON.
#[pyfunction]
#[pyo3(signature = (owner, ranges, priority = 0, backend = "auto", label = "", model_limit_gib = 0.0, foreign = Vec::new(), others_pinned_bytes = 0))]
#[allow(clippy::too_many_arguments)]
fn reconcile(
    py: Python<'_>,
    owner: u64,
    ranges: &Bound<'_, PyAny>,
    priority: i32,
    backend: &str,
    label: &str,
    model_limit_gib: f64,
    foreign: Vec<(Bound<'_, PyAny>, Bound<'_, PyAny>)>,
    others_pinned_bytes: u64,
) -> PyResult<String> {
    let backend = BackendChoice::parse(backend)?;
    let model_limit_bytes = Some(budget::gib_to_bytes("model_limit_gib", model_limit_gib)?).filter(|&bytes| bytes > 0);
    let mut parsed = Vec::new();
    for (index, item) in ranges.try_iter()?.enumerate() {
        let item = item?;
        let shape_error = || PyTypeError::new_err(format!("ranges[{index}] must be a tuple (data_ptr: int, nbytes: int, keepalive)"));
        let (addr, len, keep): (Bound<'_, PyAny>, Bound<'_, PyAny>, Py<PyAny>) = item.extract().map_err(|_| shape_error())?;
        let addr = address_like(&addr, &format!("ranges[{index}].data_ptr"))?;
        let len = address_like(&len, &format!("ranges[{index}].nbytes"))?;
        parsed.push((addr, len, Arc::new(keep) as Keepalive));
    }
    let mut foreign_ranges = Vec::new();
    for (index, (addr, len)) in foreign.iter().enumerate() {
        foreign_ranges.push((address_like(addr, &format!("foreign[{index}].ptr"))?, address_like(len, &format!("foreign[{index}].nbytes"))?));
    }
    let request = Request { owner, label: label.to_owned(), priority, backend, model_limit_bytes, ranges: parsed, foreign: foreign_ranges, others_pinned_bytes };
    guarded(py, || engine().reconcile(request).and_then(|report| to_json(&report)))
}

/// Waits until the pins made off the caller's thread (read-only file pages; see
/// backend/deferred.rs) are done, at most `timeout_s` seconds. Returns whether they all are.
#[pyfunction]
#[pyo3(signature = (timeout_s = 30.0))]
fn settle(py: Python<'_>, timeout_s: f64) -> PyResult<bool> {
    if !(timeout_s.is_finite() && timeout_s >= 0.0) {
        return Err(VikingError::invalid(format!("timeout_s must be a number of seconds, 0 or more; got {timeout_s}")).into());
    }
    guarded(py, || Ok(engine().settle(std::time::Duration::from_secs_f64(timeout_s.min(86_400.0)))))
}

/// How many pins made off the caller's thread have failed so far (their owner's next
/// reconcile reports them): a cheap number to notice that one is due.
#[pyfunction]
fn deferred_failures() -> u64 {
    engine().deferred_failures()
}

/// Releases every pin of `owner`. Returns the bytes released.
#[pyfunction]
fn release(py: Python<'_>, owner: u64) -> PyResult<u64> {
    guarded(py, || Ok(engine().release_owner(owner)))
}

/// Releases every pin. Returns the bytes released.
#[pyfunction]
fn release_all(py: Python<'_>) -> PyResult<u64> {
    guarded(py, || Ok(engine().release_all()))
}

/// The status snapshot as JSON. probe_cuda: open the CUDA device to describe it. mark_run:
/// start a new "since the last run" period for the paging counters (the status node does).
/// residency: read every pinned range's page tables for its owner's residency figures (~24 ms
/// per GiB); False leaves them None.
#[pyfunction]
#[pyo3(signature = (probe_cuda = false, mark_run = false, residency = true))]
fn status_json(py: Python<'_>, probe_cuda: bool, mark_run: bool, residency: bool) -> PyResult<String> {
    guarded(py, || to_json(&engine().status_reading(probe_cuda, mark_run, residency)))
}

/// Number of CUDA devices (0 without a driver or GPU). Never raises.
#[pyfunction]
fn cuda_device_count(py: Python<'_>) -> PyResult<i32> {
    guarded(py, || Ok(cuda::device_count()))
}

/// The device address of pinned host memory at `addr` (CUDA backend only).
#[pyfunction]
fn device_pointer(py: Python<'_>, addr: &Bound<'_, PyAny>) -> PyResult<u64> {
    let addr = address_like(addr, "addr")?;
    guarded(py, || engine().device_pointer(addr))
}

/// Relieves memory pressure now: releases the lowest-priority pins above the budget (the
/// pressure governor's ceiling while the machine stalls). Returns the bytes released. The
/// caller picks a moment when no copy to the GPU can read them (ComfyUI's side: its execution
/// thread, or while no prompt runs).
#[pyfunction]
fn relieve_pressure(py: Python<'_>) -> PyResult<u64> {
    guarded(py, || Ok(engine().relieve_pressure()))
}

/// Whether the native pressure monitor (a thread, twice a second) releases pins itself
/// (True, the default) or leaves it to `relieve_pressure()` calls.
#[pyfunction]
fn set_monitor_releases(on: bool) {
    engine().set_monitor_releases(on);
}

/// A shared, read-only view of part of an open file (see backend/file_view.rs), unmapped when
/// the last reference goes. Pass it as the keepalive of the ranges it holds.
#[pyclass(module = "viking_native", frozen, name = "FileView")]
struct FileView {
    view: file_view::FileView,
}

#[pymethods]
impl FileView {
    #[getter]
    fn addr(&self) -> u64 {
        self.view.addr()
    }
    #[getter]
    fn len(&self) -> u64 {
        self.view.len()
    }
    /// Bytes of the view whose file pages are in RAM now (None where that cannot be read).
    fn resident_bytes(&self) -> Option<u64> {
        self.view.resident_bytes()
    }
}

/// A range of a CUDA registration of Viking's as the GPU sees it (its device address: the
/// registrations carry DEVICEMAP), for torch through `__cuda_array_interface__` as bytes:
/// `torch.as_tensor(view, device="cuda")` is a uint8 CUDA tensor over the pinned host memory,
/// with no copy. The view holds its registration: it cannot end (release, pressure relief, a
/// lower budget) while this object lives, and torch's tensor holds this object.
#[pyclass(module = "viking_native", frozen, name = "MappedView")]
struct MappedView {
    view: mapped::MappedView,
}

#[pymethods]
impl MappedView {
    #[getter]
    fn device_addr(&self) -> u64 {
        self.view.device_addr
    }
    #[getter]
    fn host_addr(&self) -> u64 {
        self.view.host_addr
    }
    #[getter]
    fn nbytes(&self) -> u64 {
        self.view.len
    }
    /// Version 3 of the CUDA array interface: one dimension of bytes. Not read-only (torch
    /// refuses that flag); nothing Viking hands it to writes weights in place. No stream: the
    /// bytes were written by the CPU before the view existed.
    #[getter]
    fn __cuda_array_interface__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, pyo3::types::PyDict>> {
        let interface = pyo3::types::PyDict::new(py);
        interface.set_item("shape", (self.view.len,))?;
        interface.set_item("typestr", "|u1")?;
        interface.set_item("data", (self.view.device_addr, false))?;
        interface.set_item("strides", py.None())?;
        interface.set_item("stream", py.None())?;
        interface.set_item("version", 3)?;
        Ok(interface)
    }
}

/// A mapped view of `[addr, addr+length)`, which must lie inside one CUDA registration of
/// Viking's (a pinned model's storage). ValueError when no such pin holds it;
/// BackendUnavailableError when the OS lock holds it (no device address there).
#[pyfunction]
fn mapped_view(py: Python<'_>, addr: &Bound<'_, PyAny>, length: &Bound<'_, PyAny>) -> PyResult<MappedView> {
    let (addr, length) = (address_like(addr, "addr")?, address_like(length, "length")?);
    guarded(py, || engine().mapped_view(addr, length)).map(|view| MappedView { view })
}

/// Maps `[offset, offset+length)` of the open file `fd` (a file descriptor on Unix, a file
/// HANDLE on Windows) read-only, sharing the file's cached pages (offset a multiple of the page
/// size). ValueError when the file is shorter (replaced or truncated).
#[pyfunction]
fn map_file(py: Python<'_>, fd: i64, offset: u64, length: u64) -> PyResult<FileView> {
    guarded(py, || file_view::FileView::open(fd, offset, length)).map(|view| FileView { view })
}

/// Bytes of `[addr, addr+length)` whose pages are in RAM now (mincore: a file mapping's pages
/// count when they are in the page cache, mapped here or not). None where that cannot be read.
#[pyfunction]
fn resident_bytes(py: Python<'_>, addr: &Bound<'_, PyAny>, length: &Bound<'_, PyAny>) -> PyResult<Option<u64>> {
    let (addr, length) = (address_like(addr, "addr")?, address_like(length, "length")?);
    guarded(py, || Ok(crate::sys::os::resident_in_ram(addr, length)))
}

/// What others in this process hold pinned now (ComfyUI's total), for the budget between
/// reconciles.
#[pyfunction]
fn note_foreign_pins(py: Python<'_>, bytes: u64) -> PyResult<()> {
    // The GIL is let go while it waits for the engine's lock: a status or a pin on another
    // thread must not stop every Python thread.
    guarded(py, || {
        engine().note_foreign_pins(bytes);
        Ok(())
    })
}

/// The memory snapshot and the budget now, as JSON {"memory": ..., "budget": ...}: what the
/// status has, without its per-model figures (cheap enough to ask twice a second).
#[pyfunction]
fn budget_json(py: Python<'_>) -> PyResult<String> {
    guarded(py, || {
        let (memory, budget) = engine().budget_now();
        to_json(&serde_json::json!({"memory": memory, "budget": budget}))
    })
}

/// Test-only fault injection: fail the Nth pin / unpin from now, or act as if the device
/// were lost. All zero / False switches it off.
#[pyfunction]
#[pyo3(signature = (fail_pin_nth = 0, fail_unpin_nth = 0, device_lost = false))]
fn _set_faults(fail_pin_nth: u64, fail_unpin_nth: u64, device_lost: bool) {
    engine().set_faults(Faults { fail_pin_nth, fail_unpin_nth, device_lost });
}

/// Twice a second: one sample of the memory pressure for the governor (pressure.rs), then the
/// pins above its ceiling released, lowest priority first (unless the caller took that over:
/// `set_monitor_releases(False)`).
fn start_pressure_monitor() {
    static STARTED: OnceLock<()> = OnceLock::new();
    STARTED.get_or_init(|| {
        let _ = std::thread::Builder::new().name("viking-pressure".into()).spawn(|| loop {
            std::thread::sleep(std::time::Duration::from_millis(500));
            // A panic here must not kill the thread's loop or cross into Python.
            let _ = catch_unwind(|| engine().monitor_round());
        });
    });
}

#[pymodule]
fn viking_native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add("__source_hash__", env!("VIKING_SOURCE_HASH"))?;
    m.add("VikingNativeError", m.py().get_type::<VikingNativeError>())?;
    m.add("BackendUnavailableError", m.py().get_type::<BackendUnavailableError>())?;
    m.add_function(wrap_pyfunction!(configure, m)?)?;
    m.add_function(wrap_pyfunction!(set_headroom, m)?)?;
    m.add_function(wrap_pyfunction!(reconcile, m)?)?;
    m.add_function(wrap_pyfunction!(release, m)?)?;
    m.add_function(wrap_pyfunction!(release_all, m)?)?;
    m.add_function(wrap_pyfunction!(settle, m)?)?;
    m.add_function(wrap_pyfunction!(deferred_failures, m)?)?;
    m.add_function(wrap_pyfunction!(status_json, m)?)?;
    m.add_function(wrap_pyfunction!(cuda_device_count, m)?)?;
    m.add_function(wrap_pyfunction!(device_pointer, m)?)?;
    m.add_function(wrap_pyfunction!(relieve_pressure, m)?)?;
    m.add_function(wrap_pyfunction!(set_monitor_releases, m)?)?;
    m.add_function(wrap_pyfunction!(gib_to_bytes, m)?)?;
    m.add_function(wrap_pyfunction!(map_file, m)?)?;
    m.add_function(wrap_pyfunction!(resident_bytes, m)?)?;
    m.add_function(wrap_pyfunction!(note_foreign_pins, m)?)?;
    m.add_function(wrap_pyfunction!(budget_json, m)?)?;
    m.add_class::<FileView>()?;
    m.add_function(wrap_pyfunction!(mapped_view, m)?)?;
    m.add_class::<MappedView>()?;
    m.add_function(wrap_pyfunction!(_set_faults, m)?)?;
    start_pressure_monitor();
    // Release every pin at interpreter exit, while the memory is still alive.
    m.py().import("atexit")?.call_method1("register", (m.getattr("release_all")?,))?;
    Ok(())
}
