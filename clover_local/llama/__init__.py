"""llama.cpp backend: ctypes bindings of the Clover C API and the engine."""
