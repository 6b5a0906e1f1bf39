"""ctypes bindings of ggml's quantizer, from the libggml-base that llama-cpp-python ships.

Quantizing with the very library that later runs the model keeps the bit layout exact and avoids
a pure-Python quantization loop. ctypes releases the GIL for the duration of each call, so a
thread pool quantizes row blocks on every core.
"""

from __future__ import annotations

import ctypes
import importlib.util
from functools import cache
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType

from .errors import ConvertError

_LIB_NAMES = ("libggml-base.so", "libggml-base.dylib", "ggml-base.dll")
_f32p = ctypes.POINTER(ctypes.c_float)


def find_library() -> Path:
    """libggml-base inside the installed `llama_cpp` package."""
    spec = importlib.util.find_spec("llama_cpp")
    if spec is None or not spec.submodule_search_locations:
        raise ConvertError(
            "quantized output types need llama-cpp-python (its libggml-base); "
            "install it or choose --outtype f32, f16 or bf16"
        )
    for root in spec.submodule_search_locations:
        for name in _LIB_NAMES:
            path = Path(root) / "lib" / name
            if path.is_file():
                return path
    raise ConvertError(f"llama-cpp-python is installed but has no lib/{_LIB_NAMES[0]}")


class Ggml:
    """The few ggml functions the converter calls, one binding each (C prototype above it)."""

    def __init__(self, path: Path):
        lib = ctypes.CDLL(str(path))
        # size_t ggml_row_size(enum ggml_type type, int64_t ne);
        lib.ggml_row_size.argtypes = [ctypes.c_int, ctypes.c_int64]
        lib.ggml_row_size.restype = ctypes.c_size_t
        # bool ggml_quantize_requires_imatrix(enum ggml_type type);
        lib.ggml_quantize_requires_imatrix.argtypes = [ctypes.c_int]
        lib.ggml_quantize_requires_imatrix.restype = ctypes.c_bool
        # void ggml_quantize_init(enum ggml_type type);
        lib.ggml_quantize_init.argtypes = [ctypes.c_int]
        lib.ggml_quantize_init.restype = None
        # size_t ggml_quantize_chunk(enum ggml_type type, const float * src, void * dst,
        #                            int64_t start, int64_t nrows, int64_t n_per_row, const float * imatrix);
        lib.ggml_quantize_chunk.argtypes = [
            ctypes.c_int,
            _f32p,
            ctypes.c_void_p,
            ctypes.c_int64,
            ctypes.c_int64,
            ctypes.c_int64,
            _f32p,
        ]
        lib.ggml_quantize_chunk.restype = ctypes.c_size_t
        # void ggml_bf16_to_fp32_row(const ggml_bf16_t * x, float * y, int64_t n);
        lib.ggml_bf16_to_fp32_row.argtypes = [ctypes.c_void_p, _f32p, ctypes.c_int64]
        lib.ggml_bf16_to_fp32_row.restype = None
        self.lib = lib
        self.path = path

    def row_size(self, qtype: GGMLQuantizationType, n: int) -> int:
        return int(self.lib.ggml_row_size(int(qtype), n))

    def requires_imatrix(self, qtype: GGMLQuantizationType) -> bool:
        return bool(self.lib.ggml_quantize_requires_imatrix(int(qtype)))

    def init(self, qtype: GGMLQuantizationType) -> None:
        """Build the type's tables once, before worker threads race to do it."""
        self.lib.ggml_quantize_init(int(qtype))

    def quantize_rows(
        self, qtype: GGMLQuantizationType, src: np.ndarray, dst: np.ndarray, imatrix: np.ndarray | None
    ) -> int:
        """Quantize the rows of a C-contiguous float32 [rows, n] array into `dst` (uint8)."""
        rows, n = src.shape
        imat = None if imatrix is None else imatrix.ctypes.data_as(_f32p)
        return int(
            self.lib.ggml_quantize_chunk(
                int(qtype), src.ctypes.data_as(_f32p), dst.ctypes.data, 0, rows, n, imat
            )
        )

    def bf16_to_f32(self, src: np.ndarray, dst: np.ndarray) -> None:
        """Widen C-contiguous BF16 bit patterns (uint16) into float32 `dst` of the same size."""
        self.lib.ggml_bf16_to_fp32_row(src.ctypes.data, dst.ctypes.data_as(_f32p), src.size)


@cache
def load() -> Ggml:
    """The process-wide binding (loading a shared library twice gains nothing)."""
    return Ggml(find_library())
