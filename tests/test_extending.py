"""Adding a part takes its class (with its `@part` declaration), its conf/ yaml and a docs row (docs/layout.md,
"Adding a part"), and nothing else: no table to edit, no checkpoint code to touch.

Each test follows those steps from this module: the class is declared here (registered for the test only), its yaml
goes into a conf folder of the test's own (Hydra's searchpath), and then the part trains a step through the real
Trainer, resumes exactly from the last.ckpt of a stopped run, and exports (or is refused with the reason it declared).
A data part (a built-in labelled set, a file format) is written as a module of its package's folder in a scratch
checkout (registered as the package's import registers its own) and trains two steps.
"""

from __future__ import annotations

import csv
import importlib
import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import lightning as L
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from transformers import Olmo2Config

import sentemb.train
from sentemb.common import parts
from sentemb.common.errors import SentembConfigError
from sentemb.common.hydra_plumbing import resolved_container
from sentemb.common.parts import ENCODERS, TRAINS_ONLY, part
from sentemb.data.formats import extensions, file_format
from sentemb.data.labelled import ABSENT, TEXT_IDS, read_labelled
from sentemb.encoders.build import load_checkpoint_encoder
from sentemb.encoders.models import families
from sentemb.encoders.models.families import Family, register_family
from sentemb.encoders.poolings.base import AroundPooling, Pooling, TrainingViews
from sentemb.export import export
from sentemb.losses import LossOutput, Objective
from sentemb.losses.inputs import HARD_NEGATIVES, PAIRS, SCORES, LossInputs
from sentemb.st_modules import load_exported_folder
from sentemb.training.auxiliary import AuxiliaryTerm
from sentemb.training.auxiliary_checks import auxiliary_nodes
from sentemb.training.checks import check_parts, prepare_run
from sentemb.training.negatives import NegativesPart, StepInputs, StepNegatives
from sentemb.training.negatives.base import refuse_loss_without_negatives
from tests.conftest import compose_train
from tests.test_export import compose_export
from tests.test_labelled import write_csv
from tests.test_train import run, train_with

CONF = Path(sentemb.train.CONF_DIR)
LAYOUT_PAGE = (Path(__file__).parents[1] / "docs" / "layout.md").read_text(encoding="utf-8")
# a term's yaml is packaged under its name, so that several terms compose side by side (auxiliary=[a,b])
NEGATION_GAP_YAML = "# @package auxiliary.negation_gap\nname: negation_gap\nweight: 0.1\nmargin: 0.2\n"
SENTENCES = ["A man is playing a guitar.", "Two dogs run on the beach.", "The stock market fell sharply today."]


# ---------------------------------------------------------------------------------------------- the new parts
class AlignUniform(Objective):
    """A loss of the test's own: alignment of the positives plus log-mean-exp uniformity (Wang & Isola 2020)."""

    def __init__(self, t: float = 2.0) -> None:
        super().__init__()
        self.t = t

    def compute(self, inputs: LossInputs) -> LossOutput:
        h1, h2 = F.normalize(inputs.anchors.float(), dim=-1), F.normalize(inputs.positives.float(), dim=-1)
        align = (h1 - h2).pow(2).sum(-1).mean()
        uniform = torch.pdist(h1).pow(2).mul(-self.t).exp().mean().clamp_min(1e-12).log()
        return LossOutput(align + uniform, {})


class MaxPooling(Pooling):
    """The element-wise maximum of the real tokens' states."""

    graph_refusal = "pooling=max is not exported as an ONNX graph. Fix: format=sentence-transformers"

    def __init__(self, hidden_size: int) -> None:
        super().__init__()

    def forward(self, hidden: torch.Tensor, batch: dict[str, torch.Tensor], train_head: bool = False) -> torch.Tensor:
        real = batch["attention_mask"].unsqueeze(-1).bool()
        return hidden.masked_fill(~real, torch.finfo(hidden.dtype).min).amax(dim=1)


