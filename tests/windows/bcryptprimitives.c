/* Test support for running Rust's Windows test binaries under Wine 8 (Debian 12): Rust's
   standard library (1.78+) imports ProcessPrng from bcryptprimitives.dll, which Wine 8 lacks.
   This stand-in gives it from RtlGenRandom (advapi32's SystemFunction036), which Wine has.
   Never shipped: only placed next to the test executables. */
#include <windows.h>

BOOLEAN WINAPI SystemFunction036(PVOID buffer, ULONG length);

__declspec(dllexport) BOOL WINAPI ProcessPrng(PBYTE data, SIZE_T length) {
    while (length > 0) {
        ULONG chunk = length > 0x40000000 ? 0x40000000 : (ULONG)length;
        if (!SystemFunction036(data, chunk)) return FALSE;
        data += chunk;
        length -= chunk;
    }
    return TRUE;
}
