"""The llama.cpp backend: one Clover sequence on a patched llama.cpp context (`backend.Backend`).

Every pass runs the clover head in the graph (logit adjustment, softmax, argmax), so a pass reads
back per row only the greedy token and its probability; full logits are copied out only when a
caller asks for them (`causal_logits`, `preview_logits`: verification and tests).
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import numpy as np
from llama_cpp import llama_cpp as ll

from ..backend import Capabilities, LogitAdjustment, Routing, RowAdjustments, Verification, distribution
from ..prompt_cache import Checkpoint, PromptCache, Reuse
from . import capi

GGML_TYPE_F32 = 0
GGML_LOG_LEVEL_ERROR = 4
SEQ = 0
# routed-expert chunk (rows) for passes with layers on a GPU. 0 (one dispatch): on the H200 chunks of 8
# left the preview unchanged and slowed small coresets (docs/performance.md, H200, 2026-11-30)
MOE_CHUNK_GPU = 0

# bool (*ggml_backend_sched_eval_callback)(struct ggml_tensor * t, bool ask, void * user_data), on ggml_tensor
EvalCallback = Callable[["ctypes._Pointer[capi.ggml_tensor]", bool], bool]


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

    Each pass builds a few vocabulary-sized vectors (the logit adjustment: 3 x 1 MB at vocab
    248320). With glibc's defaults that memory goes back to the system when freed and is
    page-faulted in again by the next pass: `policy.adjustment` took 1.1 ms, 0.11 ms with freed
    memory kept (this 2-core VM). Process-wide, so once per process, where glibc's `mallopt` exists.
    """
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return
    m_trim_threshold, m_mmap_threshold = -1, -3
    libc.mallopt(m_mmap_threshold, 32 << 20)  # allocations up to 32 MiB come from the heap
    libc.mallopt(m_trim_threshold, 256 << 20)  # and up to 256 MiB of freed heap stays mapped


def require_patched() -> None:
    """Fail clearly when the installed llama-cpp-python lacks the Clover patch series."""
    if not capi.PATCHED:
        raise EngineError(
            "the installed llama-cpp-python has no Clover support (llama_clover_* missing): "
            "run `make install` (patches/build.py) to build the patched wheel"
        )


