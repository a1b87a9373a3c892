"""Which onnxruntime execution provider can run here: CUDA only where it can really start.

The onnxruntime-gpu wheel lists ``CUDAExecutionProvider`` everywhere; where the CUDA libraries
or a GPU are missing, asking for it prints red errors and runs on the CPU anyway. Loading the
provider's library and asking the driver for a device answers quietly, once per process.
"""

from __future__ import annotations

import ctypes
import logging
import sys
from functools import cache
from pathlib import Path

try:
    import onnxruntime as ort
except ImportError as exc:  # pragma: no cover - depends on the install
    raise ImportError(
        "allocator.serving needs onnxruntime: install `allocator[serve]` (onnxruntime-gpu)"
    ) from exc

logger = logging.getLogger("allocator.serving")

CUDA = "CUDAExecutionProvider"
CPU = "CPUExecutionProvider"

CUDA_DRIVER = "nvcuda.dll" if sys.platform == "win32" else "libcuda.so.1"


def cuda_provider_library() -> Path:
    name = (
        "onnxruntime_providers_cuda.dll"
        if sys.platform == "win32"
        else "libonnxruntime_providers_cuda.so"
    )
    return Path(ort.__file__).parent / "capi" / name


def cuda_unavailable_reason() -> str | None:
    """Why onnxruntime's CUDA provider cannot run here, or ``None`` when it can."""
    if CUDA not in ort.get_available_providers():
        return "this onnxruntime build has no CUDA provider"
    library = cuda_provider_library()
    try:
        ctypes.CDLL(str(library))  # what onnxruntime would do, minus the red error on failure
    except OSError as exc:
        return str(exc).replace(f"{library}: ", "")
    try:
        driver = ctypes.CDLL(CUDA_DRIVER)
    except OSError:
        return f"no NVIDIA driver ({CUDA_DRIVER} not found)"
    count = ctypes.c_int(0)
    if driver.cuInit(0) or driver.cuDeviceGetCount(ctypes.byref(count)) or count.value < 1:
        return "the CUDA driver sees no GPU"
    return None


@cache
def cuda_usable() -> bool:
    """Whether to ask onnxruntime for CUDA; when not, say why once."""
    reason = cuda_unavailable_reason()
    if reason is not None:
        logger.info(
            "onnxruntime's CUDA provider cannot run here (%s): models run on the CPU", reason
        )
    return reason is None
