"""`make mteb MODEL=<exported folder>`: MTEB's English STS tasks on a folder written by `sentemb.export`.

MTEB downloads its task data from the Hugging Face Hub, so the run needs the hub (or MTEB's
datasets already in the Hugging Face cache with HF_DATASETS_OFFLINE=1) and `pip install mteb`.
Every precondition is checked first, in seconds, with the fix; results go to `<folder>/mteb/`.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from sentemb.common.errors import SentembConfigError
from sentemb.common.process import configure_process
from sentemb.common.published_files import publish_text
from sentemb.encoders.models.backbones import hub_reachable


def check(folder: Path) -> str | None:
    """Why the run cannot start here (with the fix), or None."""
    if not (folder / "modules.json").is_file():
        return (
            f"MODEL={folder} is not a sentence-transformers folder (no modules.json). "
            "Fix: python -m sentemb.export checkpoint=<ckpt> out=<folder>, then make mteb MODEL=<folder>"
        )
    try:
        import mteb  # noqa: F401
    except ImportError:
        return "mteb is not installed. Fix: pip install mteb (MTEB's English STS tasks need it)"
    if os.environ.get("HF_DATASETS_OFFLINE") != "1" and not hub_reachable():
        return (
            "MTEB reads its STS datasets from the Hugging Face Hub, which cannot be reached from here (3 s probe). "
            "Fix: run where huggingface.co is reachable, or fill the Hugging Face datasets cache elsewhere and set "
            "HF_DATASETS_OFFLINE=1"
        )
    return None


def main(argv: list[str]) -> int:
    configure_process()
    if len(argv) != 2:
        sys.exit("usage: make mteb MODEL=<exported folder>")
    folder = Path(argv[1]).expanduser()
    problem = check(folder)
    if problem:
        sys.exit(f"sentemb: {problem}")
    import mteb

    from sentemb.st_modules import load_exported_folder

    try:
        model = load_exported_folder(folder)  # its modules.json checked: sentemb's module is the only one outside s-t
    except SentembConfigError as err:
        sys.exit(f"sentemb: {err}")
    tasks = mteb.get_tasks(task_types=["STS"], languages=["eng"])
    results = mteb.evaluate(model, tasks, cache=mteb.ResultCache(folder / "mteb"))
    scores = {r.task_name: 100 * r.get_score() for r in results.task_results}
    publish_text(folder / "mteb" / "sts_scores.json", json.dumps(scores, indent=2) + "\n")
    print("\n".join(f"{task}: {score:.2f}" for task, score in sorted(scores.items())))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
