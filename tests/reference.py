"""Greedy reference outputs from transformers, and a diff that explains a mismatch."""

from __future__ import annotations

import random
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import torch

PROMPT_LENGTHS = (1, 2, 7, 15, 16, 17, 31, 33, 64, 65, 100, 128, 150, 200, 257, 300)


def mixed_prompts(vocab: int, seed: int = 0) -> list[list[int]]:
    """16 prompts of 1 to 300 tokens, around block boundaries, from random token ids."""
    rng = random.Random(seed)
    return [[rng.randrange(3, vocab) for _ in range(n)] for n in PROMPT_LENGTHS]


def max_tokens_for(index: int) -> int:
    """24 to 40 new tokens, so padded groups finish raggedly."""
    return 24 + (index % 3) * 8


@dataclass
class HFReference:
    model_dir: Path

    @cached_property
    def model(self):
        from transformers import LlamaForCausalLM

        return LlamaForCausalLM.from_pretrained(self.model_dir, dtype=torch.float32).eval()

    @cached_property
    def eos_token_id(self) -> int:
        return self.model.generation_config.eos_token_id

    def generate(self, prompt: list[int], max_new_tokens: int) -> list[int]:
        with torch.no_grad():
            out = self.model.generate(
                torch.tensor([prompt]),
                max_new_tokens=max_new_tokens,
                do_sample=False,
                pad_token_id=self.eos_token_id,
            )
        return out[0, len(prompt) :].tolist()

    def explain(self, prompt: list[int], expected: list[int], actual: list[int]) -> str:
        """Where two greedy continuations part, and transformers' top-2 logit margin there."""
        at = next(i for i, (a, b) in enumerate(zip(expected, actual, strict=False)) if a != b)
        with torch.no_grad():
            logits = self.model(torch.tensor([prompt + expected[:at]])).logits[0, -1]
        top = logits.topk(2)
        return (
            f"prompt of {len(prompt)} tokens diverges at output {at}: transformers "
            f"{expected[at]} vs ours {actual[at]}; transformers' top-2 margin there "
            f"{float(top.values[0] - top.values[1]):.5f} (ids {top.indices.tolist()})"
        )


def assert_same_as_reference(
    reference: HFReference, prompts: list[list[int]], expected: list[list[int]], outputs
) -> None:
    problems = []
    for prompt, want, got in zip(prompts, expected, outputs, strict=True):
        if got.token_ids != want:
            if len(got.token_ids) != len(want) and got.token_ids == want[: len(got.token_ids)]:
                problems.append(f"prompt of {len(prompt)}: stopped early {got.token_ids}")
            elif want == got.token_ids[: len(want)]:
                problems.append(f"prompt of {len(prompt)}: did not stop {got.token_ids}")
            else:
                problems.append(reference.explain(prompt, want, got.token_ids))
    assert not problems, "\n".join(problems)
