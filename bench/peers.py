"""Peers on the same checkpoint in the same process: transformers' padded ``generate`` in
fixed batches, and transformers' continuous batching (``generate_batch``) with its KV cache
sized explicitly (left alone it sizes the cache from free RAM).

Both run greedy with EOS disabled, like the engine's ``ignore_eos`` runs, and every request
gets the per-token timestamps the engine's requests get, so the same metrics apply.
"""

from __future__ import annotations

import importlib.util
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from bench.runner import RequestRecord
from bench.workloads import Workload
from engine.config import EngineConfig
from engine.outputs import RequestMetrics

PAD_ID = 0
_ENGINE_DEFAULTS = EngineConfig(model="defaults")
HF_PAGE_SIZE = _ENGINE_DEFAULTS.block_size
"""generate_batch's cache page, in tokens: the engine's default block size."""
HF_BATCH_TOKENS = _ENGINE_DEFAULTS.max_num_batched_tokens
"""generate_batch's token budget per step: the engine's default max_num_batched_tokens."""


def transformers_available() -> bool:
    return importlib.util.find_spec("transformers") is not None


@dataclass
class PeerTrace:
    requests: list[RequestRecord]
    start: float
    end: float
    outputs: dict[int, list[int]]
    extra: dict[str, Any]


def load_hf_model(model_dir: Path, device: str, dtype: str) -> Any:
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, dtype))
    return model.to(device).eval()  # type: ignore[arg-type]  # typeshed's functools.wraps (on transformers' .to) leaves self unbound


class _StepTimes:
    """A transformers streamer that only notes when each generation step's tokens exist."""

    def __init__(self) -> None:
        self.times: list[float] = []

    def put(self, value: torch.Tensor) -> None:
        self.times.append(time.perf_counter())

    def end(self) -> None:
        pass


def run_hf_static(
    model: Any, workload: Workload, batch_size: int, progress: Callable[[int], None]
) -> PeerTrace:
    """``generate`` on batches of ``batch_size`` in arrival order, left-padded to the longest
    prompt; each batch runs until its longest request is done. All requests arrive at t0."""
    from transformers import GenerationConfig

    device = next(model.parameters()).device
    requests = list(enumerate(workload.requests))
    records: list[RequestRecord] = []
    outputs: dict[int, list[int]] = {}
    prefill_pads = prefill = decode_pads = decode = held = stored = 0
    start = time.perf_counter()
    for first in range(0, len(requests), batch_size):
        batch = requests[first : first + batch_size]
        width = max(len(r.prompt) for _, r in batch)
        steps = max(r.max_tokens for _, r in batch)
        ids = torch.tensor([[PAD_ID] * (width - len(r.prompt)) + list(r.prompt) for _, r in batch])
        mask = torch.tensor([[0] * (width - len(r.prompt)) + [1] * len(r.prompt) for _, r in batch])
        config = GenerationConfig(
            max_new_tokens=steps, do_sample=False, eos_token_id=None, pad_token_id=PAD_ID
        )
        streamer = _StepTimes()
        with torch.inference_mode():
            generated = model.generate(
                input_ids=ids.to(device),
                attention_mask=mask.to(device),
                generation_config=config,
                streamer=streamer,
            )
        token_times = streamer.times[1:]  # the first put is the prompt
        for row, (index, request) in enumerate(batch):
            times = token_times[: request.max_tokens]
            outputs[index] = generated[row, width : width + request.max_tokens].tolist()
            timing = RequestMetrics(
                arrival_time=start,
                first_token_time=times[0],
                token_times=times,
                finish_time=times[-1],
            )
            records.append(RequestRecord(index, request.tag, len(request.prompt), timing))
        prefill += len(batch) * width
        prefill_pads += sum(width - len(r.prompt) for _, r in batch)
        decode += len(batch) * steps
        decode_pads += sum(steps - r.max_tokens for _, r in batch)
        # a padded cache holds every row at full width; averaged over the decode steps
        for t in range(steps):
            held += len(batch) * (width + t + 1)
            stored += sum(len(r.prompt) + min(t + 1, r.max_tokens) for _, r in batch)
        progress(len(batch))
    end = max(r.finish for r in records if r.finish is not None)
    extra = {
        "padding_waste": (prefill_pads + decode_pads) / (prefill + decode),
        "padding_waste_prefill": prefill_pads / prefill,
        "padding_waste_decode": decode_pads / decode,
        "kv_utilization": stored / held if held else None,
        "batch_size": batch_size,
    }
    return PeerTrace(records, start, end, outputs, extra)


def run_hf_continuous(
    model: Any,
    workload: Workload,
    page_size: int,
    max_batch_tokens: int,
    progress: Callable[[int], None],
) -> PeerTrace:
    """``generate_batch`` with ``num_blocks`` covering the whole workload and an explicit
    ``max_batch_tokens``. Times run from when the requests were handed to the manager
    (its set-up and shut-down are not counted, as the engine's construction is not)."""
    from transformers import GenerationConfig
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    steps = {r.max_tokens for r in workload.requests}
    if len(steps) != 1:
        raise ValueError("generate_batch takes one max_new_tokens: needs a fixed-output workload")
    max_new = steps.pop()
    demand = sum(-(-(len(r.prompt) + max_new) // page_size) for r in workload.requests)
    cb_config = ContinuousBatchingConfig(
        page_size=page_size,
        num_blocks=demand + 8,
        max_batch_tokens=max_batch_tokens,
        max_requests_per_batch=len(workload.requests),
    )
    config = GenerationConfig(
        max_new_tokens=max_new, do_sample=False, eos_token_id=None, pad_token_id=PAD_ID
    )
    quiet = logging.getLogger("ContinuousBatchingLogger")
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    call_start = time.perf_counter()
    try:
        results = model.generate_batch(
            [list(r.prompt) for r in workload.requests],
            generation_config=config,
            continuous_batching_config=cb_config,
            record_timestamps=True,
            warmup=False,
            progress_bar=False,
        )
    finally:
        quiet.setLevel(level)
    call_s = time.perf_counter() - call_start
    ordered = list(results.values())
    if len(ordered) != len(workload.requests):
        raise RuntimeError(f"generate_batch returned {len(ordered)} of {len(workload.requests)}")
    start = min(out.created_time for out in ordered)
    records: list[RequestRecord] = []
    outputs: dict[int, list[int]] = {}
    for index, (request, out) in enumerate(zip(workload.requests, ordered, strict=True)):
        times = list(out.timestamps or [])
        outputs[index] = list(out.generated_tokens)
        first = times[0] if times else None
        timing = RequestMetrics(
            arrival_time=start,
            first_scheduled_time=out.lifespan[0],
            first_token_time=first,
            token_times=times,
            finish_time=out.lifespan[1],
        )
        records.append(RequestRecord(index, request.tag, len(request.prompt), timing))
    progress(len(records))
    end = max(r.finish for r in records if r.finish is not None)
    extra = {
        "page_size": page_size,
        "num_blocks": demand + 8,
        "max_batch_tokens": max_batch_tokens,
        "call_wall_s": call_s,
    }
    return PeerTrace(records, start, end, outputs, extra)
