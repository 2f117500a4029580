"""Greedy, temperature, top-k and top-p sampling with per-request seeded generators.

Numerically safe for every value ``SamplingParams`` accepts:

- a temperature below ``GREEDY_BELOW_TEMPERATURE`` is greedy (``logits / 1e-45`` is ``inf`` in
  float32, and its softmax ``nan``);
- logits are shifted by their maximum before the division, so the top token's weight is
  exactly 1 and the distribution can never be all zeros;
- top-p always keeps the top token. It used to compare the float32 cumulative sum with
  ``top_p`` as a Python float, which torch casts to float32: ``1e-300`` became ``0.0``, every
  token (the top one included, whose preceding mass is 0) was masked, and ``multinomial`` saw
  an all-zero row ("invalid multinomial distribution");
- NaN logits count as ``-inf`` and ``+inf`` as the largest float; a row with no finite
  logit left fails.

Rows that only scale by a temperature are sampled together (``sample_plain``); the others (top-k,
top-p, a seed of their own) one by one inside ``try``: a row that still fails ends only its own
request (``StepResult.failed``), never its neighbours.

Rows with a grammar (``SamplingParams.constraint``, engine/grammar.py) have the tokens it
refuses set to ``-inf`` first (``mask_logits``: one bitmask for all of them), so greedy,
temperature, top-k and top-p all choose among the allowed tokens; a row without one costs one
attribute read. A grammar that cannot go on fails its own row.

Log-probabilities (``SamplingParams.logprobs``) are of the raw distribution (of a constrained
row: the masked one), a log-softmax of
the logits before temperature, top-k and top-p, as other OpenAI-compatible servers return by
default. They are computed only for the rows that ask, in one batched pass after sampling;
a step where no row asks costs one attribute read per row.
"""

from __future__ import annotations

import torch

from engine.batch import FAILED_TOKEN, StepResult
from engine.grammar_mask import PendingMasks, grammar_rows, mask_logits
from engine.outputs import TokenLogprob
from engine.sequence import Sequence


