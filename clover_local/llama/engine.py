"""The llama.cpp backend: one Clover sequence on a patched llama.cpp context (`backend.Backend`).

Every pass is one call of `llama_clover_pass` (causal rows, then block rows previewed after them)
with its logit adjustment as a few entries per row and, when it samples, one uniform per head row.
The clover head runs in the graph, so a pass reads back per row only the greedy or drawn token and
its probability; full logits are copied out only when a caller asks for them (`causal_logits`,
`preview_logits`, sampled verifications: the acceptance rule; tests).
"""

from __future__ import annotations

import ctypes
import functools
import os
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
from llama_cpp import llama_cpp as ll

from ..backend import (
    GREEDY,
    Capabilities,
    Draw,
    LogitAdjustment,
    Routing,
    RowAdjustments,
    Sampler,
    Verification,
    distribution,
    split_draw,
)
from ..model.decoding_parameters import BY_NAME
from ..placement import Placement
from ..prompt_cache import Checkpoint, PromptCache, Reuse
from ..rpc import RpcError
from . import capi, rpc, unavailable
from .placement import Params

GGML_LOG_LEVEL_ERROR = 4
SEQ = 0

# bool (*ggml_backend_sched_eval_callback)(struct ggml_tensor * t, bool ask, void * user_data), on ggml_tensor
EvalCallback = Callable[["ctypes._Pointer[capi.ggml_tensor]", bool], bool]


# On GGML_ABORT, ggml forks gdb/lldb to print a backtrace; under a parent that waits on the process
# the forked copies stay blocked. The abort message is kept; the backtrace is not (issue 14).
os.environ.setdefault("GGML_NO_BACKTRACE", "1")


class EngineError(RuntimeError):
    """The runtime refused a request (not a Clover file, no diffusion tensors, a failed pass)."""


_errors: list[str] = []


