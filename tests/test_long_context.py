"""The long-context variant builder (evals/long_context/build.py) on the fixture datasets: the
original passages stay intact at the recorded range, padding comes from other samples, and the
same seed gives the same files."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from rt4chart.method.text import join_passages, segment_context

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures" / "datasets" / "ragtruth-qa"
ORIGINALS = {json.loads(line)["id"]: json.loads(line) for line in (FIXTURES / "dev.jsonl").read_text().splitlines()}


def build(out: Path, seed: int) -> dict[int, list[dict[str, object]]]:
    subprocess.run(
        [sys.executable, str(ROOT / "evals" / "long_context" / "build.py"), "--path", str(FIXTURES),
         "--split", "dev", "--seed", str(seed), "--sizes", "5", "8", "--out", str(out)],
        check=True, capture_output=True,
    )
    return {size: [json.loads(line) for line in (out / f"size-{size}.jsonl").read_text().splitlines()]
            for size in (0, 5, 8)}


def test_padding_keeps_the_original_at_the_recorded_range_and_is_reproducible(tmp_path: Path) -> None:
    first, again = build(tmp_path / "a", seed=7), build(tmp_path / "b", seed=7)
    assert first == again
    for size in (5, 8):
        for record in first[size]:
            layout = record["long_context"]
            assert isinstance(layout, dict) and isinstance(record["context"], list)
            joined, _ = join_passages(record["context"])
            original = ORIGINALS[str(record["id"])]
            own = [p for p in str(original["d1"]).split("\n\n") if p.strip()]
            assert joined[layout["original_start"] : layout["original_end"]] == join_passages(own)[0]
            assert record["answer"] == original["d2"]  # gold offsets point into the answer
            assert str(record["id"]) not in layout["distractor_sources"]
            assert layout["sentences"] == len(segment_context(record["context"])[1])
            # Padded until the target, unless the other samples' passages ran out.
            pool = {
                passage for other in ORIGINALS.values()
                if other["query"] != original["query"]
                for passage in str(other["d1"]).split("\n\n") if passage.strip() and passage not in own
            }
            assert layout["sentences"] >= size or len(layout["distractor_sources"]) == len(pool)
    assert all(r["long_context"]["distractor_sources"] == [] for r in first[0])
    assert any(r["long_context"]["distractor_sources"] for r in first[8])
