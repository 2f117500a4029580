"""Rows that only scale by a temperature are sampled together (``Sampler.sample_plain``): each
still draws from its own distribution, and top-k, top-p, seeded and greedy rows beside them are
sampled as before."""

from __future__ import annotations

import torch

from engine.batch import FAILED_TOKEN
from engine.sampler import Sampler
from engine.sampling_params import SamplingParams
from engine.sequence import Sequence

LOGITS = torch.tensor([2.0, 1.0, 0.0, -1.0])


def seq(name: str, seed: int | None = None, **params: object) -> Sequence:
    return Sequence.start(name, [1, 2], SamplingParams(max_tokens=4, **params), 0.0, seed=seed)  # type: ignore[arg-type]


def frequencies(tokens: list[int]) -> torch.Tensor:
    return torch.bincount(torch.tensor(tokens), minlength=LOGITS.numel()).float() / len(tokens)


def test_each_plain_row_draws_from_its_own_temperature() -> None:
    rows = 3000
    seqs = [seq(f"hot-{i}", temperature=1.0) for i in range(rows)]
    seqs += [seq(f"cool-{i}", temperature=0.5) for i in range(rows)]
    sampler = Sampler(torch.Generator().manual_seed(0))
    drawn = sampler.sample_plain(LOGITS.expand(2 * rows, -1).clone(), seqs, [True] * (2 * rows))
    assert sorted(drawn) == list(range(2 * rows))  # every plain row, in one draw
    hot = frequencies([drawn[r] for r in range(rows)])
    cool = frequencies([drawn[r] for r in range(rows, 2 * rows)])
    assert torch.allclose(hot, torch.softmax(LOGITS, -1), atol=0.03)
    assert torch.allclose(cool, torch.softmax(LOGITS / 0.5, -1), atol=0.03)


def test_top_k_top_p_seeded_and_greedy_rows_are_not_plain_and_keep_their_rules() -> None:
    seqs = [
        seq("plain-a", temperature=1.0),
        seq("plain-b", temperature=1.0),
        seq("greedy", temperature=0.0),
        seq("top-k", temperature=1.0, top_k=1),
        seq("top-p", temperature=1.0, top_p=1e-9),
        seq("seeded", seed=7, temperature=1.0),
    ]
    logits = LOGITS.expand(len(seqs), -1).clone()
    sampler = Sampler(torch.Generator().manual_seed(0))
    assert set(sampler.sample_plain(logits, seqs, [True] * len(seqs))) == {0, 1}
    result = sampler(logits, seqs)
    assert result.token_ids[2:5] == [0, 0, 0]  # greedy, top-1, top-p this small: the top token
    alone = Sampler(torch.Generator().manual_seed(99))(LOGITS[None].clone(), [seq("s", seed=7)])
    assert (
        result.token_ids[5] == alone.token_ids[0]
    )  # a seed of its own draws the same beside others
    assert not result.failed


def test_a_failing_row_among_plain_rows_fails_alone() -> None:
    seqs = [seq(f"p{i}", temperature=1.0) for i in range(4)]
    logits = LOGITS.expand(4, -1).clone()
    logits[2] = float("nan")
    result = Sampler(torch.Generator().manual_seed(0))(logits, seqs)
    assert result.token_ids[2] == FAILED_TOKEN and set(result.failed) == {"p2"}
    assert all(0 <= t < LOGITS.numel() for i, t in enumerate(result.token_ids) if i != 2)


def test_a_token_of_probability_zero_is_never_drawn() -> None:
    logits = torch.tensor([float("-inf"), 0.0, float("-inf"), 0.0, float("-inf")])
    seqs = [seq(f"r{i}") for i in range(2000)]
    sampler = Sampler(torch.Generator().manual_seed(1))
    drawn = sampler.sample_plain(logits.expand(2000, -1).clone(), seqs, [True] * 2000)
    assert set(drawn.values()) == {1, 3}
