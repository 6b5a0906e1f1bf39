"""Prepare what a run on the lent H200 machine needs, here, into the git-ignored folder `.devcarry/`.

    .venv/bin/python bench/device/prepare.py [--no-patches | --patch P ...] [--out .devcarry]

Writes (keep the total under ~40 MiB: the working tree that travels is limited to 64 MiB):

- `.devcarry/llama-src.tar.gz`: the pinned llama-cpp-python sdist (`patches/source.py`),
  with `patches/*.patch` applied the way `patches/build.py` applies them (its own function when it
  has one, else `patch -p1` in `vendor/llama.cpp`), minus everything a CUDA build of the Python
  wheel does not compile (docs, media, models except `ggml-vocab-qwen35.gguf`, tests except
  `test-backend-ops.cpp` for `kernels.sh`, examples, tools except what CMake still reads, unused
  ggml backends);
- `.devcarry/wheels/`: pure-Python wheels the device image lacks (gguf, diskcache);
- `.devcarry/meta.json`: commit, dirty files, applied patches and their sha256, sdist version;
- with `--prebuilt BUILD_DIR`, `.devcarry/site.tar.gz`: the `llama_cpp` package installed here with
  its `lib/` replaced by the shared libraries of a CUDA CMake build made here of the same patched
  tree (sm_90, nvcc 13.0 as on the device; `build_cuda_here` in bench/device/README.md). The device
  tries it first and builds from `llama-src.tar.gz` only if it does not load: a run then needs no
  five-minute build, and a cold machine costs no rebuild.

Then one device call (bench/device/README.md): `bash bench/device/run.sh` with carry [".devcarry"].
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

from clover_patches import source

ROOT = Path(__file__).resolve().parents[2]

# wheels the device's image lacks (KINDS.md lists what it has): name==version
WHEELS = ["gguf==0.19.0", "diskcache==5.6.3"]

# paths under the sdist root that the CUDA wheel build never reads
DROP_TOP = [".git", ".github", "docs", "docker", "examples", "tests", "scripts", "mkdocs.yml", "CHANGELOG.md"]
DROP_VENDOR = [
    "docs",
    "media",
    "benches",
    "examples",
    "pocs",
    "app",
    "gguf-py",
    "conversion",
    "scripts",
    "skills",
    "ci",
    "grammars",
    "requirements",
    "flake.nix",
    "build-xcframework.sh",
    "convert_hf_to_gguf.py",
    "convert_hf_to_gguf_update.py",
    "convert_llama_ggml_to_gguf.py",
    "convert_lora_to_gguf.py",
    ".devops",
    ".github",
    ".git",
]
KEEP_MODELS = {"ggml-vocab-qwen35.gguf"}
# tests/ files kept: the op checks of bench/device/kernels.sh compile test-backend-ops (ggml only)
KEEP_TESTS = {"test-backend-ops.cpp"}
UNUSED_BACKENDS = [
    "ggml-cann",
    "ggml-et",
    "ggml-hexagon",
    "ggml-hip",
    "ggml-metal",
    "ggml-musa",
    "ggml-opencl",
    "ggml-openvino",
    "ggml-sycl",
    "ggml-virtgpu",
    "ggml-vulkan",
    "ggml-webgpu",
    "ggml-zdnn",
    "ggml-zendnn",
]


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _build_module():
    """patches/build.py as a module, when it exists (the lead's / LLAMA's build script)."""
    path = ROOT / "patches" / "build.py"
    if not path.is_file():
        return None
    spec = importlib.util.spec_from_file_location("clover_patches_build", path)
    mod = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(mod)
    except Exception as e:  # a build script in progress must not stop the preparation
        print(f"note: patches/build.py did not import ({e}); applying patches with patch -p1")
        return None
    return mod


def apply_patches(src_root: Path, patches: list[Path]) -> str:
    """Apply the series to the extracted sdist; return how it was done."""
    if not patches:
        return "none"
    mod = _build_module()
    for name in ("apply_patches", "apply_series", "apply"):
        fn = getattr(mod, name, None) if mod else None
        if callable(fn):
            try:
                fn(src_root, patches)
                return f"patches/build.py:{name}"
            except TypeError:
                fn(src_root)
                return f"patches/build.py:{name}"
    vendor = src_root / "vendor" / "llama.cpp"
    for p in patches:
        res = subprocess.run(
            ["patch", "-p1", "--forward", "--batch", "-d", str(vendor), "-i", str(p)],
            capture_output=True,
            text=True,
        )
        if res.returncode != 0:
            raise SystemExit(f"error: {p.name} does not apply:\n{res.stdout[-2000:]}{res.stderr[-1000:]}")
    return "patch -p1 -d vendor/llama.cpp"


def prune(src_root: Path) -> None:
    def rm(p: Path) -> None:
        if p.is_dir():
            shutil.rmtree(p)
        elif p.exists():
            p.unlink()

    for d in DROP_TOP:
        rm(src_root / d)
    v = src_root / "vendor" / "llama.cpp"
    for d in DROP_VENDOR:
        rm(v / d)
    for f in (v / "tests").iterdir():
        if f.name not in KEEP_TESTS:
            rm(f)
    for f in (v / "models").iterdir():
        if f.name not in KEEP_MODELS:
            rm(f)
    for b in UNUSED_BACKENDS:
        rm(v / "ggml" / "src" / b)
    # tools/: only tools/mtmd is referenced by the wheel's CMakeLists (LLAVA_BUILD, off on the
    # device); keep its CMake files so a configure with LLAVA on still fails clearly, not silently
    tools = v / "tools"
    for t in tools.iterdir():
        if t.name not in ("mtmd", "CMakeLists.txt"):
            rm(t)


def git_meta() -> dict:
    def git(*args: str) -> str:
        res = subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True)
        return res.stdout.strip()

    dirty = [line[3:] for line in git("status", "--porcelain").splitlines()]
    return {
        "commit": git("rev-parse", "HEAD"),
        "commit_short": git("rev-parse", "--short", "HEAD"),
        "dirty_files": dirty,
    }


def download_wheels(dest: Path) -> list[str]:
    dest.mkdir(parents=True, exist_ok=True)
    got = []
    for spec in WHEELS:
        name = spec.split("==")[0]
        have = list(dest.glob(f"{name}-*.whl"))
        if not have:
            cmd = [
                sys.executable,
                "-m",
                "pip",
                "download",
                "-q",
                "--no-deps",
                "--only-binary=:all:",
                "--python-version",
                "3.12",
                "--implementation",
                "cp",
                "--platform",
                "any",
                "--platform",
                "manylinux2014_x86_64",
                "-d",
                str(dest),
                spec,
            ]
            res = subprocess.run(cmd, capture_output=True, text=True)
            if res.returncode != 0:
                raise SystemExit(f"error: pip download {spec}: {res.stderr[-500:]}")
            have = list(dest.glob(f"{name}-*.whl"))
        got += [h.name for h in have]
    return got


def carry_ggml_base(dest: Path) -> None:
    """This venv's CPU libggml-base (generic x86-64 code: the quantizer) as a stub `llama_cpp`
    package, so the converter can quantize on the device while the CUDA wheel still builds."""
    import importlib.util as iu

    spec = iu.find_spec("llama_cpp")
    if spec is None or not spec.submodule_search_locations:
        print("note: no llama_cpp here; the device converts after its build")
        return
    lib = Path(list(spec.submodule_search_locations)[0]) / "lib" / "libggml-base.so"
    pkg = dest / "llama_cpp"
    (pkg / "lib").mkdir(parents=True, exist_ok=True)
    (pkg / "__init__.py").write_text('"""stub: only lib/libggml-base.so, for the converter"""\n')
    shutil.copy2(lib.resolve(), pkg / "lib" / "libggml-base.so")


def carry_prebuilt(build_dir: Path, dest: Path, label: str) -> None:
    """The installed `llama_cpp` package (same patched source) with the CUDA build's libraries; its
    version says `label`, the series the libraries were built from (the Python files are the sdist's
    whatever the series, so a venv installed before the last patch was added still serves)."""
    import importlib.util as iu

    spec = iu.find_spec("llama_cpp")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("error: --prebuilt needs the patched llama_cpp installed here (make install)")
    pkg = Path(list(spec.submodule_search_locations)[0])
    libs = sorted((build_dir / "bin").glob("lib*.so*"))
    if not any(p.name.startswith("libggml-cuda.so") for p in libs):
        raise SystemExit(f"error: no libggml-cuda.so in {build_dir / 'bin'}: build it first")
    with tarfile.open(dest, "w:gz", compresslevel=9) as tar, tempfile.TemporaryDirectory() as tmp:
        init = Path(tmp) / "llama_cpp" / "__init__.py"
        init.parent.mkdir()
        shutil.copy2(pkg / "__init__.py", init)
        _build_module().set_version(Path(tmp), label)
        for f in sorted(pkg.iterdir()):
            if f.name not in ("lib", "__pycache__", "server"):
                tar.add(init if f.name == "__init__.py" else f, arcname=f"llama_cpp/{f.name}")
        for f in libs:  # symbolic links stay links inside the archive
            tar.add(f, arcname=f"llama_cpp/lib/{f.name}")
    cache = (build_dir / "CMakeCache.txt").read_text()
    keys = (
        "GGML_CUDA",
        "GGML_NATIVE",
        "GGML_AVX",
        "GGML_FMA",
        "CMAKE_CUDA_ARCHITECTURES",
        "CMAKE_BUILD_TYPE",
    )
    flags = [line for line in cache.splitlines() if line.startswith(keys)]
    (dest.parent / "site-cmake.txt").write_text(
        " ".join(f"-D{f.replace(':BOOL', '').replace(':STRING', '')}" for f in flags if "=" in f) + "\n"
    )
    print(f"{dest}: {dest.stat().st_size / 2**20:.1f} MiB (llama_cpp from {pkg}, libraries from {build_dir})")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=ROOT / ".devcarry")
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--no-patches", action="store_true", help="unpatched upstream tree (baseline)")
    g.add_argument("--patch", type=Path, action="append", help="apply only these patch files, in order")
    ap.add_argument(
        "--configure",
        action="store_true",
        help="also run a CPU `cmake` configure (no build) of the slim tree, as a check",
    )
    ap.add_argument("--prebuilt", type=Path, help="a CUDA CMake build dir of the same patched tree to carry")
    args = ap.parse_args(argv)

    t0 = time.time()
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    patches = [] if args.no_patches else (args.patch or sorted((ROOT / "patches").glob("*.patch")))
    with tempfile.TemporaryDirectory(prefix="clover-slim-") as tmp:
        src_root = source.extract(Path(tmp))
        how = apply_patches(src_root, patches)
        mod = _build_module()
        if mod is not None and hasattr(mod, "set_version") and hasattr(mod, "version"):
            mod.set_version(src_root, mod.version(patches))  # 0.3.36+clover.N, as patches/build.py does
        prune(src_root)
        if args.configure:
            bdir = Path(tmp) / "cfg"
            cmd = [
                "cmake",
                "-S",
                str(src_root),
                "-B",
                str(bdir),
                "-G",
                "Ninja",
                "-DLLAVA_BUILD=OFF",
                "-DLLAMA_BUILD_EXAMPLES=OFF",
                "-DLLAMA_BUILD_TESTS=OFF",
                "-DLLAMA_BUILD_TOOLS=OFF",
                "-DLLAMA_BUILD_SERVER=OFF",
                "-DGGML_CUDA=OFF",
            ]
            res = subprocess.run(cmd, capture_output=True, text=True)
            if res.returncode != 0:
                raise SystemExit(
                    "error: cmake configure of the slim tree failed:\n"
                    + res.stdout[-3000:]
                    + res.stderr[-3000:]
                )
            print("cmake configure of the slim tree: ok")
            shutil.rmtree(bdir)
        tarball = out / "llama-src.tar.gz"
        with tarfile.open(tarball, "w:gz", compresslevel=6) as tar:
            tar.add(src_root, arcname=source.TOP)
    wheels = download_wheels(out / "wheels")
    carry_ggml_base(out / "ggml-base")
    (out / "site.tar.gz").unlink(missing_ok=True)
    if args.prebuilt:
        carry_prebuilt(args.prebuilt, out / "site.tar.gz", _build_module().version(patches))
    meta = {
        "llama_cpp_python": source.LLAMA_CPP_PYTHON_VERSION,
        "sdist_sha256": source.SDIST_SHA256,
        "patches": [{"name": p.name, "sha256": sha256(p)} for p in patches],
        "patched_with": how,
        "wheels": wheels,
        "prepared_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        **git_meta(),
    }
    (out / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    total = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
    print(
        f"{out}: {total / 2**20:.1f} MiB ({tarball.stat().st_size / 2**20:.1f} MiB source, "
        f"{len(patches)} patches via {how}, wheels {', '.join(wheels)}) in {time.time() - t0:.0f} s"
    )
    if total > 40 * 2**20:
        print("warning: over 40 MiB; the working tree that travels is limited to 64 MiB in all")
    return 0


if __name__ == "__main__":
    sys.exit(main())