@ll.llama_log_callback
def _log(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
    """llama.cpp's log: error lines are kept for `EngineError` messages, the rest is dropped."""
    if level == GGML_LOG_LEVEL_ERROR and text:
        _errors.append(text.decode("utf-8", "replace").strip())
        del _errors[:-4]


def _failed(what: str) -> EngineError:
    """An `EngineError` for `what`, with llama.cpp's last error line when there is one."""
    return EngineError(f"{what}: {_errors[-1]}" if _errors else what)


@functools.cache
def keep_freed_memory() -> None:
    """Let glibc keep freed memory instead of returning it to the system.

    Vocabulary-sized arrays (full logits for verification, sampled adjustments) would otherwise go
    back to the system when freed and be page-faulted in again by the next pass
    (docs/performance.md). Process-wide, so once per process, where glibc's `mallopt` exists.
    """
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return
    m_trim_threshold, m_mmap_threshold = -1, -3
    libc.mallopt(m_mmap_threshold, 32 << 20)  # allocations up to 32 MiB come from the heap
    libc.mallopt(m_trim_threshold, 256 << 20)  # and up to 256 MiB of freed heap stays mapped


def require_patched() -> None:
    """Fail clearly when the installed llama-cpp-python lacks the Clover patch series, or has
    another version of it (a library built before a `git pull`)."""
    missing = unavailable()
    if missing is not None:
        raise EngineError(missing)


class LlamaEngine:
    """A model and a one-sequence context; implements `backend.Backend` plus state and logits access.

    `f32_cache` keeps K/V in F32 (verification against the float64 reference); `speculative`
    keeps recurrent-state snapshots of the last `block_size` rows (the GGUF's
    `clover-moe.diffusion.block_size`, llama.cpp's `n_rs_seq`) so that `rollback` can undo a
    verification: block_size more copies of every GDN layer's conv and recurrent state; `coreset` and
    `coreset_top_p` give `default_routing`, the routing of previews given none (None: the GGUF's
    `clover-moe.diffusion.coreset_*`);
    `placement` holds llama.cpp's placement and loading options (expert tensors on the CPU, cache
    types, flash attention, mmap; `flash_attn` and `f32_cache` are shorthands that override its
    values); `extra_buffer_types=False` keeps CPU weights in plain buffers instead of ggml-cpu's
    repacked AMX / CPU_REPACK layouts (llama.cpp's `use_extra_bufts`, on by default: the faster
    matmuls; off: the reference path to compare against);
    `eval_callback` is llama.cpp's `cb_eval`, called for every graph node (tests inspect ops and
    intermediates). With RPC servers in the placement, a server lost during loading or a pass
    raises `RpcError` (what the pass read from it is not used) and so does every later pass.
    llama.cpp's log is dropped except error lines, which end up in `EngineError`
    messages; `log=True` leaves it on stderr and installs no Python log callback.
    """

    def __init__(
        self,
        model_path: str | Path,
        n_ctx: int = 4096,
        n_gpu_layers: int = 0,
        n_threads: int | None = None,
        flash_attn: bool | None = None,
        f32_cache: bool = False,
        n_ubatch: int = 512,
        coreset: bool | None = None,
        coreset_top_p: float | None = None,
        eval_callback: EvalCallback | None = None,
        log: bool = False,
        speculative: bool = False,
        placement: Placement | None = None,
        extra_buffer_types: bool = True,
    ):
        require_patched()
        keep_freed_memory()
        # no Python log callback with log=True: llama.cpp writes to stderr itself
        ll.llama_log_set(ll.llama_log_callback() if log else _log, ctypes.c_void_p(0))
        _errors.clear()
        ll.llama_backend_init()
        placement = placement or Placement()
        if flash_attn is not None:
            placement = replace(placement, flash_attn="on" if flash_attn else "off")
        if f32_cache:
            placement = replace(placement, cache_type_k="f32", cache_type_v="f32")
        self.placement = placement
        params = Params(placement, n_gpu_layers, n_ctx, n_ubatch, n_rs_seq=0, n_threads=n_threads)
        mparams, cparams = params.model, params.context
        mparams.use_extra_bufts = extra_buffer_types
        self.model = ll.llama_model_load_from_file(str(model_path).encode(), mparams)
        self.ctx = None
        if not self.model:
            self._check_servers()
            raise _failed(f"could not load {model_path}")
        if not capi.llama_model_is_clover(self.model):
            self.close()
            raise EngineError(f"{model_path} is not a clover-moe GGUF")
        self.has_diffusion = bool(capi.llama_model_clover_has_diffusion(self.model))
        self.vocab_size = ll.llama_vocab_n_tokens(ll.llama_model_get_vocab(self.model))
        self.default_routing = Routing(
            self._parameter("coreset_enabled") if coreset is None else coreset,
            self._parameter("coreset_top_p") if coreset_top_p is None else coreset_top_p,
        )

        cparams.n_rs_seq = self._parameter("block_size") if speculative else 0
        if eval_callback is not None:
            # keep the ctypes trampoline alive as long as the context
            self._cb = ll.ggml_backend_sched_eval_callback(
                lambda t, ask, _ud: eval_callback(ctypes.cast(t, ctypes.POINTER(capi.ggml_tensor)), ask)
            )
            cparams.cb_eval = self._cb
        self.ctx = ll.llama_init_from_model(self.model, cparams)
        try:
            self._check_servers()  # the weights were sent and the graphs reserved on them
        except RpcError:
            self.close()
            raise
        if not self.ctx:
            self.close()
            raise _failed("could not create a llama.cpp context")
        self.n_batch = cparams.n_batch
        self.cache = PromptCache()  # what the sequence holds, for prompt reuse across requests
        self.reuse = Reuse(0, "none")  # what the last prefill kept
        self.checkpoint_at: int | None = None  # the next prefill's checkpoint position (`prefill`)
        self.n_rs_seq = ll.llama_n_rs_seq(self.ctx)
        self._pass_start: int | None = None  # first position of the last verification's causal rows
        # bytes the passes moved between host and model (rows and logits read, adjustment entries written)
        self.bytes_read = self.bytes_written = 0
        self._params = capi.llama_clover_pass_default_params()
        self._tok = (ll.llama_token * self.n_batch)()
        self._prob = (ctypes.c_float * self.n_batch)()
        self._params.out_tokens = ctypes.addressof(self._tok)
        self._params.out_probs = ctypes.addressof(self._prob)
        # the last one-row adjustment and its pass entries; the last sampler; a one-token row buffer
        self._adj_source: LogitAdjustment | None = None
        self._adj_entries = _NO_ENTRIES
        self._sampler: Sampler | None = None
        self._run_ids = self._run_values = self._run_uniforms = None  # what the parameters point at
        self._one = (ll.llama_token * 1)()

    def bench_tuning(self, coreset_size: int = 0, moe_chunk: int = 0) -> None:
        """Benchmarks only (`llama_clover_bench_tuning`): force every coreset to `coreset_size`
        experts (0: the top_p prefix) and dispatch the routed experts of passes of at most 64 rows in
        chunks of `moe_chunk` rows (0: one dispatch)."""
        if coreset_size < 0 or moe_chunk < 0:
            raise ValueError(f"coreset_size and moe_chunk must be >= 0, got {coreset_size}, {moe_chunk}")
        capi.llama_clover_bench_tuning(self.ctx, coreset_size, moe_chunk)

    @property
    def mask_token_id(self) -> int:
        """The GGUF's `tokenizer.ggml.mask_token_id` (-1 when it has none): what previews fill."""
        return int(self._meta("tokenizer.ggml.mask_token_id", "-1"))

    def _meta(self, key: str, default: str) -> str:
        buf = ctypes.create_string_buffer(256)
        n = ll.llama_model_meta_val_str(self.model, key.encode(), buf, len(buf))
        return buf.value.decode() if n >= 0 else default

    def _parameter(self, name: str) -> Any:
        """A decoding parameter as the GGUF holds it (its table row's key), else its default."""
        p = BY_NAME[name]
        text = self._meta(p.gguf_key, "")
        if not text:
            return p.default
        return text == "true" if p.type is bool else p.type(text)

    def close(self) -> None:
        if self.ctx:
            ll.llama_free(self.ctx)
            self.ctx = None
        if self.model:
            ll.llama_model_free(self.model)
            self.model = None

    def __enter__(self) -> LlamaEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # backend.Backend

    @property
    def capabilities(self) -> Capabilities:
        """Fused passes always; verifications of up to `n_rs_seq` rows when built `speculative`."""
        rows = self.n_rs_seq
        return Capabilities(fused=True, speculative=rows > 0, max_verify_rows=rows, counts_bytes=True)

    def prefill(
        self, tokens: Sequence[int], adj: LogitAdjustment, draw: Draw | None = None
    ) -> tuple[int, float]:
        """Start a request over `tokens`, running only what the sequence does not already hold of
        them (`prompt_cache`; `self.reuse` says what was kept). With `checkpoint_at` set (the
        API sets it to where a chat prompt's history ends) the prompt runs as two passes, with a
        checkpoint of the recurrent state between them for the next turn."""
        kept = self._reuse(tokens)
        at, self.checkpoint_at = self.checkpoint_at, None
        if at is not None and self.cache.wants_checkpoint(tokens, kept, at):
            self.commit(tokens[kept:at], adj)
            self._take_checkpoint()
            kept = at
        return self.commit(tokens[kept:], adj, draw)

    def preview(
        self,
        block: Sequence[int],
        adj: LogitAdjustment,
        routing: Routing | None = None,
        draw: Draw | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        self._require_diffusion(block)
        return self._pass([], block, *self._entries(adj), routing=routing, draw=draw)

    def commit(
        self, tokens: Sequence[int], adj: LogitAdjustment, draw: Draw | None = None
    ) -> tuple[int, float]:
        """Causal passes of at most a batch each; only the last one's pick is returned, so only it draws."""
        if len(tokens) == 0:
            raise ValueError("a pass needs at least one token")
        self._pass_start = None  # final rows (no snapshots): nothing to roll back
        ids, values = self._entries(adj)
        with self._appending(tokens):
            for start in range(0, len(tokens), self.n_batch):
                last = start + self.n_batch >= len(tokens)
                chunk = tokens[start : start + self.n_batch]
                self._run(chunk, (), ids, values, draw=draw if last else None)
        return self._tok[0], self._prob[0]

    # backend.SpeculativeBackend

    def verify_and_draft(
        self,
        tokens: Sequence[int],
        adjs: RowAdjustments,
        preview: Sequence[int],
        sampler: Sampler = GREEDY,
        routing: Routing | None = None,
    ) -> Verification:
        """One pass: `tokens` run causally, keeping a recurrent-state snapshot after every row
        (`speculative=True`), then the `preview` block over the state they produce. The head picks
        causal row j under `adjs.row(j)` and the block under `adjs.last()` (entries per row); full
        logits are read back only when sampling (the acceptance rule's distributions)."""
        if len(tokens) > self.n_rs_seq:
            raise EngineError(
                f"a verification of {len(tokens)} rows needs as many recurrent-state snapshots "
                f"(LlamaEngine(speculative=True) keeps {self.n_rs_seq})"
            )
        self._require_diffusion(preview)
        start, sampled = self.n_past, not sampler.greedy
        if len(tokens) and len(adjs.ids):
            ids, values = adjs.entries()
        else:
            ids, values = self._entries(adjs.base)
        with self._appending(tokens):
            tok, prob = self._pass(
                tokens, preview, ids, values, all_causal=True, logits=sampled, routing=routing, snapshots=True
            )
        self._pass_start = start
        k, n = len(tokens), len(tokens) + len(preview)
        logits = self._logits(n) if sampled else None
        return Verification(
            tok[:k],
            prob[:k].astype(np.float64),
            tok[k:],
            prob[k:].astype(np.float64),
            np.array([distribution(logits[j], adjs.row(j), sampler) for j in range(k)])
            if logits is not None
            else None,
            distribution(logits[k:], adjs.last(), sampler) if logits is not None and len(preview) else None,
        )

    def rollback(self, n_keep: int) -> None:
        """Cut K/V after `n_keep` and select the GDN snapshot of that row (llama.cpp's `n_rs_seq`
        rollback: the next pass reads it, nothing is recomputed). One rollback per verification."""
        if n_keep == 0:
            self.reset()
            return
        n_past = self.n_past
        if self._pass_start is None or not self._pass_start <= n_keep <= n_past:
            raise ValueError(
                f"cannot roll back to {n_keep}: the last pass spans {self._pass_start}..{n_past}"
            )
        if n_keep < n_past:
            if not ll.llama_memory_seq_rm(ll.llama_get_memory(self.ctx), SEQ, n_keep, -1):
                raise _failed(f"could not roll back to {n_keep}")
            self.cache.cut(n_keep)

    # backend.FusedBackend

    def commit_and_preview(
        self,
        tokens: Sequence[int],
        adj: LogitAdjustment,
        block: Sequence[int],
        routing: Routing | None = None,
        draw: Draw | None = None,
    ) -> tuple[tuple[int, float], tuple[np.ndarray, np.ndarray]]:
        """`commit(tokens, adj)` then `preview(block, adj)` in one pass: the causal rows append to
        the sequence, the block runs over the state they wrote (nothing is kept of it). No
        rollback, so no recurrent-state snapshots: any engine, `speculative` or not. Returns the
        last causal row's pick and the block's picks; more rows than a ubatch holds run as the two
        passes."""
        if len(tokens) == 0:
            raise ValueError("a pass needs at least one token")
        if len(tokens) + len(block) > ll.llama_n_ubatch(self.ctx):
            first, rest = split_draw(draw)
            return self.commit(tokens, adj, first), self.preview(block, adj, routing, rest)
        self._require_diffusion(block)
        self._pass_start = None  # a commit: nothing to roll back
        with self._appending(tokens):
            tok, prob = self._pass(tokens, block, *self._entries(adj), routing=routing, draw=draw)
        return (int(tok[0]), float(prob[0])), (tok[1:], prob[1:])

    # verification and tests

    def causal_logits(self, tokens: Sequence[int]) -> np.ndarray:
        """Commit `tokens` and return their causal logits [T, V] (unadjusted)."""
        self._pass_start = None
        out = []
        with self._appending(tokens):
            for start in range(0, len(tokens), self.n_batch):
                chunk = tokens[start : start + self.n_batch]
                self._pass(chunk, [], *_NO_ENTRIES, all_causal=True, logits=True)
                out.append(self._logits(len(chunk)))
        return np.concatenate(out)

    def preview_logits(self, block: Sequence[int]) -> np.ndarray:
        """A preview's logits [B, V] (unadjusted); the state is untouched."""
        self._require_diffusion(block)
        self._pass([], block, *_NO_ENTRIES, logits=True)
        return self._logits(len(block))

    def reset(self) -> None:
        """Forget the sequence."""
        ll.llama_memory_clear(ll.llama_get_memory(self.ctx), True)
        self._pass_start = None
        self.cache.held = []

    def state_bytes(self) -> bytes:
        """The sequence's serialized memory (K/V cells, conv and recurrent states)."""
        size = ll.llama_state_seq_get_size(self.ctx, SEQ)
        buf = (ctypes.c_uint8 * size)()
        n = ll.llama_state_seq_get_data(self.ctx, buf, size, SEQ)
        return bytes(buf[:n])

    @property
    def n_past(self) -> int:
        return ll.llama_memory_seq_pos_max(ll.llama_get_memory(self.ctx), SEQ) + 1

    # prompt reuse (prompt_cache)

    def _reuse(self, tokens: Sequence[int]) -> int:
        """Bring the sequence to the longest prefix of `tokens` it can keep; how many tokens that is."""
        held = self.cache.held
        reuse = self.cache.plan(tokens) if held is not None and len(held) == self.n_past else Reuse(0, "none")
        if reuse.checkpoint is not None and not self._restore(reuse.checkpoint):
            reuse = Reuse(0, "none")
        if reuse.how == "none":
            self.reset()
        self.reuse = reuse
        return reuse.kept

    def _take_checkpoint(self) -> None:
        """Copy the recurrent (GDN) state of the sequence's last position into the cache."""
        flags = ll.LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY
        size = ll.llama_state_seq_get_size_ext(self.ctx, SEQ, flags)
        buf = (ctypes.c_uint8 * size)()
        if ll.llama_state_seq_get_data_ext(self.ctx, buf, size, SEQ, flags) == size:
            self.cache.add_checkpoint(buf)

    def _restore(self, checkpoint: Checkpoint) -> bool:
        """Cut the K/V after the checkpoint's tokens and put its recurrent state back; False if
        llama.cpp refused (the caller then starts over)."""
        n, state = len(checkpoint.tokens), checkpoint.state
        self._pass_start = None
        self.cache.held = None
        flags = ll.LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY
        if ll.llama_state_seq_set_data_ext(self.ctx, state, len(state), SEQ, flags) != len(state):
            return False
        if not ll.llama_memory_seq_rm(ll.llama_get_memory(self.ctx), SEQ, n, -1) or self.n_past != n:
            return False
        self.cache.held = list(checkpoint.tokens)
        return True

    def _appending(self, tokens: Sequence[int]) -> _Appending:
        """A pass appending `tokens`: what the sequence holds is unknown until it succeeds."""
        return _Appending(self.cache, tokens)

    # internals

    def _require_diffusion(self, block: Sequence[int]) -> None:
        if len(block) and not self.has_diffusion:
            raise EngineError(
                "this GGUF has no block-diffusion tensors (converted with --ar-only): "
                "previews need a file converted without --ar-only"
            )

    def _entries(self, adj: LogitAdjustment) -> tuple[np.ndarray, np.ndarray]:
        """A one-row adjustment as pass entries (int32 ids, float32 values [1, n, 3]), converted
        once while the passes take the same adjustment (a loop's host time per token; unchanged
        entries also keep `_run`'s parameter pointers)."""
        if adj is not self._adj_source:
            values = np.ascontiguousarray(adj.values[None], dtype=np.float32)
            self._adj_source, self._adj_entries = adj, (np.ascontiguousarray(adj.ids, dtype=np.int32), values)
        return self._adj_entries

    def _pass(
        self, tokens: Sequence[int], block: Sequence[int], ids: np.ndarray, values: np.ndarray, **options: Any
    ) -> tuple[np.ndarray, np.ndarray]:
        """One `llama_clover_pass` (`_run`, which takes the keyword `options`) with entries `ids` [n]
        and `values` [rows, n, 3] of any integer and float types. Returns the head rows' tokens and
        probabilities: every causal row with `all_causal`, else the last one, then every block row."""
        ids = np.ascontiguousarray(ids, dtype=np.int32)  # the same arrays when they are already
        values = np.ascontiguousarray(values, dtype=np.float32)  # (`_entries`): `_run` keeps its pointers
        if len(values) > 1:  # the same ids for every row: [rows][n] as the C API reads them
            ids = np.ascontiguousarray(np.broadcast_to(ids, values.shape[:2]))
        n = self._run(tokens, block, ids, values, **options)
        tok = np.frombuffer(self._tok, dtype=np.int32, count=n).astype(np.int64)
        return tok, np.frombuffer(self._prob, dtype=np.float32, count=n).copy()

    def _run(
        self,
        tokens: Sequence[int],
        block: Sequence[int],
        ids: np.ndarray,
        values: np.ndarray,
        all_causal: bool = False,
        logits: bool = False,
        routing: Routing | None = None,
        draw: Draw | None = None,
        snapshots: bool = False,
    ) -> int:
        """One `llama_clover_pass`: causal `tokens`, then `block` previewed after them under
        `routing` (None: `default_routing`); adjustment entries `ids` (int32 [n], or [rows, n])
        with `values` (float32 [rows, n, 3]; head row i takes row min(i, rows - 1)); `draw`: the
        head rows' sampler and uniforms (None: greedy); `snapshots`: the causal rows keep the
        recurrent-state snapshots a rollback reads (verifications only: every other pass is final,
        and a `speculative` engine's one-row steps then cost what an `ar` engine's do). The head
        rows' picks are left in `_tok` / `_prob`; returns how many there are."""
        p, r = self._params, routing or self.default_routing
        if len(tokens) == 1:  # the `ar` step: no new ctypes array per token
            self._one[0] = tokens[0]
            p.tokens = self._one
        else:
            p.tokens = (ll.llama_token * len(tokens))(*tokens)
        p.n_tokens, p.n_block = len(tokens), len(block)
        p.block = (ll.llama_token * len(block))(*block) if block else None
        p.all_causal, p.logits, p.no_snapshots = all_causal, logits, not snapshots
        p.coreset, p.coreset_top_p = r.coreset, r.top_p
        if ids is not self._run_ids or values is not self._run_values:  # `.ctypes.data` costs ~2 us
            self._run_ids, self._run_values = ids, values
            p.n_adjust, p.n_adjust_rows = values.shape[1], values.shape[0]
            p.adjust_ids, p.adjust_values = ids.ctypes.data, values.ctypes.data
        n = (len(tokens) if all_causal else min(len(tokens), 1)) + len(block)
        if draw is None:
            sampler, uniforms = GREEDY, _NO_UNIFORMS
        else:
            sampler, uniforms = draw.sampler, np.ascontiguousarray(draw.uniforms, dtype=np.float32)
            if len(uniforms) != n:
                raise ValueError(f"a sampled pass of {n} head rows needs {n} uniforms, got {len(uniforms)}")
        if sampler is not self._sampler:
            self._sampler = sampler
            p.temperature, p.top_k, p.top_p, p.min_p = (
                sampler.temperature,
                sampler.top_k,
                sampler.top_p,
                sampler.min_p,
            )
        if uniforms is not self._run_uniforms:
            self._run_uniforms = uniforms
            p.uniforms = uniforms.ctypes.data if len(uniforms) else None
        rc = capi.llama_clover_pass(self.ctx, ctypes.byref(p))
        self._check_servers()
        if rc != 0:
            raise _failed(f"llama_clover_pass failed ({rc})")
        self.bytes_written += ids.nbytes + values.nbytes + uniforms.nbytes
        self.bytes_read += 8 * n
        return n

    def _check_servers(self) -> None:
        """Raise if an RPC server of this model was lost: its layers are gone (patch 0301)."""
        gone = rpc.lost(self.placement.rpc_servers) if self.placement.rpc_servers else None
        if gone is not None:
            raise RpcError(
                f"RPC server {gone} was lost (it ended, or the link dropped): the layers it held are "
                "gone; close this model and load it again"
            )

    def _logits(self, n: int) -> np.ndarray:
        ptr = ll.llama_get_logits(self.ctx)
        self.bytes_read += 4 * n * self.vocab_size
        return np.ctypeslib.as_array(ptr, shape=(n, self.vocab_size)).copy()


class _Appending:
    """`LlamaEngine._appending`'s context: the prompt cache forgets what the sequence holds while a
    pass runs and learns the appended tokens when it succeeds (a class: a generator-based
    context manager costs a microsecond per `ar` step)."""

    __slots__ = ("cache", "tokens", "held")

    def __init__(self, cache: PromptCache, tokens: Sequence[int]):
        self.cache, self.tokens = cache, tokens

    def __enter__(self) -> None:
        self.held, self.cache.held = self.cache.held, None

    def __exit__(self, exc_type: type[BaseException] | None, *_: object) -> None:
        if exc_type is None:
            self.cache.held = self.held
            self.cache.append(self.tokens)


# the identity adjustment as pass entries: none, one row; a greedy pass's uniforms: none
_NO_ENTRIES = (np.zeros(0, dtype=np.int32), np.zeros((1, 0, 3), dtype=np.float32))
_NO_UNIFORMS = np.zeros(0, dtype=np.float32)
