"""The lm-eval tasks in bench/lm_eval/tasks parse, and their data has what the YAML names.

lm-eval itself lives in a venv of its own and is not run here; what can break without it is
the data (a typo in the JSONL, an answer index past its choices, a field the template reads
that an item lacks) and the comparison of two sample files, both checked here.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from bench.lm_eval.compare import (
    LOGLIK_TOLERANCE,
    compare_answers,
    compare_logliks,
    read_answers,
    read_choice_scores,
)

ROOT = Path(__file__).resolve().parents[2]
TASKS = ROOT / "bench" / "lm_eval" / "tasks"


def _task(name: str) -> tuple[dict[str, object], list[dict[str, object]]]:
    config = yaml.safe_load((TASKS / f"{name}.yaml").read_text())
    data_file = ROOT / config["dataset_kwargs"]["data_files"][config["test_split"]]
    items = [json.loads(line) for line in data_file.read_text().splitlines()]
    return config, items


def _template_fields(template: str) -> set[str]:
    return set(re.findall(r"{{\s*(\w+)\s*}}", template))


def test_multiple_choice_task_items_are_complete():
    config, items = _task("servedeck_mc")
    assert config["dataset_path"] == "json" and config["output_type"] == "multiple_choice"
    assert {m["metric"] for m in config["metric_list"]} == {"acc", "acc_norm"}
    assert 40 <= len(items) <= 60
    fields = _template_fields(config["doc_to_text"]) | {config["doc_to_choice"]}
    for item in items:
        assert fields | {config["doc_to_target"]} <= item.keys(), item
        choices = item[config["doc_to_choice"]]
        assert 3 <= len(choices) <= 4 and len(set(choices)) == len(choices), item
        assert 0 <= item[config["doc_to_target"]] < len(choices), item
    assert len({item["question"] for item in items}) == len(items)


def test_generation_task_is_short_and_greedy():
    config, items = _task("servedeck_gen")
    assert config["output_type"] == "generate_until"
    kwargs = config["generation_kwargs"]
    assert kwargs["do_sample"] is False and kwargs["max_gen_toks"] <= 32 and kwargs["until"]
    assert 10 <= len(items) <= 20
    for item in items:
        assert _template_fields(config["doc_to_text"]) | {config["doc_to_target"]} <= item.keys()


def _write_samples(path: Path, rows: list[dict[str, object]]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def _mc_row(doc_id: int, logliks: list[float], acc: float) -> dict[str, object]:
    """A sample line as lm-eval 0.4.13 writes one for a multiple-choice item (its responses
    through ``str()``, so the log-likelihoods are decimal strings)."""
    return {
        "doc_id": doc_id,
        "resps": [[[str(value), "False"]] for value in logliks],
        "filtered_resps": [[str(value), "False"] for value in logliks],
        "acc": acc,
        "acc_norm": acc,
    }


def test_comparison_finds_the_worst_choice_and_a_flipped_item(tmp_path: Path):
    reference = read_choice_scores(
        _write_samples(
            tmp_path / "hf.jsonl", [_mc_row(0, [-1.0, -2.0], 1.0), _mc_row(1, [-3.0, -2.5], 1.0)]
        )
    )
    close = read_choice_scores(
        _write_samples(
            tmp_path / "close.jsonl",
            [_mc_row(0, [-1.0002, -2.0], 1.0), _mc_row(1, [-3.0, -2.5004], 1.0)],
        )
    )
    same = compare_logliks(reference, close)
    assert same.agrees and same.worst_doc_id == 1
    assert same.max_abs_diff == pytest.approx(4e-4)
    flipped = read_choice_scores(
        _write_samples(
            tmp_path / "far.jsonl", [_mc_row(0, [-1.0, -2.0], 1.0), _mc_row(1, [-2.0, -2.5], 0.0)]
        )
    )
    apart = compare_logliks(reference, flipped)
    assert not apart.agrees and apart.items_disagreeing == (1,)
    assert apart.max_abs_diff > LOGLIK_TOLERANCE and apart.acc_candidate == 0.5


def test_answers_compare_as_exact_strings(tmp_path: Path):
    def rows(answers: list[str]) -> list[dict[str, object]]:
        return [
            {"doc_id": i, "doc": {"question": f"q{i}"}, "filtered_resps": [a]}
            for i, a in enumerate(answers)
        ]

    hf = read_answers(_write_samples(tmp_path / "hf.jsonl", rows(["Paris", "Four"])))
    served = read_answers(_write_samples(tmp_path / "s.jsonl", rows(["Paris", "Four "])))
    result = compare_answers(hf, served)
    assert (result.items, result.equal, result.agrees) == (2, 1, False)
    assert compare_answers(hf, hf).agrees
