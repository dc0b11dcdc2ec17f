#!/usr/bin/env bash
# Mutation testing of hangd/analysis/ on a seeded sample, in one run (docs/testing.md: sampling):
# generate every mutant, draw SAMPLE names with SEED, collect the test statistics and judge only
# those in one mutmut run, then score them with a 95% interval. `make mutate-sample SAMPLE=150 SEED=2026`.
set -euo pipefail
SAMPLE=${SAMPLE:-150}
SEED=${SEED:-2026}
BIN=${BIN:-.venv/bin}
CHILDREN=${CHILDREN:-2}
export HANGD_FUZZ_SCALE=${HANGD_FUZZ_SCALE:-0.1}
start=$(date +%s)
rm -rf mutants
# every mutant generated, none judged: the names to draw the sample from
"$BIN/python" scripts/mutmut_generate.py "$CHILDREN" > mutants-generate.log 2>&1
"$BIN/mutmut" results --all true > mutmut-results.txt || true
"$BIN/python" scripts/mutation_score.py mutmut-results.txt --sample "$SAMPLE" --seed "$SEED" --prefix hangd.analysis > sample.txt
echo "generated in $(( $(date +%s) - start )) s: $(grep -c . mutmut-results.txt) mutants, $(grep -c . sample.txt) sampled"
# shellcheck disable=SC2046
"$BIN/mutmut" run --max-children "$CHILDREN" $(cat sample.txt) > mutants-run.log 2>&1
"$BIN/mutmut" results --all true > mutmut-results.txt || true
"$BIN/python" scripts/mutation_score.py mutmut-results.txt --only sample.txt
echo "in all $(( $(date +%s) - start )) s"