class Sampler:
    def __init__(self, generator: torch.Generator) -> None:
        self.generator = generator

    def __call__(
        self, logits: torch.Tensor, seqs: list[Sequence], masks: PendingMasks | None = None
    ) -> StepResult:
        """``logits`` ``[len(seqs), vocab]`` -> one token id per sequence, plus failed rows.
        ``masks``: the constrained rows' masks the runner started beside the forward (None:
        computed here, if any row is constrained)."""
        logits = logits.float()
        refused: dict[int, str] = {}
        if masks is not None:
            refused = masks.apply(logits)
        elif grammars := grammar_rows(seqs):
            refused = mask_logits(logits, grammars, seqs)
        best, argmax = logits.max(dim=-1)  # a row holding a NaN or +inf has no finite maximum
        if not bool(torch.isfinite(best).all()):
            logits = torch.nan_to_num(
                logits,
                nan=float("-inf"),
                posinf=torch.finfo(torch.float32).max,
                neginf=float("-inf"),
            )
            best, argmax = logits.max(dim=-1)
        finite = torch.isfinite(best).tolist()
        for row in refused:
            finite[row] = False
        tokens = argmax.tolist()
        failed: dict[str, str] = {}
        want: list[int] = []
        drawn = self.sample_plain(logits, seqs, finite, best)
        for row, seq in enumerate(seqs):
            params = seq.params
            try:
                if not finite[row]:
                    raise ValueError(
                        refused.get(row, "the model produced no finite logit (all NaN or -inf)")
                    )
                if row in drawn:
                    tokens[row] = drawn[row]
                elif not params.greedy:
                    tokens[row] = self.sample_row(logits[row], seq)
            except Exception as exc:  # this row only: its request ends with the error
                tokens[row] = FAILED_TOKEN
                failed[seq.seq_id] = f"sampling failed: {exc}"
                continue
            if params.logprobs is not None:
                want.append(row)
        if not want:
            return StepResult(tokens, failed)
        return StepResult(tokens, failed, self.logprobs(logits, want, tokens, seqs))

    @staticmethod
    def logprobs(
        logits: torch.Tensor, rows: list[int], tokens: list[int], seqs: list[Sequence]
    ) -> list[TokenLogprob | None]:
        """The chosen tokens' log-probabilities and each row's top-N, for ``rows``; None for
        the other rows."""
        index = torch.tensor(rows, device=logits.device)
        widths = [seqs[r].params.logprobs or 0 for r in rows]
        entries = token_logprobs(logits.index_select(0, index), [tokens[r] for r in rows], widths)
        out: list[TokenLogprob | None] = [None] * len(seqs)
        for row, entry in zip(rows, entries, strict=True):
            out[row] = entry
        return out

    def sample_plain(
        self,
        logits: torch.Tensor,
        seqs: list[Sequence],
        finite: list[bool],
        best: torch.Tensor | None = None,
    ) -> dict[int, int]:
        """The rows that only scale by a temperature (no top-k, no top-p, no seed of their own)
        sampled together: one softmax and one inverse-transform draw over ``[rows, vocab]`` from
        the engine's generator, instead of one each (a 49k vocabulary made the per-row loop a tenth
        of a decode step). ``row -> token``; empty when such a batch fails, and then every row is
        sampled alone, so a failure stays its own row's. ``best``: each row's maximum, when
        the caller has it."""
        vocab = logits.shape[-1]
        rows = [
            row
            for row, seq in enumerate(seqs)
            if finite[row] and seq.generator is None and _plain(seq, vocab)
        ]
        if len(rows) < 2:
            return {}
        try:
            whole = len(rows) == logits.shape[0]  # every row (vLLM's client: all at 1.0)
            index = torch.tensor(rows, device=logits.device)
            picked = logits if whole else logits.index_select(0, index)
            temperatures = [seqs[r].params.temperature for r in rows]
            if all(t == 1.0 for t in temperatures):
                scores = picked  # softmax subtracts each row's maximum itself
            else:
                top = picked.max(dim=-1).values if best is None else best.index_select(0, index)
                scale = torch.tensor(temperatures, device=logits.device)
                scores = (picked - top[:, None]) / scale[:, None]
            # Inverse transform: one uniform per row against the row's cumulative sum (float64,
            # so a 49k vocabulary's tail keeps its mass). torch.multinomial, or an exponential
            # race, draws a random number per token: 54 ms on [64, 49152], this ~7 ms.
            cdf = torch.cumsum(torch.softmax(scores, dim=-1), dim=-1, dtype=torch.float64)
            uniform = torch.rand(
                len(rows), 1, generator=self.generator, dtype=cdf.dtype, device=cdf.device
            )
            # right=True: the first token whose cumulative sum passes u, so a token of
            # probability 0 (an empty step in the sum) is never drawn, not even at u = 0.
            drawn = torch.searchsorted(cdf, uniform.mul_(cdf[:, -1:]), right=True)
            tokens = drawn.clamp_(max=logits.shape[-1] - 1)[:, 0].tolist()
        except RuntimeError:
            return {}
        return dict(zip(rows, tokens, strict=True))

    def sample_row(self, logits: torch.Tensor, seq: Sequence) -> int:
        """Sample one row (finite maximum guaranteed by the caller)."""
        params = seq.params
        scores = (logits - logits.max()) / params.temperature
        if 0 < params.top_k < scores.shape[-1]:
            kth = torch.topk(scores, params.top_k).values[-1]
            scores = scores.masked_fill(scores < kth, float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        if params.top_p < 1.0:
            sorted_probs, order = probs.double().sort(descending=True)
            before = sorted_probs.cumsum(-1) - sorted_probs
            drop = before >= params.top_p
            drop[0] = False  # the top token always stays, however small top_p is
            sorted_probs[drop] = 0.0
            probs = torch.zeros_like(sorted_probs).scatter_(-1, order, sorted_probs)
        generator = seq.generator or self.generator
        return int(torch.multinomial(probs, 1, generator=generator).item())


def _plain(seq: Sequence, vocab: int) -> bool:
    params = seq.params
    return not params.greedy and not 0 < params.top_k < vocab and params.top_p >= 1.0


def token_logprobs(
    logits: torch.Tensor, token_ids: list[int], widths: list[int]
) -> list[TokenLogprob]:
    """Row ``i`` of ``logits``: ``token_ids[i]``'s log-probability and the ``widths[i]`` most
    likely tokens', under the raw distribution (one log-softmax and one top-k for all rows)."""
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    ids = torch.tensor(token_ids, device=logits.device)
    chosen = logprobs.gather(1, ids[:, None])[:, 0].tolist()
    width = max(widths, default=0)
    top_values: list[list[float]] = [[] for _ in token_ids]
    top_ids: list[list[int]] = [[] for _ in token_ids]
    if width > 0:
        top = torch.topk(logprobs, width, dim=-1)
        top_values, top_ids = top.values.tolist(), top.indices.tolist()
    return [
        TokenLogprob(
            token_id, chosen[i], tuple(zip(top_ids[i][:w], top_values[i][:w], strict=True))
        )
        for i, (token_id, w) in enumerate(zip(token_ids, widths, strict=True))
    ]
