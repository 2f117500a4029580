"""Engine capacity settings: the caps that policy params live under."""

from __future__ import annotations

import math
import types
from dataclasses import dataclass, field, fields
from functools import cache
from typing import Any, Literal, Union, get_args, get_origin, get_type_hints

from engine.cpu import DtypeChoice, choose_dtype

BLOCK_SIZES = (16, 32, 64)
MEMORY_RESERVE_BOUNDS = (0.0, 0.5)
"""The reserve's allowed range; the server's settings and policy store read it from here."""
CPU_KV_CACHE_BYTES = 1 << 30
"""On CPU the pool is sized from this budget, never from all free RAM."""


Dtype = Literal["float32", "bfloat16", "float16"]
"""The weights' and the KV cache's dtype, by torch's name."""
DTYPES: tuple[Dtype, ...] = get_args(Dtype)


DtypeSetting = Literal["float32", "bfloat16", "float16", "auto"]
"""A dtype, or ``auto``: the one that fits this CPU (``engine.cpu.choose_dtype``)."""


def as_dtype(name: str) -> Dtype:
    """``name`` as a ``Dtype`` (a flag's or a file's string); ValueError if it is none."""
    for dtype in DTYPES:
        if dtype == name:
            return dtype
    raise ValueError(f"dtype must be float32, bfloat16 or float16, got {name!r}")


@dataclass(frozen=True, slots=True)
class EngineLimits:
    """What every policy may rely on; policy params default from and stay under these."""

    block_size: int
    num_kv_blocks: int
    max_model_len: int
    max_num_seqs: int
    max_num_batched_tokens: int

    def blocks_for(self, num_tokens: int) -> int:
        return math.ceil(num_tokens / self.block_size)


def knob(
    default: Any,
    help: str,
    *,
    ge: float | None = None,
    le: float | None = None,
    choices: tuple[Any, ...] | None = None,
) -> Any:
    """An EngineConfig field with its help text and bounds in the field's metadata."""
    return field(default=default, metadata={"help": help, "ge": ge, "le": le, "choices": choices})


