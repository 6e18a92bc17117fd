"""Benchmark adapters: human-labelled datasets read into :class:`Sample` objects with gold labels.

Every adapter keeps the answer text byte for byte, so gold spans (character offsets into the
answer, end exclusive) stay valid, and puts the labels in ``Sample.gold``, which no judge sees.

Datasets and their gold:

- ``ragtruth-qa``: the RAGTruth QA test responses in the QC-NLI layout (``d1`` passages, ``d2``
  response, ``query``, ``labels``), split into ``dev.jsonl`` / ``test.jsonl``. Hallucinated = any
  annotated span (all four RAGTruth label types; ``implicit_true`` spans included, because the
  context does not state them either).
- ``ragtruth``: the original RAGTruth layout (``response.jsonl`` + ``source_info.jsonl``), which
  users supply; ``split`` selects ``train`` / ``test`` by the responses' own ``split`` field. A
  data-to-text (``Data2txt``) source becomes one structured document (``documents``, named by its
  ``source_id``): evidence then names the JSON path of the field it quotes.
- ``faithbench``: FaithBench ``batch_<n>.json`` files. Hallucinated = any annotation whose first
  label is ``Unwanted`` (or one of its subtypes); gold spans are those annotations' summary spans
  and gold evidence their source spans, when annotators gave one. The dev/test split is
  ``int(sha256(f"{batch}:{sample_id}"), 16) % 3 == 0`` -> test.
- ``mu-shroom``: SemEval-2025 Mu-SHROOM jsonl files (``val`` -> dev, ``test_labeled`` -> test).
  The task is closed-book: there is no retrieved context, so the context is empty and the model
  input becomes the question. A context-grounded verifier therefore finds every claim baseless;
  the adapter exists for the IoU scoring semantics and for users who attach their own context.
  ``task_type`` is the language code, so per-task metrics are per language.
- ``conversations``: rt4chart input JSONL whose lines carry ``messages`` (no gold): each line becomes
  one line per assistant turn with text, holding the messages up to that turn (so each turn is audited
  on what came before it, the earlier turns still never grounding a claim), its id ``ID#message-N``
  (N the turn's 0-based index in the messages, the line's id ``line-L`` when it has none). ``rt4
  verify`` keeps one record per input line; this is how to audit every turn.
- ``generic``: rt4chart input JSONL (``id``, ``context``, ``question``, ``answer``) with gold either
  as a ``gold`` object (what ``rt4 convert`` writes) or as top-level ``spans`` / ``label``.

Data location: an explicit ``path``, else the ``RT4_DATA_DIR`` environment variable, else the
first of :func:`data_dir_candidates` that holds the dataset's folder: ``../shared/data`` and
``shared/data`` from the working directory, then ``../shared/data`` beside the checkout the
package runs from or was installed from (pip records the source directory of a non-editable
install, so the documented default survives ``pip install .``).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal
from urllib.parse import unquote, urlparse

from pydantic import ValidationError

from rt4chart.conversations import assistant_turns, message_document_id
from rt4chart.records.io import read_json_lines
from rt4chart.types import Gold, GoldAnnotation, GoldKind, Label, Sample, Span, describe_validation_error, merge_spans

DATA_DIR_ENV = "RT4_DATA_DIR"
"""Environment variable naming the folder that holds ``ragtruth-qa/``, ``faithbench/``, ..."""

_BATCH_FILE = re.compile(r"batch_(\d+)\.json$")
_MU_SHROOM_FOLDERS = {"dev": "val", "test": "test_labeled"}


class DatasetError(ValueError):
    """A dataset cannot be read: unknown name or split, missing file, or a malformed record."""


DATA_LOCATION_HELP = (
    f"Dataset file or folder (default: its folder under ${DATA_DIR_ENV}, else under the first of "
    "../shared/data or shared/data from the working directory, then ../shared/data beside the "
    "checkout rt4chart was installed from, that holds it)."
)
"""How a dataset is found, in the words ``--help`` shows."""


def _installed_from_checkout() -> Path | None:
    """The local source directory pip installed this package from (PEP 610 ``direct_url.json``), if any.

    A non-editable ``pip install .`` copies the package into site-packages, so ``__file__`` no longer
    says where the checkout is; pip's record of the install does.
    """
    try:
        record = importlib.metadata.distribution("rt4chart").read_text("direct_url.json")
    except importlib.metadata.PackageNotFoundError:
        return None
    if not record:
        return None
    try:
        direct_url = json.loads(record)
    except json.JSONDecodeError:
        return None
    url = urlparse(str(direct_url.get("url", "")))
    # dir_info marks a directory (archive_info a wheel or sdist, which has no checkout beside it).
    if url.scheme != "file" or "dir_info" not in direct_url:
        return None
    return Path(unquote(url.path))


def data_dir_candidates() -> list[Path]:
    """Where the data directory is looked for when neither a path nor ``$RT4_DATA_DIR`` is given, in order."""
    working_directory = Path.cwd()
    places = [working_directory.parent / "shared" / "data", working_directory / "shared" / "data"]
    running_from = Path(__file__).resolve().parent.parent
    places.append(running_from.parent / "shared" / "data")
    checkout = _installed_from_checkout()
    if checkout is not None:
        places.append(checkout.parent / "shared" / "data")
    unique: list[Path] = []
    for place in places:
        resolved = place.resolve()
        if resolved not in unique:
            unique.append(resolved)
    return unique


def default_data_dir() -> Path:
    """``$RT4_DATA_DIR`` if set, else the first existing place of :func:`data_dir_candidates` (else the first place)."""
    configured = os.environ.get(DATA_DIR_ENV)
    if configured:
        return Path(configured)
    candidates = data_dir_candidates()
    return next((place for place in candidates if place.is_dir()), candidates[0])


def dataset_path(name: str, path: Path | None = None) -> Path:
    """Where ``name`` is read from: ``path`` when given, else its folder in the data directory.

    Raises :class:`DatasetError` listing every place looked in when the folder is nowhere.
    """
    adapter = _adapter(name)
    if path is not None:
        return path
    if adapter.folder is None:
        raise DatasetError(f"the {name} dataset needs a path to a JSONL file")
    configured = os.environ.get(DATA_DIR_ENV)
    if configured:
        return Path(configured) / adapter.folder
    looked_in = [place / adapter.folder for place in data_dir_candidates()]
    found = next((place for place in looked_in if place.exists()), None)
    if found is None:
        raise DatasetError(
            f"{name} data not found; looked in {', '.join(str(place) for place in looked_in)} "
            f"(pass --path, or set {DATA_DIR_ENV} to the folder holding {adapter.folder}/)"
        )
    return found


def dataset_files(name: str, path: Path | None = None, split: str | None = None) -> list[Path]:
    """The files an adapter reads for ``name`` / ``split``, in reading order."""
    adapter = _adapter(name)
    root = dataset_path(name, path)
    split = _check_split(name, split)
    if not root.exists():
        where = f" (${DATA_DIR_ENV})" if path is None else ""
        raise DatasetError(
            f"{name} data not found at {root}{where} (pass --path, or set {DATA_DIR_ENV} to the folder "
            f"holding {adapter.folder or 'the data'}/)"
        )
    return adapter.files(root, split)


def load_dataset(
    name: str, path: Path | None = None, split: str | None = None, limit: int | None = None
) -> list[Sample]:
    """Read a benchmark as samples with gold labels, in a stable order.

    ``split``: ``dev`` / ``test`` for ragtruth-qa (default ``dev``), faithbench and mu-shroom (all
    samples when omitted); ``train`` / ``test`` for ragtruth; none for generic. ``limit`` keeps the
    first N samples of the split. Raises :class:`DatasetError` with the file and line at fault.
    """
    if limit is not None and limit < 0:
        raise DatasetError(f"limit must be at least 0 (got {limit})")
    files = dataset_files(name, path, split)
    samples = _adapter(name).load(files, _check_split(name, split))
    return samples if limit is None else samples[:limit]


def source_key(sample: Sample) -> str:
    """A cross-validation group of a sample: its context (one source answered by several models), so a
    fold never sees the context of a held-out answer (evals/embedded/train.py, ``rt4 calibrate``)."""
    return hashlib.sha256(json.dumps(sample.context).encode()).hexdigest()[:16]


def samples_sha256(samples: Sequence[Sample]) -> str:
    """sha256 over the loaded samples (inputs and gold): identifies exactly what was evaluated."""
    digest = hashlib.sha256()
    for sample in samples:
        digest.update(sample.model_dump_json().encode())
        digest.update(b"\n")
    return digest.hexdigest()


def faithbench_split(batch: int, sample_id: int) -> Literal["dev", "test"]:
    """The FaithBench split rule of the shared data README (242 of 750 samples are test)."""
    digest = hashlib.sha256(f"{batch}:{sample_id}".encode()).hexdigest()
    return "test" if int(digest, 16) % 3 == 0 else "dev"


def _check_split(name: str, split: str | None) -> str | None:
    allowed = _adapter(name).splits
    if split is not None and split not in allowed:
        choices = ", ".join(allowed) if allowed else "none"
        raise DatasetError(f"{name} has no split {split!r} (splits: {choices})")
    return split


def _existing(path: Path) -> Path:
    if not path.is_file():
        raise DatasetError(f"dataset file not found: {path}")
    return path


def _jsonl(path: Path) -> Iterator[tuple[dict[str, Any], str]]:
    for line in read_json_lines(path):
        where = f"{path}:{line.number}"
        if line.problem is not None:
            raise DatasetError(f"{where}: {line.problem}")
        if not isinstance(line.value, dict):
            raise DatasetError(f"{where}: expected a JSON object")
        yield line.value, where


def _field(record: dict[str, Any], key: str, where: str) -> Any:
    if key not in record:
        raise DatasetError(f"{where}: missing field {key!r}")
    return record[key]


def _span(start: Any, end: Any, answer: str, where: str) -> Span:
    if not isinstance(start, int) or not isinstance(end, int) or not 0 <= start <= end <= len(answer):
        raise DatasetError(
            f"{where}: gold span [{start}, {end}) is not inside the answer ({len(answer)} characters)"
        )
    return Span(start=start, end=end)


def _sample(where: str, **fields: Any) -> Sample:
    try:
        return Sample.model_validate(fields)
    except ValidationError as error:
        raise DatasetError(f"{where}: {error.errors()[0]['loc']}: {error.errors()[0]['msg']}") from None


def _ragtruth_labels(labels: list[dict[str, Any]], answer: str, where: str) -> list[Span]:
    return merge_spans([_span(label.get("start"), label.get("end"), answer, where) for label in labels])


def _ragtruth_kind(label_type: str) -> GoldKind | None:
    """RAGTruth's Evident/Subtle Conflict contradicts the context, Evident/Subtle Baseless Info is
    not in it; other types (none in the QA split) are left untyped."""
    if "Conflict" in label_type:
        return "contradiction"
    if "Baseless" in label_type:
        return "baseless"
    return None


def _ragtruth_gold(labels: list[dict[str, Any]], answer: str, where: str, task_type: str) -> Gold:
    spans = _ragtruth_labels(labels, answer, where)
    annotations = [
        GoldAnnotation(
            span=_span(label.get("start"), label.get("end"), answer, where),
            label=str(label.get("label_type", "")),
            kind=_ragtruth_kind(str(label.get("label_type", ""))),
        )
        for label in labels
    ]
    return Gold(hallucinated=bool(spans), spans=spans, task_type=task_type, typed=True, annotations=annotations)


def _ragtruth_qa(record: dict[str, Any], where: str) -> Sample:
    answer = _field(record, "d2", where)
    return _sample(
        where,
        id=str(_field(record, "id", where)),
        context=_field(record, "d1", where),
        question=record.get("query"),
        answer=answer,
        gold=_ragtruth_gold(_field(record, "labels", where), answer, where, "QA"),
    )


def _ragtruth(responses: Path, sources: Path, split: str | None) -> list[Sample]:
    source_info: dict[str, tuple[dict[str, Any], str]] = {
        str(_field(record, "source_id", where)): (record, where) for record, where in _jsonl(sources)
    }
    samples = []
    for record, where in _jsonl(responses):
        if split is not None and record.get("split") != split:
            continue
        source_id = str(_field(record, "source_id", where))
        if source_id not in source_info:
            raise DatasetError(f"{where}: source_id {source_id!r} is not in {sources}")
        source, source_where = source_info[source_id]
        task_type = _field(source, "task_type", source_where)
        info = _field(source, "source_info", source_where)
        question: str | None = None
        given: dict[str, Any]
        if task_type == "QA" and isinstance(info, dict):
            question, given = info.get("question"), {"context": info.get("passages", "")}
        elif isinstance(info, str):
            given = {"context": info}
        else:
            # Data2txt sources are structured records (Yelp business JSON): one document whose fields are
            # the units, so evidence names the JSON path it quotes.
            given = {"documents": [{"id": source_id, "data": info}]}
        answer = _field(record, "response", where)
        samples.append(
            _sample(
                where,
                id=str(_field(record, "id", where)),
                **given,
                question=question,
                answer=answer,
                gold=_ragtruth_gold(_field(record, "labels", where), answer, where, task_type),
            )
        )
    return samples


def _faithbench_files(root: Path) -> list[Path]:
    if root.is_file():
        return [root]
    folder = root / "data_for_release" if (root / "data_for_release").is_dir() else root
    files = [f for f in folder.iterdir() if _BATCH_FILE.search(f.name)]
    if not files:
        raise DatasetError(f"no FaithBench batch_<n>.json files in {folder}")
    return sorted(files, key=_batch_number)


def _batch_number(path: Path) -> int:
    match = _BATCH_FILE.search(path.name)
    if match is None:
        raise DatasetError(f"{path}: FaithBench files must be named batch_<n>.json")
    return int(match.group(1))


def _is_unwanted(annotation: dict[str, Any]) -> bool:
    labels = annotation.get("label") or []
    return bool(labels) and str(labels[0]).startswith("Unwanted")


def _faithbench_kind(annotation: dict[str, Any]) -> GoldKind | None:
    """Unwanted.Intrinsic contradicts the source, Unwanted.Extrinsic adds what it lacks; a plain
    ``Unwanted`` (or both subtypes at once) has no type."""
    labels = {str(label) for label in annotation.get("label") or []}
    intrinsic, extrinsic = "Unwanted.Intrinsic" in labels, "Unwanted.Extrinsic" in labels
    if intrinsic != extrinsic:
        return "contradiction" if intrinsic else "baseless"
    return None


def _source_span(annotation: dict[str, Any], source: str) -> Span | None:
    start, end = annotation.get("source_start"), annotation.get("source_end")
    if isinstance(start, int) and isinstance(end, int) and 0 <= start < end <= len(source):
        return Span(start=start, end=end)
    return None


def _faithbench(files: list[Path], split: str | None) -> list[Sample]:
    samples = []
    for file in files:
        batch = _batch_number(file)
        try:
            content = json.loads(file.read_text(encoding="utf-8"))
        except json.JSONDecodeError as error:
            raise DatasetError(f"{file}: not valid JSON ({error.msg})") from None
        for position, record in enumerate(_field(content, "samples", str(file))):
            where = f"{file} sample #{position}"
            sample_id = _field(record, "sample_id", where)
            if split is not None and faithbench_split(batch, sample_id) != split:
                continue
            answer, source = _field(record, "summary", where), _field(record, "source", where)
            unwanted = [a for a in record.get("annotations") or [] if _is_unwanted(a)]
            spans = [
                _span(a.get("summary_start"), a.get("summary_end"), answer, where)
                for a in unwanted if a.get("summary_start") is not None
            ]
            evidence = [span for a in unwanted if (span := _source_span(a, source)) is not None]
            annotations = [
                GoldAnnotation(
                    span=_span(a.get("summary_start"), a.get("summary_end"), answer, where)
                    if a.get("summary_start") is not None else None,
                    label=".".join(str(label) for label in a.get("label") or []),
                    kind=_faithbench_kind(a),
                    evidence=_source_span(a, source),
                )
                for a in unwanted
            ]
            samples.append(
                _sample(
                    where,
                    id=f"faithbench-{batch}-{sample_id}",
                    context=source,
                    answer=answer,
                    gold=Gold(
                        hallucinated=bool(unwanted),
                        spans=merge_spans(spans),
                        task_type="Summary",
                        evidence=merge_spans(evidence),
                        typed=True,
                        annotations=annotations,
                    ),
                )
            )
    return samples


def _mu_shroom(record: dict[str, Any], where: str) -> Sample:
    answer = _field(record, "model_output_text", where)
    pairs = _field(record, "hard_labels", where)
    spans = merge_spans([_span(pair[0], pair[1], answer, where) for pair in pairs])
    return _sample(
        where,
        id=str(_field(record, "id", where)),
        context="",
        question=record.get("model_input"),
        answer=answer,
        # Each file is one language ("lang": "ZH"): the answers are audited in it, not guessed at.
        language=record.get("lang"),
        gold=Gold(hallucinated=bool(spans), spans=spans, task_type=record.get("lang")),
    )


def _generic_label(value: Any, where: str) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str):
        lowered = value.strip().lower()
        if lowered in ("hallucinated", "true", "1"):
            return True
        if lowered in ("faithful", "false", "0"):
            return False
        if lowered in {label.value for label in Label}:
            return lowered != Label.ENTAILED
    raise DatasetError(
        f"{where}: label must be true/false, 0/1, hallucinated/faithful or entailed/contradicted/baseless "
        f"(got {value!r})"
    )


def _generic_spans(value: Any, answer: str, where: str) -> list[Span]:
    if not isinstance(value, list):
        raise DatasetError(f"{where}: spans must be a list of {{start, end}} objects or [start, end] pairs")
    spans = []
    for item in value:
        if isinstance(item, dict):
            spans.append(_span(item.get("start"), item.get("end"), answer, where))
        elif isinstance(item, list) and len(item) == 2:
            spans.append(_span(item[0], item[1], answer, where))
        else:
            raise DatasetError(f"{where}: bad span {item!r}; expected {{start, end}} or [start, end]")
    return merge_spans(spans)


def _conversation_turns(files: list[Path], _split: str | None) -> list[Sample]:
    return [turn for file in files for record, where in _jsonl(file) for turn in _turns(record, where)]


def _turns(record: dict[str, Any], where: str) -> list[Sample]:
    """A conversation line as one sample per assistant turn (see the module's docstring)."""
    for key in ("answer_message", "gold"):
        if key in record:
            raise DatasetError(f"{where}: {key}: every assistant turn becomes a line of its own: drop {key}")
    if not isinstance(record.get("messages"), list):
        raise DatasetError(f"{where}: messages: a list of OpenAI-style chat messages (a conversation per line)")
    line_id = record.get("id", f"line-{where.rsplit(':', 1)[-1]}")
    try:
        turns = assistant_turns(Sample.model_validate({**record, "id": str(line_id)}).messages or [])
        return [Sample.model_validate({**record, "id": f"{line_id}#{message_document_id(turn)}",
                                       "messages": record["messages"][: turn + 1]}) for turn in turns]
    except ValidationError as error:
        raise DatasetError(f"{where}: {describe_validation_error(error)}") from None


def _generic(record: dict[str, Any], where: str) -> Sample:
    answer = _field(record, "answer", where)
    if not isinstance(answer, str):
        raise DatasetError(f"{where}: answer must be a string")
    gold_record = record.get("gold")
    if gold_record is not None:
        try:
            gold = Gold.model_validate(gold_record)
        except ValidationError as error:
            raise DatasetError(f"{where}: gold: {error.errors()[0]['msg']}") from None
        gold = gold.model_copy(update={"spans": _generic_spans(
            [[s.start, s.end] for s in gold.spans], answer, where
        )})
    else:
        spans = _generic_spans(record.get("spans", []), answer, where)
        hallucinated = (
            _generic_label(record["label"], where) if "label" in record
            else bool(spans) if "spans" in record else None
        )
        try:
            gold = Gold(
                hallucinated=hallucinated,
                spans=spans,
                task_type=record.get("task_type"),
                evidence=record.get("evidence", []),
            )
        except ValidationError as error:
            raise DatasetError(f"{where}: {error.errors()[0]['loc']}: {error.errors()[0]['msg']}") from None
    if gold.hallucinated is None and gold.spans:
        gold = gold.model_copy(update={"hallucinated": True})
    return _sample(
        where,
        id=str(_field(record, "id", where)),
        context=_field(record, "context", where),
        question=record.get("question"),
        answer=answer,
        gold=gold,
    )


# --- the adapters ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Adapter:
    """How one dataset is found and read."""

    folder: str | None
    """Its folder in the data directory (``None``: the user always gives a path)."""
    splits: tuple[str, ...]
    """The splits it knows."""
    files: Callable[[Path, str | None], list[Path]]
    """The files to read under a root, for a split."""
    load: Callable[[list[Path], str | None], list[Sample]]
    """Samples from those files, for a split."""


def _records(read: Callable[[dict[str, Any], str], Sample]) -> Callable[[list[Path], str | None], list[Sample]]:
    """A loader that turns every JSONL record of every file into one sample."""
    return lambda files, _split: [read(record, where) for file in files for record, where in _jsonl(file)]


def _mu_shroom_files(root: Path, split: str | None) -> list[Path]:
    if root.is_file():
        return [root]
    folder = root / _MU_SHROOM_FOLDERS[split] if split else root
    files = sorted(folder.rglob("*.jsonl"))
    if not files:
        raise DatasetError(f"no Mu-SHROOM .jsonl files under {folder}")
    return files


_ADAPTERS: dict[str, _Adapter] = {
    "ragtruth-qa": _Adapter(
        "ragtruth-qa",
        ("dev", "test"),
        lambda root, split: [root if root.is_file() else _existing(root / f"{split or 'dev'}.jsonl")],
        _records(_ragtruth_qa),
    ),
    "ragtruth": _Adapter(
        "ragtruth",
        ("train", "test"),
        lambda root, _split: [_existing(root / "response.jsonl"), _existing(root / "source_info.jsonl")],
        lambda files, split: _ragtruth(files[0], files[1], split),
    ),
    "faithbench": _Adapter("faithbench", ("dev", "test"), lambda root, _split: _faithbench_files(root), _faithbench),
    "mu-shroom": _Adapter("mu-shroom", ("dev", "test"), _mu_shroom_files, _records(_mu_shroom)),
    "conversations": _Adapter(None, (), lambda root, _split: [_existing(root)], _conversation_turns),
    "generic": _Adapter(None, (), lambda root, _split: [_existing(root)], _records(_generic)),
}

DATASET_NAMES: tuple[str, ...] = tuple(_ADAPTERS)
"""Every dataset name ``rt4 convert`` accepts."""

UNLABELLED_DATASETS: tuple[str, ...] = ("conversations",)
"""The names among them with no gold labels: ``rt4 eval`` has nothing to score them against."""


def _adapter(name: str) -> _Adapter:
    if name not in _ADAPTERS:
        raise DatasetError(f"unknown dataset {name!r}; choose one of {', '.join(_ADAPTERS)}")
    return _ADAPTERS[name]
