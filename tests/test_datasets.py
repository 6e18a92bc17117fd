"""Dataset adapters on small fixture files the project wrote, plus a smoke test on the real data."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from rt4chart.analysis.datasets import (
    DATA_DIR_ENV,
    DatasetError,
    dataset_files,
    default_data_dir,
    faithbench_split,
    load_dataset,
    samples_sha256,
)
from rt4chart.types import Sample, Span, merge_spans

FIXTURES = Path(__file__).parent / "fixtures" / "datasets"


def _gold_texts(sample: Sample) -> list[str]:
    assert sample.gold is not None
    return [sample.answer[s.start : s.end] for s in sample.gold.spans]


def test_ragtruth_qa_reads_split_with_spans_question_and_passages() -> None:
    dev = load_dataset("ragtruth-qa", FIXTURES / "ragtruth-qa", split="dev")
    assert [s.id for s in dev] == ["qa-1", "qa-2", "qa-3"]
    first = dev[0]
    assert first.question == "When is the library open?"
    assert isinstance(first.context, str) and first.context.startswith("passage 1:")
    assert first.gold is not None and first.gold.hallucinated and first.gold.task_type == "QA"
    assert _gold_texts(first) == ["It closes at 8 pm."]
    assert dev[1].gold is not None and dev[1].gold.hallucinated is False and dev[1].gold.spans == []
    # Overlapping annotations ("in 1850" inside the whole sentence) merge into one span.
    assert _gold_texts(dev[2]) == ["The park was built in 1850 by the mayor."]
    test = load_dataset("ragtruth-qa", FIXTURES / "ragtruth-qa", split="test")
    assert [s.id for s in test] == ["qa-4", "qa-5"]


def test_ragtruth_qa_defaults_to_dev_and_limit_keeps_the_first() -> None:
    assert [s.id for s in load_dataset("ragtruth-qa", FIXTURES / "ragtruth-qa", limit=2)] == ["qa-1", "qa-2"]
    single_file = load_dataset("ragtruth-qa", FIXTURES / "ragtruth-qa" / "test.jsonl")
    assert [s.id for s in single_file] == ["qa-4", "qa-5"]


def test_faithbench_split_rule_unwanted_labels_and_source_evidence() -> None:
    everything = load_dataset("faithbench", FIXTURES / "faithbench")
    assert [s.id for s in everything] == [
        "faithbench-1-0", "faithbench-1-1", "faithbench-1-2", "faithbench-2-0", "faithbench-2-3",
    ]
    test = load_dataset("faithbench", FIXTURES / "faithbench", split="test")
    assert [s.id for s in test] == ["faithbench-1-2", "faithbench-2-3"]
    dev = load_dataset("faithbench", FIXTURES / "faithbench", split="dev")
    assert len(dev) + len(test) == len(everything)
    by_id = {s.id: s for s in everything}
    # Questionable and Benign annotations are not hallucinations; Unwanted ones are.
    questionable = by_id["faithbench-1-1"].gold
    assert questionable is not None and questionable.hallucinated is False and questionable.spans == []
    intrinsic = by_id["faithbench-1-2"]
    assert intrinsic.gold is not None and intrinsic.gold.hallucinated
    assert _gold_texts(intrinsic) == ["500"]
    assert isinstance(intrinsic.context, str)
    assert [intrinsic.context[e.start : e.end] for e in intrinsic.gold.evidence] == ["300 loaves"]
    extrinsic = by_id["faithbench-2-3"]
    assert _gold_texts(extrinsic) == ["and is always late"]
    assert extrinsic.gold is not None and extrinsic.gold.evidence == []


def test_faithbench_split_rule_matches_the_data_readme() -> None:
    assert faithbench_split(1, 2) == "test"
    assert faithbench_split(1, 0) == "dev"
    assert faithbench_split(2, 3) == "test"


def test_original_ragtruth_layout_by_task_type_and_split() -> None:
    samples = load_dataset("ragtruth", FIXTURES / "ragtruth")
    by_id = {s.id: s for s in samples}
    qa = by_id["r1"]
    assert qa.question == "When does the pool open?" and qa.context == "passage 1:The pool opens at 7 am.\n\n"
    assert qa.gold is not None and qa.gold.task_type == "QA" and _gold_texts(qa) == ["8 am"]
    summary = by_id["r2"]
    assert summary.question is None and summary.gold is not None and summary.gold.task_type == "Summary"
    data2txt = by_id["r3"]
    # A data-to-text source is one structured document named by its source id, a line per field.
    assert data2txt.passage_ids == ["src-d2t"] and data2txt.context == ["city: Porto\nname: Cafe Blue\nstars: 4"]
    assert [s.id for s in load_dataset("ragtruth", FIXTURES / "ragtruth", split="test")] == ["r1", "r2"]


def test_mu_shroom_is_closed_book_with_language_as_task_type() -> None:
    dev = load_dataset("mu-shroom", FIXTURES / "mu-shroom", split="dev")
    assert [s.id for s in dev] == ["val-en-1", "val-en-2"]
    first = dev[0]
    assert first.context == "" and first.question == "When did Marie Curie win Nobel Prizes?"
    assert first.gold is not None and first.gold.task_type == "EN" and _gold_texts(first) == ["1925"]
    assert dev[1].gold is not None and dev[1].gold.hallucinated is False
    test = load_dataset("mu-shroom", FIXTURES / "mu-shroom", split="test")
    assert [s.id for s in test] == ["tst-de-1"] and _gold_texts(test[0]) == ["2000 km"]


def test_generic_reads_top_level_and_nested_gold() -> None:
    samples = {s.id: s for s in load_dataset("generic", FIXTURES / "generic.jsonl")}
    spans_only = samples["g-1"]
    assert spans_only.gold is not None and spans_only.gold.hallucinated and spans_only.gold.task_type == "QA"
    assert _gold_texts(spans_only) == ["It sells only bicycles."]
    label_only = samples["g-2"]
    assert label_only.gold is not None and label_only.gold.hallucinated is False
    assert label_only.context == ["The bridge is 1 km long.", "It opened in 1990."]
    nested = samples["g-3"]
    assert nested.gold is not None and nested.gold.evidence == [Span(start=0, end=34)]


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("not json", "not valid JSON"),
        ('{"id": "x", "context": "c", "answer": "abc", "spans": [[1, 9]]}', "not inside the answer"),
        ('{"id": "x", "context": "c", "answer": "abc", "label": "maybe"}', "label must be"),
        ('{"id": "x", "context": "c"}', "missing field 'answer'"),
    ],
)
def test_generic_bad_lines_name_file_and_line(tmp_path: Path, line: str, message: str) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text('{"id": "ok", "context": "c", "answer": "a"}\n' + line + "\n", encoding="utf-8")
    with pytest.raises(DatasetError, match=message) as caught:
        load_dataset("generic", path)
    assert f"{path}:2" in str(caught.value)


def test_unknown_name_split_and_missing_data_are_clear(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match="unknown dataset"):
        load_dataset("halueval")
    with pytest.raises(DatasetError, match="no split 'train'"):
        load_dataset("ragtruth-qa", FIXTURES / "ragtruth-qa", split="train")
    with pytest.raises(DatasetError, match="not found"):
        load_dataset("faithbench", tmp_path / "nowhere")
    with pytest.raises(DatasetError, match="needs a path"):
        load_dataset("generic")


def test_data_dir_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(DATA_DIR_ENV, str(FIXTURES))
    assert default_data_dir() == FIXTURES
    assert [s.id for s in load_dataset("ragtruth-qa", split="test")] == ["qa-4", "qa-5"]
    assert dataset_files("faithbench")[0].name == "batch_1.json"


def test_merge_spans_and_samples_hash() -> None:
    spans = [Span(start=5, end=9), Span(start=0, end=3), Span(start=3, end=4), Span(start=7, end=7)]
    merged = merge_spans(spans)
    assert merged == [Span(start=0, end=4), Span(start=5, end=9)]
    samples = load_dataset("ragtruth-qa", FIXTURES / "ragtruth-qa")
    assert samples_sha256(samples) == samples_sha256(load_dataset("ragtruth-qa", FIXTURES / "ragtruth-qa"))
    assert samples_sha256(samples) != samples_sha256(samples[:2])


REAL_DATA = default_data_dir()


@pytest.mark.skipif(
    not (REAL_DATA / "ragtruth-qa" / "dev.jsonl").is_file() or not (REAL_DATA / "faithbench").is_dir(),
    reason=f"shared benchmark data not found at {REAL_DATA} (set {DATA_DIR_ENV} to the folder holding it)",
)
def test_real_data_sizes_match_the_data_readme() -> None:
    dev = load_dataset("ragtruth-qa", split="dev")
    test = load_dataset("ragtruth-qa", split="test")
    assert (len(dev), len(test)) == (525, 304)
    assert sum(bool(s.gold and s.gold.hallucinated) for s in dev) == 101
    for sample in dev + test:
        assert sample.gold is not None
        assert all(0 <= s.start < s.end <= len(sample.answer) for s in sample.gold.spans)
    faithbench = load_dataset("faithbench")
    assert len(faithbench) == 750
    assert len(load_dataset("faithbench", split="test")) == 242
    # The shared README's reference points count 436 hallucinated samples ("first label Unwanted").
    assert sum(bool(s.gold and s.gold.hallucinated) for s in faithbench) == 436
    if (REAL_DATA / "mu-shroom").is_dir():
        assert len(load_dataset("mu-shroom", split="dev")) == 499


def test_gold_keeps_the_benchmarks_label_types() -> None:
    dev = {s.id: s.gold for s in load_dataset("ragtruth-qa", FIXTURES / "ragtruth-qa", split="dev")}
    conflict, clean, baseless = dev["qa-1"], dev["qa-2"], dev["qa-3"]
    assert conflict is not None and clean is not None and baseless is not None
    assert [(a.label, a.kind) for a in conflict.annotations] == [("Evident Conflict", "contradiction")]
    assert (conflict.has_kind("contradiction"), conflict.has_kind("baseless")) == (True, False)
    assert (clean.has_kind("contradiction"), clean.has_kind("baseless")) == (False, False)
    assert [a.kind for a in baseless.annotations] == ["baseless", "baseless"]  # Evident and Subtle
    faithbench = {s.id: s for s in load_dataset("faithbench", FIXTURES / "faithbench")}
    intrinsic = faithbench["faithbench-1-2"]
    assert intrinsic.gold is not None and isinstance(intrinsic.context, str)
    [annotation] = intrinsic.gold.annotations
    assert annotation.kind == "contradiction" and annotation.span == Span(start=17, end=20)
    assert annotation.evidence is not None
    assert intrinsic.context[annotation.evidence.start : annotation.evidence.end] == "300 loaves"
    extrinsic = faithbench["faithbench-2-3"].gold
    assert extrinsic is not None and [a.kind for a in extrinsic.annotations] == ["baseless"]
    # Questionable annotations are not hallucinations, so they carry no type either.
    questionable = faithbench["faithbench-1-1"].gold
    assert questionable is not None and questionable.annotations == []
    assert questionable.has_kind("contradiction") is False
    # Untyped datasets answer "unknown", never "no".
    shroom = load_dataset("mu-shroom", FIXTURES / "mu-shroom")[0].gold
    assert shroom is not None and shroom.has_kind("contradiction") is None


REPOSITORY = Path(__file__).resolve().parent.parent
SITE_PACKAGES = Path(".venv", "lib", "python3.11", "site-packages")


def _install_like_pip(checkout: Path, site: Path) -> None:
    """Install rt4chart non-editable into ``site`` from a copy of the repository at ``checkout``, with
    pip itself, as the README's Try-it command does (``--no-build-isolation``: hatchling comes from
    the dev extra, so the build needs no network; ``--no-deps``: the venv already has them).

    The copy holds what the wheel is built from (pyproject's hatch table); pip records the copy as
    the install's source (PEP 610 ``direct_url.json``), which is where ``rt4 eval`` looks for data."""
    checkout.mkdir(parents=True, exist_ok=True)
    ignore = shutil.ignore_patterns("__pycache__")
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        if (REPOSITORY / name).exists():
            shutil.copy2(REPOSITORY / name, checkout / name)
    for folder in ("rt4chart", "prompts", "judges"):
        shutil.copytree(REPOSITORY / folder, checkout / folder, ignore=ignore)
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation", "--no-index",
         "--target", str(site), str(checkout)],
        check=True, capture_output=True, text=True, timeout=600,
    )


