"""The seeded synthetic claims the embedded verifier's head is trained with (evals/embedded/synthetic.py)."""

from __future__ import annotations

import importlib.util
import random
import sys
from pathlib import Path
from types import ModuleType

from rt4chart.types import Sample

SCRIPT = Path(__file__).resolve().parents[1] / "evals" / "embedded" / "synthetic.py"


def load_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("synthetic_pairs", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


synthetic = load_script()

LIBRARY = (
    "The Hollow Pine library opened in 1962 on Mill Street in Ashford. "
    "The library is closed on Mondays and stays open until 8 pm on Thursdays. "
    "Readers may borrow up to 12 books at a time from Margaret Olsen, the head librarian. "
    "The council decided to raise the membership fee for visitors from Brookfield next year."
)
BUSES = (
    "Riverton's council voted on Tuesday to raise the bus fare from 2 dollars to 2.50 dollars. "
    "Council members said rising fuel costs forced the decision, and student passes will not change."
)


def test_each_rewrite_changes_what_the_sentence_says() -> None:
    rng = random.Random(0)
    names = ["Ashford", "Brookfield", "Margaret", "Olsen"]
    made = synthetic.rewrites(
        "The library is closed on Mondays and stays open until 8 pm on Thursdays.", names, ["Elsewhere."], rng
    )
    assert made["negation"] == "The library is not closed on Mondays and stays open until 8 pm on Thursdays."
    assert made["antonym"] in {
        "The library is open on Mondays and stays open until 8 pm on Thursdays.",
        "The library is closed on Mondays and stays closed until 8 pm on Thursdays.",
    }
    assert made["number"] != made.get("copy") and "8 pm" not in made["number"]
    assert made["elsewhere"] == "Elsewhere."
    # "Mondays" and "Thursdays" are capitalised inside the sentence: one is replaced by a name.
    assert any(name in made["entity"] for name in names)
    assert synthetic.rewrites("the fee was raised.", names, [], rng).get("entity") is None  # no name to swap
    made = synthetic.rewrites(
        "Readers may borrow up to 12 books at a time from Margaret Olsen.", names, [], random.Random(1)
    )
    assert made["qualifier"] == "Readers will borrow up to 12 books at a time from Margaret Olsen."
    assert made["entity"] != "Readers may borrow up to 12 books at a time from Margaret Olsen."
    assert any(name in made["entity"] for name in ("Ashford", "Brookfield"))
    assert "elsewhere" not in made
    negated = synthetic.rewrites("Student passes will not change next year.", [], [], random.Random(0))
    assert negated["negation"] == "Student passes will change next year."
    raised = synthetic.rewrites("The council decided to raise the fee.", [], [], random.Random(0))
    assert raised["antonym"].split()[4] in synthetic.ANTONYMS["raise"] >= {"decrease", "reduce", "lower", "cut"}


def test_generation_is_seeded_and_labelled_by_construction() -> None:
    samples = [
        Sample(id="a", context=LIBRARY, answer="x"),
        Sample(id="b", context=LIBRARY, answer="y"),
        Sample(id="c", context=BUSES, answer="z"),
    ]
    first = synthetic.generate(samples, seed=3)
    assert first == synthetic.generate(samples, seed=3)
    assert first != synthetic.generate(samples, seed=4)
    # One group per source: the two answers about the library share theirs.
    assert {claim.source for claim in first} == {synthetic.source_key(samples[0]), synthetic.source_key(samples[2])}
    copies = {(claim.source, claim.claim) for claim in first if claim.kind == "copy"}
    for claim in first:
        assert claim.unsupported == (claim.kind != "copy")
        assert claim.sample in {0, 2}
        if claim.kind == "copy":
            assert claim.claim in (LIBRARY if claim.sample == 0 else BUSES)
        else:
            assert (claim.source, claim.claim) not in copies
    assert {claim.kind for claim in first} - {"copy"}, "no rewrite was made"
