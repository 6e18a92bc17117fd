#!/usr/bin/env bash
# FaithBench test part (242 samples): FaithBench's 8 stored detectors, rt4chart's embedded verifier,
# a cascade and the flag-everything baseline, compared with each other and with the human labels by
# `rt4 agree`. Writes evals/results/agreement/faithbench_test.{txt,json,png}. Run from the checkout
# root with rt4chart installed ('.[embedded,plot]') and the data where `rt4 eval` finds it.
# Scratch files (they quote the benchmark or carry its labels) go to $WORK, never into the repository.
set -euo pipefail
WORK=${WORK:-/tmp/faithbench-agree}
OUT=evals/results/agreement
mkdir -p "$WORK" "$OUT"

# 1. the stored detectors as rt4chart output records (ids and lines as rt4 convert / rt4 eval number them)
python evals/agreement/faithbench_detectors.py --split test --out-dir "$WORK"

# 2. rt4chart's own judges on the same samples
rt4 convert faithbench --split test -o "$WORK/input.jsonl"
nice -n 10 rt4 verify "$WORK/input.jsonl" --judge embedded --no-cache -q -o "$WORK/embedded.jsonl" || [ $? -eq 1 ]
rt4 verify "$WORK/input.jsonl" --judge scripted:evals/sanity/flag_everything.rules.json --no-cache -q \
  -o "$WORK/flag_everything.jsonl" || [ $? -eq 1 ]
# a cautious offline cascade: the embedded verifier settles the claims it is at least 0.9 sure of,
# every other claim is flagged (baseless)
nice -n 10 rt4 verify "$WORK/input.jsonl" --judge cascade:embedded@0.9,scripted:evals/sanity/flag_everything.rules.json \
  --no-cache -q -o "$WORK/cascade.jsonl" || [ $? -eq 1 ]

# 3. agreement and the vs-gold table (gold is carried in every record), 1000 resamples, seed 0
FILES=()
for name in GPT-4o GPT-4-Turbo GPT-3.5-Turbo HHEM-1.0 HHEM-2.1 HHEM-2.1-English TrueTeacher TRUE-NLI \
            embedded cascade flag_everything; do
  FILES+=("$WORK/$name.jsonl")
done
COLUMNS=200 rt4 agree "${FILES[@]}" --plot "$OUT/faithbench_test.png" > "$OUT/faithbench_test.txt"
rt4 agree "${FILES[@]}" --json > "$OUT/faithbench_test.json"
python evals/agreement/table.py "$OUT/faithbench_test.json" > "$OUT/faithbench_test.md"
