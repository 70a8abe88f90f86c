"""One epoch of each encoder variant next to plain CLS, from the same script and settings.

    python benchmarks/encoder_variants.py [--out DIR] [--fresh] [--quick] [-- extra overrides]

MiniLM, the 12k-sentence sample, one epoch, STS-B dev every 125 steps keeping the best
checkpoint (the same runner as benchmarks/loss_study.py). Writes <out>/encoder_variants.md.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from loss_study import QUICK, ROOT, run_one  # noqa: E402

VARIANTS = {
    "cls": ["pooling=cls"],
    "prompt": ["pooling=prompt"],
    "hicl": ["pooling=hicl"],
    "sarcse": ["pooling=cls", "head=sarcse"],
    "hicl+sarcse+focal": ["pooling=hicl", "head=sarcse", "loss=focal"],
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "encoder_variants")
    parser.add_argument("--fresh", action="store_true")
    parser.add_argument("--quick", action="store_true", help="make bench: cls and hicl, 30 steps each")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    if args.quick:  # the pipeline end to end in minutes; the comparison needs the full epoch
        args.variants, args.overrides, args.fresh = "cls,hicl", [*QUICK, *args.overrides], True
        args.out = args.out.with_name(args.out.name + "_quick")
    args.out.mkdir(parents=True, exist_ok=True)
    results = {}
    for label in args.variants.split(","):
        folder = args.out / label.replace("+", "_")
        result_file = folder / "result.json"
        if result_file.is_file() and not args.fresh:
            results[label] = json.loads(result_file.read_text())
        else:
            print(f"{label}: training ...", flush=True)
            results[label] = run_one(label, folder, args.overrides, choice=VARIANTS[label])
            result_file.write_text(json.dumps(results[label], indent=2))
        r = results[label]
        print(f"{label}: dev {r['dev']:.2f} test {r['test']:.2f} ({r['seconds']:.0f} s)", flush=True)
    lines = ["| variant | overrides | STS-B dev | STS-B test | best step | time (s) |", "|---|---|---|---|---|---|"]
    for label, r in results.items():
        choice = " ".join(VARIANTS[label])
        lines.append(
            f"| {label} | `{choice}` | {r['dev']:.2f} | {r['test']:.2f} | {r['best_step']} | {r['seconds']:.0f} |"
        )
    (args.out / "encoder_variants.md").write_text("\n".join(lines) + "\n")
    print("\n" + "\n".join(lines))


if __name__ == "__main__":
    main()
