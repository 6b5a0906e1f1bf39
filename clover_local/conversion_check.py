"""`clover verify`: run the same prompt through the llama.cpp runtime and the float64 reference.

Compares the causal pass over the prompt, one preview of a partially masked block and the commit
of that block, then a short greedy block-diffusion generation and (files with the diffusion
tensors) whether self-speculative decoding writes exactly what left-to-right decoding writes on the
same file, which must hold for every file type up to near-ties that the backend's batched and
one-row kernels round apart (`divergence`). Where the converter is installed, every tensor of
the file is also compared with its checkpoint source (`clover_convert.file_check`, through the
`clover_local.checks` entry point): the only check that tells a wrong quantized file from a right one
on a small random model.

Each pass is judged by its softmax distributions, not by raw logit differences:

- KL(reference || runtime) per row, mean and 99th percentile. A bound on raw KL cannot serve a
  flat model and a peaked one (the same relative rounding gives a flat model ~20x less KL; a 30%
  error in a diffusion tensor of a flat model gives less KL than correct Q8_0 rounding of a peaked
  one), so the bounds apply to the relative KL: a row's KL over its reference's distance from
  uniform, log V - H(reference), the share of what the distribution says that the runtime lost.
  It is the same for flat and peaked models (docs/performance.md, "clover verify tolerances").
- top-1 agreement on rows whose reference argmax is clear (top-1 minus top-2 logit at least half
  the row's logit standard deviation), and top-5 overlap.
- rows whose expert top-k set differs from the reference's in some MoE layer (read from the graph's
  `ffn_moe_topk` nodes) are counted and shown, and left out of the KL: a near-tie in a router flips
  under any rounding (GPU TF32, quantized weights) and moves that row far more than the rounding
  itself; a bound on their share catches a wrong router.

Tolerances depend on the file type and on where the layers run (`tolerance`). Generation
agreement is always reported, and judged only where the logits must match to float precision
(F32 on the CPU): elsewhere one flipped near-tie changes every token after it, right or not.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import json
import os
import zipfile
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from importlib.metadata import entry_points
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from . import policy, speculative
from .backend import LogitAdjustment, adjust_logits
from .loops import ar_loop, complete, last_result
from .model.config import CheckpointConfig
from .model.gguf_info import read_info
from .model.tokenizer import CloverTokenizer
from .placement import Placement
from .policy import DecodingSettings
from .reference.backend import NumpyBackend
from .reference.model import ReferenceModel
from .speculative import SpeculativeSettings

if TYPE_CHECKING:  # the engine needs the patched llama.cpp: imported where a check runs
    from .llama.engine import LlamaEngine

# the router's chosen experts per row: llama.cpp's graph name and the reference's record
TOPK_NODE = "ffn_moe_topk"
CLEAR_MARGIN = 0.5  # top-1 minus top-2 reference logit, in the row's logit standard deviations


@dataclass(frozen=True)
class Tolerance:
    """Bounds on one pass's `PassMetrics`; None: reported only."""

    rel_kl_mean: float  # mean relative KL over the rows routed like the reference
    rel_kl_p99: float  # its 99th percentile
    top1_clear: float  # minimum top-1 agreement on rows with a clear reference argmax
    top5: float  # minimum mean top-5 overlap
    routing_flips: float | None  # maximum share of rows routed to other experts than the reference
    generation: float | None = None  # minimum fraction of generated tokens equal to the reference's