class LlamaEngine:
    """A model and a one-sequence context; implements `backend.Backend` plus state and logits access.

    `f32_cache` keeps K/V in F32 (verification against the float64 reference); `speculative`
    keeps recurrent-state snapshots of the last `block_size` rows (the GGUF's
    `clover-moe.diffusion.block_size`, llama.cpp's `n_rs_seq`) so that `rollback` can undo a
    verification: block_size more copies of every GDN layer's conv and recurrent state; `coreset` and
    `coreset_top_p` give `default_routing`, the routing of previews given none (None: the GGUF's
    `clover-moe.diffusion.coreset_*`);
    `coreset_size` > 0 forces the coreset to that many experts instead of the top_p prefix
    (benchmarks); `moe_chunk` dispatches the routed experts of passes of at most 64 rows in chunks
    of that many rows (0: one dispatch; see `MOE_CHUNK_GPU`);
    `eval_callback` is llama.cpp's `cb_eval`, called for every graph node (tests inspect ops and
    intermediates). llama.cpp's log is dropped except error lines, which end up in `EngineError`
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
        coreset_size: int = 0,
        moe_chunk: int | None = None,
    ):
        require_patched()
        keep_freed_memory()
        # no Python log callback with log=True: llama.cpp writes to stderr itself
        ll.llama_log_set(ll.llama_log_callback() if log else _log, ctypes.c_void_p(0))
        _errors.clear()
        ll.llama_backend_init()
        mparams = ll.llama_model_default_params()
        mparams.n_gpu_layers = n_gpu_layers
        self.model = ll.llama_model_load_from_file(str(model_path).encode(), mparams)
        if not self.model:
            raise _failed(f"could not load {model_path}")
        self.ctx = None
        if not capi.llama_model_is_clover(self.model):
            self.close()
            raise EngineError(f"{model_path} is not a clover-moe GGUF")
        self.has_diffusion = bool(capi.llama_model_clover_has_diffusion(self.model))
        self.vocab_size = ll.llama_vocab_n_tokens(ll.llama_model_get_vocab(self.model))
        self.default_routing = Routing(
            self._meta("clover-moe.diffusion.coreset_enabled", "true") == "true"
            if coreset is None
            else coreset,
            float(self._meta("clover-moe.diffusion.coreset_top_p", "0.9"))
            if coreset_top_p is None
            else coreset_top_p,
        )

        cparams = ll.llama_context_default_params()
        cparams.n_ctx = n_ctx
        cparams.n_batch = max(n_ubatch, 512)
        cparams.n_ubatch = n_ubatch
        cparams.n_seq_max = 1
        cparams.n_rs_seq = int(self._meta("clover-moe.diffusion.block_size", "32")) if speculative else 0
        if n_threads is not None:
            cparams.n_threads = cparams.n_threads_batch = n_threads
        if flash_attn is not None:
            cparams.flash_attn_type = (
                ll.LLAMA_FLASH_ATTN_TYPE_ENABLED if flash_attn else ll.LLAMA_FLASH_ATTN_TYPE_DISABLED
            )
        if f32_cache:
            cparams.type_k = cparams.type_v = GGML_TYPE_F32
        if eval_callback is not None:
            # keep the ctypes trampoline alive as long as the context
            self._cb = ll.ggml_backend_sched_eval_callback(
                lambda t, ask, _ud: eval_callback(ctypes.cast(t, ctypes.POINTER(capi.ggml_tensor)), ask)
            )
            cparams.cb_eval = self._cb
        self.ctx = ll.llama_init_from_model(self.model, cparams)
        if not self.ctx:
            self.close()
            raise _failed("could not create a llama.cpp context")
        self.n_batch = cparams.n_batch
        self.cache = PromptCache()  # what the sequence holds, for prompt reuse across requests
        self.reuse = Reuse(0, "none")  # what the last prefill kept
        self.checkpoint_at: int | None = None  # the next prefill's checkpoint position (`prefill`)
        self.n_rs_seq = ll.llama_n_rs_seq(self.ctx)
        self._adjusted = False
        self._pass_start: int | None = None  # first position of the last verification's causal rows
        # bytes the passes moved between host and model (rows and logits read, adjustments written)
        self.bytes_read = self.bytes_written = 0
        self.coreset_size = coreset_size
        self.moe_chunk = (MOE_CHUNK_GPU if n_gpu_layers != 0 else 0) if moe_chunk is None else moe_chunk

    @property
    def coreset_size(self) -> int:
        return self._coreset_size

    @coreset_size.setter
    def coreset_size(self, n: int) -> None:
        if n < 0:
            raise ValueError(f"coreset_size must be >= 0, got {n}")
        capi.llama_clover_set_coreset_size(self.ctx, n)
        self._coreset_size = n

    @property
    def moe_chunk(self) -> int:
        return self._moe_chunk

    @moe_chunk.setter
    def moe_chunk(self, n: int) -> None:
        if n < 0:
            raise ValueError(f"moe_chunk must be >= 0, got {n}")
        capi.llama_clover_set_moe_chunk(self.ctx, n)
        self._moe_chunk = n

    def _meta(self, key: str, default: str) -> str:
        buf = ctypes.create_string_buffer(256)
        n = ll.llama_model_meta_val_str(self.model, key.encode(), buf, len(buf))
        return buf.value.decode() if n >= 0 else default

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

    def prefill(self, tokens: Sequence[int], adj: LogitAdjustment) -> tuple[int, float]:
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
        return self.commit(tokens[kept:], adj)

    def preview(
        self, block: Sequence[int], adj: LogitAdjustment, routing: Routing | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        return self._preview(block, adj, logits=False, routing=routing)[:2]

    def commit(self, tokens: Sequence[int], adj: LogitAdjustment) -> tuple[int, float]:
        with self._appending(tokens):
            tok, prob, _ = self._decode(tokens, adj, all_rows=False, logits=False)
        return int(tok[-1]), float(prob[-1])

    # backend.SpeculativeBackend

    def verify_and_draft(
        self,
        tokens: Sequence[int],
        adjs: RowAdjustments,
        preview: Sequence[int],
        temperature: float = 0.0,
        routing: Routing | None = None,
    ) -> Verification:
        """One graph (`llama_clover_verify_and_draft`): `tokens` run causally, keeping a recurrent-state
        snapshot after every row (`speculative=True`), then the `preview` block over the state they
        produce. The head picks causal row j under `adjs.row(j)` and the block under `adjs.last()`
        (the base vector plus [rows, len(adjs.ids)] entries); full logits are read back only when
        sampling."""
        if len(tokens) > self.n_rs_seq:
            raise EngineError(
                f"a verification of {len(tokens)} rows needs as many recurrent-state snapshots "
                f"(LlamaEngine(speculative=True) keeps {self.n_rs_seq})"
            )
        if len(preview) and not self.has_diffusion:
            raise EngineError(
                "this GGUF has no block-diffusion tensors (converted with --ar-only): "
                "drafts need a file converted without --ar-only"
            )
        start, sampled = self.n_past, temperature > 0
        self._set_adjust(adjs.base)
        if len(tokens) and len(adjs.ids):
            ids = np.ascontiguousarray(adjs.ids, dtype=np.int32)
            rows = [
                np.ascontiguousarray(a, dtype=np.float32) for a in (adjs.pos_scale, adjs.neg_scale, adjs.bias)
            ]
            rc = capi.llama_clover_set_row_adjust(
                self.ctx, ids.ctypes.data, len(ids), *(r.ctypes.data for r in rows), len(tokens)
            )
            if rc != 0:
                raise _failed(f"llama_clover_set_row_adjust failed ({rc})")
            self.bytes_written += ids.nbytes + sum(r.nbytes for r in rows)
        capi.llama_clover_set_head(self.ctx, False, sampled)
        causal, block = (ll.llama_token * len(tokens))(*tokens), (ll.llama_token * len(preview))(*preview)
        r = routing or self.default_routing
        with self._appending(tokens):
            rc = capi.llama_clover_verify_and_draft(
                self.ctx, SEQ, causal, len(tokens), block, len(preview), r.coreset, r.top_p
            )
            if rc != 0:
                raise _failed(f"llama_clover_verify_and_draft failed ({rc})")
        self._pass_start = start
        k, n = len(tokens), len(tokens) + len(preview)
        tok, prob = self._rows(n)
        logits = self._logits(n) if sampled else None
        return Verification(
            tok[:k],
            prob[:k].astype(np.float64),
            tok[k:],
            prob[k:].astype(np.float64),
            np.array([distribution(logits[j], adjs.row(j), temperature) for j in range(k)])
            if logits is not None
            else None,
            distribution(logits[k:], adjs.last(), temperature)
            if logits is not None and len(preview)
            else None,
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
    ) -> tuple[tuple[int, float], tuple[np.ndarray, np.ndarray]]:
        """`commit(tokens, adj)` then `preview(block, adj)` in one graph (`llama_clover_verify_and_draft`):
        the causal rows append to the sequence, the block runs over the state they wrote (nothing is
        kept of it). No rollback, so no recurrent-state snapshots: any engine, `speculative` or not.
        Returns the last causal row's pick and the block's picks; more rows than a ubatch holds
        run as the two passes."""
        if len(tokens) == 0:
            raise ValueError("a pass needs at least one token")
        if len(tokens) + len(block) > ll.llama_n_ubatch(self.ctx):
            return self.commit(tokens, adj), self.preview(block, adj, routing)
        if len(block) and not self.has_diffusion:
            raise EngineError(
                "this GGUF has no block-diffusion tensors (converted with --ar-only): "
                "previews need a file converted without --ar-only"
            )
        self._set_adjust(adj)
        self._pass_start = None  # a commit: nothing to roll back
        capi.llama_clover_set_head(self.ctx, False, False)
        causal, rows = (ll.llama_token * len(tokens))(*tokens), (ll.llama_token * len(block))(*block)
        r = routing or self.default_routing
        with self._appending(tokens):
            rc = capi.llama_clover_verify_and_draft(
                self.ctx, SEQ, causal, len(tokens), rows, len(block), r.coreset, r.top_p
            )
            if rc != 0:
                raise _failed(f"llama_clover_verify_and_draft failed ({rc})")
        k = len(tokens)
        tok, prob = self._rows(k + len(block))
        return (int(tok[k - 1]), float(prob[k - 1])), (tok[k:], prob[k:])

    # verification and tests

    def causal_logits(self, tokens: Sequence[int]) -> np.ndarray:
        """Commit `tokens` and return their causal logits [T, V] (unadjusted)."""
        with self._appending(tokens):
            out = self._decode(tokens, LogitAdjustment.identity(self.vocab_size), all_rows=True, logits=True)
        return out[2]

    def preview_logits(self, block: Sequence[int]) -> np.ndarray:
        """A preview's logits [B, V] (unadjusted); the state is untouched."""
        return self._preview(block, LogitAdjustment.identity(self.vocab_size), logits=True)[2]

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

    @contextmanager
    def _appending(self, tokens: Sequence[int]) -> Iterator[None]:
        """A pass appending `tokens`: what the sequence holds is unknown until it succeeds."""
        held, self.cache.held = self.cache.held, None
        yield
        self.cache.held = held
        self.cache.append(tokens)

    # internals

    def _set_adjust(self, adj: LogitAdjustment) -> None:
        identity = not adj.bias.any() and (adj.pos_scale == 1).all() and (adj.neg_scale == 1).all()
        if identity and not self._adjusted:
            return
        if identity:
            capi.llama_clover_set_adjust(self.ctx, None, None, None)
        else:
            rows = [
                np.ascontiguousarray(a, dtype=np.float32) for a in (adj.pos_scale, adj.neg_scale, adj.bias)
            ]
            if any(r.shape != (self.vocab_size,) for r in rows):
                raise ValueError(f"logit adjustment vectors must have {self.vocab_size} entries")
            capi.llama_clover_set_adjust(self.ctx, *(r.ctypes.data for r in rows))
            self.bytes_written += sum(r.nbytes for r in rows)
        self._adjusted = not identity

    def _rows(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        tok = (ll.llama_token * n)()
        prob = (ctypes.c_float * n)()
        got = capi.llama_clover_get_rows(self.ctx, tok, prob, n)
        if got != n:
            raise EngineError(f"the clover head returned {got} rows, expected {n}")
        self.bytes_read += ctypes.sizeof(tok) + ctypes.sizeof(prob)
        return np.frombuffer(tok, dtype=np.int32).astype(np.int64), np.frombuffer(
            prob, dtype=np.float32
        ).copy()

    def _logits(self, n: int) -> np.ndarray:
        ptr = ll.llama_get_logits(self.ctx)
        self.bytes_read += 4 * n * self.vocab_size
        return np.ctypeslib.as_array(ptr, shape=(n, self.vocab_size)).copy()

    def _decode(
        self, tokens: Sequence[int], adj: LogitAdjustment, all_rows: bool, logits: bool
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        if len(tokens) == 0:
            raise ValueError("a pass needs at least one token")
        self._set_adjust(adj)
        self._pass_start = None  # the snapshots now belong to this pass
        capi.llama_clover_set_head(self.ctx, True, logits)
        toks, probs, outs = [], [], []
        batch = ll.llama_batch_init(self.n_batch, 0, 1)
        try:
            for start in range(0, len(tokens), self.n_batch):
                chunk = tokens[start : start + self.n_batch]
                pos0 = self.n_past
                for i, t in enumerate(chunk):
                    batch.token[i] = t
                    batch.pos[i] = pos0 + i
                    batch.n_seq_id[i] = 1
                    batch.seq_id[i][0] = SEQ
                    batch.logits[i] = all_rows or start + i == len(tokens) - 1
                batch.n_tokens = len(chunk)
                rc = ll.llama_decode(self.ctx, batch)
                if rc != 0:
                    raise _failed(f"llama_decode failed ({rc})")
                n_out = len(chunk) if all_rows else int(start + len(chunk) == len(tokens))
                if n_out:
                    t, p = self._rows(n_out)
                    toks.append(t)
                    probs.append(p)
                    if logits:
                        outs.append(self._logits(n_out))
        finally:
            ll.llama_batch_free(batch)
            capi.llama_clover_set_head(self.ctx, False, True)
        return np.concatenate(toks), np.concatenate(probs), np.concatenate(outs) if logits else None

    def _preview(
        self, block: Sequence[int], adj: LogitAdjustment, logits: bool, routing: Routing | None = None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        if not self.has_diffusion:
            raise EngineError(
                "this GGUF has no block-diffusion tensors (converted with --ar-only): "
                "previews need a file converted without --ar-only"
            )
        self._set_adjust(adj)
        capi.llama_clover_set_head(self.ctx, False, logits)
        arr = (ll.llama_token * len(block))(*block)
        r = routing or self.default_routing
        rc = capi.llama_clover_preview(self.ctx, SEQ, arr, len(block), r.coreset, r.top_p)
        if rc != 0:
            raise _failed(f"llama_clover_preview failed ({rc})")
        tok, prob = self._rows(len(block))
        return tok, prob, self._logits(len(block)) if logits else None
