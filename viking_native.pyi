"""Typed stub of the native module `viking_native` (src/python.rs), shipped in the wheel.
The JSON strings it returns follow comfy_node/contract.py (Report, NativeStatus)."""

from typing import Any, Iterable, Optional, Sequence, Tuple

__version__: str
__source_hash__: str  # fnv1a64 of the native source it was built from (build.rs)

class VikingNativeError(RuntimeError):
    """A pin or release failed."""

class BackendUnavailableError(VikingNativeError):
    """The requested backend cannot run here."""

class FileView:
    """A shared read-only view of part of a file; unmapped when the last reference goes. Pass
    it as the keepalive of the ranges that lie in it."""
    @property
    def addr(self) -> int: ...
    @property
    def len(self) -> int: ...
    def resident_bytes(self) -> Optional[int]: ...

class MappedView:
    """A range of a CUDA registration of Viking's at its device address (DEVICEMAP): the GPU
    reads the pinned host bytes in place. `torch.as_tensor(view, device="cuda")` gives a uint8
    CUDA tensor over them with no copy (torch's tensor holds the view). Lifetime: while a view
    lives, its registration never ends; release(), release_all(), pressure relief and a lower
    budget skip it, and it stays counted (status: mapped_view_bytes). Once the last view is
    gone, the next reconcile of its owner, release or pressure round releases what is due."""
    @property
    def device_addr(self) -> int: ...
    @property
    def host_addr(self) -> int: ...
    @property
    def nbytes(self) -> int: ...
    @property
    def __cuda_array_interface__(self) -> dict: ...

def mapped_view(addr: int, length: int) -> MappedView:
    """A MappedView of [addr, addr+length), inside one CUDA registration of Viking's; ValueError
    when no pin of Viking's holds it whole (or it is still being made), BackendUnavailableError
    when the OS lock holds it (no device address)."""

def configure(budget_gib: float = 0.0, share: float = 0.0, headroom_gib: float = -1.0, device: int = 0,
              cuda_devicemap: Optional[bool] = None) -> None:
    """The shared budget (for all models): budget_gib (0 = auto) or a share of RAM; headroom_gib
    (negative = auto); the CUDA device; PORTABLE|DEVICEMAP (True) or PORTABLE only (False)."""

def set_headroom(headroom_gib: float) -> None:
    """Only the shared headroom (RAM kept un-pinned; negative = auto); the limit and device stay."""

def reconcile(owner: int, ranges: Iterable[Tuple[int, int, Any]], priority: int = 0, backend: str = "auto",
              label: str = "", model_limit_gib: float = 0.0, foreign: Sequence[Tuple[int, int]] = (),
              others_pinned_bytes: int = 0) -> str:
    """Makes `owner`'s pins match `ranges` ((data_ptr, nbytes, keepalive) each); returns a
    contract.Report as JSON. model_limit_gib: this model's own limit (0: none)."""

def release(owner: int) -> int: ...
def release_all() -> int: ...
def settle(timeout_s: float = 30.0) -> bool:
    """Waits for the pins made off the caller's thread (read-only file pages); True when done."""
def deferred_failures() -> int:
    """How many pins made off the caller's thread have failed so far."""
def status_json(probe_cuda: bool = False, mark_run: bool = False, residency: bool = True) -> str:
    """A contract.NativeStatus as JSON; residency=False skips the page-table reads (each owner's
    resident / swapped figures None)."""
def cuda_device_count() -> int: ...
def device_pointer(addr: int) -> int: ...
def gib_to_bytes(name: str, gib: float) -> int:
    """The one rule for sizes in GiB: 0 to 1048576; ValueError naming `name` otherwise."""
def relieve_pressure() -> int:
    """Gives back the pins above the budget (the pressure governor's ceiling while the machine
    stalls), lowest priority first; returns the bytes. The monitor thread samples the pressure."""
def map_file(fd: int, offset: int, length: int) -> "FileView":
    """A read-only view sharing the cached pages of [offset, offset+length) of the open file
    `fd` (a file descriptor; on Windows a file HANDLE) (offset page aligned); ValueError when
    the file is shorter (replaced or truncated on disk)."""
def resident_bytes(addr: int, length: int) -> Optional[int]:
    """Bytes of the range whose pages are in RAM (mincore; a file mapping's page cache counts)."""
def note_foreign_pins(bytes: int) -> None: ...
def budget_json() -> str:
    """{"memory": ..., "budget": ...} as JSON (contract.Memory, contract.Budget)."""
def set_monitor_releases(on: bool) -> None: ...
def _set_faults(fail_pin_nth: int = 0, fail_unpin_nth: int = 0, device_lost: bool = False) -> None: ...