# F32 on the CPU: float32 rounding only (relative KL ~1e-12). GPU: ggml-cuda's F32 matmuls run at
# about 1e-3 relative (TF32). Other types: the weights' rounding. Each bound sits a few times above
# what correct files of the generated checkpoints (tiny, flat, small, Qwen vocabulary) measure;
# F32, F16 and BF16 bounds sit below what one diffusion tensor off by 30% gives. Quantized types
# cannot catch that in general: random weights amplify rounding through depth (8 layers: 4x the KL
# of 4, half the preview rows routed elsewhere), so a correct small Q8_0 file measures what the 30%
# error gives a tiny one (docs/performance.md, "clover verify tolerances").
TOLERANCES: dict[tuple[str, str], Tolerance] = {
    ("F32", "cpu"): Tolerance(1e-6, 1e-5, top1_clear=1.0, top5=0.98, routing_flips=0.1, generation=1.0),
    ("F32", "gpu"): Tolerance(3e-4, 3e-3, top1_clear=0.95, top5=0.9, routing_flips=0.25),
    ("F16", "cpu"): Tolerance(1e-4, 1e-3, top1_clear=0.95, top5=0.9, routing_flips=0.25),
    ("BF16", "cpu"): Tolerance(2e-3, 2e-2, top1_clear=0.9, top5=0.85, routing_flips=0.4),
    ("Q8_0", "cpu"): Tolerance(1.5e-2, 0.15, top1_clear=0.9, top5=0.75, routing_flips=None),
    ("Q6_K", "cpu"): Tolerance(4e-2, 0.3, top1_clear=0.85, top5=0.65, routing_flips=None),
    ("Q5_K_M", "cpu"): Tolerance(0.1, 0.6, top1_clear=0.8, top5=0.55, routing_flips=None),
    ("Q4_K_M", "cpu"): Tolerance(0.3, 1.2, top1_clear=0.75, top5=0.45, routing_flips=None),
}
GPU_FLOOR = TOLERANCES[("F32", "gpu")]  # what the GPU's F32 matmuls add to any file type


def tolerance(file_type: str, backend: str) -> Tolerance | None:
    """The bounds for a file type on "cpu" or "gpu" (None: no verdict for that type).

    On the GPU a file type gets the looser of its CPU bounds and the GPU's F32 floor."""
    if backend == "cpu" or (file_type, backend) in TOLERANCES:
        return TOLERANCES.get((file_type, backend))
    cpu = TOLERANCES.get((file_type, "cpu"))
    if cpu is None:
        return None
    return Tolerance(
        rel_kl_mean=max(cpu.rel_kl_mean, GPU_FLOOR.rel_kl_mean),
        rel_kl_p99=max(cpu.rel_kl_p99, GPU_FLOOR.rel_kl_p99),
        top1_clear=min(cpu.top1_clear, GPU_FLOOR.top1_clear),
        top5=min(cpu.top5, GPU_FLOOR.top5),
        routing_flips=None if cpu.routing_flips is None else max(cpu.routing_flips, GPU_FLOOR.routing_flips),
    )


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def routing_flips(got: dict[str, np.ndarray], ref: dict[str, np.ndarray], rows: int) -> np.ndarray:
    """Per row: whether some MoE layer chose another expert set than the reference ([rows] bool).

    `got` and `ref` map `ffn_moe_topk-<layer>` to [rows, k] expert ids; layers absent from `got`
    (a backend that does not expose them) count as agreeing."""
    flips = np.zeros(rows, dtype=bool)
    for name, ids in ref.items():
        if name.startswith(TOPK_NODE + "-") and name in got:
            g = np.sort(got[name].reshape(rows, -1), axis=1)
            flips |= (g != np.sort(ids.reshape(rows, -1), axis=1)).any(axis=1)
    return flips


