"""Every attention backend against the plain oracle (kernels.reference), step after step.

A small world of sequences on a two-layer pool plays steps the way the runner lays them out
(decode rows shortest first, then prefill chunks): whole prompts, chunks extending a cached
prefix, decodes, pad rows, copy-on-write, rows joining and leaving. Each step every layer's
output and K/V writes are compared with the oracle run on its own copy of the pool. The pools
start random, so a missing mask or a stale gathered block shows. The torch backend's kept
gather is checked step by step: kept exactly where the rows stay the same.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import pytest
import torch

from engine.kv_pool import allocate_kv_cache
from kernels import reference
from kernels.attention import AttentionInputs
from kernels.decode_gather import length_buckets
from kernels.registry import make_backend
from kernels.torch_backend import TorchAttentionBackend
from tests.kernels.native_support import native_kernels

HEADS, KV_HEADS, DIM, BLOCK, LAYERS, NUM_BLOCKS = 4, 2, 32, 16, 2, 64
SCALE = DIM**-0.5
TOLERANCE = {"torch": 1e-5, "torch-native": 1e-5, "triton": 1e-4}


@dataclass
class Seq:
    seq_id: str
    length: int = 0
    """Tokens stored in the cache."""
    table: list[int] = field(default_factory=list)


class World:
    def __init__(self, backend: str, seed: int = 0, **backend_kwargs) -> None:
        gen = torch.Generator().manual_seed(seed)
        self.pools = allocate_kv_cache(
            LAYERS, NUM_BLOCKS, BLOCK, KV_HEADS, DIM, torch.float32, torch.device("cpu")
        )
        for pool in self.pools:
            pool.copy_(torch.randn(pool.shape, generator=gen))
        self.oracle = [pool.clone() for pool in self.pools]
        if backend == "torch-native":
            self.backend = TorchAttentionBackend(self.pools, BLOCK, native=native_kernels())
        elif backend_kwargs:
            self.backend = TorchAttentionBackend(self.pools, BLOCK, **backend_kwargs)
        else:
            self.backend = make_backend(backend, self.pools, BLOCK)  # type: ignore[arg-type]
        self.name = backend
        self.gen = gen
        self.free = list(range(NUM_BLOCKS))
        random.Random(seed).shuffle(self.free)
        self.kept: list[bool] = []

    def _slot(self, seq: Seq, position: int) -> int:
        while len(seq.table) * BLOCK <= position:
            seq.table.append(self.free.pop())
        return seq.table[position // BLOCK] * BLOCK + position % BLOCK

    def copy_on_write(self, seq: Seq) -> None:
        """``seq``'s last block moves to a fresh copy (as a shared block written to)."""
        src, dst = seq.table[-1], self.free.pop()
        self.backend.copy_blocks([(src, dst)])
        for pool in self.oracle:
            pool[:, dst] = pool[:, src]
        seq.table[-1] = dst

    def step(
        self,
        decodes: list[Seq] = (),
        prefills: list[tuple[Seq, int]] = (),
        pads: list[Seq] = (),
        layers: int = LAYERS,
    ) -> None:
        """One step: ``decodes`` write one token, ``pads`` recompute their last token and
        store nothing, ``prefills`` store ``n`` new tokens each. ``layers`` < LAYERS plays a
        forward that fails part way (the sequences then do not advance)."""
        rows = sorted([(s, False) for s in decodes] + [(s, True) for s in pads],
                      key=lambda r: r[0].length)  # fmt: skip
        slots, lens, tables = [], [], []
        for seq, pad in rows:
            slots.append(-1 if pad else self._slot(seq, seq.length))
            lens.append(seq.length if pad else seq.length + 1)
            tables.append(seq.table[: -(-lens[-1] // BLOCK)])
        p_lens, starts, p_tables = [], [0], []
        for seq, n in prefills:
            slots += [self._slot(seq, p) for p in range(seq.length, seq.length + n)]
            p_lens.append(seq.length + n)
            starts.append(starts[-1] + n)
            p_tables.append(seq.table[: -(-p_lens[-1] // BLOCK)])
        inputs = AttentionInputs(
            slot_mapping=torch.tensor(slots, dtype=torch.int64),
            decode_seq_ids=[s.seq_id for s, _ in rows],
            decode_block_tables=tables,
            decode_seq_lens=lens,
            prefill_block_tables=p_tables,
            prefill_seq_lens=p_lens,
            prefill_query_start_loc=starts,
        )
        meta = self.backend.prepare(inputs)
        if isinstance(self.backend, TorchAttentionBackend) and self.backend.native is not None:
            # the native kernel reads the pool through the tables: nothing gathered or kept
            assert meta.decode_plan is None and self.backend.gathers.buffer_bytes() == 0
        elif isinstance(self.backend, TorchAttentionBackend) and rows:
            assert meta.decode_plan is not None
            self.kept.append(not meta.decode_plan.full_gather)
        for layer in range(layers):
            self._check_layer(layer, inputs, meta)
        if layers == LAYERS:
            for seq, pad in rows:
                seq.length += 0 if pad else 1
            for seq, n in prefills:
                seq.length += n

    def _check_layer(self, layer: int, inputs: AttentionInputs, meta) -> None:
        tokens = inputs.slot_mapping.shape[0]
        q = torch.randn(tokens, HEADS, DIM, generator=self.gen)
        k = torch.randn(tokens, KV_HEADS, DIM, generator=self.gen)
        v = torch.randn(tokens, KV_HEADS, DIM, generator=self.gen)
        out = self.backend.forward(layer, q, k, v, meta, SCALE)

        oracle = self.oracle[layer]
        reference.write_kv_cache(k, v, oracle[0], oracle[1], inputs.slot_mapping)
        assert torch.equal(self.pools[layer], oracle), "K/V writes differ from the oracle"
        nd = inputs.num_decode_tokens
        tol = TOLERANCE[self.name]
        if nd:
            want = reference.decode_attention(
                q[:nd], oracle[0], oracle[1], _tables(inputs.decode_block_tables),
                torch.tensor(inputs.decode_seq_lens), SCALE,
            )  # fmt: skip
            torch.testing.assert_close(out[:nd], want, atol=tol, rtol=tol)
        if nd < tokens:
            want = reference.prefill_attention(
                q[nd:], oracle[0], oracle[1], _tables(inputs.prefill_block_tables),
                inputs.prefill_seq_lens, inputs.prefill_query_start_loc, SCALE,
            )  # fmt: skip
            torch.testing.assert_close(out[nd:], want, atol=tol, rtol=tol)


def _tables(tables: list[list[int]]) -> torch.Tensor:
    width = max(len(t) for t in tables)
    return torch.tensor([t + [NUM_BLOCKS - 1] * (width - len(t)) for t in tables])


BACKENDS = ["torch", "torch-native", "triton"]


@pytest.mark.parametrize("backend", BACKENDS)
def test_prompts_chunks_decodes_joins_leaves_pads_and_copies(backend: str) -> None:
    world = World(backend)
    a, b, c, d = Seq("a"), Seq("b"), Seq("c"), Seq("d")
    world.step(prefills=[(a, 30), (b, 5), (c, 33)])  # whole prompts, no decode rows
    world.step(decodes=[a, c], prefills=[(b, 12)])  # mixed: a chunk extends b's prefix
    world.step(decodes=[a, b, c])  # b joins the decode rows: its row copied in
    world.step(decodes=[a, b, c])  # same rows, a's token opens its third block: kept, grown
    world.step(decodes=[a, b, c])  # kept
    world.step(decodes=[a, b, c], prefills=[(d, 7)])  # d prefills alongside: kept
    world.step(decodes=[a, b, c, d])  # d joins
    world.step(decodes=[a, c, d])  # b leaves
    world.step(decodes=[a, d], pads=[c])  # c turns pad row (stores nothing): same rows, kept
    world.step(decodes=[a, d], pads=[c])
    world.copy_on_write(a)
    world.step(decodes=[a, d], pads=[c])  # a block copied: a's row copied from that block
    world.step(decodes=[a, d], pads=[c])
    assert (a.length, b.length, c.length, d.length) == (41, 22, 40, 13)
    if backend == "torch":
        # only the first decode step gathers every row; joins, leaves and copies copy rows
        assert world.kept == [False] + [True] * 10
        assert world.backend.gathers.kept_steps == world.kept.count(True)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_step_that_stops_part_way_is_not_kept(backend: str) -> None:
    """A forward that fails after the first layer leaves the second layer's buffers holding
    an older gather: the retried step must gather afresh."""
    world = World(backend)
    a, b, c = Seq("a"), Seq("b"), Seq("c")
    world.step(prefills=[(a, 20), (b, 40), (c, 9)])
    world.step(decodes=[a, b])
    world.step(decodes=[b, c], layers=1)  # fails part way: nothing advances
    world.step(decodes=[b, c])  # the retry
    world.step(decodes=[b, c])
    if backend == "torch":
        assert world.kept == [False, True, False, True]


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_longest_row_opening_a_block_widens_the_gather(backend: str) -> None:
    world = World(backend)
    a, b = Seq("a"), Seq("b")
    world.step(prefills=[(a, 15), (b, 63)])
    world.step(decodes=[a, b])  # a opens its second block: the gather stays four blocks wide
    world.step(decodes=[a, b])  # b opens its fifth: five wide, in the buffers' headroom
    world.step(decodes=[a, b])
    if backend == "torch":
        assert world.kept == [False, True, True]


@pytest.mark.parametrize("backend", BACKENDS)
def test_many_mixed_lengths_decode_in_two_buckets(backend: str) -> None:
    world = World(backend, seed=1)
    seqs = [Seq(str(i)) for i in range(10)]
    lens = [3, 5, 9, 16, 17, 20, 26, 33, 100, 120]
    world.step(prefills=list(zip(seqs, lens, strict=True)))
    for _ in range(3):
        world.step(decodes=seqs)
    if backend == "torch":
        assert length_buckets([-(-(n + 1) // BLOCK) for n in lens]) == [(0, 7, 2), (7, 10, 8)]
        assert world.kept == [False, True, True]


def test_torch_backend_without_budget_shares_buffers_and_never_keeps() -> None:
    world = World("torch", gather_budget_bytes=0)
    a, b = Seq("a"), Seq("b")
    world.step(prefills=[(a, 17), (b, 3)])
    for _ in range(3):
        world.step(decodes=[a, b])
    assert world.kept == [False, False, False]
    buffers = world.backend.gathers.plan(9, ["a"], [[0]], [1], [0]).buckets[0].buffers
    assert buffers[0] is buffers[1], "one pair shared by every layer"


def test_torch_backend_refuses_a_token_major_pool() -> None:
    pools = [torch.zeros(2, 4, BLOCK, KV_HEADS, DIM)]
    with pytest.raises(ValueError, match="head-major"):
        make_backend("torch", pools, BLOCK)


def test_length_buckets() -> None:
    assert length_buckets([1, 1, 2, 2, 2, 2, 3, 8, 8, 8]) == [(0, 6, 2), (6, 10, 8)]
    assert length_buckets([4] * 10) == [(0, 10, 4)], "equal lengths: nothing to save"
    assert length_buckets([1, 9]) == [(0, 2, 9)], "too few rows to split"
