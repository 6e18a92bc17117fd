"""Record the shipped model's verdicts on the hand-written cases of tests/fixtures/embedded_pinned.json.

    python evals/embedded/pin_predictions.py

Run after ``evals/embedded/train.py`` writes a new model file: it fills in each case's expected
labels and confidences and the model file's sha256. ``tests/backends/test_embedded_model.py`` then
checks that the shipped file is that one and that it reproduces those verdicts (what CI checks
instead of retraining).
"""

from __future__ import annotations

import json
from pathlib import Path

from rt4chart.judges.embedded.model import artefact_sha256
from rt4chart.judges.embedded.verifier import EmbeddedBackend
from rt4chart.method.tasks import VerifyInput
from rt4chart.method.text import segment_context

PINNED = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "embedded_pinned.json"


def main() -> None:
    pinned = json.loads(PINNED.read_text())
    backend = EmbeddedBackend()
    for case in pinned["cases"]:
        _, sentences = segment_context(case["context"])
        payload = VerifyInput(stage="global", claims=case["claims"], sentences=sentences, question=case["question"])
        judgements = backend.judge(payload).judgements
        case["expected"] = [{"label": j.label.value, "confidence": j.confidence} for j in judgements]
        for claim, judgement in zip(case["claims"], judgements, strict=True):
            print(f"{judgement.label.value:>12} {judgement.confidence:.4f}  {claim}")
    pinned["artefact_sha256"] = artefact_sha256()
    PINNED.write_text(json.dumps(pinned, indent=2) + "\n")
    print(f"wrote {PINNED}")


if __name__ == "__main__":
    main()