@dataclass(frozen=True)
class PassMetrics:
    """Runtime vs reference on one pass's rows: distributions, routing, raw logit difference.

    The KL figures cover the rows routed like the reference (all rows when none is)."""

    rows: int
    routing_flip_rows: int  # rows with another expert top-k set than the reference in some layer
    kl_mean: float  # KL(reference || runtime), nats
    kl_p99: float
    rel_kl_mean: float  # KL / (log V - H(reference))
    rel_kl_p99: float
    clear_rows: int  # rows whose reference top-1 leads top-2 by CLEAR_MARGIN standard deviations
    top1_clear: float  # top-1 agreement on those rows (1.0 when there are none)
    top1_all: float
    top5: float  # mean |top-5 ∩ reference top-5| / 5
    max_abs: float
    max_rel: float

    @classmethod
    def of(cls, got: np.ndarray, ref: np.ndarray, flips: np.ndarray) -> PassMetrics:
        lp, lq = log_softmax(ref), log_softmax(got)
        p = np.exp(lp)
        kl = (p * (lp - lq)).sum(-1)
        rel = kl / np.maximum(np.log(ref.shape[-1]) + (p * lp).sum(-1), 1e-12)
        routed = ~flips if (~flips).any() else np.ones_like(flips)
        top2 = np.sort(ref, axis=-1)[:, -2:]
        clear = top2[:, 1] - top2[:, 0] >= CLEAR_MARGIN * ref.std(-1)
        hit = got.argmax(-1) == ref.argmax(-1)
        k = min(5, ref.shape[-1])
        t_ref, t_got = np.argsort(-ref, axis=-1)[:, :k], np.argsort(-got, axis=-1)[:, :k]
        overlap = np.mean([len(set(a) & set(b)) / k for a, b in zip(t_ref, t_got, strict=True)])
        diff = float(np.abs(got - ref).max())
        return cls(
            rows=len(ref),
            routing_flip_rows=int(flips.sum()),
            kl_mean=float(kl[routed].mean()),
            kl_p99=float(np.percentile(kl[routed], 99)),
            rel_kl_mean=float(rel[routed].mean()),
            rel_kl_p99=float(np.percentile(rel[routed], 99)),
            clear_rows=int(clear.sum()),
            top1_clear=float(hit[clear].mean()) if clear.any() else 1.0,
            top1_all=float(hit.mean()),
            top5=float(overlap),
            max_abs=diff,
            max_rel=diff / float(np.abs(ref).max()),
        )

    def failures(self, name: str, tol: Tolerance) -> list[str]:
        """One line per bound this pass misses."""
        flips = self.routing_flip_rows / self.rows
        checks = [
            (
                self.rel_kl_mean > tol.rel_kl_mean,
                f"mean relative KL {self.rel_kl_mean:.3g} > {tol.rel_kl_mean:g}",
            ),
            (self.rel_kl_p99 > tol.rel_kl_p99, f"p99 relative KL {self.rel_kl_p99:.3g} > {tol.rel_kl_p99:g}"),
            (
                self.top1_clear < tol.top1_clear,
                f"top-1 agrees on {self.top1_clear:.1%} of {self.clear_rows} clear rows"
                f" < {tol.top1_clear:.0%}",
            ),
            (self.top5 < tol.top5, f"top-5 overlap {self.top5:.1%} < {tol.top5:.0%}"),
            (
                tol.routing_flips is not None and flips > tol.routing_flips,
                f"{self.routing_flip_rows} of {self.rows} rows routed to other experts"
                f" > {tol.routing_flips or 0:.0%}",
            ),
        ]
        return [f"{name}: {msg}" for bad, msg in checks if bad]


@dataclass
class ConversionReport:
    gguf: str
    file_type: str
    backend: str  # "cpu" or "gpu": which tolerances apply
    prompt_tokens: int
    tolerance: Tolerance | None
    causal: PassMetrics
    preview: PassMetrics
    commit: PassMetrics
    generated: list[int]
    reference_generated: list[int]
    token_agreement: float
    speculative_identical: bool | None = None  # speculative == ar on this file (None: not run)
    # where they part (GPU): the token, ar's one-row logit margin over speculative's pick there and
    # the backend's own logit error on this file (the passes' max_abs); a margin within it is a
    # near-tie that batched and one-row kernels round apart, not a wrong pass
    speculative_divergence: dict | None = None
    # per check of the `clover_local.checks` entry points (the converter's: "tensors"), its report
    checks: dict[str, dict] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool | None:
        """False on any failure; else True against the file type's tolerance, None when it has none."""
        if self.failures:
            return False
        return None if self.tolerance is None else True

    def to_dict(self) -> dict:
        return {**asdict(self), "passed": self.passed}


REFERENCE_RUN_VERSION = 1  # bump when what `ReferenceRun.save` writes changes


@functools.cache
def reference_code() -> str:
    """A hash of the code a `ReferenceRun` comes from (the reference model, the decoding loop and
    policy): a cached run made by other code is not reused."""
    here = Path(__file__).parent
    files = [
        *sorted((here / "reference").glob("*.py")),
        *(here / f for f in ("backend.py", "loops.py", "policy.py")),
    ]
    return hashlib.sha256(b"".join(f.read_bytes() for f in files)).hexdigest()