def _installed_rt4(site: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """The ``rt4`` command of the installation in ``site``, run from ``cwd`` as a user would
    (``-P``: the working directory is not put on the import path, as for a console script)."""
    environment = {key: value for key, value in os.environ.items() if key != DATA_DIR_ENV}
    environment["PYTHONPATH"] = str(site)
    return subprocess.run(
        [sys.executable, "-P", "-c", "from rt4chart.cli.app import main; main()", *args],
        cwd=cwd, env=environment, capture_output=True, text=True, timeout=600, check=False,
    )


def test_the_readme_eval_command_finds_its_data_after_a_non_editable_install(tmp_path: Path) -> None:
    # A user's layout: the clone and the shared data beside it; the package copied into site-packages.
    checkout, site, elsewhere = tmp_path / "clone", tmp_path / SITE_PACKAGES, tmp_path / "home" / "user"
    for folder in (checkout, site, elsewhere):
        folder.mkdir(parents=True)
    shutil.copytree(FIXTURES / "ragtruth-qa", tmp_path / "shared" / "data" / "ragtruth-qa")
    _install_like_pip(checkout, site)
    probe = _installed_rt4(site, checkout, "--help")
    assert probe.returncode == 0, probe.stderr
    imported = subprocess.run(
        [sys.executable, "-P", "-c", "import rt4chart; print(rt4chart.__file__)"],
        env={**os.environ, "PYTHONPATH": str(site)}, capture_output=True, text=True, check=True,
    ).stdout.strip()
    assert Path(imported).is_relative_to(site), imported  # the installed copy runs, not the repository
    readme_eval = ["eval", "ragtruth-qa", "--split", "test", "--judge", "embedded"]
    for cwd in (checkout, elsewhere):  # from the clone (../shared/data), and from anywhere (pip's record)
        completed = _installed_rt4(site, cwd, *readme_eval, "--resamples", "10")
        assert completed.returncode == 0, completed.stderr
        written = sorted((cwd / "rt4-results").glob("*.json"))
        assert written, completed.stderr
        result = json.loads(written[0].read_text(encoding="utf-8"))
        assert result["config"]["path"] == str((tmp_path / "shared" / "data" / "ragtruth-qa").resolve())


def test_a_missing_dataset_lists_every_place_looked_in(tmp_path: Path) -> None:
    site, elsewhere = tmp_path / SITE_PACKAGES, tmp_path / "home" / "user"
    site.mkdir(parents=True)
    elsewhere.mkdir(parents=True)
    _install_like_pip(tmp_path / "gone", site)
    shutil.rmtree(tmp_path / "gone")  # the clone it was installed from is gone
    completed = _installed_rt4(site, elsewhere, "eval", "ragtruth-qa", "--judge", "embedded")
    assert completed.returncode == 2
    message = " ".join(completed.stderr.split())
    for place in (tmp_path / "shared" / "data", elsewhere / "shared" / "data", elsewhere.parent / "shared" / "data"):
        assert str(place / "ragtruth-qa") in message
    assert DATA_DIR_ENV in message and "--path" in message
    shown = _installed_rt4(site, elsewhere, "eval", "--help").stdout
    help_text = "".join(character for character in shown if not character.isspace() and character != "│")
    assert DATA_DIR_ENV in help_text and "installedfrom" in help_text


def test_eval_never_writes_into_the_tracked_results_by_default(tmp_path: Path) -> None:
    """From the checkout, `rt4 eval` without --results-dir leaves evals/results (tracked figures) alone."""
    data = tmp_path / "shared" / "data"
    shutil.copytree(FIXTURES / "ragtruth-qa", data / "ragtruth-qa")
    checkout = tmp_path / "clone"
    (checkout / "evals" / "results").mkdir(parents=True)
    environment = {**os.environ, DATA_DIR_ENV: str(data)}
    completed = subprocess.run(
        [sys.executable, "-m", "rt4chart", "eval", "ragtruth-qa", "--split", "test", "--judge", "embedded",
         "--resamples", "10", "-q"],
        cwd=checkout, env=environment, capture_output=True, text=True, timeout=600, check=False,
    )
    assert completed.returncode == 0, completed.stderr
    assert list((checkout / "evals" / "results").iterdir()) == []
    assert sorted(path.suffix for path in (checkout / "rt4-results").iterdir()) == [".json", ".md"]
