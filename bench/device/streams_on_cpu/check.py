"""Patch 0115's stream plan on the tiny preset's real passes, without a GPU (check.sh).

    python check.py LIBRARY

LIBRARY is streams_plan.cpp built by check.sh. A CPU engine on the tiny checkpoint's F32 GGUF records a
preview (coreset on) and a fused pass node by node through llama's eval callback (the CUDA backend sees the
same node list: a fully offloaded model's graph is one split); the library plans each as ggml-cuda would and
checks the plan. Every layer must give two regions: its attention or GDN input projections and its MoE
block. Exit 1: a check failed or a region is missing.
"""

from __future__ import annotations

import ctypes
import sys

from clover_local.testing.recorded_passes import recorded_passes

LAYERS = 4  # the tiny preset


def main(library: str) -> int:
    lib = ctypes.CDLL(library)
    rc = 0
    for name in recorded_passes(lib, "sp"):
        regions = lib.sp_check()
        if regions != 2 * LAYERS:
            print(f"FAIL {name}: {regions} (want {2 * LAYERS} regions; negative: failed checks)")
            rc = 1
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