@dataclass
class ReferenceRun:
    """The float64 reference's side of a check: each pass's logits and expert choices, and its
    greedy generation.

    It depends only on the checkpoint, the passes' tokens and the decoding settings, not on the
    file checked, so the files and backends of one checkpoint can share one (`of`'s cache): at
    full width the reference needs ~35 GB and minutes, the runtime's side seconds."""

    logits: dict[str, np.ndarray]  # per pass name, [rows, vocab]
    topk: dict[str, dict[str, np.ndarray]]  # per pass name, `ffn_moe_topk-<layer>` -> [rows, k]
    generated: list[int]

    @classmethod
    def compute(
        cls, checkpoint_dir: str | Path, inputs: dict[str, Sequence[int]], settings: DecodingSettings
    ) -> ReferenceRun:
        """`inputs`: each pass's tokens, "preview" for the preview pass, any other name a causal
        pass from the empty state; the generation continues `inputs["causal"]`."""
        ref = ReferenceModel.from_checkpoint(checkpoint_dir)
        state = ref.new_state()
        logits, topk = {}, {}
        for name, tokens in inputs.items():
            record: dict[str, np.ndarray] = {}
            ref_pass = ref.preview if name == "preview" else ref.commit
            logits[name] = ref_pass(tokens, state, record=record)
            topk[name] = {k: v for k, v in record.items() if k.startswith(TOPK_NODE + "-")}
        generated = list(complete(NumpyBackend(ref), inputs["causal"], settings).tokens)
        return cls(logits, topk, generated)

    @classmethod
    def of(
        cls,
        checkpoint_dir: str | Path,
        inputs: dict[str, Sequence[int]],
        settings: DecodingSettings,
        cache: str | Path | None = None,
    ) -> ReferenceRun:
        """The run from `cache` when it holds this checkpoint's run of these inputs, else computed
        (and written to `cache`, replacing what it held)."""
        if cache is None:
            return cls.compute(checkpoint_dir, inputs, settings)
        key = cls.key(checkpoint_dir, inputs, settings)
        found = cls.load(cache, key)
        if found is None:
            found = cls.compute(checkpoint_dir, inputs, settings)
            found.save(cache, key)
        return found

    @staticmethod
    def key(checkpoint_dir: str | Path, inputs: dict[str, Sequence[int]], settings: DecodingSettings) -> str:
        """What the run depends on: the checkpoint's files (names, sizes, modification times),
        the inputs, the settings, the code (`reference_code`) and `REFERENCE_RUN_VERSION`."""
        files = sorted(Path(checkpoint_dir).iterdir())
        what = {
            "version": REFERENCE_RUN_VERSION,
            "code": reference_code(),
            "files": [(f.name, f.stat().st_size, f.stat().st_mtime_ns) for f in files if f.is_file()],
            "inputs": {k: [int(t) for t in v] for k, v in inputs.items()},
            "settings": repr(settings),
        }
        return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()

    def save(self, path: str | Path, key: str) -> None:
        """Write the run as an .npz (a temporary name, then a rename)."""
        arrays = {"key": np.array(key), "generated": np.array(self.generated, dtype=np.int64)}
        for name, logits in self.logits.items():
            arrays[f"logits.{name}"] = logits
            arrays |= {f"topk.{name}.{layer}": ids for layer, ids in self.topk[name].items()}
        path = Path(path)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        try:
            with open(tmp, "wb") as f:
                np.savez(f, **arrays)
            tmp.replace(path)
        finally:
            tmp.unlink(missing_ok=True)

    @classmethod
    def load(cls, path: str | Path, key: str) -> ReferenceRun | None:
        """The run in `path`, None when there is none or it was made for something else."""
        if not Path(path).is_file():
            return None
        logits: dict[str, np.ndarray] = {}
        topk: dict[str, dict[str, np.ndarray]] = defaultdict(dict)
        try:
            with np.load(path) as z:
                if str(z["key"]) != key:
                    return None
                for k in z.files:
                    kind, _, rest = k.partition(".")
                    if kind == "logits":
                        logits[rest] = z[k]
                    elif kind == "topk":
                        name, _, layer = rest.partition(".")
                        topk[name][layer] = z[k]
                generated = [int(t) for t in z["generated"]]
        except (OSError, ValueError, KeyError, zipfile.BadZipFile):  # not a run of ours: recompute
            return None
        return cls(logits, {name: topk[name] for name in logits}, generated)


