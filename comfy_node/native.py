"""The one place that imports the native module. If it is missing, the nodes still register
and tell the user how to install it."""

try:
    import viking_native as native
    IMPORT_ERROR = None
except ImportError as error:  # not built/installed yet
    native = None
    IMPORT_ERROR = error

INSTALL_HINT = (
    "Viking Engine's native module is not installed. In the Python that runs ComfyUI, run "
    "`python -m pip install .` inside custom_nodes/viking_engine (needs Rust: https://rustup.rs)."
)


def require():
    """The native module, or a RuntimeError that says how to install it."""
    if native is None:
        raise RuntimeError(f"{INSTALL_HINT} (import error: {IMPORT_ERROR})")
    return native
