#!/usr/bin/env python3
"""Build llama-cpp-python with the Clover patch series and install it into this interpreter.

    python patches/build.py [--cuda] [--dev] [--no-install]

The pinned sdist comes from PyPI through `clover_patches.source` (`source.py` here) (sha256-verified), the
numbered `*.patch` files of this directory are applied in order to its `vendor/llama.cpp`, the
version becomes `0.3.36+clover.N` (N: patches in the series) and `pip wheel` builds it. Wheels
are cached under `build/wheels/<key>/`, key = (sdist sha256, series sha256, CMAKE_ARGS,
platform), so a second run reuses the wheel. Every build has ggml's RPC backend
(`-DGGML_RPC=ON`); `CMAKE_ARGS` from the environment is passed through; `--cuda` adds
`-DGGML_CUDA=on` (architectures from `CMAKE_CUDA_ARCHITECTURES`). `--dev` keeps one patched tree
and one CMake build dir under `build/llama-dev/` for incremental rebuilds.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from clover_patches import source

ROOT = Path(__file__).resolve().parent.parent

PATCHES = Path(__file__).resolve().parent
WHEELS = ROOT / "build" / "wheels"
DEV = ROOT / "build" / "llama-dev"
VENDOR = "vendor/llama.cpp"

# the CPU build stays lean: the library only, no multimodal library, examples, tools, tests or server
LEAN_ARGS = (
    "-DLLAVA_BUILD=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF "
    "-DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_CURL=OFF"
)
# every build carries ggml's RPC backend (libggml-rpc: client and server), CPU and CUDA alike:
# `clover rpc-server` and `--rpc` call it through its C API, no rpc-server binary needed
RPC_ARGS = "-DGGML_RPC=ON"


class BuildError(RuntimeError):
    """A step of the build failed; the message says which."""


def series() -> list[Path]:
    """The patch series, in order."""
    return sorted(PATCHES.glob("[0-9][0-9][0-9][0-9]-*.patch"))


def series_hash(patches: list[Path]) -> str:
    h = hashlib.sha256()
    for p in patches:
        h.update(p.name.encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()


def version(patches: list[Path]) -> str:
    return f"{source.LLAMA_CPP_PYTHON_VERSION}+clover.{len(patches)}"


def cmake_args(cuda: bool, env: dict[str, str]) -> str:
    """CMAKE_ARGS for the build: the lean options, the RPC backend, the caller's CMAKE_ARGS, CUDA
    when asked."""
    args = [LEAN_ARGS, RPC_ARGS, env.get("CMAKE_ARGS", "").strip()]
    if cuda:
        args.append("-DGGML_CUDA=on")
        if env.get("CMAKE_CUDA_ARCHITECTURES"):
            args.append(f"-DCMAKE_CUDA_ARCHITECTURES={env['CMAKE_CUDA_ARCHITECTURES']}")
    return " ".join(a for a in args if a)


def cache_key(sdist_sha256: str, patches_sha256: str, args: str) -> str:
    plat = f"{sys.platform}-{platform.machine()}-py{sys.version_info.major}"
    return hashlib.sha256("\n".join([sdist_sha256, patches_sha256, args, plat]).encode()).hexdigest()[:16]


def cached_wheel(key: str, cache: Path = WHEELS) -> Path | None:
    found = sorted((cache / key).glob("llama_cpp_python-*.whl"))
    return found[0] if found else None


def apply_series(tree: Path, patches: list[Path]) -> None:
    """Apply the series to `tree/vendor/llama.cpp`, checking each patch before applying it."""
    vendor = tree / VENDOR
    for p in patches:
        for check in (["--check"], []):
            res = subprocess.run(["git", "apply", *check, str(p)], cwd=vendor, capture_output=True, text=True)
            if res.returncode != 0:
                raise BuildError(f"{p.name} does not apply to the pinned llama.cpp: {res.stderr.strip()}")


def set_version(tree: Path, label: str) -> None:
    init = tree / "llama_cpp" / "__init__.py"
    text, n = re.subn(r'__version__ = "[^"]*"', f'__version__ = "{label}"', init.read_text())
    if n != 1:
        raise BuildError(f"no __version__ in {init}")
    init.write_text(text)


def prepare_tree(dest: Path, patches: list[Path]) -> Path:
    """Extract the verified sdist under `dest`, apply the series, set the version label."""
    tree = source.extract(dest)
    apply_series(tree, patches)
    set_version(tree, version(patches))
    return tree


def sync_tree(src: Path, dst: Path) -> None:
    """Make `dst` equal to `src`, copying only changed files, each with a fresh mtime, so that a build
    rebuilds exactly them (a file put back to the pristine source must not keep the sdist's old mtime,
    older than the object built from its patched version)."""
    for path in src.rglob("*"):
        rel = path.relative_to(src)
        target = dst / rel
        if path.is_dir():
            target.mkdir(parents=True, exist_ok=True)
        elif not target.is_file() or target.read_bytes() != path.read_bytes():
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(path, target)
    for path in sorted(dst.rglob("*"), reverse=True):
        if not (src / path.relative_to(dst)).exists():
            path.unlink() if path.is_file() or path.is_symlink() else shutil.rmtree(path)


def pip_wheel(tree: Path, out: Path, args: str, build_dir: Path | None = None) -> Path:
    """`pip wheel --no-deps` of a prepared tree into `out` (scikit-build-core)."""
    out.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "-w", str(out), str(tree)]
    if build_dir is not None:
        cmd[4:4] = ["-C", f"build-dir={build_dir}"]
    env = dict(os.environ, CMAKE_ARGS=args)
    env.setdefault("CMAKE_BUILD_PARALLEL_LEVEL", str(os.cpu_count() or 2))
    if subprocess.run(cmd, env=env).returncode != 0:
        raise BuildError("pip wheel failed (see the output above)")
    wheels = sorted(out.glob("llama_cpp_python-*.whl"), key=lambda p: p.stat().st_mtime)
    if not wheels:
        raise BuildError(f"pip wheel wrote no wheel into {out}")
    return wheels[-1]


def build(
    cuda: bool = False,
    env: dict[str, str] | None = None,
    cache: Path = WHEELS,
    wheel_builder: Callable[[Path, Path, str], Path] = pip_wheel,
) -> Path:
    """The patched wheel for this configuration: from the cache, or built once and cached."""
    patches = series()
    args = cmake_args(cuda, dict(os.environ) if env is None else env)
    key = cache_key(source.SDIST_SHA256, series_hash(patches), args)
    wheel = cached_wheel(key, cache)
    if wheel is not None:
        return wheel
    source.sdist_path()
    with tempfile.TemporaryDirectory(prefix="clover-llama-") as tmp:
        tree = prepare_tree(Path(tmp), patches)
        staging = cache / f"{key}.tmp"
        shutil.rmtree(staging, ignore_errors=True)
        built = wheel_builder(tree, staging, args)
        final = cache / key
        shutil.rmtree(final, ignore_errors=True)
        final.mkdir(parents=True)
        wheel = final / built.name
        built.replace(wheel)
        shutil.rmtree(staging, ignore_errors=True)
    return wheel


def build_dev(cuda: bool = False) -> Path:
    """Incremental build: one patched tree and one CMake build dir under build/llama-dev/."""
    patches = series()
    args = cmake_args(cuda, dict(os.environ))
    tree = DEV / "src"
    with tempfile.TemporaryDirectory(prefix="clover-llama-") as tmp:
        fresh = prepare_tree(Path(tmp), patches)
        tree.mkdir(parents=True, exist_ok=True)
        sync_tree(fresh, tree)
    return pip_wheel(tree, DEV / "wheels", args, build_dir=DEV / "cmake")


def install(wheel: Path) -> None:
    """Install the wheel into this interpreter (replacing any llama-cpp-python), then its dependencies."""
    pip = [sys.executable, "-m", "pip", "install", "-q"]
    if subprocess.run([*pip, "--force-reinstall", "--no-deps", str(wheel)]).returncode != 0:
        raise BuildError(f"could not install {wheel}")
    if subprocess.run([*pip, str(wheel)]).returncode != 0:
        raise BuildError(f"could not install the dependencies of {wheel}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cuda", action="store_true", help="build the CUDA backend (needs nvcc)")
    ap.add_argument(
        "--dev", action="store_true", help="incremental build in build/llama-dev/ (no wheel cache)"
    )
    ap.add_argument("--install", action="store_true", default=True, help="install the wheel (default)")
    ap.add_argument(
        "--no-install", dest="install", action="store_false", help="only build (or find) the wheel"
    )
    opts = ap.parse_args(argv)
    try:
        if opts.cuda and shutil.which("nvcc") is None:
            raise BuildError("--cuda needs nvcc on PATH (CUDA toolkit)")
        wheel = build_dev(opts.cuda) if opts.dev else build(opts.cuda)
        print(f"wheel: {wheel}")
        if opts.install:
            install(wheel)
            print(f"installed llama-cpp-python {version(series())}")
    except (BuildError, source.SourceError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