def first_difference(a: Sequence[int], b: Sequence[int]) -> int | None:
    """The first position where two token lists differ (the shorter one's length if one extends
    the other), None when they are equal."""
    if list(a) == list(b):
        return None
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


def divergence(
    ar: Sequence[int], spec: Sequence[int], margin: float | None, bound: float, exact: bool
) -> dict | None:
    """Where speculative and ar decoding part, None if they do not. Where a backend's batched and
    one-row passes run different kernels (a GPU's MMQ and MMVQ; the CPU's repacked weights, whose
    multi-row gemm and one-row gemv sum in other orders) a part whose one-row margin
    (`one_row_margin`) lies within the backend's own logit error `bound`, either way, is a
    near-tie that they round apart (the recomputed row may even prefer speculative's pick: its
    prefix ran in other batches). Where they compute the same numbers (`exact`: the CPU's plain
    weight buffers) every part is a failure."""
    first = first_difference(ar, spec)
    if first is None:
        return None
    near_tie = not exact and margin is not None and abs(margin) <= bound
    return {"token": first, "margin": margin, "bound": bound, "near_tie": near_tie}


def one_row_margin(
    eng: LlamaEngine, context: Sequence[int], token: int, other: int, adj: LogitAdjustment | None = None
) -> float:
    """How far `token` leads `other` in the logits of the row after `context`, computed as the ar
    mode computes it: the context's last token alone in its pass (a one-row kernel), after the
    step's logit adjustment `adj` (penalties, ramps: what both modes pick from)."""
    eng.reset()
    eng.causal_logits(context[:-1])
    logits = eng.causal_logits(context[-1:])[-1]
    if adj is not None:
        logits = adjust_logits(logits, adj)
    return float(logits[token] - logits[other])


def agreement(got: Sequence[int], ref: Sequence[int]) -> float:
    """Fraction of the reference's positions where the runtime produced the same token."""
    if not ref:
        return float(list(got) == list(ref))
    return sum(a == b for a, b in zip(got, ref, strict=False)) / max(len(ref), len(got))


class RoutingRecorder:
    """An engine eval callback that keeps each pass's `ffn_moe_topk-<layer>` expert ids.

    A pass split into several ubatches evaluates each node once per ubatch; the rows are joined."""

    def __init__(self) -> None:
        self.found: dict[str, list[np.ndarray]] = defaultdict(list)

    def __call__(self, t, ask: bool) -> bool:
        from .llama import capi

        name = t.contents.name.decode()
        if not name.startswith(TOPK_NODE + "-"):
            return not ask
        if not ask:  # a view of the argsort: k ids per row, rows `nb[1]` bytes apart
            k, rows, stride = t.contents.ne[0], t.contents.ne[1], t.contents.nb[1] // 4
            buf = np.zeros(rows * stride, dtype=np.int32)
            capi.ggml_backend_tensor_get(t, buf.ctypes.data_as(ctypes.c_void_p), 0, capi.ggml_nbytes(t))
            self.found[name].append(buf.reshape(rows, stride)[:, :k].copy())
        return True

    def take(self) -> dict[str, np.ndarray]:
        """The expert ids recorded since the last call, [rows, k] per layer."""
        out = {name: np.concatenate(parts) for name, parts in self.found.items()}
        self.found.clear()
        return out


