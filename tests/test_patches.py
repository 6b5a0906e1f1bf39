"""The llama.cpp patch series and `patches/build.py`: clean application, version label, wheel cache."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
from clover_patches import source

PATCHES = Path(__file__).resolve().parent.parent / "patches"


def load_build():
    spec = importlib.util.spec_from_file_location("clover_patches_build", PATCHES / "build.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


build = load_build()


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> Path:
    return source.extract(tmp_path_factory.mktemp("sdist"))


def test_series_is_numbered_and_in_format_patch_style():
    # groups: 00xx the model (llama.cpp's src/), 01xx ggml-cuda kernels, 02xx ggml-cpu fixes, 03xx ggml-rpc,
    # 04xx libllama's context;
    # each 1..n
    patches = build.series()
    groups: dict[int, list[Path]] = {}
    for p in patches:
        groups.setdefault(int(p.name[:4]) // 100, []).append(p)
    assert sorted(groups) == list(range(len(groups)))
    for g, members in groups.items():
        assert [p.name[:4] for p in members] == [f"{100 * g + i:04d}" for i in range(1, len(members) + 1)]
        for i, p in enumerate(members, 1):
            head = p.read_text().splitlines()[:4]
            numbered = f"Subject: [PATCH {i}/{len(members)}]" if len(members) > 1 else "Subject: [PATCH"
            assert head[0].startswith("From ") and head[3].startswith(numbered), p.name


def touched(p: Path) -> list[str]:
    return [line.split(" b/", 1)[1] for line in p.read_text().splitlines() if line.startswith("diff --git ")]


@pytest.mark.parametrize(
    ("group", "allowed"),
    [
        ("01", ("ggml/src/ggml-cuda/",)),
        ("03", ("ggml/src/ggml-rpc/", "ggml/include/ggml-rpc.h")),
        ("04", ("src/llama-context.cpp", "src/llama-context.h")),
    ],
)
def test_independent_groups_touch_only_their_files(group, allowed):
    members = [p for p in build.series() if p.name.startswith(group)]
    assert members
    for p in members:
        files = touched(p)
        assert files and all(f.startswith(allowed) for f in files), p.name


def test_each_patch_applies_in_order_to_the_pristine_tree(pristine):
    vendor = pristine / build.VENDOR
    for p in build.series():
        for check in (["--check"], []):
            res = subprocess.run(["git", "apply", *check, str(p)], cwd=vendor, capture_output=True, text=True)
            assert res.returncode == 0, f"{p.name}: {res.stderr}"
    assert "llama_clover_pass" in (vendor / "include" / "llama.h").read_text()
    assert (vendor / "src" / "models" / "clover-moe.cpp").is_file()


def test_a_patch_that_does_not_apply_is_reported(tmp_path):
    (tmp_path / build.VENDOR).mkdir(parents=True)
    first = build.series()[0]
    with pytest.raises(build.BuildError, match=f"{first.name} does not apply"):
        build.apply_series(tmp_path, [first])


def test_version_label_counts_the_series(tmp_path):
    n = len(build.series())
    assert build.version(build.series()) == f"{source.LLAMA_CPP_PYTHON_VERSION}+clover.{n}"
    init = tmp_path / "llama_cpp" / "__init__.py"
    init.parent.mkdir()
    init.write_text('from .llama_cpp import *\n\n__version__ = "0.3.36"\n')
    build.set_version(tmp_path, "0.3.36+clover.7")
    assert '__version__ = "0.3.36+clover.7"' in init.read_text()


def test_cmake_args_are_lean_with_rpc_pass_through_and_switch_cuda():
    args = build.cmake_args(False, {"CMAKE_ARGS": "-DGGML_NATIVE=OFF"})
    assert (
        "-DLLAMA_BUILD_EXAMPLES=OFF" in args
        and "-DLLAVA_BUILD=OFF" in args
        and args.endswith("-DGGML_NATIVE=OFF")
    )
    assert "GGML_CUDA" not in args
    cuda = build.cmake_args(True, {"CMAKE_CUDA_ARCHITECTURES": "90"})
    assert "-DGGML_CUDA=on" in cuda and "-DCMAKE_CUDA_ARCHITECTURES=90" in cuda
    assert "-DGGML_RPC=ON" in args and "-DGGML_RPC=ON" in cuda  # every build serves and uses RPC


def test_cache_key_depends_on_sdist_series_and_cmake_args():
    key = build.cache_key("a" * 64, "b" * 64, "-DX=1")
    assert key == build.cache_key("a" * 64, "b" * 64, "-DX=1")
    assert (
        len(
            {
                key,
                build.cache_key("c" * 64, "b" * 64, "-DX=1"),
                build.cache_key("a" * 64, "c" * 64, "-DX=1"),
                build.cache_key("a" * 64, "b" * 64, "-DX=2"),
            }
        )
        == 4
    )
    assert build.series_hash(build.series()) != build.series_hash(build.series()[:-1])


def test_second_build_reuses_the_cached_wheel(tmp_path):
    calls: list[tuple[Path, str]] = []

    def fake_builder(tree: Path, out: Path, args: str) -> Path:
        assert (tree / build.VENDOR / "src" / "models" / "clover-moe.cpp").is_file()
        assert f'"{build.version(build.series())}"' in (tree / "llama_cpp" / "__init__.py").read_text()
        calls.append((tree, args))
        out.mkdir(parents=True)
        wheel = out / "llama_cpp_python-0.3.36+clover.x-py3-none-any.whl"
        wheel.write_bytes(b"wheel")
        return wheel

    env = {"CMAKE_ARGS": "-DGGML_NATIVE=OFF"}
    first = build.build(env=env, cache=tmp_path, wheel_builder=fake_builder)
    second = build.build(env=env, cache=tmp_path, wheel_builder=fake_builder)
    assert first == second and first.read_bytes() == b"wheel" and len(calls) == 1
    assert first.parent.name == build.cache_key(
        source.SDIST_SHA256, build.series_hash(build.series()), build.cmake_args(False, env)
    )
    assert not list(tmp_path.glob("*.tmp"))


def test_dev_tree_sync_copies_only_changed_files(tmp_path):
    src, dst = tmp_path / "src", tmp_path / "dst"
    for root in (src, dst):
        (root / "d").mkdir(parents=True)
        (root / "same.c").write_text("same")
    (src / "d" / "changed.c").write_text("new")
    (dst / "d" / "changed.c").write_text("old")
    # the pristine source is older than what it replaces (an sdist's file put back after an experiment)
    os.utime(src / "d" / "changed.c", (1e9, 1e9))
    replaced = (dst / "d" / "changed.c").stat().st_mtime_ns
    (dst / "gone.c").write_text("stale")
    (src / "d" / "added.c").write_text("added")
    mtime = (dst / "same.c").stat().st_mtime_ns
    build.sync_tree(src, dst)
    assert sorted(p.relative_to(dst).as_posix() for p in dst.rglob("*")) == [
        "d",
        "d/added.c",
        "d/changed.c",
        "same.c",
    ]
    assert (dst / "d" / "changed.c").read_text() == "new"
    assert (dst / "d" / "changed.c").stat().st_mtime_ns >= replaced  # newer than its object file would be
    assert (dst / "same.c").stat().st_mtime_ns == mtime