class MemoryHead(AroundPooling):
    """A head with state that checkpoints must hold: the last batch's view-1 vectors (a persistent buffer) and the
    steps seen (torch's extra state); its auxiliary term pushes this batch away from the remembered one."""

    def __init__(self, hidden_size: int, special_ids: list[int], weight: float = 0.5, size: int = 8) -> None:
        super().__init__()
        self.weight = weight
        self.register_buffer("memory", torch.zeros(size, hidden_size))
        self.steps = 0

    def get_extra_state(self) -> dict[str, int]:
        return {"steps": self.steps}

    def set_extra_state(self, state: dict[str, int]) -> None:
        self.steps = int(state["steps"])

    def training_views(self, rows: dict[str, torch.Tensor], batch: dict[str, torch.Tensor], n: int) -> TrainingViews:
        views = super().training_views(rows, batch, n)
        if self.steps:  # nothing remembered before the first step
            term = F.cosine_similarity(views.z1.unsqueeze(1), self.memory.unsqueeze(0), dim=-1).mean()
            views.own_terms["memory"] = (self.weight, term)
        with torch.no_grad():
            self.memory.copy_(views.z1[: len(self.memory)].detach())
        self.steps += 1
        return views


class MemoryBank(NegativesPart):
    """A negatives part with state: the positives of the last steps (at most `size` rows) as extra negatives of the
    loss. It writes only what it changes: its check, the step's negatives, what it keeps after the loss, its state."""

    def __init__(self, size: int = 8) -> None:
        super().__init__()
        self.size = size
        self.bank = torch.zeros(0)  # (k <= size, D), oldest first: torch's extra state, so checkpoints hold it

    def check_config(self, cfg: dict) -> None:
        refuse_loss_without_negatives(cfg, "negatives=memory_bank", "The bank adds negatives to a loss's denominator.")

    def step_negatives(self, inputs: StepInputs) -> StepNegatives:
        return StepNegatives(negatives=self.bank.to(inputs.z1.device) if len(self.bank) else None)

    def after_loss(self, inputs: StepInputs, step: StepNegatives) -> None:
        z2 = inputs.z2.detach().float()
        kept = self.bank.to(z2.device) if len(self.bank) else z2.new_zeros(0, z2.shape[1])
        self.bank = torch.cat([kept, z2])[-self.size :]

    def get_extra_state(self) -> dict[str, torch.Tensor]:
        return {"bank": self.bank.cpu()}

    def set_extra_state(self, state: dict[str, torch.Tensor]) -> None:
        self.bank = state["bank"]


class NegationGap(AuxiliaryTerm):
    """An auxiliary term reading an extra view: each sentence's negation kept at least `margin` below its positive,
    weight · mean ReLU(cos(z, z_neg) − cos(z, z⁺) + margin). The data makes the view from the options it names."""

    label = "negation_gap"
    reads = ("negation",)

    def __init__(self, weight: float = 0.1, margin: float = 0.2) -> None:
        super().__init__()
        self.weight, self.margin = weight, margin

    def data_views(self) -> dict[str, dict[str, str]]:
        return {"negation": {"source": "rule"}}

    def term(self, views: TrainingViews) -> tuple[float, torch.Tensor]:
        z, positive, negation = views.z1, views.z2, views.view("negation", asked_by="auxiliary=negation_gap")
        gap = F.cosine_similarity(z, negation, dim=-1) - F.cosine_similarity(z, positive, dim=-1)
        return self.weight, torch.relu(gap + self.margin).mean()


@pytest.fixture
def conf_dir(tmp_path: Path) -> Path:
    """The test's own conf/ (what a part's yaml adds to the repo's), on Hydra's searchpath."""
    folder = tmp_path / "conf"
    for group in ("loss", "pooling", "head", "model", "negatives", "auxiliary"):
        (folder / group).mkdir(parents=True)
    return folder


@pytest.fixture
def declared(monkeypatch):
    """The test's parts, declared as a module of sentemb declares them, for this test only."""
    monkeypatch.setattr(parts, "REGISTRY", {kind: dict(parts.registered(kind)) for kind in parts.KINDS})
    monkeypatch.setattr(families, "FAMILIES", dict(families.FAMILIES))
    part("loss", "align_uniform")(AlignUniform)
    part(
        "pooling", "max", serves=ENCODERS, why_not="a decoder's padding side puts pads first, which max does not skip"
    )(MaxPooling)
    part("head", "memory", export=TRAINS_ONLY)(MemoryHead)
    part("negatives", "memory_bank")(MemoryBank)
    part("auxiliary", "negation_gap")(NegationGap)
    register_family(Family("olmo2", decoder=True, config_class=Olmo2Config))


