"""The C allocator's settings for a serving process (glibc only; elsewhere nothing changes).

glibc serves an allocation of at least its *mmap threshold* (128 KiB at start) with a mapping
of its own, returned to the system when freed; smaller ones come from its heap, whose freed
pages mostly stay with the process.  By default the threshold moves: each freed mapping up to
32 MiB raises it to that size.  In a proxy that is a trap — one freed 1 MiB buffer, and every
later answer body, reply and result under 1 MiB lands in the heap, so a 60 MiB batch answer
freed leaves its pages resident and the next one needs fresh ones (measured: a 500-call batch
of 0.6 MiB results peaked at +175 MiB instead of +118; docs/decisions/hardening.md, "Batch
memory").  Setting the threshold pins it (glibc then never moves it): big buffers always go
back to the system when freed.  The cost is a page-faulted mapping per big buffer, small
beside copying the buffer.
"""

from __future__ import annotations

import ctypes
import platform

M_MMAP_THRESHOLD = -3  # mallopt's parameter number (malloc.h)
MMAP_THRESHOLD = 128 << 10  # glibc's own initial value, held fixed


def pin_mmap_threshold() -> bool:
    """Fix glibc's mmap threshold; False where the C library is not glibc (or refuses)."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    try:
        libc = ctypes.CDLL(None)
        return bool(libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD))
    except (OSError, AttributeError):
        return False
