"""Compares two lm-eval runs item by item, from the sample files ``--log_samples`` writes.

Aggregate scores can agree by luck (two items wrong the other way round); the issue asks for
the same per-item log-likelihoods, so the comparison reads every choice of every item. Only the
standard library: this module runs in whichever Python starts the runner, never in the
project's venv and never importing lm_eval (the sample files are its public output).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

LOGLIK_TOLERANCE = 1e-3
"""The issue's bound on |log-likelihood difference| per choice (float32 on both sides)."""


@dataclass(frozen=True, slots=True)
class ChoiceScores:
    """One multiple-choice item as a backend scored it."""

    doc_id: int
    logliks: tuple[float, ...]
    acc: float
    acc_norm: float | None


@dataclass(frozen=True, slots=True)
class LoglikComparison:
    items: int
    choices: int
    max_abs_diff: float
    worst_doc_id: int
    acc_reference: float
    acc_candidate: float
    acc_norm_reference: float | None
    acc_norm_candidate: float | None
    items_disagreeing: tuple[int, ...]
    """Items whose acc differs (the same accuracy with different items would hide a bug)."""

    @property
    def agrees(self) -> bool:
        return (
            self.max_abs_diff <= LOGLIK_TOLERANCE
            and not self.items_disagreeing
            and self.acc_reference == self.acc_candidate
            and self.acc_norm_reference == self.acc_norm_candidate
        )


@dataclass(frozen=True, slots=True)
class AnswerPair:
    doc_id: int
    question: str
    reference: str
    candidate: str


@dataclass(frozen=True, slots=True)
class GenerationComparison:
    items: int
    equal: int
    pairs: tuple[AnswerPair, ...]

    @property
    def agrees(self) -> bool:
        return self.items > 0 and self.equal == self.items


def samples_file(output_dir: Path, task: str) -> Path:
    """The one ``samples_<task>_*.jsonl`` lm-eval wrote under ``output_dir`` (it nests the file
    in a folder named after the model, so the path is found, not built)."""
    found = sorted(output_dir.rglob(f"samples_{task}_*.jsonl"))
    if len(found) != 1:
        raise FileNotFoundError(f"expected one samples file for {task} under {output_dir}: {found}")
    return found[0]


def _lines(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _number(value: object) -> float:
    """lm-eval 0.4.13 writes ``resps`` through ``str()`` (``"-4.5093..."``), so a number may
    arrive as its decimal string; anything else is a format change worth stopping on."""
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):
        return float(value)
    raise TypeError(f"expected a number, got {value!r}")


def read_choice_scores(path: Path) -> dict[int, ChoiceScores]:
    """Per item: each choice's log-likelihood (``resps[i][0][0]``, before any filter) and acc."""
    scores: dict[int, ChoiceScores] = {}
    for sample in _lines(path):
        doc_id = int(_number(sample["doc_id"]))
        resps = sample["resps"]
        if not isinstance(resps, list):
            raise TypeError(f"doc {doc_id}: resps is not a list")
        logliks = tuple(_number(resp[0][0]) for resp in resps)
        acc_norm = sample.get("acc_norm")
        scores[doc_id] = ChoiceScores(
            doc_id=doc_id,
            logliks=logliks,
            acc=_number(sample["acc"]),
            acc_norm=None if acc_norm is None else _number(acc_norm),
        )
    return scores


def read_answers(path: Path) -> dict[int, tuple[str, str]]:
    """Per item: (the question, the filtered answer string)."""
    answers: dict[int, tuple[str, str]] = {}
    for sample in _lines(path):
        doc = sample["doc"]
        question = str(doc.get("question", "")) if isinstance(doc, dict) else ""
        filtered = sample["filtered_resps"]
        answer = filtered[0] if isinstance(filtered, list) else filtered
        answers[int(_number(sample["doc_id"]))] = (question, str(answer))
    return answers


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def compare_logliks(
    reference: dict[int, ChoiceScores], candidate: dict[int, ChoiceScores]
) -> LoglikComparison:
    if reference.keys() != candidate.keys() or not reference:
        raise ValueError(
            f"the runs scored different items: {sorted(reference.keys() ^ candidate.keys())}"
        )
    worst, worst_doc = 0.0, -1
    for doc_id, ref in reference.items():
        cand = candidate[doc_id]
        if len(ref.logliks) != len(cand.logliks):
            raise ValueError(f"doc {doc_id}: {len(ref.logliks)} vs {len(cand.logliks)} choices")
        diff = max(abs(a - b) for a, b in zip(ref.logliks, cand.logliks, strict=True))
        if diff > worst or worst_doc < 0:
            worst, worst_doc = diff, doc_id
    refs = list(reference.values())
    cands = [candidate[doc_id] for doc_id in reference]
    has_norm = all(s.acc_norm is not None for s in refs + cands)
    return LoglikComparison(
        items=len(refs),
        choices=sum(len(s.logliks) for s in refs),
        max_abs_diff=worst,
        worst_doc_id=worst_doc,
        acc_reference=_mean([s.acc for s in refs]),
        acc_candidate=_mean([s.acc for s in cands]),
        acc_norm_reference=_mean([s.acc_norm or 0.0 for s in refs]) if has_norm else None,
        acc_norm_candidate=_mean([s.acc_norm or 0.0 for s in cands]) if has_norm else None,
        items_disagreeing=tuple(
            r.doc_id for r, c in zip(refs, cands, strict=True) if r.acc != c.acc
        ),
    )


def compare_answers(
    reference: dict[int, tuple[str, str]], candidate: dict[int, tuple[str, str]]
) -> GenerationComparison:
    if reference.keys() != candidate.keys() or not reference:
        raise ValueError(
            f"the runs answered different items: {sorted(reference.keys() ^ candidate.keys())}"
        )
    pairs = tuple(
        AnswerPair(doc_id, question, answer, candidate[doc_id][1])
        for doc_id, (question, answer) in sorted(reference.items())
    )
    return GenerationComparison(
        items=len(pairs),
        equal=sum(p.reference == p.candidate for p in pairs),
        pairs=pairs,
    )