class KeepLastAfterFirstStep(L.Callback):
    """What a job killed after step 1 leaves behind: its last.ckpt of that step, copied to `path` as step 2 starts,
    with the best checkpoint beside it (a resumed run goes on with its best tracking)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def on_train_batch_start(self, trainer: L.Trainer, *args) -> None:
        if trainer.global_step == 1:
            self.path.parent.mkdir(parents=True)
            shutil.copyfile(Path(trainer.default_root_dir) / "checkpoints" / "last.ckpt", self.path)
            for best in (Path(trainer.default_root_dir) / "checkpoints").glob("best-*.ckpt"):
                shutil.copyfile(best, self.path.parent / best.name)


def train_and_resume(overrides: list[str], tmp_path: Path) -> tuple[dict, dict, dict]:
    """A 2-step run, and its last.ckpt of step 1 resumed to step 2: (the run's metrics, both step-2 last.ckpt)."""
    stopped = tmp_path / "stopped" / "checkpoints" / "last.ckpt"
    full = train_with(overrides, tmp_path / "full", KeepLastAfterFirstStep(stopped))
    run([*overrides, f"ckpt_path={stopped}"], tmp_path / "resumed")  # writes on beside the checkpoint it resumed
    saved = [torch.load(path, weights_only=True) for path in (tmp_path / "full" / "checkpoints" / "last.ckpt", stopped)]
    assert saved[0]["global_step"] == saved[1]["global_step"] == 2
    return full, saved[0], saved[1]


def assert_resumed_exactly(full: dict, resumed: dict) -> None:
    """Same computation on the same machine: bit for bit (the weights, the optimizer, every part's state)."""
    assert full["state_dict"].keys() == resumed["state_dict"].keys()
    for key, value in full["state_dict"].items():
        assert same(value, resumed["state_dict"][key]), key


def same(value: object, other: object) -> bool:
    """Equal tensors, or equal values, or dicts of them equal key by key (a part's extra state)."""
    if torch.is_tensor(value):
        return torch.is_tensor(other) and torch.equal(value, other)
    if isinstance(value, dict):
        return isinstance(other, dict) and value.keys() == other.keys() and all(same(value[k], other[k]) for k in value)
    return value == other


def assert_exports(metrics: dict, tmp_path: Path) -> None:
    """The best checkpoint exports to a folder that embeds as the checkpoint's encoder does."""
    folder = export(compose_export([f"checkpoint={metrics['best_checkpoint']}", f"out={tmp_path / 'st'}"]))
    ours = load_checkpoint_encoder(metrics["best_checkpoint"])[0].encode(SENTENCES)
    theirs = load_exported_folder(folder).encode(SENTENCES)
    # sentence-transformers batches and pads its own way: float32 rounding differs in the last bits
    np.testing.assert_allclose(theirs, np.asarray(ours), rtol=1e-5, atol=1e-5)


@pytest.fixture
def overrides(tiny_overrides, small_stsb, conf_dir, declared) -> list[str]:
    return [
        *tiny_overrides,
        f"hydra.searchpath=[file://{conf_dir}]",
        f"eval.stsb_dir={small_stsb}",
        "trainer.max_steps=2",
        "eval.every_n_steps=1",
    ]


# ---------------------------------------------------------------------------------------------- the six additions
def test_a_new_loss(overrides, conf_dir, tmp_path):
    (conf_dir / "loss" / "align_uniform.yaml").write_text("name: align_uniform\nt: 2.0\n")
    full, saved, resumed = train_and_resume([*overrides, "loss=align_uniform"], tmp_path)
    assert saved["hyper_parameters"]["loss"] == {"name": "align_uniform", "t": 2.0}
    assert_resumed_exactly(saved, resumed)
    assert_exports(full, tmp_path)


def test_a_new_pooling_with_a_decoder_refusal(overrides, conf_dir, tmp_path):
    (conf_dir / "pooling" / "max.yaml").write_text("name: max\n")
    with pytest.raises(SentembConfigError, match=r"pooling=max with model=tiny-llama, a decoder LLM: a decoder's pad"):
        check_parts(compose_train([*overrides, "model=tiny-llama", "pooling=max"], tmp_path))
    full, saved, resumed = train_and_resume([*overrides, "pooling=max"], tmp_path)
    assert_resumed_exactly(saved, resumed)
    assert_exports(full, tmp_path)
    onnx = compose_export([f"checkpoint={full['best_checkpoint']}", f"out={tmp_path / 'onnx'}", "format=onnx"])
    with pytest.raises(SentembConfigError, match="pooling=max is not exported as an ONNX graph"):
        export(onnx)


def test_a_new_head_whose_state_survives_a_resume(overrides, conf_dir, tmp_path):
    (conf_dir / "head" / "memory.yaml").write_text("name: memory\nweight: 0.5\n")
    full, saved, resumed = train_and_resume([*overrides, "pooling=mean", "head=memory"], tmp_path)
    state = saved["state_dict"]
    assert state["encoder.pooling._extra_state"] == {"steps": 2} and state["encoder.pooling.memory"].abs().sum() > 0
    assert_resumed_exactly(saved, resumed)  # the memory the second step read came back from the checkpoint
    assert_exports(full, tmp_path)  # export=TRAINS_ONLY: the folder embeds with the pooling inside


def test_a_new_decoder_family(overrides, conf_dir, tmp_path):
    tiny_llama = (Path(sentemb.train.CONF_DIR) / "model" / "tiny-llama.yaml").read_text()
    olmo = tiny_llama.replace("name_or_path: tiny-llama", "name_or_path: tiny-olmo2").replace(
        "family: llama", "family: olmo2"
    )
    (conf_dir / "model" / "tiny-olmo2.yaml").write_text(olmo)
    full, saved, resumed = train_and_resume([*overrides, "model=tiny-olmo2", "pooling=mean"], tmp_path)
    assert saved["hyper_parameters"]["model"]["backbone"]["family"] == "olmo2"
    assert_resumed_exactly(saved, resumed)
    assert_exports(full, tmp_path)


def test_a_new_negatives_part_whose_state_survives_a_resume(overrides, conf_dir, tmp_path):
    (conf_dir / "negatives" / "memory_bank.yaml").write_text("name: memory_bank\nsize: 8\n")
    with pytest.raises(SentembConfigError, match=r"negatives=memory_bank with loss=barlow.*Fix: a loss that takes"):
        check_parts(compose_train([*overrides, "negatives=memory_bank", "loss=barlow"], tmp_path))
    full, saved, resumed = train_and_resume([*overrides, "negatives=memory_bank"], tmp_path)
    bank = saved["state_dict"]["negatives._extra_state"]["bank"]
    assert bank.shape == (8, 32) and bank.abs().sum() > 0, "two steps of 16 positives, the newest 8 kept"
    assert_resumed_exactly(saved, resumed)  # the bank the second step read came back from the checkpoint
    assert_exports(full, tmp_path)  # a negatives part only trains: the folder is the encoder's


def test_a_new_auxiliary_term_reading_an_extra_view(overrides, conf_dir, tmp_path):
    (conf_dir / "auxiliary" / "negation_gap.yaml").write_text(NEGATION_GAP_YAML)
    overrides = [*overrides, "auxiliary=[negation_gap]"]
    full, saved, resumed = train_and_resume(overrides, tmp_path)
    logged = (tmp_path / "full" / "csv" / "version_0" / "metrics.csv").read_text().splitlines()
    assert "train/loss/negation_gap" in logged[0], "the term ran on the negation view the data made for it"
    assert_resumed_exactly(saved, resumed)
    assert_exports(full, tmp_path)


def test_every_step_part_registers_with_its_package_in_a_fresh_process():
    """No import anywhere names a negatives part or an auxiliary term: looking the kind up imports its package, and
    finds a part for every yaml of its group (conf/negatives/, conf/auxiliary/)."""
    code = "from sentemb.common.parts import names; print(names('negatives'), names('auxiliary'))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    yamls = [sorted(path.stem for path in (CONF / group).glob("*.yaml")) for group in ("negatives", "auxiliary")]
    assert out.split("\n")[0] == f"{yamls[0]} {yamls[1]}"


# ---------------------------------------------------------------------------------------------- inputs by role
class ScoredHardMargin(Objective):
    """A loss reading hard negatives and scores by role: each anchor's positive kept above its own hard negative by a
    margin scaled by the pair's gold score, mean ReLU(margin·s_i − (cos(a_i, p_i) − cos(a_i, n_i))) over the rows
    that have a hard negative. What it reads is declared (`reads`); the job's checks refuse data without them."""

    reads = frozenset({*PAIRS, HARD_NEGATIVES, SCORES})
    conventions = ("paper",)
    has_symmetric = False

    def __init__(self, margin: float = 0.5) -> None:
        super().__init__()
        self.margin = margin

    def compute(self, inputs: LossInputs) -> LossOutput:
        a, p, n = (F.normalize(x.float(), dim=-1) for x in (inputs.anchors, inputs.positives, inputs.hard_negatives[0]))
        hinge = torch.relu(self.margin * inputs.scores.float() - ((a * p).sum(-1) - (a * n).sum(-1)))
        present = torch.ones_like(hinge, dtype=torch.bool) if inputs.absent is None else ~inputs.absent[:, 0]
        return LossOutput((hinge * present).sum() / present.sum().clamp_min(1), {})


SEEN: list[tuple[int, int]] = []  # (rows the term saw, rows of its step with a hard negative): the test's record


class HardNegativeGap(AuxiliaryTerm):
    """A term reading the first hard negative: it stays below the positive, weight · mean ReLU(cos(z, z_neg) −
    cos(z, z⁺)). It records how many rows it saw (the test compares them with the batch's rows that have one)."""

    label = "hard_gap"
    reads = ("hard_negative_1",)

    def __init__(self, weight: float = 0.1) -> None:
        super().__init__()
        self.weight = weight

    def term(self, views: TrainingViews) -> tuple[float, torch.Tensor]:
        hard = views.view("hard_negative_1", asked_by="auxiliary=hard_gap")
        SEEN.append((hard.shape[0], -1))
        gap = F.cosine_similarity(views.z1, hard, dim=-1) - F.cosine_similarity(views.z1, views.z2, dim=-1)
        return self.weight, torch.relu(gap).mean()


class PositiveGap(AuxiliaryTerm):
    """A second term beside another: the positive pulled closer, weight · mean (1 − cos(z, z⁺))."""

    label = "positive_gap"

    def __init__(self, weight: float = 0.05) -> None:
        super().__init__()
        self.weight = weight

    def term(self, views: TrainingViews) -> tuple[float, torch.Tensor]:
        return self.weight, (1.0 - F.cosine_similarity(views.z1, views.z2, dim=-1)).mean()


class LocalGap(PositiveGap):
    """The same term under HiCL's own term's label: refused, it would replace HiCL's local loss."""

    label = "local"


class ShortRowsOnly(PositiveGap):
    """A term that refuses data it cannot use, from the data config its check is given."""

    label = "short_rows"

    def check_config(self, cfg: dict) -> None:
        if cfg["data"]["max_length"] > 16:
            raise SentembConfigError(f"auxiliary=short_rows with data.max_length={cfg['data']['max_length']}: > 16")


class RowsWithHardNegative(L.Callback):
    """The rows of each training batch that have a first hard negative, beside what the term saw that step."""

    def on_train_batch_end(self, trainer: L.Trainer, module: L.LightningModule, outputs, batch, batch_idx) -> None:
        seen, _ = SEEN[-1]
        SEEN[-1] = (seen, int((batch[TEXT_IDS][:, 2] != ABSENT).sum()))


# a term's yaml is packaged under its name (docs/layout.md): auxiliary=[a,b] composes them side by side
HARD_GAP_YAML = "# @package auxiliary.hard_gap\nname: hard_gap\nweight: 0.1\n"
POSITIVE_GAP_YAML = "# @package auxiliary.positive_gap\nname: positive_gap\nweight: 0.05\n"


@pytest.fixture
def role_parts(declared):
    part("loss", "scored_margin")(ScoredHardMargin)
    part("auxiliary", "hard_gap")(HardNegativeGap)
    part("auxiliary", "positive_gap")(PositiveGap)


def labelled(overrides: list[str]) -> list[str]:
    """The tiny job on labelled data: no corpus."""
    return [override for override in overrides if not override.startswith("data.corpus=")]


def files_a_part_takes() -> int:
    """The count docs/layout.md states for a part of your own: its class file and its yaml."""
    return int(re.search(r"A part of your own is (\d+) files", LAYOUT_PAGE).group(1))


def files_a_format_takes() -> int:
    """The count docs/layout.md states for a file format: its class alone."""
    return int(re.search(r"a file format is (\d+) \(its\s+class", LAYOUT_PAGE).group(1))


def test_a_new_loss_reading_hard_negatives_and_scores(overrides, conf_dir, role_parts, tmp_path, data_root):
    written = [conf_dir / "loss" / "scored_margin.yaml"]
    written[0].write_text("name: scored_margin\nmargin: 0.5\n")
    assert 1 + len(written) == files_a_part_takes(), "this module (its class file) and its yaml"
    lines = [line for line in (data_root / "wiki" / "wiki1m_head.txt").read_text().splitlines() if line][:192]
    rows = [[*lines[i : i + 3], str(i % 6)] for i in range(0, 192, 3)]
    scored = write_csv(tmp_path / "scored.csv", ["anchor", "positive", "negative", "score"], rows)
    job = [*labelled(overrides), "data=labelled", f"data.path={scored}", "data.score_range=[0,5]"]
    # what it declares decides the job: scores and hard negatives both read; CoSENT reads no hard negatives
    with pytest.raises(SentembConfigError, match=r"has hard negatives: loss=cosent takes no hard negatives"):
        prepare_run(compose_train([*job, "loss=cosent"], tmp_path))
    triplets = write_csv(tmp_path / "triplets.csv", ["anchor", "positive", "negative"], [r[:3] for r in rows])
    unscored = [*labelled(overrides), "data=labelled", f"data.path={triplets}", "loss=scored_margin"]
    with pytest.raises(SentembConfigError, match=r"loss=scored_margin learns from scored pairs"):
        prepare_run(compose_train(unscored, tmp_path))
    train_with([*job, "loss=scored_margin"], tmp_path / "run")
    with (tmp_path / "run" / "csv" / "version_0" / "metrics.csv").open() as handle:
        losses = [float(row["train/loss"]) for row in csv.DictReader(handle) if row["train/loss"]]
    assert len(losses) == 2 and all(0 < loss < 1 for loss in losses), "the margin trained on the scored rows"


def test_an_auxiliary_term_never_sees_an_absent_hard_negative(overrides, conf_dir, role_parts, tmp_path):
    """data=sick_nli: 1,040 of its 1,299 rows have no hard negative; the term reads hard_negative_1 on the rest only."""
    (conf_dir / "auxiliary" / "hard_gap.yaml").write_text(HARD_GAP_YAML)
    assert 1 + 1 == files_a_part_takes()
    SEEN.clear()
    job = [*labelled(overrides), "data=sick_nli", "auxiliary=[hard_gap]", "data.batch_size=32"]
    train_with(job, tmp_path / "run", RowsWithHardNegative())
    assert len(SEEN) == 2 and all(seen == present for seen, present in SEEN), SEEN
    assert all(0 < present < 32 for _, present in SEEN), "each batch mixes rows with and without one"
    logged = (tmp_path / "run" / "csv" / "version_0" / "metrics.csv").read_text().splitlines()
    assert "train/loss/hard_gap" in logged[0]


def test_two_auxiliary_terms_at_once(overrides, conf_dir, role_parts, declared, tmp_path):
    (conf_dir / "auxiliary" / "negation_gap.yaml").write_text(NEGATION_GAP_YAML)
    (conf_dir / "auxiliary" / "positive_gap.yaml").write_text(POSITIVE_GAP_YAML)
    job = [*overrides, "auxiliary=[negation_gap,positive_gap]", "auxiliary.positive_gap.weight=0.2"]
    train_with(job, tmp_path / "full")
    saved = torch.load(tmp_path / "full" / "checkpoints" / "last.ckpt", weights_only=True)
    assert [node["name"] for node in auxiliary_nodes(saved["hyper_parameters"]["auxiliary"])] == [
        "negation_gap",
        "positive_gap",
    ]
    assert auxiliary_nodes(saved["hyper_parameters"]["auxiliary"])[1]["weight"] == 0.2
    logged = (tmp_path / "full" / "csv" / "version_0" / "metrics.csv").read_text().splitlines()
    assert "train/loss/negation_gap" in logged[0] and "train/loss/positive_gap" in logged[0]


def test_a_term_is_refused_before_any_model_loads_for_a_view_the_data_lacks_or_a_taken_label(
    overrides, conf_dir, role_parts, tmp_path, forbid_model_loading
):
    (conf_dir / "auxiliary" / "hard_gap.yaml").write_text(HARD_GAP_YAML)
    (conf_dir / "auxiliary" / "positive_gap.yaml").write_text(POSITIVE_GAP_YAML)
    message = r"auxiliary=hard_gap reads the training view 'hard_negative_1', which data.corpus=.* does not make"
    with pytest.raises(SentembConfigError, match=message):
        prepare_run(compose_train([*overrides, "auxiliary=[hard_gap]"], tmp_path))
    (conf_dir / "auxiliary" / "local_gap.yaml").write_text("# @package auxiliary.local_gap\nname: local_gap\n")
    part("auxiliary", "local_gap")(LocalGap)
    with pytest.raises(SentembConfigError, match=r"train/loss/local, which is pooling=hicl's own term"):
        prepare_run(compose_train([*overrides, "pooling=hicl", "auxiliary=[local_gap]"], tmp_path))
    (conf_dir / "auxiliary" / "short_rows.yaml").write_text("# @package auxiliary.short_rows\nname: short_rows\n")
    part("auxiliary", "short_rows")(ShortRowsOnly)
    with pytest.raises(SentembConfigError, match=r"auxiliary=short_rows with data.max_length=32: > 16"):
        prepare_run(compose_train([*overrides, "auxiliary=[short_rows]"], tmp_path))


# ---------------------------------------------------------------------------------------------- data parts
# The files each addition takes, as docs/layout.md counts them: a built-in set is its class (a module of
# sentemb/data/sets/) and its conf/data/<name>.yaml; a file format is its class alone (a module of
# sentemb/data/formats/): the file's extension picks it, so no config names it and it has no yaml.
SET_FILES = files_a_part_takes()
FORMAT_FILES = files_a_format_takes()

TINY_PAIRS_CLASS = '''"""tiny_pairs: (anchor, positive) pairs, a tab-separated pair a line, in tiny_pairs/pairs.txt."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from sentemb.common.parts import part
from sentemb.data.labelled import LabelledSet
from sentemb.data.sets import TabSeparatedSet


@part("data.set", "tiny_pairs")
class TinyPairs(TabSeparatedSet):
    file = "pairs.txt"
    what = "tiny_pairs"
    header = False
    columns = ("anchor", "positive")
    fix = "data.path=<the folder holding pairs.txt>"

    def rows(self, path: Path, lines: Iterator[tuple[int, list[str]]]) -> LabelledSet:
        pairs = [(fields[0], fields[1]) for _, fields in lines]
        return LabelledSet(([anchor for anchor, _ in pairs], [positive for _, positive in pairs]), None, str(path))
'''
TINY_PAIRS_YAML = "defaults:\n  - labelled\nsource: tiny_pairs\npath: ${paths.data_dir}/tiny_pairs\n"

PIPE_SEPARATED_CLASS = '''"""PSV: pipe-separated, a header row, CSV's quoting (a field holding a pipe is quoted)."""

from __future__ import annotations

from sentemb.common.parts import part
from sentemb.data.formats.delimited import Delimited


@part("data.format", "psv")
class PipeSeparated(Delimited):
    extensions = (".psv",)
    label = "PSV"
    described = "pipe-separated"
    delimiter = "|"
'''


def add_files(checkout: Path, files: dict[str, str]) -> list[str]:
    """`files` (path in the repository → text) written under `checkout`; every file there afterwards, by path."""
    for relative, text in files.items():
        (checkout / relative).parent.mkdir(parents=True, exist_ok=True)
        (checkout / relative).write_text(text, encoding="utf-8")
    return sorted(str(path.relative_to(checkout)) for path in checkout.rglob("*") if path.is_file())


@pytest.fixture
def package_modules(monkeypatch, declared):
    """Adds a folder to a sentemb package's folders and imports its modules as the package's import does its own
    (`import_parts` over its `__path__`), so the parts they declare register; all forgotten after the test."""
    added: list[tuple[ModuleType, str]] = []

    def add(package: str, folder: Path) -> None:
        module = importlib.import_module(package)
        monkeypatch.setattr(module, "__path__", [*module.__path__, str(folder)])
        monkeypatch.setattr(sys, "dont_write_bytecode", True)  # the folder holds only what the test wrote
        added.extend((module, path.stem) for path in folder.glob("*.py"))
        parts.import_parts(package, [str(folder)])

    yield add
    for module, name in added:
        sys.modules.pop(f"{module.__name__}.{name}", None)
        vars(module).pop(name, None)


def sentence_pairs(data_root: Path, count: int, forbidden: str) -> list[tuple[str, str]]:
    """`count` pairs of consecutive wiki-sample sentences, none holding `forbidden` (the file's delimiter)."""
    lines = (data_root / "wiki" / "wiki1m_head.txt").read_text(encoding="utf-8").splitlines()
    lines = [line.strip() for line in lines if line.strip() and forbidden not in line and '"' not in line]
    return [(lines[2 * i], lines[2 * i + 1]) for i in range(count)]


def labelled_run(overrides: list[str], small_stsb: Path, output_dir: Path) -> dict:
    """A 2-step run of tiny BERT on labelled data through the real Trainer: its last.ckpt."""
    run(
        [*overrides, "model=tiny", "trainer.max_steps=2", "logger=csv", "data.batch_size=16", "eval.every_n_steps=1",
         "eval.at_start=false", f"eval.stsb_dir={small_stsb}", "trainer.log_every_n_steps=1"],
        output_dir,
    )  # fmt: skip
    return torch.load(output_dir / "checkpoints" / "last.ckpt", weights_only=True)


def test_a_new_built_in_set(package_modules, tmp_path, data_root, small_stsb):
    checkout = tmp_path / "checkout"
    files = {"sentemb/data/sets/tiny_pairs.py": TINY_PAIRS_CLASS, "conf/data/tiny_pairs.yaml": TINY_PAIRS_YAML}
    assert add_files(checkout, files) == sorted(files) and len(files) == SET_FILES
    package_modules("sentemb.data.sets", checkout / "sentemb" / "data" / "sets")
    root = tmp_path / "data"  # a data root: the real one's folders, and the new set's own
    (root / "tiny_pairs").mkdir(parents=True)
    for folder in ("wiki", "senteval"):
        (root / folder).symlink_to(data_root / folder)
    pairs = sentence_pairs(data_root, 48, "\t")
    (root / "tiny_pairs" / "pairs.txt").write_text("".join(f"{a}\t{p}\n" for a, p in pairs), encoding="utf-8")
    overrides = ["data=tiny_pairs", f"paths.data_dir={root}", f"hydra.searchpath=[file://{checkout / 'conf'}]"]

    saved = labelled_run(overrides, small_stsb, tmp_path / "run")
    assert saved["global_step"] == 2
    read = read_labelled(resolved_container(compose_train(overrides).data))
    assert read.texts == ([a for a, _ in pairs], [p for _, p in pairs]) and read.roles == ["anchor", "positive"]
    with pytest.raises(SentembConfigError, match=r"data.source='nope' is not one of .*stsb_train, tiny_pairs\."):
        read_labelled({"source": "nope", "path": str(root)})  # the sources listed are the registry's


def test_a_new_file_format(package_modules, tmp_path, data_root, small_stsb, monkeypatch):
    checkout = tmp_path / "checkout"
    files = {"sentemb/data/formats/pipe_separated.py": PIPE_SEPARATED_CLASS}
    assert add_files(checkout, files) == sorted(files) and len(files) == FORMAT_FILES
    monkeypatch.chdir(tmp_path)
    rows = ["anchor|positive", *(f"{a}|{p}" for a, p in sentence_pairs(data_root, 48, "|"))]
    Path("x.psv").write_text("\n".join(rows) + "\n", encoding="utf-8")
    with pytest.raises(SentembConfigError, match=r"read by its extension, one of \.csv.*; \.psv is not one"):
        file_format(Path("x.psv"))
    package_modules("sentemb.data.formats", checkout / "sentemb" / "data" / "formats")
    assert ".psv" in extensions() and file_format(Path("x.psv")).label == "PSV"

    saved = labelled_run(["data=labelled", "data.path=x.psv"], small_stsb, tmp_path / "run")
    assert saved["global_step"] == 2
    Path("x.psv").write_text("anchor|positive\na|b\nc|d|e\n", encoding="utf-8")
    with pytest.raises(SentembConfigError, match=r"x\.psv:3: 3 fields, but the header has 2 \(anchor, positive\)"):
        read_labelled({"source": "file", "path": "x.psv"})  # checked as every format's rows are


def test_every_data_part_registers_with_its_package_in_a_fresh_process_without_torch():
    """The data parts are looked up before torch is imported (the pre-run checks read the data first): their packages
    import none of torch, lightning, transformers or pyarrow (a parquet file imports it when read)."""
    code = (
        "import sys; from sentemb.common.parts import names; "
        "print(names('data.set'), names('data.format'), names('data.view')); "
        "print([m for m in ('torch', 'lightning', 'transformers', 'pyarrow') if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.splitlines() == [
        "['file', 'mrpc', 'nli', 'sick_nli', 'stsb_train'] ['csv', 'json', 'parquet', 'tsv'] ['negation']",
        "[]",
    ]
