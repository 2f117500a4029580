"""Greedy, temperature, top-k and top-p sampling with per-request seeded generators."""

from __future__ import annotations

import torch

from engine.sequence import Sequence


class Sampler:
    def __init__(self, generator: torch.Generator) -> None:
        self.generator = generator

    def __call__(self, logits: torch.Tensor, seqs: list[Sequence]) -> list[int]:
        """``logits`` ``[len(seqs), vocab]`` (float32) -> one token id per sequence."""
        tokens = logits.argmax(dim=-1).tolist()
        for row, seq in enumerate(seqs):
            if not seq.params.greedy:
                tokens[row] = self._sample_row(logits[row], seq)
        return tokens

    def _sample_row(self, logits: torch.Tensor, seq: Sequence) -> int:
        params = seq.params
        scores = logits / params.temperature
        if 0 < params.top_k < scores.shape[-1]:
            kth = torch.topk(scores, params.top_k).values[-1]
            scores = scores.masked_fill(scores < kth, float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        if params.top_p < 1.0:
            sorted_probs, order = probs.sort(descending=True)
            before = sorted_probs.cumsum(-1) - sorted_probs
            sorted_probs[before >= params.top_p] = 0.0
            probs = torch.zeros_like(probs).scatter_(-1, order, sorted_probs)
        generator = seq.generator or self.generator
        return int(torch.multinomial(probs, 1, generator=generator).item())
