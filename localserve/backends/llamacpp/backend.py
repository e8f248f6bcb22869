"""The llama.cpp backend, on llama-cpp-python's low-level API.

One `llama_context` holds `num_slots` sequences, each slot in its own KV
stream (or all in one shared pool when the KV budget is smaller, see
`_open_context`). Every step is a single `llama_decode` over a `llama_batch`
that mixes the decode tokens of running sequences with prompt chunks of new
ones, padding-free. Sampling reads the step's logits rows in numpy
(backends/numpy_sampling.py): the greedy rows in one argmax, the sampled
rows in one `sample_rows` (each with its own generator, over the few
candidates the cuts keep; penalties, logit bias and typical_p sample row
by row); only a sequence under a grammar keeps a native llama.cpp sampler
chain (sampling.py), which masks candidates when the grammar refuses a token.
"""

from __future__ import annotations

import ctypes
import dataclasses
import logging
import os
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

import llama_cpp
import numpy as np

from localserve.backends.constraints import GrammarMatcher, think_budget
from localserve.backends.kv_types import KV_CACHE_TYPES, resolve_flash_attn
from localserve.backends.llamacpp.devices import init_llama, load_model, warm_up
from localserve.backends.llamacpp.draft import DraftMismatchError, DraftModel
from localserve.backends.llamacpp.kv_state import KvEdits, apply_kv_ops, library_build
from localserve.backends.llamacpp.sampling import SamplerChain, token_logprob
from localserve.backends.llamacpp.tokenizer import LlamaTokenizer
from localserve.backends.numpy_sampling import NumpySampler, greedy_rows, sample_rows
from localserve.backends.numpy_sampling import token_logprob as row_logprob
from localserve.engine.backend import BackendInfo, GenerativeBackend
from localserve.engine.types import Capacity, KvOp, SampledToken, SamplingParams, SeqChunk, StepPlan, StepResult
from localserve.errors import BackendError, InvalidRequestError, LocalServeError

log = logging.getLogger(__name__)

_DECODE_ERRORS = {
    1: "no KV cache room for the batch",
    2: "the computation was aborted",
    -1: "invalid input batch",
}


#: Drafts one sequence may carry into a step (speculative decoding); the scheduler's --draft-max is capped here.
MAX_DRAFT_TOKENS = 32

_FLASH_ATTN = {
    "auto": llama_cpp.LLAMA_FLASH_ATTN_TYPE_AUTO,
    "on": llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED,
    "off": llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED,
}


@dataclass(frozen=True, slots=True)
class LlamaCppConfig:
    """How to load a GGUF model. Zero means "choose for me"."""

    model_path: str
    n_ctx: int = 4096  # the longest sequence (prompt + output) one slot holds
    num_slots: int = 8  # sequences decoded together (KV slots)
    kv_size: int = 0  # KV cells in all; 0: n_ctx*num_slots; fewer: the slots share one pool
    kv_unified: bool = False  # one KV pool even when n_ctx*num_slots cells fit (see _open_context)
    step_tokens: int = 512  # token budget of one step
    n_threads: int = 0  # 0: all cores
    device: str = "auto"  # a device name (backends/device_names.py): auto, cpu, gpu, gpu:N, cuda, vulkan, ...
    n_gpu_layers: int = -1  # on a GPU: layers to offload, -1 all
    cache_type_k: str = "f16"  # KV cache element types (kv_types.KV_CACHE_TYPES); a quantized V needs flash attention
    cache_type_v: str = "f16"
    flash_attn: str = "auto"  # auto | on | off; auto: off on the CPU with a KV stream per slot (kv_types)
    draft_model_path: str = ""  # a smaller GGUF of the same vocabulary that drafts tokens (--draft-model)


