"""The step loop: apply pending commands, schedule, run, settle the KV blocks, postprocess.

``LLMEngine`` is driven by exactly one thread (its owner): the offline ``LLM`` calls ``step()``
itself; the server's ``AsyncEngine`` runs it on a background thread. Any other thread may add
requests or issue commands (policy switch, memory reserve, reclaim, abort, snapshot): they go
through the ``CommandQueue`` (engine/commands.py) and are applied at the next step boundary,
so a switch never lands in the middle of a batch.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

import torch
from tokenizers import Tokenizer

from engine.admission import check_request, check_text_size, max_prompt_bytes
from engine.batch import ScheduledBatch, StepInfo, StepResult
from engine.commands import CommandQueue
from engine.config import EngineConfig, EngineLimits, config_options
from engine.detokenizer import IncrementalDetokenizer
from engine.errors import QueueFull, RequestRejected
from engine.families import Family, child_seed
from engine.kv_cache import BlockManager, StepChanges
from engine.kv_stats import KVIntegrity, KVStats, ReclaimResult
from engine.outputs import RequestMetrics, RequestOutput, TokenLogprob
from engine.runner import Runner
from engine.sampling_params import SamplingParams
from engine.sequence import NO_BLOCKS, Sequence
from engine.snapshot import (
    EngineSnapshot,
    Latency,
    QueueDepths,
    ReclaimRecord,
    RequestSnapshot,
    Throughput,
    Totals,
)
from engine.stats import EngineStats, StepRecord
from policies.base import SchedulingPolicy
from policies.registry import as_spec, make_policy
from policies.spec import PolicySpec

if TYPE_CHECKING:
    from engine.builder import ModelBundle

Prompt = str | list[int]


class LLMEngine:
    def __init__(
        self,
        config: EngineConfig,
        runner: Runner,
        limits: EngineLimits,
        tokenizer: Tokenizer | None = None,
        eos_token_ids: tuple[int, ...] = (),
        vocab_size: int | None = None,
        clock: Callable[[], float] = time.monotonic,
        policy: PolicySpec | str | dict[str, Any] | None = None,
    ) -> None:
        self.config = config
        self.runner = runner
        self.limits = limits
        self.tokenizer = tokenizer
        self.max_prompt_bytes = (
            0 if tokenizer is None else max_prompt_bytes(tokenizer, limits.max_model_len)
        )
        """UTF-8 bytes of text past which a prompt cannot fit (computed once, at build)."""
        self.eos_token_ids = frozenset(eos_token_ids)
        self.vocab_size = vocab_size
        self.clock = clock
        self.blocks = BlockManager(
            limits.num_kv_blocks,
            limits.block_size,
            config.memory_reserve,
            config.enable_prefix_caching,
        )
        self.policy_spec = as_spec(policy or config.policy)
        self.policy: SchedulingPolicy = make_policy(self.policy_spec, limits, self.blocks, clock)
        self.policy_version: int | None = None
        """The version given with the running policy to ``set_policy`` (None: not given)."""
        self.stats = EngineStats()
        self.started_at = clock()
        self.wakeup = threading.Event()
        self._sequences: dict[str, Sequence] = {}
        self._families: dict[str, Family] = {}
        """Requests with ``n`` > 1 (engine/families.py), by request id, until they end."""
        self._inbox: deque[Sequence] = deque()
        self._inbox_lock = threading.Lock()
        self.commands = CommandQueue(self.wakeup, self._drain_inbox)
        self._pending_outputs: list[RequestOutput] = []
        self.current_step: StepInfo | None = None
        """The step whose batch is running now (None between steps); read by the watchdog."""

    @classmethod
    def from_config(
        cls,
        config: EngineConfig,
        clock: Callable[[], float] = time.monotonic,
        bundle: ModelBundle | None = None,
        policy: PolicySpec | str | dict[str, Any] | None = None,
    ) -> LLMEngine:
        """Load the checkpoint (or reuse a loaded ``bundle``) and size a fresh KV pool."""
        from engine.builder import build_runner, load_bundle

        torch.manual_seed(config.seed)
        bundle = bundle or load_bundle(config)
        runner, limits = build_runner(bundle, config)
        return cls(
            config,
            runner,
            limits,
            tokenizer=bundle.tokenizer,
            eos_token_ids=bundle.eos_token_ids,
            vocab_size=bundle.config.vocab_size,
            clock=clock,
            policy=policy,
        )

    # -- requests -----------------------------------------------------------------------

    def tokenize(self, prompt: Prompt) -> list[int]:
        """Token ids of a prompt (thread-safe). Text that cannot fit ``max_model_len`` is refused
        before it is tokenized; ``encode_batch`` releases the GIL while it works (``encode`` does
        not), so a server calling this on a worker thread keeps answering meanwhile."""
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise RequestRejected("this model has no tokenizer: send token ids", "prompt")
            check_text_size(prompt, self.max_prompt_bytes, self.limits.max_model_len)
            return self.tokenizer.encode_batch([prompt])[0].ids
        return list(prompt)

    def add_request(
        self,
        prompt: Prompt,
        params: SamplingParams | None = None,
        request_id: str | None = None,
        arrival_time: float | None = None,
    ) -> str:
        """Validate and queue a request (thread-safe); it joins the policy at the next step."""
        params = params or SamplingParams()
        token_ids = self.tokenize(prompt)
        self.check_request(token_ids, params)
        if self.num_waiting >= self.config.max_waiting:
            raise QueueFull(f"waiting queue is full (max_waiting={self.config.max_waiting})")
        request_id = request_id or uuid.uuid4().hex
        arrival = self.clock() if arrival_time is None else arrival_time
        seq = self._new_sequence(request_id, token_ids, params, arrival)
        with self._inbox_lock:
            if request_id in self._sequences or any(s.seq_id == request_id for s in self._inbox):
                raise RequestRejected(f"request id {request_id!r} is already in use", "request_id")
            self._inbox.append(seq)
        self.wakeup.set()
        return request_id

    def _new_sequence(
        self,
        seq_id: str,
        token_ids: list[int],
        params: SamplingParams,
        arrival_time: float,
        index: int = 0,
        request_id: str = "",
    ) -> Sequence:
        seq = Sequence(seq_id, token_ids, params, arrival_time, index=index, request_id=request_id)
        seed = child_seed(params.seed, index)
        if seed is not None:
            seq.generator = torch.Generator(device=self._device).manual_seed(seed)
        if self.tokenizer is not None:
            seq.detokenizer = IncrementalDetokenizer.for_prompt(
                self.tokenizer, len(token_ids), params.stop
            )
        return seq

    def check_request(self, token_ids: list[int], params: SamplingParams) -> None:
        """Raise ``RequestRejected`` (naming the field) for a request that can never be served."""
        check_request(token_ids, params, self.limits, self.blocks, self.vocab_size)

    def abort(self, request_id: str) -> Future[bool]:
        """Stop a request and free its blocks; its stream ends with ``finish_reason='abort'``."""
        return self.commands.submit(lambda: self._abort(request_id))

    def release_buffers(self) -> Future[None]:
        """At the next step boundary, free what the runner keeps between steps (the decode
        gather buffers; a runner without any, such as the simulator's, keeps nothing)."""

        def release() -> None:
            if (free := getattr(self.runner, "release_buffers", None)) is not None:
                free()

        return self.commands.submit(release)

    def has_unfinished_requests(self) -> bool:
        return bool(self._sequences or self._inbox or self._pending_outputs)

    @property
    def num_waiting(self) -> int:
        return len(self._inbox) + len(self.policy.waiting)

    # -- the step ---------------------------------------------------------------------

    def step(self) -> list[RequestOutput]:
        started = time.perf_counter()
        with self.commands.step():
            outputs, self._pending_outputs = self._pending_outputs, []
            changes = self.blocks.begin_step()
            try:
                batch = self.policy.schedule(changes)
                if batch.is_empty:
                    changes.commit({})
                    return outputs
                now = self.clock()
                for entry in batch.entries:
                    if entry.seq.first_scheduled_time is None:
                        entry.seq.first_scheduled_time = now
                counts = batch.token_counts()
                self.current_step = StepInfo.of(self.stats.num_steps + 1, batch, counts)
                result = self.runner.execute(batch)
            except BaseException:
                self._roll_back(changes)
                raise
            finally:
                self.current_step = None
            requeued = self._settle(changes, batch, result)
            outputs.extend(self._postprocess(batch, result, requeued))
            self._requeue(requeued)
            generated = len(result.token_ids) - len(result.failed) - len(requeued)
            self._record(batch, started, generated, counts)
            return outputs

    def _settle(self, changes: StepChanges, batch: ScheduledBatch, result: StepResult) -> set[str]:
        """The rows that ran commit their tokens' K/V; a failed row's block changes roll back
        (its request is then ended by ``_postprocess``). Returns the requests admitted in this
        step on prefix blocks a failed row published: rolled back too, they are requeued."""
        failed = result.failed
        dropped = set(changes.rollback(failed)) | failed.keys() if failed else set()
        written: dict[str, tuple[int, int]] = {}
        for entry in batch.entries:  # hot: once per sequence per step
            num_new = entry.num_new_tokens
            if num_new:
                seq = entry.seq
                if dropped and seq.seq_id in dropped:
                    continue
                start = seq.num_computed_tokens
                seq.num_computed_tokens = end = start + num_new
                written[seq.seq_id] = (start, end)
        changes.commit(written)
        return dropped - failed.keys()

    def _roll_back(self, changes: StepChanges) -> None:
        """The step failed as a whole: undo all its block changes."""
        if changes.is_open:
            self._requeue(changes.rollback())

    def _requeue(self, undone: Iterable[str]) -> None:
        """Sequences whose admission was undone hold no blocks: they go back to waiting, the
        policy re-adopting what still holds blocks (as a policy switch does)."""
        seqs = [self._sequences[seq_id] for seq_id in undone]
        for seq in seqs:
            seq.num_computed_tokens = 0
            seq.block_table = NO_BLOCKS
        if seqs:
            self.policy.adopt(self.policy.handover())

    def _postprocess(
        self, batch: ScheduledBatch, result: StepResult, requeued: set[str]
    ) -> list[RequestOutput]:
        """Turn the step's tokens into outputs; a row in ``result.failed`` ends only its own
        request, a requeued one's token is dropped (it is computed again)."""
        now = self.clock()
        if result.prompt_logprobs:
            self._record_prompt_logprobs(result.prompt_logprobs, requeued | result.failed.keys())
        sampled = iter(result.token_ids)
        logprobs = iter(result.logprobs) if result.logprobs is not None else None
        outputs: list[RequestOutput] = []
        finished: list[Sequence] = []
        failed: list[Sequence] = []
        forked: list[Sequence] = []
        failed_rows = result.failed
        families = self._families
        for entry in batch.entries:  # hot: once per sequence per step
            if not entry.sample:
                continue
            seq = entry.seq
            token = next(sampled)
            logprob = next(logprobs) if logprobs is not None else None
            if requeued and seq.seq_id in requeued:
                continue
            if failed_rows and seq.seq_id in failed_rows:
                failed.append(seq)
                continue
            seq.append_token(token, now, logprob)
            if self._check_stop(seq, token, now):
                finished.append(seq)
            if not families or seq.request_id not in families:
                outputs.append(RequestOutput.of(seq, [token]))
                continue
            family = families[seq.request_id]
            if seq.index == 0 and len(seq.token_ids) - len(seq.prompt_token_ids) == 1:
                forked.extend(family.fork(seq, self.blocks, self._new_sequence, self._sequences))
            if seq.is_finished:
                family.live -= 1
            outputs.append(RequestOutput.of(seq, [token], None, family.siblings_running(seq)))
        if forked:
            self.policy.adopt(forked)
        blocks = self.blocks  # after the step's writes, before finished requests leave
        batch.kv_held_slots = blocks.num_used * blocks.block_size  # as KVStats.held_slots
        batch.kv_live_tokens = blocks.live_tokens
        for seq in failed:
            self.policy.abort(seq.seq_id)  # frees its blocks
            seq.finish("error", now)
            siblings = self._left_family(seq)
            outputs.append(RequestOutput.of(seq, [], result.failed[seq.seq_id], siblings))
        self.policy.on_step_done(batch, finished)
        for seq in finished + failed:
            self._sequences.pop(seq.seq_id, None)
            self.stats.record_finish(RequestMetrics.of(seq), seq.num_output_tokens)
        for seq in finished:
            family = families.get(seq.request_id) if families else None
            if family is not None and family.live == 0:
                del families[seq.request_id]
        return outputs

    def _record_prompt_logprobs(
        self, computed: dict[str, tuple[int, list[TokenLogprob]]], undone: set[str]
    ) -> None:
        """Append what the step computed of each asking sequence's prompt logprobs (a chunk
        computed again, after a preemption, adds nothing)."""
        for seq_id, (start, entries) in computed.items():
            seq = self._sequences.get(seq_id)
            if seq_id in undone or seq is None or seq.prompt_logprobs is None:
                continue
            known = seq.prompt_logprobs
            if start <= len(known) < start + len(entries):
                known.extend(entries[len(known) - start :])

    def _left_family(self, seq: Sequence) -> int:
        """``seq`` ended (error or abort): how many of its request's sequences still run
        (0 for a request of one); a request with none left is forgotten."""
        family = self._families.get(seq.request_id)
        if family is None:
            return 0
        family.live -= 1
        if family.live == 0:
            del self._families[seq.request_id]
        return family.live

    def _check_stop(self, seq: Sequence, token: int, now: float) -> bool:
        """Finish ``seq`` if ``token`` ends it; returns whether it did."""
        params = seq.params
        matched = seq.detokenizer.update(seq.token_ids) if seq.detokenizer else None
        num_tokens = len(seq.token_ids)
        if not params.ignore_eos and token in self.eos_token_ids:
            seq.finish("stop", now)
        elif params.stop_token_ids and token in params.stop_token_ids:
            seq.finish("stop", now, stop_reason=token)
        elif matched is not None:
            seq.finish("stop", now, stop_reason=matched)
        elif (
            num_tokens - len(seq.prompt_token_ids) >= params.max_tokens
            or num_tokens >= self.limits.max_model_len
        ):
            seq.finish("length", now)
        else:
            return False
        return True

    def _record(
        self,
        batch: ScheduledBatch,
        started: float,
        generated: int,
        counts: tuple[int, int, int],
    ) -> None:
        prefill, decode, padded = counts
        self.stats.record_step(
            StepRecord(
                time=self.clock(),
                wall_s=time.perf_counter() - started,
                forward_s=self.runner.last_forward_s,
                mode=batch.mode,
                num_seqs=batch.num_seqs,
                prefill_tokens=prefill,
                decode_tokens=decode,
                padded_tokens=padded,
                generated_tokens=generated,
                preempted=len(batch.preempted),
                kv_held_slots=batch.kv_held_slots,
                kv_live_tokens=batch.kv_live_tokens,
            )
        )

    # -- commands (applied at step boundaries) --------------------------------------------

    def bind_to_current_thread(self) -> None:
        """Make the calling thread the one that steps the engine (the server's loop)."""
        self.commands.bind_to_current_thread()

    def has_pending_commands(self) -> bool:
        return self.commands.has_pending()

    def _drain_inbox(self) -> None:
        with self._inbox_lock:
            arrived, self._inbox = self._inbox, deque()
            for seq in arrived:
                self._sequences[seq.seq_id] = seq
        for seq in arrived:
            if seq.params.n > 1:
                self._families[seq.request_id] = Family(seq.request_id, [seq], live=1)
            self.policy.add(seq)

    def _queued(self) -> list[Sequence]:
        with self._inbox_lock:
            return list(self._inbox)

    def set_policy(
        self, spec: PolicySpec | str | dict[str, Any], version: int | None = None
    ) -> Future[PolicySpec]:
        """Validate now (raises pydantic's ValidationError); switch at the next boundary.
        ``version`` (the control plane's policy version) is recorded with the switch and
        reported by ``snapshot().policy_version``."""
        spec = as_spec(spec)
        new_policy = make_policy(spec, self.limits, self.blocks, self.clock)

        def switch() -> PolicySpec:
            new_policy.adopt(self.policy.handover())
            new_policy.num_preemptions = self.policy.num_preemptions
            self.policy, self.policy_spec, self.policy_version = new_policy, spec, version
            return spec

        return self.commands.submit(switch)

    def set_memory_reserve(self, fraction: float) -> Future[float]:
        config_options()["memory_reserve"].check(fraction)

        def apply() -> float:
            self.blocks.memory_reserve = fraction
            self.config.memory_reserve = fraction
            return fraction

        return self.commands.submit(apply)

    def reclaim(self) -> Future[ReclaimResult]:
        """The maintenance sweep: free leaked blocks, then the memory-reserve guard."""

        def sweep() -> ReclaimResult:
            live = self.policy.live_ids() | {s.seq_id for s in self._queued()}
            result = self.blocks.reclaim(live)
            self.stats.record_reclaim(self.clock(), result)
            return result

        return self.commands.submit(sweep)

    def _abort(self, request_id: str) -> bool:
        """Abort every unfinished sequence of the request (all ``n`` of them)."""
        self._drain_inbox()
        family = self._families.get(request_id)
        if family is not None:
            seqs = family.unfinished()
        else:
            seq = self._sequences.get(request_id)
            seqs = [] if seq is None else [seq]
        now = self.clock()
        for seq in seqs:
            self._sequences.pop(seq.seq_id, None)
            self.policy.abort(seq.seq_id)
            seq.finish("abort", now)
            siblings = self._left_family(seq)
            self._pending_outputs.append(RequestOutput.of(seq, [], None, siblings))
            self.stats.record_finish(RequestMetrics.of(seq), seq.num_output_tokens)
        return bool(seqs)

    # -- inspection -----------------------------------------------------------------------

    def kv_stats(self) -> KVStats:
        return self.blocks.stats()

    def check_kv_integrity(self) -> Future[KVIntegrity]:
        """The block manager's self-check at the next step boundary (no step half-applied)."""

        def check() -> KVIntegrity:
            problems = tuple(self.blocks.integrity_problems())
            return KVIntegrity(ok=not problems, problems=problems, stats=self.blocks.stats())

        return self.commands.submit(check)

    def snapshot(self, timeout: float | None = 30.0) -> EngineSnapshot:
        """A consistent picture of queue, requests and KV (taken at a step boundary); waits up
        to ``timeout`` for the boundary (``TimeoutError`` after it)."""
        return self.commands.call(self._snapshot, timeout)

    def _snapshot(self) -> EngineSnapshot:
        now, blocks, stats = self.clock(), self.blocks, self.stats
        queued = self._queued()
        requests = tuple(
            RequestSnapshot.of(s, len(blocks.table(s.seq_id)) if blocks.holds(s.seq_id) else 0, now)
            for s in [*self._sequences.values(), *queued]
        )
        scheduler = self.policy.snapshot()  # a fresh model: the queued requests count as waiting
        scheduler = scheduler.model_copy(update={"waiting": scheduler.waiting + len(queued)})
        return EngineSnapshot(
            policy=self.policy_spec,
            policy_version=self.policy_version,
            scheduler=scheduler,
            queue=QueueDepths(
                waiting=scheduler.waiting,
                running=scheduler.running,
                max_waiting=self.config.max_waiting,
            ),
            memory_reserve=blocks.memory_reserve,
            uptime_s=now - self.started_at,
            requests=requests,
            kv=blocks.stats(),
            block_map=blocks.block_map(),
            throughput=Throughput.model_validate(stats.throughput(now)),
            latency=Latency.model_validate(stats.latency(now)),
            totals=Totals.of(stats),
            reclaims=tuple(
                ReclaimRecord(**asdict(r), time=t) for t, r in list(stats.reclaims)[-10:]
            ),
        )

    @property
    def _device(self) -> torch.device:
        device = getattr(self.runner, "device", None)
        return device if isinstance(device, torch.device) else torch.device("cpu")
