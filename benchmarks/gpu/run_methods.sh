#!/usr/bin/env bash
# HiCL's Table 1 methods on all-MiniLM-L6-v2 (benchmarks/method_table.py), on a GPU machine with no network.
#
# Here, first:  make gpu-bundle      (builds the git-ignored .gpu_bundle/, < 60 MiB)
# There, from the repository root, with .gpu_bundle carried and $OUT the folder that comes back:
#     bash benchmarks/gpu/run_methods.sh [COMMIT]
# Environment: BUDGET_S (default 420): no run starts that would end past this many seconds of training;
# SEEDS (default "1 2 3"); METHODS (default: all six); PRECISION (default 32-true); WORK (default /tmp/method_table);
# EXTRA_ARGS: more arguments for method_table.py (e.g. --dry-run, for a quick check of this script on any machine).
#
# Comes back under $OUT: method_table/method_table.{md,json} (rewritten after every run, so a cut-short call still
# returns the seeds done), method_table.log, method_table_runs.tar.gz (each run's result, step times, CSV log; no
# checkpoints) and environment.txt. Each run's folder and the float32 MiniLM live under $WORK.
set -euo pipefail

ROOT=$PWD
WORK=${WORK:-/tmp/method_table}
BUDGET_S=${BUDGET_S:-420}
SEEDS=${SEEDS:-1 2 3}
METHODS=${METHODS:-simcse,esimcse,sncse,hicl_simcse,hicl_esimcse,hicl_sncse}
PRECISION=${PRECISION:-32-true}
EXTRA_ARGS=${EXTRA_ARGS:-}
[ -f benchmarks/method_table.py ] || { echo "run from the repository root" >&2; exit 1; }
[ -z "${1:-}" ] || COMMIT=$1
# shellcheck source=benchmarks/gpu/setup.sh
source "$ROOT/benchmarks/gpu/setup.sh"
mkdir -p "$OUT/method_table"

phase "MiniLM: the bundle's float16 weights cast back to float32 in $WORK/minilm-fp32"
rm -rf "$WORK/minilm-fp32"
cp -r "$BUNDLE/minilm" "$WORK/minilm-fp32"
rm "$WORK/minilm-fp32/model.fp16.safetensors"
"$PYTHON" - "$BUNDLE/minilm/model.fp16.safetensors" "$WORK/minilm-fp32/model.safetensors" <<'EOF'
import sys

import torch
from safetensors.torch import load_file, save_file

half = load_file(sys.argv[1])
full = {k: v.float() if v.is_floating_point() else v for k, v in half.items()}
save_file(full, sys.argv[2], metadata={"format": "pt"})
print(f"{len(full)} tensors, {sum(v.numel() for v in full.values()):,} values, dtypes {sorted({str(v.dtype) for v in full.values()})}")
EOF

phase "train: methods $METHODS, seeds $SEEDS, budget $BUDGET_S s"
# shellcheck disable=SC2086
logged method_table.log "$PYTHON" benchmarks/method_table.py --model "$WORK/minilm-fp32" --out "$OUT/method_table" \
  --runs-dir "$WORK/runs" --seeds $SEEDS --methods "$METHODS" --precision "$PRECISION" --budget-s "$BUDGET_S" \
  --commit "$COMMIT" $EXTRA_ARGS

phase "pack each run's record (no checkpoints) into method_table_runs.tar.gz"
tar czf "$OUT/method_table_runs.tar.gz" -C "$WORK" --exclude='*.ckpt' runs 2>/dev/null || echo "nothing to pack"
finish "$OUT/method_table"