def check_conversion(
    gguf_path: str | Path,
    reference_checkpoint_dir: str | Path,
    prompt: str | Sequence[int] = "The quick brown fox",
    max_new_tokens: int = 32,
    n_gpu_layers: int = 0,
    n_threads: int | None = None,
    flash_attn: bool = False,
    f32_cache: bool = True,
    log: bool = False,
    placement: Placement | None = None,
    extra_buffer_types: bool = True,
    reference_cache: str | Path | None = None,
) -> ConversionReport:
    """Run the checks; the runtime defaults (no flash attention, F32 K/V) make F32 logits comparable.

    `log` leaves llama.cpp's log on stderr (`LlamaEngine`); `placement`: where the weights live
    (its flash attention and cache types give way to `flash_attn` and `f32_cache`);
    `extra_buffer_types=False` runs CPU matmuls on plain weight buffers (no AMX / repacked layouts);
    `reference_cache`: an .npz that keeps the reference's side (`ReferenceRun`) for the next check.
    """
    from .llama.engine import LlamaEngine

    ckpt = CheckpointConfig.from_dir(reference_checkpoint_dir)
    mask = ckpt.model.mask_token_id
    ids = (
        CloverTokenizer.from_dir(reference_checkpoint_dir).encode(prompt)
        if isinstance(prompt, str)
        else list(prompt)
    )
    if not ids:
        raise ValueError("the prompt is empty")
    block = [ids[i % len(ids)] if i % 2 == 0 else mask for i in range(ckpt.model.block_size)]
    resolved = [ids[i % len(ids)] for i in range(ckpt.model.block_size)]

    settings = DecodingSettings.from_defaults(ckpt.generation, mask, max_new_tokens=max_new_tokens)
    info = read_info(gguf_path)  # a file that is not a GGUF fails before the reference runs (minutes)
    inputs = {"causal": ids, "preview": block, "commit": resolved}
    expected = ReferenceRun.of(reference_checkpoint_dir, inputs, settings, reference_cache)
    ftype, speculative_check = info.file_type, info.has_diffusion_tensors
    backend = "gpu" if n_gpu_layers != 0 else "cpu"
    tol = tolerance(ftype, backend)
    routing = RoutingRecorder()

    def measure(got: np.ndarray, name: str) -> PassMetrics:
        ref = expected.logits[name]
        return PassMetrics.of(got, ref, routing_flips(routing.take(), expected.topk[name], len(ref)))

    with LlamaEngine(
        gguf_path,
        n_ctx=len(ids) + 2 * ckpt.model.block_size + max_new_tokens + 64,
        n_gpu_layers=n_gpu_layers,
        n_threads=n_threads,
        flash_attn=flash_attn,
        f32_cache=f32_cache,
        log=log,
        speculative=speculative_check,
        placement=placement,
        eval_callback=routing,
        extra_buffer_types=extra_buffer_types,
    ) as eng:
        causal = measure(eng.causal_logits(ids), "causal")
        preview = measure(eng.preview_logits(block), "preview")
        commit = measure(eng.causal_logits(resolved), "commit")
        got = list(complete(eng, ids, settings).tokens)
        ar = spec = None
        margin = None
        if speculative_check:
            ar = last_result(ar_loop(eng, ids, settings)).tokens
            spec = last_result(speculative.speculative_loop(eng, ids, settings, SpeculativeSettings())).tokens
            first = first_difference(ar, spec)
            if first is not None and first < min(len(ar), len(spec)):
                adj = policy.adjustment(settings, eng.vocab_size, ids, ar[:first])
                margin = one_row_margin(eng, [*ids, *ar[:first]], ar[first], spec[first], adj)
        routing.take()

    report = ConversionReport(
        str(gguf_path),
        ftype,
        backend,
        len(ids),
        tol,
        causal,
        preview,
        commit,
        got,
        expected.generated,
        agreement(got, expected.generated),
    )
    if speculative_check:
        report.speculative_identical = ar == spec
        bound = max(causal.max_abs, commit.max_abs)
        exact = backend == "cpu" and not extra_buffer_types  # plain buffers: one kernel per matmul
        report.speculative_divergence = divergence(ar, spec, margin, bound, exact)
        if report.speculative_divergence and not report.speculative_divergence["near_tie"]:
            first = report.speculative_divergence["token"]
            report.failures.append(f"speculative decoding differs from ar decoding at token {first}")
    for check in entry_points(group="clover_local.checks"):
        report.checks[check.name], failures = check.load()(gguf_path, reference_checkpoint_dir)
        report.failures += failures
    if tol is not None:
        for name, m in (("causal", causal), ("preview", preview), ("commit", commit)):
            report.failures += m.failures(name, tol)
        if tol.generation is not None and report.token_agreement < tol.generation:
            report.failures.append(
                f"generation agrees on {report.token_agreement:.1%} of tokens < {tol.generation:.0%}"
            )
    return report
