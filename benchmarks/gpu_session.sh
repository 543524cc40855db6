#!/usr/bin/env bash
# What a session with a lent GPU runs, from the checkout root, in as few device calls as possible:
#   bash benchmarks/gpu_session.sh tests     # the GPU-only tests (CUDA graphs, streams, NVTX, ...) + the suite
#   bash benchmarks/gpu_session.sh data      # the full-grid synthetic data set for the ladder (minutes)
#   bash benchmarks/gpu_session.sh ladder [RUNGS]   # the ladder -> benchmarks/results/ (or $OUT); at full size
#       it may not fit one 10-minute call: run it in parts, e.g. `ladder baseline,workers,gpu_pipeline` then
#       `ladder amp_fp16,amp_bf16,fused,compile,cuda_graphs`; the parts merge into one table
#   bash benchmarks/gpu_session.sh tune [MINUTES]   # dlscale tune of `short` on the ladder's data (default 8
#       minutes per call; call it again to continue from its cache) -> $RESULTS/<date>-gpu-tune-short.*
#   bash benchmarks/gpu_session.sh forecast   # train the demo (about a minute), then forecast/evaluate
#       throughput and what a 10-day rollout of `short` costs in fp32 and bf16 -> $RESULTS/*-forecast-throughput.*
# The machine has torch but no network: dlscale runs from the checkout (PYTHONPATH=src).
set -euo pipefail
export PYTHONPATH=src
DATA=${DATA:-/tmp/era5_ladder}
RESULTS=${OUT:-benchmarks/results}
mkdir -p "$RESULTS"
case "${1:-}" in
  tests)
    python3 -m pytest -q -rs -m gpu tests 2>&1 | tee "$RESULTS/$(date +%F)-gpu-tests.txt"
    ;;
  data)
    python3 -m dlscale data synth-era5 --out "$DATA" --preset full --train-years 1 --valid-years 1 \
      --test-years 0 --steps-per-year 520 --if-missing
    ;;
  ladder)
    python3 benchmarks/ladder.py --data "$DATA" --out "$RESULTS" ${2:+--rungs "$2"}
    ;;
  tune)
    python3 -m dlscale tune --yaml_config configs/vit_era5.yaml --config short --set "data.root=$DATA" \
      --budget "${2:-8}" --out "$RESULTS/$(date +%F)-gpu-tune-short.yaml"
    ;;
  forecast)
    python3 -m dlscale data synth-era5 --out /tmp/era5_demo --preset demo --if-missing
    python3 -m dlscale train --yaml_config configs/vit_era5.yaml --config demo --set data.root=/tmp/era5_demo \
      --set log.expdir=/tmp/runs
    python3 benchmarks/forecast_throughput.py --run /tmp/runs/demo/00 --batch-sizes 16,64,236 --init-count 236 \
      --amp-modes none,bf16 --model-batch 16 --out "$RESULTS"
    ;;
  *)
    echo "usage: $0 tests|data|ladder|tune|forecast" >&2
    exit 2
    ;;
esac
