"""ctypes bindings of the Clover C API that the patch series adds to `llama.h`.

Same style as `llama_cpp/llama_cpp.py`: each function has its C prototype as a comment and binds
the library llama-cpp-python loaded. On an unpatched build, or one of another version of the series
(`INSTALLED_API_VERSION`), `PATCHED` is false and nothing is bound.
A few ggml functions, used to inspect graph tensors from an eval callback, are bound as well.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

from llama_cpp import llama_cpp as _llama

_lib = _llama._lib
ctypes_function = _llama.ctypes_function
llama_model_p_ctypes = _llama.llama_model_p_ctypes
llama_context_p_ctypes = _llama.llama_context_p_ctypes
llama_token_p = _llama.llama_token_p
llama_seq_id = _llama.llama_seq_id

# The Clover C API these bindings are written for (`LLAMA_CLOVER_API_VERSION`, patch 0011): a library
# of another version has another `struct llama_clover_pass_params`, whose fields these bindings would
# misplace, so it is not used; one without `llama_clover_api_version` has version 1 (0: no Clover API).
API_VERSION = 2


def _installed_api_version() -> int:
    if not hasattr(_lib, "llama_clover_pass"):
        return 0
    if not hasattr(_lib, "llama_clover_api_version"):
        return 1
    _lib.llama_clover_api_version.argtypes, _lib.llama_clover_api_version.restype = [], ctypes.c_int32
    return int(_lib.llama_clover_api_version())


INSTALLED_API_VERSION = _installed_api_version()
PATCHED = INSTALLED_API_VERSION == API_VERSION


# LLAMA_API bool llama_model_is_clover(const struct llama_model * model);
@ctypes_function("llama_model_is_clover", [llama_model_p_ctypes], ctypes.c_bool, enabled=PATCHED)
def llama_model_is_clover(model: int, /) -> bool: ...


# LLAMA_API bool llama_model_clover_has_diffusion(const struct llama_model * model);
@ctypes_function("llama_model_clover_has_diffusion", [llama_model_p_ctypes], ctypes.c_bool, enabled=PATCHED)
def llama_model_clover_has_diffusion(model: int, /) -> bool: ...


class llama_clover_pass_params(ctypes.Structure):
    """`struct llama_clover_pass_params`: one pass's rows, head, adjustment entries and sampler."""

    _fields_ = [
        ("seq_id", llama_seq_id),
        ("tokens", llama_token_p),
        ("n_tokens", ctypes.c_int32),
        ("block", llama_token_p),
        ("n_block", ctypes.c_int32),
        ("all_causal", ctypes.c_bool),
        ("logits", ctypes.c_bool),
        ("coreset", ctypes.c_bool),
        ("coreset_top_p", ctypes.c_float),
        ("no_snapshots", ctypes.c_bool),
        ("n_adjust", ctypes.c_int32),
        ("n_adjust_rows", ctypes.c_int32),
        ("adjust_ids", ctypes.c_void_p),
        ("adjust_values", ctypes.c_void_p),
        ("temperature", ctypes.c_float),
        ("top_k", ctypes.c_int32),
        ("top_p", ctypes.c_float),
        ("min_p", ctypes.c_float),
        ("uniforms", ctypes.c_void_p),
        ("out_tokens", ctypes.c_void_p),
        ("out_probs", ctypes.c_void_p),
    ]


# LLAMA_API struct llama_clover_pass_params llama_clover_pass_default_params(void);
@ctypes_function("llama_clover_pass_default_params", [], llama_clover_pass_params, enabled=PATCHED)
def llama_clover_pass_default_params() -> llama_clover_pass_params: ...


# LLAMA_API int32_t llama_clover_pass(
#         struct llama_context * ctx,
#         const struct llama_clover_pass_params * params);
@ctypes_function(
    "llama_clover_pass",
    [llama_context_p_ctypes, ctypes.POINTER(llama_clover_pass_params)],
    ctypes.c_int32,
    enabled=PATCHED,
)
def llama_clover_pass(ctx: int, params: ctypes._Pointer, /) -> int: ...


# LLAMA_API void llama_clover_bench_tuning(
#         struct llama_context * ctx, int32_t coreset_size, int32_t moe_chunk);
@ctypes_function(
    "llama_clover_bench_tuning",
    [llama_context_p_ctypes, ctypes.c_int32, ctypes.c_int32],
    None,
    enabled=PATCHED,
)
def llama_clover_bench_tuning(ctx: int, coreset_size: int, moe_chunk: int, /) -> None: ...


# ggml: enough of `struct ggml_tensor` (ggml/include/ggml.h of the pinned tree) to walk a graph node
GGML_MAX_DIMS, GGML_MAX_SRC, GGML_MAX_OP_PARAMS, GGML_MAX_NAME = 4, 10, 64, 64


class ggml_tensor(ctypes.Structure):
    pass


ggml_tensor._fields_ = [
    ("type", ctypes.c_int),
    ("buffer", ctypes.c_void_p),
    ("ne", ctypes.c_int64 * GGML_MAX_DIMS),
    ("nb", ctypes.c_size_t * GGML_MAX_DIMS),
    ("op", ctypes.c_int),
    ("op_params", ctypes.c_int32 * (GGML_MAX_OP_PARAMS // 4)),
    ("flags", ctypes.c_int32),
    ("src", ctypes.POINTER(ggml_tensor) * GGML_MAX_SRC),
    ("view_src", ctypes.POINTER(ggml_tensor)),
    ("view_offs", ctypes.c_size_t),
    ("data", ctypes.c_void_p),
    ("name", ctypes.c_char * GGML_MAX_NAME),
    ("extra", ctypes.c_void_p),
    ("padding", ctypes.c_char * 8),
]


def _load_ggml_base() -> ctypes.CDLL:
    """libggml-base, which sits next to the libllama that llama-cpp-python loaded."""
    lib = Path(_lib._name)
    return ctypes.CDLL(
        str(lib.with_name("ggml-base.dll" if lib.suffix == ".dll" else f"libggml-base{lib.suffix}"))
    )


_ggml = _load_ggml_base()

# GGML_API const char * ggml_op_name  (enum ggml_op   op);
ggml_op_name = _ggml.ggml_op_name
ggml_op_name.argtypes, ggml_op_name.restype = [ctypes.c_int], ctypes.c_char_p

# GGML_API const char * ggml_op_desc(const struct ggml_tensor * t); // unary or op name
ggml_op_desc = _ggml.ggml_op_desc
ggml_op_desc.argtypes, ggml_op_desc.restype = [ctypes.POINTER(ggml_tensor)], ctypes.c_char_p

# GGML_API const char * ggml_type_name(enum ggml_type type);
ggml_type_name = _ggml.ggml_type_name
ggml_type_name.argtypes, ggml_type_name.restype = [ctypes.c_int], ctypes.c_char_p

# GGML_API size_t ggml_nbytes(const struct ggml_tensor * tensor);
ggml_nbytes = _ggml.ggml_nbytes
ggml_nbytes.argtypes, ggml_nbytes.restype = [ctypes.POINTER(ggml_tensor)], ctypes.c_size_t

# GGML_API void ggml_backend_tensor_get(
#     const struct ggml_tensor * tensor, void * data, size_t offset, size_t size);
ggml_backend_tensor_get = _ggml.ggml_backend_tensor_get
ggml_backend_tensor_get.argtypes = [
    ctypes.POINTER(ggml_tensor),
    ctypes.c_void_p,
    ctypes.c_size_t,
    ctypes.c_size_t,
]
ggml_backend_tensor_get.restype = None
