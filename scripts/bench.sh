#!/usr/bin/env bash
# Throughput and memory per objective: trains each recipe for a few steps on Fashion-MNIST at
# batch 256 (TALLY_BENCH_BATCH to change it) and prints images/s (median step after warm-up),
# GFLOP per step and peak RSS.
#   scripts/bench.sh [STEPS] [RECIPE...]     e.g. scripts/bench.sh 25 inbatch moco mae
# Extra settings go through TALLY_BENCH_SET, e.g. TALLY_BENCH_SET="parallel.replicas=2".
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${1:-25}
shift || true
recipes=("$@")
[ ${#recipes[@]} -gt 0 ] || recipes=(inbatch moco mae inbatch-vit moco-vit)
warmup=5
[ "$steps" -gt $((warmup + 1)) ] || { echo "bench: need more than $((warmup + 1)) steps" >&2; exit 2; }
[ -x build/tally ] || scripts/setup.sh
# Batch 256 by default whatever the recipe says, so the numbers compare with the reference's.
extra=(--set "train.batch_size=${TALLY_BENCH_BATCH:-256}")
for kv in ${TALLY_BENCH_SET:-}; do extra+=(--set "$kv"); done

out=bench-results/$(date +%Y%m%d-%H%M%S)
mkdir -p "$out"
printf '%-12s %-8s %6s %10s %10s %12s %14s\n' recipe objective batch "images/s" "step ms" "GFLOP/step" "peak RSS MiB"
for recipe in "${recipes[@]}"; do
  case $recipe in
    *-vit) objective=${recipe%-vit} ;;
    *) objective=$recipe ;;
  esac
  run="$out/$recipe"
  build/tally train --objective="$objective" --config "configs/$recipe.ini" --steps "$steps" \
    --no-knn --quiet --out "$run" "${extra[@]}" > "$run.log" 2>&1 || {
    echo "bench: $recipe failed, see $run.log" >&2
    continue
  }
  # Median step time over the steps after warm-up, from the ledger (field: value pairs).
  field() { grep -o "\"$1\":[^,}]*" "$run/ledger.jsonl" | cut -d: -f2; }
  median=$(paste <(field step) <(field step_ms) | awk -v w=$warmup '$1 >= w { print $2 }' |
    sort -g | awk '{ t[NR] = $1 } END { print (NR % 2) ? t[(NR + 1) / 2] : (t[NR / 2] + t[NR / 2 + 1]) / 2 }')
  gflop=$(paste <(field flops_forward) <(field flops_backward) <(field replicas) | tail -n 1 |
    awk '{ print ($1 + $2) * $3 / 1e9 }')
  batch=$(grep -o '"batch_size": [0-9]*' "$run/summary.json" | grep -o '[0-9]*$')
  rss=$(grep -o '"peak_rss_bytes": [0-9]*' "$run/summary.json" | grep -o '[0-9]*$')
  awk -v r="$recipe" -v o="$objective" -v b="$batch" -v m="$median" -v g="$gflop" -v rss="$rss" \
    'BEGIN { printf "%-12s %-8s %6d %10.1f %10.1f %12.1f %14.0f\n", r, o, b, b * 1000 / m, m, g, rss / 1048576 }'
done
echo "runs and ledgers: $out"