class LlamaCppBackend(GenerativeBackend):
    """A GGUF model in one multi-sequence llama.cpp context."""

    # The native objects: made by __init__ and _open_context, None once freed.
    _model: llama_cpp.llama_model_p | None
    _ctx: llama_cpp.llama_context_p | None
    _mem: llama_cpp.llama_memory_t | None
    _batch: llama_cpp.llama_batch | None
    _capacity: Capacity
    _split_kv: bool  # a KV stream per slot (else one pool the slots share)
    _flash_attn: str  # config.flash_attn resolved for this model's device (kv_types.resolve_flash_attn)
    _n_ctx_train: int

    def __init__(self, config: LlamaCppConfig) -> None:
        init_llama()
        self.config = config
        model, self._device = load_model(Path(config.model_path), config.device, config.n_gpu_layers)
        self._model, self._ctx, self._mem, self._batch = model, None, None, None
        try:
            self._open_context(config, model)
        except BaseException:
            self.close()
            raise
        self._tokenizer = LlamaTokenizer(model)
        self._n_vocab = self._tokenizer.vocab_size
        self._samplers: dict[int, SamplerChain | NumpySampler] = {}
        self._draft: DraftModel | None = None
        if config.draft_model_path:
            try:
                self._draft = self._open_draft(config)
            except DraftMismatchError as exc:  # another family's model: serve it, without a draft model
                log.warning("%s: no draft model: %s", Path(config.model_path).name, exc.message)
            except BaseException:
                self.close()
                raise

    def _open_context(self, config: LlamaCppConfig, model: llama_cpp.llama_model_p) -> None:
        """One KV stream per slot when memory allows, as llama-server does.

        With a unified pool every token of a step attends over all occupied cells
        of every sequence (masked), so attention grows with the sum of all context
        lengths: measured on SmolLM2 at 8 and 16 sequences, split streams decode
        about 1.3x faster. But a stream is fixed at n_ctx cells, so when the KV
        budget (`kv_size`) is smaller than n_ctx * num_slots, the slots share one
        pool instead: every slot can still reach n_ctx tokens, just not all at
        once (the scheduler accounts for the pool).
        """
        n_ctx_train = llama_cpp.llama_model_n_ctx_train(model)
        n_ctx = min(config.n_ctx, n_ctx_train) if n_ctx_train > 0 else config.n_ctx
        num_slots = max(1, config.num_slots)
        unified = config.kv_unified or num_slots == 1 or 0 < config.kv_size < n_ctx * num_slots
        kv_size = max(config.kv_size, n_ctx) if unified and config.kv_size else n_ctx * num_slots
        threads = self._threads = config.n_threads or os.cpu_count() or 1
        params = llama_cpp.llama_context_default_params()
        params.n_ctx = kv_size
        params.n_batch = config.step_tokens
        params.n_ubatch = min(config.step_tokens, 512)
        params.n_seq_max = num_slots
        params.kv_unified = unified
        params.n_threads = threads
        params.n_threads_batch = threads
        params.no_perf = True
        params.type_k = KV_CACHE_TYPES[config.cache_type_k][0]
        params.type_v = KV_CACHE_TYPES[config.cache_type_v][0]
        n_kv_seq = kv_size // num_slots if not unified else kv_size  # KV cells one sequence's attention spans
        self._flash_attn = resolve_flash_attn(
            config.flash_attn,
            on_cpu=self._device == "CPU" or config.n_gpu_layers == 0,
            own_cells=not unified or num_slots == 1,
            type_v=config.cache_type_v,
            scores_bytes=params.n_ubatch * n_kv_seq * max(1, llama_cpp.llama_model_n_head(model)) * 4,
        )
        params.flash_attn_type = _FLASH_ATTN[self._flash_attn]
        ctx = self._ctx = llama_cpp.llama_init_from_model(model, params)
        if not ctx:
            hint = "lower --ctx-size or --parallel"
            if config.cache_type_v not in ("f32", "f16", "bf16"):
                hint += f"; a quantized V cache ({config.cache_type_v}) needs flash attention (--flash-attn on)"
            raise LocalServeError(
                f"llama.cpp could not create a context of {kv_size} KV tokens x {num_slots} sequences; {hint}"
            )
        if self._flash_attn != config.flash_attn:
            log.debug("%s: flash attention %s (%s)", Path(config.model_path).name, self._flash_attn, config.flash_attn)
        self._mem = llama_cpp.llama_get_memory(ctx)
        self._batch = llama_cpp.llama_batch_init(config.step_tokens, 0, 1)
        self._split_kv = not params.kv_unified
        kv_actual = int(llama_cpp.llama_n_ctx(ctx))
        per_slot = int(llama_cpp.llama_n_ctx_seq(ctx)) if self._split_kv else kv_actual
        self._capacity = Capacity(
            num_slots=num_slots,
            step_tokens=config.step_tokens,
            kv_size=per_slot * num_slots if self._split_kv else kv_actual,
            n_ctx=min(n_ctx, per_slot),
            max_draft_tokens=MAX_DRAFT_TOKENS,
            slot_streams=self._split_kv,
        )
        self._n_ctx_train = n_ctx_train

    def _open_draft(self, config: LlamaCppConfig) -> DraftModel:
        """The draft model, in a context of the same slot layout as the model's."""
        ctx, _, _ = self._native()
        draft = DraftModel(
            Path(config.draft_model_path),
            target=self._tokenizer,
            kv_size=int(llama_cpp.llama_n_ctx(ctx)),
            num_slots=self._capacity.num_slots,
            unified=not self._split_kv,
            step_tokens=config.step_tokens,
            threads=self._threads,
            flash_attn=_FLASH_ATTN[self._flash_attn],
            device=config.device,
            n_gpu_layers=config.n_gpu_layers,
        )
        self._capacity = dataclasses.replace(self._capacity, has_draft_model=True)
        return draft

    # ---- GenerativeBackend ---------------------------------------------------

    def capacity(self) -> Capacity:
        return self._capacity

    def warm_up(self) -> None:
        ctx, _, b = self._native()
        assert self._model is not None
        warm_up(self._model, ctx, b)
        if self._draft is not None:
            self._draft.warm_up()

    def tokenizer(self) -> LlamaTokenizer:
        return self._tokenizer

    def cpu_threads(self) -> int:
        return self._threads

    def set_cpu_threads(self, threads: int) -> None:
        """llama.cpp takes the count per decode (`llama_set_n_threads`); with
        one thread ggml computes on the calling thread, no OpenMP team."""
        ctx, _, _ = self._native()
        threads = max(1, min(self._threads, threads))
        llama_cpp.llama_set_n_threads(ctx, threads, threads)
        if self._draft is not None:
            self._draft.set_threads(threads)

    def info(self) -> BackendInfo:
        model = self._model
        if model is None:
            raise BackendError("the model is closed")
        desc = ctypes.create_string_buffer(256)
        llama_cpp.llama_model_desc(model, desc, len(desc))
        return BackendInfo(
            backend="llamacpp",
            device=self._device,
            model_path=self.config.model_path,
            architecture=desc.value.decode("utf-8", errors="replace"),
            num_params=int(llama_cpp.llama_model_n_params(model)),
            n_ctx_train=int(self._n_ctx_train),
        )

    def validate(self, params: SamplingParams) -> None:
        """Raise InvalidRequestError now if `params` cannot build a sampler
        (e.g. a grammar that does not compile). Safe from any thread."""
        if params.grammar is not None:
            self._matcher(params.grammar)

    def kv_state_identity(self) -> str | None:
        config = self.config
        stat = Path(config.model_path).stat()
        layout = "streams" if self._split_kv else "pool"
        return (
            f"{Path(config.model_path).resolve()}|{stat.st_size}|{stat.st_mtime_ns}|k={config.cache_type_k}|"
            f"v={config.cache_type_v}|fa={self._flash_attn}|{layout}|lib={library_build()}"
        )

    def execute(self, batch: StepPlan) -> StepResult:
        ctx, mem, b = self._native()
        self.release(batch.released_seq_ids)
        state = self._apply_kv_ops(ctx, mem, batch.kv_ops)
        if not batch.chunks:  # a step of KV edits only (saves at unload)
            return StepResult({}, saved=state.saved)
        if state.restore_failed:
            batch = dataclasses.replace(
                batch, chunks=tuple(c for c in batch.chunks if c.slot not in state.restore_failed)
            )
        failed = self._ensure_samplers(batch)
        model_drafts = self._draft.drafts_for(batch) if self._draft is not None else {}
        sample_at, num_outputs = _fill_batch(b, batch, model_drafts)
        rc = llama_cpp.llama_decode(ctx, b)
        if rc != 0:
            reason = _DECODE_ERRORS.get(rc, "internal error")
            raise BackendError(f"llama_decode failed with code {rc} ({reason})")
        rows = _LogitsRows(ctx, num_outputs, self._n_vocab)
        firsts = self._firsts(rows, sample_at, model_drafts, failed)
        sampled: dict[int, SampledToken] = {}
        accepted: dict[int, tuple[SampledToken, ...]] = {}
        for chunk, index in sample_at:
            fed = chunk.token_ids + tuple(model_drafts.get(chunk.seq_id, ()))
            num_draft = chunk.num_draft + len(model_drafts.get(chunk.seq_id, ()))
            try:
                if chunk.seq_id in failed:
                    continue
                sampled[chunk.seq_id] = first = self._sample(rows, chunk, index, firsts.get(chunk.seq_id))
                if num_draft:
                    drafts = fed[len(fed) - num_draft :]
                    accepted[chunk.seq_id] = self._verify(rows, chunk, index, first.token_id, drafts)
            except InvalidRequestError as exc:  # this sequence only: e.g. a grammar that allows no token
                failed[chunk.seq_id] = exc.message
                sampled.pop(chunk.seq_id, None)
                accepted.pop(chunk.seq_id, None)
            finally:
                num_kept = len(fed) - num_draft + len(accepted.get(chunk.seq_id, ()))
                self._keep_fed(mem, chunk, fed, num_kept)
        for chunk in batch.chunks:
            if not chunk.sample and self._draft is not None:
                self._draft.record(chunk, chunk.token_ids)
        drafted = {seq_id: len(d) for seq_id, d in model_drafts.items()}
        return StepResult(
            sampled=sampled,
            failed=failed,
            accepted=accepted,
            drafted=drafted,
            saved=state.saved,
            restore_s=state.restore_s,
            restore_failed=tuple(state.restore_failed),
        )

    def _firsts(
        self,
        rows: _LogitsRows,
        sample_at: list[tuple[SeqChunk, int]],
        model_drafts: dict[int, list[int]],
        failed: dict[int, str],
    ) -> dict[int, int]:
        """The first token of every plain greedy and plain sampled sequence of
        the step (no drafts to verify): one argmax over the greedy rows, one
        `sample_rows` over the others (a row it leaves out samples alone)."""
        greedy: tuple[list[int], list[int], list[NumpySampler]] = ([], [], [])
        sampled: tuple[list[int], list[int], list[NumpySampler]] = ([], [], [])
        for chunk, index in sample_at:
            sampler = self._samplers.get(chunk.seq_id)
            if (
                not isinstance(sampler, NumpySampler)
                or chunk.seq_id in failed
                or chunk.num_draft
                or chunk.seq_id in model_drafts
            ):
                continue
            group = greedy if sampler.plain_greedy else sampled if sampler.plain_sampled else None
            if group is not None:
                group[0].append(chunk.seq_id)
                group[1].append(rows.row_of(index))
                group[2].append(sampler)
        firsts: dict[int, int] = {}
        for (seq_ids, row_ids, samplers), pick in ((greedy, greedy_rows), (sampled, sample_rows)):
            if seq_ids:
                tokens = pick(rows.table, row_ids, samplers)
                firsts.update(
                    (seq_id, token) for seq_id, token in zip(seq_ids, tokens, strict=True) if token is not None
                )
        return firsts

    def _sample(self, rows: _LogitsRows, chunk: SeqChunk, index: int, token_id: int | None = None) -> SampledToken:
        """The token at batch index `index` (`token_id`: already taken by the
        step's argmax or `sample_rows`), with its log-probability when asked."""
        sampler = self._samplers[chunk.seq_id]
        num_top = chunk.sampling.logprobs
        if isinstance(sampler, SamplerChain):
            token_id = sampler.sample(rows.ctx, index)
            logprob = None
            if num_top is not None:
                logprob = token_logprob(rows.ctx, index, self._n_vocab, token_id, num_top)
            return SampledToken(token_id, logprob, ends=sampler.ended)
        if token_id is not None and num_top is None:  # taken by the step's argmax or sample_rows
            return SampledToken(token_id, None, ends=sampler.ended)
        row = rows.table[rows.row_of(index)]
        if token_id is None:
            token_id = sampler.sample(row)
        logprob = row_logprob(row, token_id, num_top) if num_top is not None else None
        return SampledToken(token_id, logprob, ends=sampler.ended)

    def _verify(
        self, rows: _LogitsRows, chunk: SeqChunk, index: int, token_id: int, drafts: tuple[int, ...]
    ) -> tuple[SampledToken, ...]:
        """Sample at each draft position while the token sampled before it
        equals the draft (engine/step/speculation.py): the tokens sampled after
        each accepted draft, in order."""
        out: list[SampledToken] = []
        for offset, draft in enumerate(drafts, start=1):
            if token_id != draft:
                break
            sampled = self._sample(rows, chunk, index + offset)
            out.append(sampled)
            token_id = sampled.token_id
        return tuple(out)

    def _keep_fed(self, mem: llama_cpp.llama_memory_t, chunk: SeqChunk, fed: tuple[int, ...], num_kept: int) -> None:
        """Keep the KV cells of the first `num_kept` fed tokens (a step's
        tokens and its accepted drafts); the rejected drafts' cells go."""
        if num_kept < len(fed):
            llama_cpp.llama_memory_seq_rm(mem, chunk.slot, chunk.start_pos + num_kept, -1)
        if self._draft is not None:
            self._draft.record(chunk, fed[:num_kept])

    def release(self, seq_ids: Collection[int]) -> None:
        for seq_id in seq_ids:
            sampler = self._samplers.pop(seq_id, None)
            if isinstance(sampler, SamplerChain):
                sampler.free()

    def clear_slots(self, slots: Collection[int]) -> None:
        _, mem, _ = self._native()
        for slot in slots:
            llama_cpp.llama_memory_seq_rm(mem, slot, -1, -1)
        if self._draft is not None:
            self._draft.forget(list(slots))

    def close(self) -> None:
        for sampler in getattr(self, "_samplers", {}).values():
            if isinstance(sampler, SamplerChain):
                sampler.free()
        self._samplers = {}
        if getattr(self, "_draft", None) is not None:
            self._draft.close()  # type: ignore[union-attr]
            self._draft = None
        if self._batch is not None:
            llama_cpp.llama_batch_free(self._batch)
            self._batch = None
        self._mem = None  # the context's
        if self._ctx:
            llama_cpp.llama_free(self._ctx)
            self._ctx = None
        if self._model:
            llama_cpp.llama_model_free(self._model)
            self._model = None

    # ---- internals -----------------------------------------------------------

    def _native(self) -> tuple[llama_cpp.llama_context_p, llama_cpp.llama_memory_t, llama_cpp.llama_batch]:
        """The context, its memory and the batch; a clear error once closed."""
        ctx, mem, b = self._ctx, self._mem, self._batch
        if ctx is None or mem is None or b is None:
            raise BackendError("the model is closed")
        return ctx, mem, b

    def _apply_kv_ops(
        self, ctx: llama_cpp.llama_context_p, mem: llama_cpp.llama_memory_t, kv_ops: tuple[KvOp, ...]
    ) -> KvEdits:
        if self._draft is not None:
            self._draft.follow_kv_ops(kv_ops)
        return apply_kv_ops(ctx, mem, kv_ops, split_kv=self._split_kv)

    def _matcher(self, grammar: str) -> GrammarMatcher:
        return GrammarMatcher(self._tokenizer.guidance_tokenizer(), grammar)

    def _ensure_samplers(self, batch: StepPlan) -> dict[int, str]:
        """A sampler for every sequence that samples in this step and has
        none yet: numpy's, or a native chain under a grammar."""
        failed: dict[int, str] = {}
        for chunk in batch.chunks:
            if chunk.sample and chunk.seq_id not in self._samplers:
                params = chunk.sampling
                eog = self._tokenizer.eog_token_ids
                budget = think_budget(params, self._tokenizer)
                try:
                    if params.grammar is None:
                        self._samplers[chunk.seq_id] = NumpySampler(params, None, budget, eog_token_ids=eog)
                    else:
                        matcher = self._matcher(params.grammar)
                        self._samplers[chunk.seq_id] = SamplerChain(params, self._n_vocab, eog, matcher, budget)
                except InvalidRequestError as exc:
                    failed[chunk.seq_id] = exc.message
        return failed


