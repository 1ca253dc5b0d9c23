"""Reads what the kernel says about a process's memory (Linux /proc)."""


def status_kib(field: str, pid: str | int = "self") -> int:
    """A `kB` field of /proc/PID/status, e.g. VmLck (locked) or VmSwap (swapped out)."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise KeyError(field)


def locked_bytes(pid: str | int = "self") -> int:
    return status_kib("VmLck", pid) * 1024


def mem_available() -> int:
    """The kernel's MemAvailable (/proc/meminfo), in bytes."""
    with open("/proc/meminfo") as meminfo:
        return next(int(line.split()[1]) * 1024 for line in meminfo if line.startswith("MemAvailable:"))
