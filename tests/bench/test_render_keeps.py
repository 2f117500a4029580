"""Re-rendering docs/benchmarks.md keeps the sections after the marker (written by hand or by
other tools) and replaces everything before it."""

from __future__ import annotations

from pathlib import Path

from bench.report import KEPT_MARKER, render_document

RESULTS = Path(__file__).resolve().parents[2] / "bench" / "results" / "cpu" / "results.json"


def test_sections_after_the_marker_survive_a_re_render(tmp_path: Path) -> None:
    target = tmp_path / "benchmarks.md"
    tail = f"{KEPT_MARKER}\n\n## Loading memory\n\nkept by hand.\n\n## OpenAI load testers\n\nx\n"
    target.write_text("# an old rendering\n\nstale table\n\n" + tail)
    render_document(RESULTS, target, "servedeck bench --preset cpu")
    text = target.read_text()
    assert "stale table" not in text
    assert text.startswith("# servedeck bench — preset `cpu`")
    assert text.endswith(tail)
    assert text.count(KEPT_MARKER) == 1
    render_document(RESULTS, target, "servedeck bench --preset cpu")
    assert target.read_text() == text, "rendering twice changes nothing"


def test_a_fresh_page_ends_with_the_marker(tmp_path: Path) -> None:
    target = tmp_path / "new.md"
    render_document(RESULTS, target, "servedeck bench --preset cpu")
    assert target.read_text().rstrip().endswith(KEPT_MARKER)
