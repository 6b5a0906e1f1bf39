"""The model's description, shared by the converter, the reference and the runtime.

Its config and checkpoint (`config`, `checkpoint`), its GGUF names (`gguf_names`) and what a GGUF
says about it (`gguf_info`), its tokenizer and chat template (`tokenizer`), and where a model file
comes from (`location`, `hub`). Nothing here imports the loops or a backend.
"""
