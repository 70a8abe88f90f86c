#!/usr/bin/env bash
# HiCL's Table 1 methods on all-MiniLM-L6-v2 (benchmarks/method_table.py), on a GPU machine with no network.
#
# Here, first:  .venv/bin/python benchmarks/gpu/bundle.py      (builds the git-ignored .gpu_bundle/, < 60 MiB)
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

phase() { echo "[$(date -u +%H:%M:%S)] == $*"; }

: "${OUT:?OUT must name the folder that comes back}"
ROOT=$PWD
BUNDLE=$ROOT/.gpu_bundle
WORK=${WORK:-/tmp/method_table}
BUDGET_S=${BUDGET_S:-420}
SEEDS=${SEEDS:-1 2 3}
METHODS=${METHODS:-simcse,esimcse,sncse,hicl_simcse,hicl_esimcse,hicl_sncse}
PRECISION=${PRECISION:-32-true}
EXTRA_ARGS=${EXTRA_ARGS:-}
[ -f "$BUNDLE/manifest.json" ] || { echo "no $BUNDLE/manifest.json: build it with benchmarks/gpu/bundle.py and carry .gpu_bundle" >&2; exit 1; }
[ -f benchmarks/method_table.py ] || { echo "run from the repository root" >&2; exit 1; }
COMMIT=${1:-${COMMIT:-}}
if [ -z "$COMMIT" ]; then  # the commit bundle.py saw, and how many paths differed from it
  COMMIT=$(python3 -c 'import json, sys; m = json.load(open(sys.argv[1])); print(m["commit"], "(+%s uncommitted paths when bundled)" % m["uncommitted_paths"])' "$BUNDLE/manifest.json")
fi
mkdir -p "$OUT/method_table" "$WORK"

phase "machine"
{
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | head -1
  python3 --version
  python3 -c "import sys, torch; print(sys.executable, 'torch', torch.__version__, 'CUDA', torch.version.cuda, 'GPU', torch.cuda.is_available() and torch.cuda.get_device_name(0))"
  python3 -m pip list 2>/dev/null | grep -iE '^(torch|lightning|pytorch-lightning|torchmetrics|transformers|tokenizers|huggingface.hub|safetensors|numpy|pandas|pyarrow|fsspec|xxhash|requests|urllib3|scipy|statsmodels|peft|accelerate|sentence-transformers) ' || true
  echo "commit: $COMMIT"
} 2>&1 | tee "$OUT/environment.txt"

phase "install the bundle's wheels into $BUNDLE/site (no index, no dependencies)"
rm -rf "$BUNDLE/site"
python3 -m pip install --no-index --no-deps --no-compile --disable-pip-version-check -q --target "$BUNDLE/site" "$BUNDLE"/wheels/*.whl
export PYTHONPATH=$ROOT:$BUNDLE/site${PYTHONPATH:+:$PYTHONPATH}
export BUNDLE_SITE=$BUNDLE/site

phase "the bundled packages' requirements against this machine's versions (a mismatch is reported, not fatal)"
python3 - <<'EOF' 2>&1 | tee -a "$OUT/environment.txt"
import importlib.metadata as md
import os
from packaging.requirements import Requirement

bundled = list(md.distributions(path=[os.environ["BUNDLE_SITE"]]))
for dist in sorted(bundled, key=lambda d: d.metadata["Name"].lower()):
    problems = []
    for text in dist.requires or []:
        requirement = Requirement(text)
        if requirement.marker is not None and not requirement.marker.evaluate({"extra": ""}):
            continue
        try:
            have = md.version(requirement.name)
        except md.PackageNotFoundError:
            problems.append(f"{requirement.name} missing")
            continue
        if requirement.specifier and not requirement.specifier.contains(have, prereleases=True):
            problems.append(f"{requirement} (have {have})")
    print(f"{dist.metadata['Name']} {dist.version}: " + ("; ".join(problems) if problems else "requirements met"))
EOF

phase "MiniLM: the bundle's float16 weights cast back to float32 in $WORK/minilm-fp32"
rm -rf "$WORK/minilm-fp32"
cp -r "$BUNDLE/minilm" "$WORK/minilm-fp32"
rm "$WORK/minilm-fp32/model.fp16.safetensors"
python3 - "$BUNDLE/minilm/model.fp16.safetensors" "$WORK/minilm-fp32/model.safetensors" <<'EOF'
import sys

import torch
from safetensors.torch import load_file, save_file

half = load_file(sys.argv[1])
full = {k: v.float() if v.is_floating_point() else v for k, v in half.items()}
save_file(full, sys.argv[2], metadata={"format": "pt"})
print(f"{len(full)} tensors, {sum(v.numel() for v in full.values()):,} values, dtypes {sorted({str(v.dtype) for v in full.values()})}")
EOF

export SENTEMB_DATA=$BUNDLE/data
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1 WANDB_MODE=disabled TQDM_DISABLE=1
export HF_HOME=$WORK/hf_home HF_DATASETS_CACHE=$WORK/hf_datasets PYTHONUNBUFFERED=1

phase "preflight: the bundled packages import from the bundle"
python3 - <<'EOF2'
import datasets, dill, hydra, multiprocess, omegaconf, torchdata  # noqa: E401

for module in (hydra, omegaconf, datasets, torchdata, dill, multiprocess):
    print(f"{module.__name__} {getattr(module, '__version__', '?')}: {module.__file__}")
EOF2

phase "train: methods $METHODS, seeds $SEEDS, budget $BUDGET_S s"
status=0
# shellcheck disable=SC2086
python3 benchmarks/method_table.py --model "$WORK/minilm-fp32" --out "$OUT/method_table" --runs-dir "$WORK/runs" \
  --seeds $SEEDS --methods "$METHODS" --precision "$PRECISION" --budget-s "$BUDGET_S" --commit "$COMMIT" $EXTRA_ARGS \
  2>&1 | tee "$OUT/method_table.log" || status=$?

phase "pack each run's record (no checkpoints) into method_table_runs.tar.gz"
tar czf "$OUT/method_table_runs.tar.gz" -C "$WORK" --exclude='*.ckpt' runs 2>/dev/null || echo "nothing to pack"
ls -la "$OUT" "$OUT/method_table"
phase "done (exit $status)"
exit "$status"
