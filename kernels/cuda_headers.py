"""Where CUDA's own headers are (cuda_fp16.h and kin), for NVRTC's include path.

NVRTC ships none of them: a kernel that includes <cuda_fp16.h> compiles only with `-I` to a
CUDA toolkit's include folder. Looked for in order: `VRAMFABRIC_CUDA_INCLUDE` (read by the
caller's settings), the nvidia-cuda-runtime wheel (the `cuda` extra installs the one that
matches NVRTC), cuda-pathfinder's search (CUDA_HOME, /usr/local/cuda), then the folder
beside the `nvcc` on PATH.
"""

from __future__ import annotations

import functools
import importlib
import shutil
from pathlib import Path

_MARKER = "cuda_fp16.h"


@functools.cache
def cuda_include(configured: str = "") -> Path | None:
    """The folder holding cuda_fp16.h, or None when there is no CUDA toolkit's headers here."""
    for found in (_configured(configured), _wheel(), _pathfinder(), _nvcc()):
        if found is not None and (found / _MARKER).is_file():
            return found
    return None


def _configured(text: str) -> Path | None:
    return Path(text) if text else None


def _wheel() -> Path | None:
    try:
        module = importlib.import_module("nvidia.cuda_runtime")
    except ImportError:
        return None
    for folder in getattr(module, "__path__", []):
        if (Path(folder) / "include").is_dir():
            return Path(folder) / "include"
    return None


def _pathfinder() -> Path | None:
    try:
        pathfinder = importlib.import_module("cuda.pathfinder")
        found = pathfinder.find_nvidia_header_directory("cudart")
    except Exception:  # an absent or older pathfinder: recorded as "not found"
        return None
    return Path(found) if found else None


def _nvcc() -> Path | None:
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        return None
    path = Path(nvcc).resolve()
    candidates = [path.parent.parent / "include"]
    # A wrapper script (`exec /usr/local/cuda-13.0/bin/nvcc "$@"`) names the real one.
    try:
        text = path.read_text(errors="replace")[:4096] if path.stat().st_size < 4096 else ""
    except OSError:
        text = ""
    for word in text.split():
        if word.endswith("/bin/nvcc"):
            candidates.append(Path(word).parent.parent / "include")
    return next((c for c in candidates if (c / _MARKER).is_file()), None)
