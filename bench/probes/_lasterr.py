import ctypes


def cuda_last_error() -> int:
    with open("/proc/self/maps") as maps:
        cudart = next(line.split()[-1] for line in maps if "libcudart.so" in line)
    return ctypes.CDLL(cudart).cudaGetLastError()
