"""The step loop: apply pending commands, schedule, run, settle the KV blocks, postprocess.

``LLMEngine`` is driven by exactly one thread (its owner): the offline ``LLM`` calls ``step()``
itself; the server's ``AsyncEngine`` runs it on a background thread. Any other thread may add
requests or issue commands (policy switch, memory reserve, reclaim, abort, snapshot): they go
through the ``CommandQueue`` (serving/commands.py) and are applied at the next step boundary,
so a switch never lands in the middle of a batch.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import abc, deque
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

import torch
from tokenizers import Tokenizer

from engine.batch import ScheduledBatch, StepInfo, StepResult
from engine.config import EngineConfig, EngineLimits, config_options
from engine.errors import QueueFull, RequestRejected
from engine.front import EngineFront, Prompt, QueuedPrompt, request_ids
from engine.kv_cache import BlockManager
from engine.kv_stats import KVIntegrity, KVStats, ReclaimResult
from engine.kv_step import StepChanges
from engine.outputs import RequestMetrics, RequestOutput
from engine.runner import Runner
from engine.sampling_params import SamplingParams
from engine.sequence import NO_BLOCKS, Sequence
from engine.stats import EngineStats, StepRecord
from engine.tenants import TenantLedger
from engine.timeline import RequestTimeline, TimelineRecorder
from policies.base import SchedulingPolicy
from policies.discipline import QueueDiscipline, make_discipline
from policies.queue import FairQueue, FcfsQueue, QueueSpec
from policies.registry import as_spec, make_policy
from policies.spec import PolicySpec
from serving.commands import CommandQueue
from serving.families import Families, child_seed
from serving.snapshot import EngineSnapshot

if TYPE_CHECKING:
    from engine.builder import ModelBundle


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
        policy: PolicySpec | str | Mapping[str, Any] | None = None,
        queue: QueueSpec | None = None,
    ) -> None:
        self.config = config
        self.runner = runner
        self.front = EngineFront(config, limits, tokenizer, eos_token_ids, vocab_size)
        """Tokenizer, limits and admission checks: what a request is judged by before it queues."""
        self.clock = clock
        self.blocks = BlockManager(
            limits.num_kv_blocks,
            limits.block_size,
            config.memory_reserve,
            config.enable_prefix_caching,
        )
        self.tenants = TenantLedger()
        """Each tenant's service so far (engine/tenants.py); kept across every switch."""
        self.queue_spec: QueueSpec = queue or FcfsQueue()
        self.tenants.configure(self.queue_spec.cost())
        self.policy_spec = as_spec(policy or config.policy)
        self.policy: SchedulingPolicy = make_policy(
            self.policy_spec, limits, self.blocks, clock, self._discipline(self.queue_spec)
        )
        self.policy_version: int | None = None
        """The version given with the running policy to ``set_policy`` (None: not given)."""
        self.stats = EngineStats()
        self.timelines = TimelineRecorder(config.timelines_kept, config.wait_window_s)
        self.timelines.max_wait_s = self.policy.params.max_wait_s
        """Each request's timeline and why it waits (engine/timeline.py); engine thread only."""
        self.started_at = clock()
        self.wakeup = threading.Event()
        self._sequences: dict[str, Sequence] = {}
        self.families = Families()
        """Requests with ``n`` > 1 (serving/families.py), until they end."""
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
        policy: PolicySpec | str | Mapping[str, Any] | None = None,
        queue: QueueSpec | None = None,
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
            queue=queue,
        )

    # -- requests -----------------------------------------------------------------------

    def add_request(
        self,
        prompt: Prompt,
        params: SamplingParams | None = None,
        request_id: str | None = None,
        arrival_time: float | None = None,
    ) -> str:
        """Validate and queue a request (thread-safe): the batch of one (``add_requests``)."""
        token_ids = self.front.tokenize(prompt)
        queued = QueuedPrompt(token_ids, params or SamplingParams(), request_id or uuid.uuid4().hex)
        return self.add_requests([queued], arrival_time)[0]

    def add_requests(
        self, batch: abc.Sequence[QueuedPrompt], arrival_time: float | None = None
    ) -> list[str]:
        """Validate and queue a batch whole or not at all (thread-safe); its ids, in order.
        Every prompt is checked first (``RequestRejected`` names the one refused); the room in
        the waiting queue for all of them and their ids are checked under the inbox lock, where
        they are appended, so a ``QueueFull`` queues none and two batches never overfill it.
        They join the policy at the next step. Under the ``fair`` queue a tenant's share of
        the waiting queue is bounded too (``QuotaExceeded``, a ``QueueFull``: its neighbours
        still get in); every refusal is counted against its tenants."""
        self.front.check_batch(batch)
        ids = request_ids(batch)
        arrival = self.clock() if arrival_time is None else arrival_time
        seqs = [self._new_sequence(q.request_id, q.token_ids, q.params, arrival) for q in batch]
        max_waiting = self.config.max_waiting
        queue = self.queue_spec  # read once: a switch replaces it whole
        quota = queue.quota(max_waiting) if isinstance(queue, FairQueue) else None
        with self._inbox_lock:
            accounts = self.tenants.admit([q.tenant for q in batch], quota)
            room = max_waiting - self.num_waiting
            if len(seqs) > room:
                self.tenants.refuse(accounts)
                raise QueueFull(_no_room(len(seqs), room, max_waiting))
            queued = {seq.seq_id for seq in self._inbox}
            for request_id in ids:
                if request_id in self._sequences or request_id in queued:
                    self.tenants.refuse(accounts)
                    raise RequestRejected(
                        f"request id {request_id!r} is already in use", "request_id"
                    )
            for seq, prompt, account in zip(seqs, batch, accounts, strict=True):
                seq.priority, seq.tenant, seq.account = prompt.priority, account.name, account
            self._inbox.extend(seqs)
        self.wakeup.set()
        return ids

    def _new_sequence(
        self,
        seq_id: str,
        token_ids: list[int],
        params: SamplingParams,
        arrival_time: float,
        index: int = 0,
        request_id: str = "",
    ) -> Sequence:
        return Sequence.start(
            seq_id,
            token_ids,
            params,
            arrival_time,
            index=index,
            request_id=request_id,
            seed=child_seed(params.seed, index),
            device=self._device,
            tokenizer=self.front.tokenizer,
            grammars=self.front.grammars,
        )

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
        started, started_cpu = time.perf_counter(), time.thread_time()
        with self.commands.step():
            outputs, self._pending_outputs = self._pending_outputs, []
            changes = self.blocks.begin_step()
            try:
                batch = self.policy.schedule(changes)
                now = self.clock()
                self._scheduled(now, batch)
                if batch.is_empty:
                    changes.commit({})
                    self.timelines.ran(batch.paused)
                    return outputs
                for entry in batch.entries:
                    if entry.seq.first_scheduled_time is None:
                        entry.seq.first_scheduled_time = now
                        self._left_queue(entry.seq, charge=True)
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
            self.timelines.ran(batch.paused)
            generated = len(result.token_ids) - len(result.failed) - len(requeued)
            now, wall_s = self.clock(), time.perf_counter() - started
            forward_s, cpu_s = self.runner.last_forward_s, time.thread_time() - started_cpu
            self.stats.record_step(
                StepRecord.of(batch, counts, generated, now, wall_s, forward_s, cpu_s)
            )
            if batch.preempt_causes:
                self.stats.record_preemptions(batch.preempt_causes)
            return outputs

    def _scheduled(self, now: float, batch: ScheduledBatch) -> None:
        """Tell the timelines what the step planned at ``now``."""
        self.timelines.scheduled(
            now,
            batch.admitted,
            batch.preempted,
            batch.preempt_causes,
            batch.waiting_on,
            self.policy.ahead,
        )

    def _settle(self, changes: StepChanges, batch: ScheduledBatch, result: StepResult) -> set[str]:
        """The rows that ran commit their tokens' K/V; a failed row's block changes roll back
        (its request is then ended by ``_postprocess``). Returns the requests admitted in this
        step on prefix blocks a failed row published: rolled back too, they are requeued."""
        failed = result.failed
        dropped = set(changes.rollback(failed)) | failed.keys() if failed else set()
        changes.commit(batch.advance(dropped))
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
            self.timelines.put_back(seq)
        if seqs:
            self.policy.adopt(self.policy.handover())

    def _postprocess(
        self, batch: ScheduledBatch, result: StepResult, requeued: set[str]
    ) -> list[RequestOutput]:
        """Turn the step's tokens into outputs; a row in ``result.failed`` ends only its own
        request, a requeued one's token is dropped (it is computed again)."""
        now = self.clock()
        if result.prompt_logprobs:
            undone = requeued | result.failed.keys()
            for seq_id, (start, entries) in result.prompt_logprobs.items():
                if seq_id not in undone and (seq := self._sequences.get(seq_id)) is not None:
                    seq.add_prompt_logprobs(start, entries)
        sampled = iter(result.token_ids)
        logprobs = iter(result.logprobs) if result.logprobs is not None else None
        outputs: list[RequestOutput] = []
        finished: list[Sequence] = []
        failed: list[Sequence] = []
        forked: list[Sequence] = []
        failed_rows = result.failed
        eos_token_ids, max_model_len = self.front.eos_token_ids, self.front.limits.max_model_len
        families = self.families
        forking = bool(families)
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
            if (account := seq.account) is not None:
                account.charge_output()
            if seq.finish_if_stopped(token, now, eos_token_ids, max_model_len):
                finished.append(seq)
            siblings = (
                families.on_token(seq, self.blocks, self._new_sequence, self._sequences, forked)
                if forking
                else None
            )
            if siblings is None:
                outputs.append(RequestOutput.of(seq, [token]))
            else:
                outputs.append(RequestOutput.of(seq, [token], None, siblings))
        if forked:
            self.policy.adopt(forked)
            for child in forked:
                self.timelines.forked(child)
        blocks = self.blocks  # after the step's writes, before finished requests leave
        batch.kv_held_slots = blocks.num_used * blocks.block_size  # as KVStats.held_slots
        batch.kv_live_tokens = blocks.live_tokens
        outputs.extend(self._end(seq, "error", now, failed_rows[seq.seq_id]) for seq in failed)
        self.policy.on_step_done(batch, finished)
        for seq in finished:
            self._sequences.pop(seq.seq_id, None)
            self.stats.record_finish(RequestMetrics.of(seq), seq.num_output_tokens)
            self.timelines.finished(seq)
        return outputs

    def _end(self, seq: Sequence, reason: str, now: float, error: str | None) -> RequestOutput:
        """End an unfinished sequence early (an abort, a failed row): free its blocks, finish
        it and count it; returns its last output."""
        self._sequences.pop(seq.seq_id, None)
        self.policy.abort(seq.seq_id)  # frees its blocks
        if seq.first_scheduled_time is None:
            self._left_queue(seq, charge=False)
        seq.finish(reason, now)
        self.stats.record_finish(RequestMetrics.of(seq), seq.num_output_tokens)
        self.timelines.finished(seq)
        return RequestOutput.of(seq, [], error, self.families.left(seq))

    # -- commands (applied at step boundaries) --------------------------------------------

    def _drain_inbox(self) -> None:
        with self._inbox_lock:
            arrived, self._inbox = self._inbox, deque()
            for seq in arrived:
                self._sequences[seq.seq_id] = seq
        for seq in arrived:
            self.timelines.arrived(seq)
            self.families.admit(seq)
            if seq.account is not None:
                self.tenants.join(seq.account)
            self.policy.add(seq)

    def _left_queue(self, seq: Sequence, charge: bool) -> None:
        """``seq`` was scheduled for the first time (its prompt is charged to its tenant), or
        ended before it was: it no longer counts as its tenant's waiting request."""
        if (account := seq.account) is None:
            return
        self.tenants.leave(account)
        self.tenants.release(account)
        if charge:
            self.tenants.charge_prompt(account, seq.num_prompt_tokens)

    def _queued(self) -> list[Sequence]:
        with self._inbox_lock:
            return list(self._inbox)

    def set_policy(
        self,
        spec: PolicySpec | str | Mapping[str, Any],
        version: int | None = None,
        queue: QueueSpec | None = None,
    ) -> Future[PolicySpec]:
        """Validate now (raises pydantic's ValidationError); switch at the next boundary.
        ``version`` (the control plane's policy version) is recorded with the switch and
        reported by ``snapshot().policy_version``. ``queue`` (None: the one in force) is the
        queue discipline; the tenants' counters carry across."""
        spec = as_spec(spec)
        new_queue = queue or self.queue_spec
        discipline = self._discipline(new_queue)
        new_policy = make_policy(spec, self.front.limits, self.blocks, self.clock, discipline)

        def switch() -> PolicySpec:
            new_policy.adopt(self.policy.handover())
            new_policy.num_preemptions = self.policy.num_preemptions
            self.policy, self.policy_spec, self.policy_version = new_policy, spec, version
            self.tenants.configure(new_queue.cost())
            self.queue_spec = new_queue
            self.timelines.switched(self.clock(), spec.name, new_policy.params.max_wait_s)
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
        seqs = self.families.unfinished(request_id)
        if seqs is None:
            seq = self._sequences.get(request_id)
            seqs = [] if seq is None else [seq]
        now = self.clock()
        self._pending_outputs.extend(self._end(seq, "abort", now, None) for seq in seqs)
        return bool(seqs)

    # -- inspection -----------------------------------------------------------------------

    def timeline(self, request_id: str, timeout: float | None = 30.0) -> RequestTimeline | None:
        """A request's timeline (engine/timeline.py) as of the next step boundary; None for an
        unknown id or a finished one no longer kept."""
        return self.commands.call(
            lambda: self.timelines.timeline(request_id, self.clock()), timeout
        )

    def kv_stats(self) -> KVStats:
        return self.blocks.stats()

    def check_kv_integrity(self) -> Future[KVIntegrity]:
        """The block manager's self-check at the next step boundary (no step half-applied)."""

        return self.commands.submit(self.blocks.integrity)

    def snapshot(self, timeout: float | None = 30.0) -> EngineSnapshot:
        """A consistent picture of queue, requests and KV (taken at a step boundary); waits up
        to ``timeout`` for the boundary (``TimeoutError`` after it)."""
        return self.commands.call(self._snapshot, timeout)

    def _snapshot(self) -> EngineSnapshot:
        return EngineSnapshot.of(
            now=self.clock(),
            started_at=self.started_at,
            policy=self.policy_spec,
            policy_version=self.policy_version,
            scheduler=self.policy.snapshot(),
            sequences=self._sequences.values(),
            queued=self._queued(),
            max_waiting=self.config.max_waiting,
            queue_order=self.queue_spec,
            tenants=self.tenants.accounts(),
            blocks=self.blocks,
            stats=self.stats,
            compute=getattr(self.runner, "compute", None),
            timelines=self.timelines,
        )

    def _discipline(self, queue: QueueSpec) -> QueueDiscipline:
        return make_discipline(queue, self.tenants)

    @property
    def _device(self) -> torch.device:
        device = getattr(self.runner, "device", None)
        return device if isinstance(device, torch.device) else torch.device("cpu")


def _no_room(asked: int, room: int, max_waiting: int) -> str:
    if asked == 1:
        return f"waiting queue is full (max_waiting={max_waiting})"
    return (
        f"waiting queue has room for {max(room, 0)} of this batch's {asked} prompts "
        f"(max_waiting={max_waiting}); none was queued"
    )
