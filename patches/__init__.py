"""Build tooling (import name `clover_patches`): the pinned llama-cpp-python sdist and the patch series.

Outside the runtime package: the runtime never downloads or builds llama.cpp.
"""