@dataclass(slots=True)
class EngineConfig:
    """Every engine knob, its default, help text and bounds, defined once (the field's metadata).

    ``servedeck`` flags and the server's settings are generated from these fields
    (``config_options()``); the bounds are checked here and repeated by pydantic there.
    """

    model: str = field(metadata={"help": "Hugging Face model folder or GGUF file"})
    tokenizer: str | None = knob(
        None, "tokenizer folder (tokenizer.json) overriding the model's own (default: the model's)"
    )
    policy: str = knob("continuous", "batch scheduling policy (a policies.base.PolicyName)")
    device: str = knob("cpu", "torch device: cpu or cuda")
    dtype: DtypeSetting = knob(  # noqa: RUF009 - a Literal alias
        "float32",
        "weights and KV dtype; auto: bfloat16 where the CPU has bfloat16 arithmetic (AVX-512 "
        "BF16, AMX), else float32 (bfloat16 on a GPU)",
    )
    block_size: int = knob(16, "tokens per KV block", choices=BLOCK_SIZES)
    num_kv_blocks: int | None = knob(None, "KV blocks in the pool (default: from memory)", ge=1)
    max_model_len: int | None = knob(
        None, "longest prompt + output in tokens (default: the model's)", ge=2
    )
    max_num_seqs: int = knob(256, "most sequences in one batch", ge=1)
    max_num_batched_tokens: int = knob(2048, "token budget of one engine step", ge=1)
    memory_reserve: float = knob(
        0.10,
        "fraction of KV blocks admission of new work may not take",
        ge=MEMORY_RESERVE_BOUNDS[0],
        le=MEMORY_RESERVE_BOUNDS[1],
    )
    enable_prefix_caching: bool = knob(True, "share KV blocks of identical prompt prefixes")
    max_waiting: int = knob(1024, "waiting requests before new ones get 429", ge=1)
    timelines_kept: int = knob(
        1000,
        "finished requests whose timelines (why each waited; no text) are kept for "
        "GET /admin/requests/{id}/timeline",
        ge=0,
        le=1_000_000,
    )
    wait_window_s: float = knob(
        60.0,
        "seconds of waiting that /admin/state's waits.recent and its tail cover",
        ge=1.0,
        le=86400.0,
    )
    attention_backend: Literal["auto", "torch", "triton"] = knob(
        "auto", "attention kernels: torch (CPU), triton (GPU) or auto"
    )
    native_attention: bool = knob(
        True,
        "CPU decode attention through servedeck's C++ kernel, built on first start with the "
        "machine's g++ (AVX-512, or AVX2 with FMA; kernels.native); where it cannot be built, "
        "torch's products",
    )
    packed_products: Literal["auto", "onednn", "off"] = knob(
        "off",
        "weight products on CPU: onednn (each weight reordered once at load into oneDNN's "
        "layout), off (F.linear on row-major weights) or auto (onednn for float32; "
        "engine.model.products; off by default: the 64-request burst did not gain)",
    )
    gpu_memory_utilization: float = knob(0.90, "share of GPU memory the engine may take")
    num_threads: int | None = knob(None, "torch CPU threads (default: torch's)", ge=1)
    retain_freed_host_memory: bool = knob(
        True, "on CPU, keep freed allocations mapped between forwards (engine.host_memory)"
    )
    seed: int = knob(0, "seed of the engine's torch generators")
    tensor_parallel_size: int = knob(
        1,
        "ranks splitting each layer's attention heads and MLP columns (torch.distributed; "
        "must divide the model's attention and KV heads)",
        ge=1,
    )

    def __post_init__(self) -> None:
        if self.block_size not in BLOCK_SIZES:
            raise ValueError(f"block_size must be one of {BLOCK_SIZES}, got {self.block_size}")
        for option in config_options().values():
            option.check(getattr(self, option.name))
        self.dtype_choice  # noqa: B018 - a dtype that is none of ours fails here, not at load

    @property
    def dtype_choice(self) -> DtypeChoice:
        """The dtype in force here and why (``dtype`` keeps what was asked: ``auto`` too)."""
        return choose_dtype(self.dtype, self.device)

    @property
    def weights_dtype(self) -> Dtype:
        """The dtype in force: ``dtype``, with ``auto`` resolved for this CPU."""
        return self.dtype_choice.dtype
        if self.attention_backend not in ("auto", "torch", "triton"):
            raise ValueError(
                f"attention_backend must be auto, torch or triton, got {self.attention_backend!r}"
            )


@dataclass(frozen=True, slots=True)
class ConfigOption:
    """One EngineConfig field as a flag or a setting sees it: ``type`` is the scalar type
    (``int | None`` gives ``int`` with ``optional``), ``choices`` come from a ``Literal``."""

    name: str
    type: type
    default: Any
    help: str
    optional: bool
    choices: tuple[Any, ...] | None = None
    ge: float | None = None
    le: float | None = None

    def check(self, value: Any) -> None:
        if value is None:
            return
        if self.ge is not None and self.le is not None and not self.ge <= value <= self.le:
            raise ValueError(f"{self.name} must be in [{self.ge}, {self.le}], got {value}")
        if self.ge is not None and value < self.ge:
            raise ValueError(f"{self.name} must be >= {self.ge}, got {value}")
        if self.le is not None and value > self.le:
            raise ValueError(f"{self.name} must be <= {self.le}, got {value}")


@cache
def config_options() -> dict[str, ConfigOption]:
    """EngineConfig's fields with a default, by name, in declaration order."""
    hints = get_type_hints(EngineConfig)
    options: dict[str, ConfigOption] = {}
    for f in fields(EngineConfig):
        if "help" not in f.metadata or f.name == "model":
            continue
        kind, optional = hints[f.name], False
        if get_origin(kind) in (Union, types.UnionType):
            args = [a for a in get_args(kind) if a is not type(None)]
            kind, optional = args[0], True
        choices = f.metadata["choices"]
        if get_origin(kind) is Literal:
            choices = get_args(kind)
            kind = type(choices[0])
        options[f.name] = ConfigOption(
            f.name, kind, f.default, f.metadata["help"], optional, choices,
            f.metadata["ge"], f.metadata["le"],
        )  # fmt: skip
    return options


def config_default(name: str) -> Any:
    """EngineConfig's default for ``name`` (the one place it is defined)."""
    return config_options()[name].default
