"""Patches 0114's, 0116's, 0117's and 0118's matchers and kernels, and 0122's test of the expert matmuls'
ids, on the tiny preset's real passes, without a GPU (check.sh `real`).

    [LLAMA_CPP_LIB_PATH=<a CPU build of the series>] python real_graph.py LIBRARY

LIBRARY is real_graph.cpp built by check.sh. A CPU engine on the tiny checkpoint's F32 GGUF records a
preview (coreset on) and a fused pass node by node through llama's eval callback; the library then asks
the matchers at each node as ggml-cuda does and runs what they matched on host threads against the
CPU's nodes. The CUDA backend sees the same node list (a fully offloaded model's graph is one split).
Exit 1: a kernel differs, the matchers did not find as many constructions as the tiny preset has, or an
expert matmul's ids do not read as a coreset's (or a coreset's own top-k does).
"""

from __future__ import annotations

import ctypes
import sys

from clover_local.testing.recorded_passes import recorded_passes

GDN_LAYERS, MOE_LAYERS = 3, 4  # the tiny preset: 4 layers, every 4th full attention, all MoE
HEADS = 1  # a pass's head


def main(library: str) -> int:
    lib = ctypes.CDLL(library)
    lib.rg_check.argtypes, lib.rg_check.restype = [ctypes.c_int] * 3, ctypes.c_int
    rc = 0
    for _ in recorded_passes(lib, "rg"):
        rc |= lib.rg_check(GDN_LAYERS, MOE_LAYERS, HEADS) != 0
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
