"""The pinned llama-cpp-python source release: download once, verify, read files from it.

The project never commits llama.cpp; everything that needs its tree (the patched build, the
Qwen vocabulary for test checkpoints, upstream's converter for benchmarks) goes through here.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tarfile
from pathlib import Path

LLAMA_CPP_PYTHON_VERSION = "0.3.36"
SDIST_SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
SDIST_NAME = f"llama_cpp_python-{LLAMA_CPP_PYTHON_VERSION}.tar.gz"
TOP = f"llama_cpp_python-{LLAMA_CPP_PYTHON_VERSION}"


class SourceError(RuntimeError):
    """The pinned source release could not be fetched or failed verification."""


def cache_dir() -> Path:
    root = os.environ.get("CLOVER_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "clover-local"
    )
    path = Path(root)
    path.mkdir(parents=True, exist_ok=True)
    return path


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def sdist_path() -> Path:
    """The verified sdist, downloaded from PyPI with pip on first use."""
    path = cache_dir() / SDIST_NAME
    if not path.is_file():
        tmp = cache_dir() / "download.tmp"
        tmp.mkdir(exist_ok=True)
        cmd = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--no-binary",
            ":all:",
            "-d",
            str(tmp),
            f"llama-cpp-python=={LLAMA_CPP_PYTHON_VERSION}",
        ]
        res = subprocess.run(cmd, capture_output=True, text=True)
        got = tmp / SDIST_NAME
        if res.returncode != 0 or not got.is_file():
            raise SourceError(f"could not download {SDIST_NAME} from PyPI: {res.stderr.strip()[-300:]}")
        got.replace(path)
    digest = sha256(path)
    if digest != SDIST_SHA256:
        path.unlink()
        raise SourceError(f"{SDIST_NAME}: sha256 {digest} does not match the pinned {SDIST_SHA256}")
    return path


def extract(dest: Path) -> Path:
    """Unpack the sdist under `dest` and return its root directory."""
    with tarfile.open(sdist_path()) as tar:
        tar.extractall(dest, filter="data")
    return dest / TOP


def read_member(relpath: str) -> bytes:
    """One file of the sdist, e.g. `vendor/llama.cpp/models/ggml-vocab-qwen35.gguf`."""
    cached = cache_dir() / "members" / relpath
    if not cached.is_file():
        with tarfile.open(sdist_path()) as tar:
            f = tar.extractfile(f"{TOP}/{relpath}")
            if f is None:
                raise SourceError(f"{relpath} is not a file in {SDIST_NAME}")
            data = f.read()
        cached.parent.mkdir(parents=True, exist_ok=True)
        tmp = cached.with_suffix(cached.suffix + ".tmp")
        tmp.write_bytes(data)
        tmp.replace(cached)
    return cached.read_bytes()