class _LogitsRows:
    """The step's logits as one numpy table (a view of llama.cpp's output
    buffer, valid until the next decode), and the row of a batch index."""

    __slots__ = ("ctx", "table", "_base", "_row_bytes")

    def __init__(self, ctx: llama_cpp.llama_context_p, num_outputs: int, n_vocab: int) -> None:
        self.ctx = ctx
        pointer = llama_cpp.llama_get_logits(ctx)  # outputs in batch order (llama.cpp reorders them first)
        self.table = np.ctypeslib.as_array(
            ctypes.cast(pointer, ctypes.POINTER(ctypes.c_float)), shape=(max(num_outputs, 1), n_vocab)
        )
        self._base = ctypes.cast(pointer, ctypes.c_void_p).value or 0
        self._row_bytes = 4 * n_vocab

    def row_of(self, index: int) -> int:
        """The row of the token at batch index `index` (its logits were asked for)."""
        address = ctypes.cast(llama_cpp.llama_get_logits_ith(self.ctx, index), ctypes.c_void_p).value or 0
        return (address - self._base) // self._row_bytes


def _fill_batch(
    b: llama_cpp.llama_batch, batch: StepPlan, model_drafts: dict[int, list[int]]
) -> tuple[list[tuple[SeqChunk, int]], int]:
    """Write the step's tokens (and the draft model's drafts) into `b`; the
    chunks that sample, with the index in `b` of their last token before
    any drafts, and the number of tokens whose logits are asked for."""
    token, pos, n_seq_id, seq_id, logits = b.token, b.pos, b.n_seq_id, b.seq_id, b.logits
    k = 0
    num_outputs = 0
    sample_at = []
    # In slot order: with one KV stream per slot, llama.cpp puts into one
    # micro-batch only sequences whose ids run consecutively in the batch
    # (`split_equal`, sequential); sequences in any other order become one
    # graph computation each, which made 16-sequence decode steps 1.5-2x slower.
    for chunk in sorted(batch.chunks, key=lambda c: c.slot):
        slot = chunk.slot
        p = chunk.start_pos
        extra = model_drafts.get(chunk.seq_id, ())
        for tok in (*chunk.token_ids, *extra):
            token[k] = tok
            pos[k] = p  # type: ignore[call-overload]  # pos is a llama_pos*; llama_cpp's stubs say an array of arrays
            n_seq_id[k] = 1
            seq_id[k][0] = slot
            logits[k] = 0
            k += 1
            p += 1
        if chunk.sample:  # logits at the last token, and at every draft verified after it
            first = k - 1 - chunk.num_draft - len(extra)
            for i in range(first, k):
                logits[i] = 1
            num_outputs += k - first
            sample_at.append((chunk, first))
    b.n_tokens = k
    return sample_at, num_outputs
