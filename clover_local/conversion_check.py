"""`clover verify`: run the same prompt through the llama.cpp runtime and the float64 reference.

Compares causal logits over the prompt, one preview of a partially masked block, the commit of
that block, a short greedy block-diffusion generation, and (files with the diffusion tensors)
that self-speculative decoding writes exactly what left-to-right decoding writes on the same file,
which must hold for every file type. Tolerances depend on the file type:
F32 files must match the logits to 1e-3 (0.1 with layers on a GPU: ggml-cuda's F32 matmuls are
about 1e-3 relative) and generate the same tokens; F16, BF16 and Q8_0 files must agree on at least
95% of the generated tokens; other types are reported without a verdict.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np

from . import speculative
from .loops import ar_loop, complete, last_result
from .model.config import CheckpointConfig
from .model.gguf_info import read_info
from .model.tokenizer import CloverTokenizer
from .policy import DecodingSettings
from .reference.backend import NumpyBackend
from .reference.model import ReferenceModel
from .speculative import SpeculativeSettings


@dataclass(frozen=True)
class Tolerance:
    logit_max_abs: float | None  # None: logits are reported, not judged
    token_agreement: float | None  # minimum fraction of generated tokens equal to the reference's


TOLERANCES = {
    "F32": Tolerance(1e-3, 1.0),
    "F16": Tolerance(None, 0.95),
    "BF16": Tolerance(None, 0.95),
    "Q8_0": Tolerance(None, 0.95),
}
GPU_LOGIT_MAX_ABS = 0.1


@dataclass(frozen=True)
class PassDiff:
    """Runtime vs reference logits of one pass: max abs diff, that over the reference's max |logit|,
    and the fraction of rows with the same argmax."""

    rows: int
    max_abs: float
    max_rel: float
    argmax_agreement: float

    @classmethod
    def of(cls, got: np.ndarray, ref: np.ndarray) -> PassDiff:
        diff = float(np.abs(got - ref).max())
        return cls(
            len(ref), diff, diff / float(np.abs(ref).max()), float((got.argmax(-1) == ref.argmax(-1)).mean())
        )


@dataclass
class ConversionReport:
    gguf: str
    file_type: str
    prompt_tokens: int
    tolerance: Tolerance | None
    causal: PassDiff
    preview: PassDiff
    commit: PassDiff
    generated: list[int]
    reference_generated: list[int]
    token_agreement: float
    speculative_identical: bool | None = None  # speculative == ar on this file (None: not run)
    failures: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool | None:
        """False on any failure; else True against the file type's tolerance, None when it has none."""
        if self.failures:
            return False
        return None if self.tolerance is None else True

    def to_dict(self) -> dict:
        return {**asdict(self), "passed": self.passed}


def agreement(got: Sequence[int], ref: Sequence[int]) -> float:
    """Fraction of the reference's positions where the runtime produced the same token."""
    if not ref:
        return float(list(got) == list(ref))
    return sum(a == b for a, b in zip(got, ref, strict=False)) / max(len(ref), len(got))


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
) -> ConversionReport:
    """Run the checks; the runtime defaults (no flash attention, F32 K/V) make F32 logits comparable.

    `log` leaves llama.cpp's log on stderr (`LlamaEngine`).
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

    ref = ReferenceModel.from_checkpoint(reference_checkpoint_dir)
    state = ref.new_state()
    settings = DecodingSettings.from_defaults(ckpt.generation, mask, max_new_tokens=max_new_tokens)
    info = read_info(gguf_path)
    ftype, speculative_check = info.file_type, info.has_diffusion_tensors
    tol = TOLERANCES.get(ftype)
    if tol is not None and tol.logit_max_abs is not None and n_gpu_layers > 0:
        tol = replace(tol, logit_max_abs=GPU_LOGIT_MAX_ABS)

    with LlamaEngine(
        gguf_path,
        n_ctx=len(ids) + 2 * ckpt.model.block_size + max_new_tokens + 64,
        n_gpu_layers=n_gpu_layers,
        n_threads=n_threads,
        flash_attn=flash_attn,
        f32_cache=f32_cache,
        log=log,
        speculative=speculative_check,
    ) as eng:
        causal = PassDiff.of(eng.causal_logits(ids), ref.commit(ids, state))
        preview = PassDiff.of(eng.preview_logits(block), ref.preview(block, state))
        commit = PassDiff.of(eng.causal_logits(resolved), ref.commit(resolved, state))
        got = list(complete(eng, ids, settings).tokens)
        ar = spec = None
        if speculative_check:
            ar = last_result(ar_loop(eng, ids, settings)).tokens
            spec = last_result(speculative.speculative_loop(eng, ids, settings, SpeculativeSettings())).tokens
    expected = list(complete(NumpyBackend(ref), ids, settings).tokens)

    report = ConversionReport(
        str(gguf_path), ftype, len(ids), tol, causal, preview, commit, got, expected, agreement(got, expected)
    )
    if speculative_check:
        report.speculative_identical = ar == spec
        if ar != spec:
            first = next(
                (i for i, (a, b) in enumerate(zip(ar, spec, strict=False)) if a != b), min(len(ar), len(spec))
            )
            report.failures.append(f"speculative decoding differs from ar decoding at token {first}")
    if tol is not None:
        for name, d in (("causal", causal), ("preview", preview), ("commit", commit)):
            if tol.logit_max_abs is not None and d.max_abs > tol.logit_max_abs:
                report.failures.append(f"{name} logits differ by {d.max_abs:.3g} > {tol.logit_max_abs:g}")
        if tol.token_agreement is not None and report.token_agreement < tol.token_agreement:
            report.failures.append(
                f"generation agrees on {report.token_agreement:.1%} of tokens < {tol.token_agreement:.0%}"
            )
    return report
