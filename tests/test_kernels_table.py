"""bench/device/kernels_table.py: the device's kernel logs read back into per-mode rows."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("kernels_table", ROOT / "bench/device/kernels_table.py")
kernels_table = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(kernels_table)

DENSE = "MUL_MAT_SMALL(type_a=q6_K,type_b=f32,m=8192,n=32,k=2048,bs=[1,1],nr=[1,1],per=[0,1,2,3],k_v=0,o=1)"


def perf_log(us: float) -> str:
    # test-backend-ops perf's line, with the colour codes it prints on a terminal
    return f"  {DENSE}: \x1b[1;32m  4000 runs -   {us:.2f} us/run -  20480 kB/run\x1b[0m\n"


def passes(preview: float, coreset8: float) -> str:
    res = {"preview_ms": preview, "pp_ms": {"512": 20.0}, "preview_ms_by_coreset": {"8": coreset8}}
    return json.dumps(res)


def summary(backends_passed: int) -> str:
    # test-backend-ops' closing lines, as it prints them on a terminal
    ok = backends_passed == 2
    return f"{backends_passed}/2 backends passed\n\x1b[1;3{2 if ok else 1}m{'OK' if ok else 'FAIL'}\x1b[0m\n"


def test_modes_and_repeated_passes(tmp_path: Path, capsys) -> None:
    (tmp_path / "tbo-perf-nosmall.log").write_text(perf_log(30.0))
    (tmp_path / "tbo-perf-default.log").write_text(perf_log(20.0))
    wider = DENSE.replace("n=32", "n=33")
    (tmp_path / "tbo-eval-default.log").write_text(f"  {DENSE}: OK\n  {wider}: FAIL\n{summary(1)}")
    # a mode's own eval (EVAL_MODES) is a check of its own; a sanitizer rerun is not
    (tmp_path / "tbo-eval-h16all.log").write_text(f"  {DENSE}: OK\n{summary(2)}")
    (tmp_path / "tbo-eval-h16all-sanitizer.log").write_text(f"  {DENSE}: FAIL\n")
    (tmp_path / "passes-nosmall.json").write_text(passes(5.0, 4.0))
    (tmp_path / "passes-nosmall-2.json").write_text(passes(7.0, 6.0))
    (tmp_path / "passes-default.json").write_text(passes(4.0, 3.0))
    out = tmp_path / "kernels.json"
    assert kernels_table.main([str(tmp_path), "--out", str(out)]) == 0

    res = json.loads(out.read_text())
    (row,) = res["ops"]
    assert (row["nosmall_us"], row["default_us"]) == (30.0, 20.0)
    assert "legacy_us" not in row
    # Q6_K 8192 x 2048 read once at 4.8 TB/s
    assert abs(row["floor_us"] - 8192 * 2048 * 210 / 256 / 4.8e12 * 1e6) < 1e-6
    assert res["checks"]["eval-default"] == {
        "cases": 2,
        "failed": 1,
        "failed_cases": [wider],
        "finished": True,
    }
    assert res["checks"]["eval-h16all"] == {"cases": 1, "failed": 0, "failed_cases": [], "finished": True}
    assert sorted(res["checks"]) == ["eval-default", "eval-h16all"]
    # a mode run twice is the median (here the mean) of its runs, key by key
    assert res["passes"]["nosmall"]["preview_ms"] == 6.0
    assert res["passes"]["nosmall"]["preview_ms_by_coreset"] == {"8": 5.0}
    assert res["passes"]["nosmall"]["runs"] == 2
    assert res["passes"]["default"]["pp512_ms"] == 20.0

    table = capsys.readouterr().out
    assert "nosmall  default" in table
    # s = nosmall / default: 30 / 20 per op, 6 / 4 per preview
    assert " 1.50" in table.split("== engine passes")[0]
    assert "preview_ms" in table and " 1.50" in table.split("== engine passes")[1]


def test_nonarrow_is_a_mode_with_its_ratio(tmp_path: Path, capsys) -> None:
    (tmp_path / "tbo-perf-nonarrow.log").write_text(perf_log(50.0))
    (tmp_path / "tbo-perf-default.log").write_text(perf_log(20.0))
    (tmp_path / "passes-nonarrow.json").write_text(passes(9.0, 3.0))
    (tmp_path / "passes-default.json").write_text(passes(4.0, 3.0))
    assert kernels_table.main([str(tmp_path), "--out", str(tmp_path / "kernels.json")]) == 0

    (row,) = json.loads((tmp_path / "kernels.json").read_text())["ops"]
    assert (row["nonarrow_us"], row["default_us"]) == (50.0, 20.0)
    ops, passes_table = capsys.readouterr().out.split("== engine passes")
    # n = nonarrow / default: 50 / 20 per op, 9 / 4 per preview
    assert "nonarrow  default" in ops and ops.rstrip().endswith("2.50")
    (preview,) = [line for line in passes_table.splitlines() if line.startswith("preview_ms ")]
    assert preview.rstrip().endswith("2.25")


def test_a_mode_of_its_own_follows_the_known_ones(tmp_path: Path, capsys) -> None:
    # kernels.sh's MODE_<tag>: a tuning setting named by the caller
    (tmp_path / "tbo-perf-default.log").write_text(perf_log(20.0))
    (tmp_path / "tbo-perf-kw8.log").write_text(perf_log(10.0))
    (tmp_path / "passes-kw8-2.json").write_text(passes(3.0, 2.0))
    assert kernels_table.main([str(tmp_path), "--out", str(tmp_path / "kernels.json")]) == 0

    res = json.loads((tmp_path / "kernels.json").read_text())
    assert res["modes"][-1] == "kw8" and res["ops"][0]["kw8_us"] == 10.0
    assert res["passes"]["kw8"]["preview_ms"] == 3.0
    assert "default      kw8" in capsys.readouterr().out


# test_mul_mat_vec_fusion's names: m tokens, n rows of each of the two matrices
GLU_VARS = (
    "glu_op=SWIGLU,m=32,n=512,k=2048,use_id={id},n_mats={mats},n_used={used},b={id},"
    "with_bias=0,with_gate=1,with_lane_scale=0,batch_dims=[1,1]"
)
TOUCHED = 256 * (1 - (1 - 8 / 256) ** 32)  # experts hit by 32 tokens of 8 picks


@pytest.mark.parametrize(
    ("case", "short", "weights"),
    [
        (
            "MUL_MAT_ID_SMALL_GLU(type=q4_K," + GLU_VARS.format(id=1, mats=256, used=8) + ")",
            "glu q4_K 2x512x2048 e=256/256 n=32",
            2 * TOUCHED * 512 * 2048 * 144 / 256,
        ),
        (
            "MUL_MAT_SMALL_GLU(type=q6_K," + GLU_VARS.format(id=0, mats=1, used=1) + ")",
            "glu q6_K 2x512x2048 n=32",
            2 * 512 * 2048 * 210 / 256,
        ),
    ],
)
def test_a_gate_up_glu_case_reads_as_two_matrices(
    tmp_path: Path, case: str, short: str, weights: float
) -> None:
    (tmp_path / "tbo-perf-default.log").write_text(
        f"  {case}: \x1b[1;32m  900 runs -   61.50 us/run\x1b[0m\n"
    )
    assert kernels_table.main([str(tmp_path), "--out", str(tmp_path / "kernels.json")]) == 0

    (row,) = json.loads((tmp_path / "kernels.json").read_text())["ops"]
    assert row["short"] == short and row["default_us"] == 61.5
    assert abs(row["floor_us"] - weights / 4.8e12 * 1e6) < 1e-6


def test_an_op_other_than_a_matmul_has_a_row_and_a_check(tmp_path: Path) -> None:
    shape = "head_count=16,head_size=128,n_seq_tokens=32,n_seqs=1,v_repeat=2"
    gdn = f"GATED_DELTA_NET(type=f32,{shape},permuted=0,kda=0,K=1)"
    line = f"  {gdn}: \x1b[1;32m  8000 runs -   {{us:.2f}} us/run -  1024 kB/run\x1b[0m\n"
    (tmp_path / "tbo-perf-default.log").write_text(line.format(us=9.5))
    (tmp_path / "tbo-perf-gdn0.log").write_text(line.format(us=28.0))
    (tmp_path / "tbo-eval-default.log").write_text(f"  {gdn}: OK\n{summary(2)}")
    out = tmp_path / "kernels.json"
    assert kernels_table.main([str(tmp_path), "--out", str(out)]) == 0

    res = json.loads(out.read_text())
    (row,) = res["ops"]
    assert (row["default_us"], row["gdn0_us"], row["floor_us"]) == (9.5, 28.0, None)
    assert row["short"] == "gated_delta_net type=f32 " + shape.replace(",", " ") + " permuted=0 kda=0 K=1"
    assert res["checks"]["eval-default"] == {"cases": 1, "failed": 0, "failed_cases": [], "finished": True}


def test_an_eval_that_ended_early_says_so(tmp_path: Path, capsys) -> None:
    # 2026-12-06: test-backend-ops aborted (a GGML_ASSERT) after two passing cases; the table said "2/2 ok"
    wider = DENSE.replace("n=32", "n=33")
    abort = "ggml-cuda.cu:677: GGML_ASSERT(ptr == (void *) ((char *)(pool_addr) + pool_used)) failed\n"
    (tmp_path / "tbo-eval-nd.log").write_text(
        f"  {DENSE}: \x1b[1;32mOK\x1b[0m\n  {wider}: \x1b[1;32mOK\x1b[0m\n{abort}"
    )
    # and one that aborted before its first case is a check too, not left out
    (tmp_path / "tbo-eval-nd8.log").write_text(abort)
    # while one that matched no case and ended normally is none
    (tmp_path / "tbo-eval-none.log").write_text(summary(2))
    out = tmp_path / "kernels.json"
    assert kernels_table.main([str(tmp_path), "--out", str(out)]) == 0

    checks = json.loads(out.read_text())["checks"]
    assert sorted(checks) == ["eval-nd", "eval-nd8"]
    check = checks["eval-nd"]
    assert (check["cases"], check["failed"], check["finished"]) == (2, 0, False)
    assert (checks["eval-nd8"]["cases"], checks["eval-nd8"]["finished"]) == (0, False)
    lines = capsys.readouterr().out.splitlines()
    line = next(x for x in lines if x.startswith("eval-nd "))
    assert "2/2 ok" in line and "ENDED EARLY" in line
    assert "ENDED EARLY" in next(x for x in lines if x.startswith("eval-nd8"))
