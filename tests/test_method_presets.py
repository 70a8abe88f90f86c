"""The ESimCSE, SNCSE, HiCL, SARCSE, DiffCSE and DCLR presets (conf/experiment/<method>/), Focal-InfoNCE on DiffCSE and
DCLR (its Table 3), and HiCL's tuning searches (conf/hparams_search/hicl_table13*.yaml) compose and hold the values
their papers and released scripts give (docs/methods.md).

Composition only: nothing trains here (the tiny presets run through the Trainer in their own tests)."""

from __future__ import annotations

import re

import pytest
from omegaconf import DictConfig, OmegaConf

from sentemb.common.metric_names import SICKR_DEV_SPEARMAN_BEST_RESCORED
from sentemb.runs.sweep_check import check_sweep
from tests.conftest import CONF_DIR, compose_train

ANCHOR_TEMPLATE = 'This sentence : "[X]" means [MASK] .'
POSITIVE_TEMPLATE = 'This sentence of "[X]" means [MASK] .'
BACKBONES = {  # preset suffix: the hub name the model config loads
    "bert_base": "bert-base-uncased",
    "bert_large": "bert-large-uncased",
    "roberta_base": "roberta-base",
    "roberta_large": "roberta-large",
}
FP16, FP32 = "16-mixed", "32-true"


def row(model, batch, lr, precision, pooling, *, dup=0.0, queue=None, weight=None, dropout=None, head=None):
    return {
        "model": model, "batch": batch, "lr": lr, "precision": precision, "pooling": pooling, "dup_rate": dup,
        "queue_size": queue, "weight": weight, "dropout": dropout, "head": head,
    }  # fmt: skip


# ESimCSE's run.sh (docs/methods.md#esimcse): batch 64, lr, dup_rate, queue K (2.5 × 64; 2 × 64 for roberta-large),
# dropout, fp16
ESIMCSE = {
    "bert_base": row("bert-base-uncased", 64, 3e-5, FP16, "cls", dup=0.32, queue=160, dropout=0.1),
    "bert_large": row("bert-large-uncased", 64, 1e-5, FP16, "cls", dup=0.32, queue=160, dropout=0.1),
    "roberta_base": row("roberta-base", 64, 1e-5, FP16, "cls", dup=0.30, queue=160, dropout=0.1),
    "roberta_large": row("roberta-large", 64, 1e-5, FP16, "cls", dup=0.28, queue=128, dropout=0.15),
}
# SNCSE's train_SNCSE.sh: batch 256 base / 128 large, lr 1e-5 / 5e-6, λ 1e-3 BERT / 5e-4 RoBERTa, no fp16
SNCSE = {
    "bert_base": row("bert-base-uncased", 256, 1e-5, FP32, "prompt", weight=1e-3),
    "bert_large": row("bert-large-uncased", 128, 5e-6, FP32, "prompt", weight=1e-3),
    "roberta_base": row("roberta-base", 256, 1e-5, FP32, "prompt", weight=5e-4),
    "roberta_large": row("roberta-large", 128, 5e-6, FP32, "prompt", weight=5e-4),
}
# HiCL A.3 (batch 256 base / 128 large, fp32 base / fp16 large) and A.4 (lr 1e-5 base / 5e-6 large); on ESimCSE its
# queue keeps 2.5 × the batch (2 × for roberta-large: our reading), its dup_rate and dropout; on SNCSE its λ
HICL = {}
for _bb, _hub in BACKBONES.items():
    _large = _bb.endswith("large")
    _batch, _lr, _precision = (128, 5e-6, FP16) if _large else (256, 1e-5, FP32)
    HICL[f"simcse_{_bb}"] = row(_hub, _batch, _lr, _precision, "hicl")
    _esimcse = ESIMCSE[_bb]
    _queue = _batch * _esimcse["queue_size"] // 64
    HICL[f"esimcse_{_bb}"] = row(
        _hub, _batch, _lr, _precision, "hicl", dup=_esimcse["dup_rate"], queue=_queue, dropout=_esimcse["dropout"]
    )
    HICL[f"sncse_{_bb}"] = row(_hub, _batch, _lr, _precision, "hicl", weight=SNCSE[_bb]["weight"])
# SARCSE §3.1: RoBERTa, lr 1e-5, batch 64
SARCSE = {bb: row(BACKBONES[bb], 64, 1e-5, FP32, "cls", head="sarcse") for bb in ("roberta_base", "roberta_large")}

PRESETS = {
    **{f"esimcse/{bb}": values for bb, values in ESIMCSE.items()},
    **{f"sncse/{bb}": values for bb, values in SNCSE.items()},
    **{f"hicl/{name}": values for name, values in HICL.items()},
    **{f"sarcse/{bb}": values for bb, values in SARCSE.items()},
}
# DiffCSE's run_diffcse.sh (bert-base only, docs/methods.md#diffcse): lr, batch, masking ratio, λ, epochs, generator,
# fp16; RoBERTa's lr, masking ratio and λ *unverified*, its batch and epochs not found (BERT's kept)
DIFFCSE = {
    "bert_base": {"model": "bert-base-uncased", "lr": 7e-6, "batch": 64, "masking_ratio": 0.3, "weight": 0.005,
                  "epochs": 2, "generator": "distilbert-base-uncased"},
    "roberta_base": {"model": "roberta-base", "lr": 1e-5, "batch": 64, "masking_ratio": 0.2, "weight": 0.005,
                     "epochs": 2, "generator": "distilroberta-base"},
}  # fmt: skip
# the preset lines that must say their value is unverified or was not found (as the spec marks them)
DIFFCSE_UNVERIFIED = {"roberta_base": {"lr": "*unverified*", "masking_ratio": "*unverified*", "weight": "*unverified*",
                                       "batch_size": "not found", "max_epochs": "not found"}}  # fmt: skip
# DCLR's run.sh (docs/methods.md#dclr): init, batch (large: 4 GPUs × 64), lr, epochs, φ, noise_times; fp32 (its --fp16
# is commented out); the complementary model SimCSE's released base one (for the large ones too: *unverified*)
SIMCSE_BERT, SIMCSE_ROBERTA = "princeton-nlp/unsup-simcse-bert-base-uncased", "princeton-nlp/unsup-simcse-roberta-base"
DCLR = {
    "bert_base": {"model": "bert-base-uncased", "batch": 128, "lr": 3e-5, "epochs": 3, "phi": 0.9, "noise_times": 1,
                  "complementary": SIMCSE_BERT},
    "roberta_base": {"model": "roberta-base", "batch": 128, "lr": 3e-5, "epochs": 3, "phi": 0.85, "noise_times": 2.5,
                     "complementary": SIMCSE_ROBERTA},
    "bert_large": {"model": "princeton-nlp/unsup-simcse-bert-large-uncased", "batch": 256, "lr": 3e-5, "epochs": 1,
                   "phi": 0.9, "noise_times": 3, "complementary": SIMCSE_BERT},
    "roberta_large": {"model": "princeton-nlp/unsup-simcse-roberta-large", "batch": 256, "lr": 1e-5, "epochs": 1,
                      "phi": 0.85, "noise_times": 5, "complementary": SIMCSE_ROBERTA},
}  # fmt: skip
# Focal-InfoNCE's Table 3 gives no m or τ per method: its Table 1 values per backbone (experiment=focal/<backbone>)
FOCAL = {"bert_base": (0.07, 0.3), "roberta_base": (0.05, 0.3)}
FOCAL_ON = {f"focal/{method}_{bb}": (method, bb) for method in ("diffcse", "dclr") for bb in FOCAL}
DIFFCSE_DCLR = {
    **{f"diffcse/{bb}": values for bb, values in DIFFCSE.items()},
    **{f"dclr/{bb}": values for bb, values in DCLR.items()},
}
# each tiny preset: the base preset it runs at toy size, and the model it runs on
TINY = {
    "esimcse/tiny": ("esimcse/bert_base", "tiny"),
    "sncse/tiny": ("sncse/bert_base", "tiny"),
    "hicl/simcse_tiny": ("hicl/simcse_bert_base", "tiny"),
    "hicl/esimcse_tiny": ("hicl/esimcse_bert_base", "tiny"),
    "hicl/sncse_tiny": ("hicl/sncse_bert_base", "tiny"),
    "sarcse/tiny": ("sarcse/roberta_base", "tiny-roberta"),
    "diffcse/tiny": ("diffcse/bert_base", "tiny"),
    "focal/diffcse_tiny": ("focal/diffcse_bert_base", "tiny"),
    "dclr/tiny": ("dclr/bert_base", "tiny"),
    "focal/dclr_tiny": ("focal/dclr_bert_base", "tiny"),
}
# what a tiny preset may change in its base preset: the model, the run's size, CPU precision, the queue's length
TINY_CHANGES = {"task_name", "data.batch_size", "negatives.queue_size", "trainer.precision", "trainer.max_steps"}
TINY_CHANGES |= {"eval.every_n_steps", "auxiliary.sncse.source"}
TINY_CHANGES |= {"head.generator", "negatives.complementary"}  # DiffCSE's and DCLR's offline stand-ins
# the methods' folders of conf/experiment/, and focal/'s presets on them
METHOD_FOLDERS = ("esimcse", "sncse", "hicl", "sarcse", "diffcse", "dclr")
FOCAL_ON_PREFIXES = ("focal/diffcse_", "focal/dclr_")
# HiCL A.4: stage 1's α grid, stage 2's learning rates per method
ALPHAS = [0.01, 0.05, 0.15]
LR_GRIDS = {"simcse": [5e-6, 1e-5, 3e-5, 5e-5], "esimcse": [5e-6, 1e-5, 3e-5], "sncse": [5e-6, 1e-5]}


def choice(cfg: DictConfig, group: str) -> str | None:
    return cfg.hydra.runtime.choices.get(group)


def run_folder(preset: str) -> str:
    """A preset's task_name: its name from before the presets moved into folders (`sncse/tiny` → `sncse_tiny`)."""
    return preset.replace("/", "_")


def preset_names() -> set[str]:
    """Every preset under conf/experiment/, as `experiment=` names it (`sncse/tiny`)."""
    folder = CONF_DIR / "experiment"
    return {p.relative_to(folder).with_suffix("").as_posix() for p in folder.rglob("*.yaml")}


def flat(cfg: DictConfig) -> dict[str, object]:
    """The composed config without hydra's node, unresolved, as {dotted key: leaf}."""
    container = OmegaConf.to_container(cfg, resolve=False)
    container.pop("hydra", None)
    out: dict[str, object] = {}

    def walk(node: object, prefix: str) -> None:
        if isinstance(node, dict) and node:
            for key, value in node.items():
                walk(value, f"{prefix}{key}.")
        else:
            out[prefix[:-1]] = node

    walk(container, "")
    return out


def test_every_method_preset_file_is_in_the_tables():
    files = {n for n in preset_names() if n.split("/")[0] in METHOD_FOLDERS or n.startswith(FOCAL_ON_PREFIXES)}
    assert files == set(PRESETS) | set(DIFFCSE_DCLR) | set(FOCAL_ON) | set(TINY)


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_preset_holds_the_papers_values(name, tmp_path):
    want = PRESETS[name]
    cfg = compose_train([f"experiment={name}"], tmp_path)
    assert choice(cfg, "experiment") == name and cfg.task_name == run_folder(name)
    assert cfg.model.name_or_path == want["model"]
    assert (cfg.data.batch_size, cfg.optimizer.lr) == (want["batch"], want["lr"])
    assert cfg.trainer.precision == want["precision"]
    assert choice(cfg, "pooling") == cfg.pooling.name == want["pooling"]
    assert choice(cfg, "loss") == "infonce" and cfg.loss.tau == 0.05
    assert cfg.eval.every_n_steps == 125 and cfg.trainer.max_epochs == 1
    assert cfg.data.dup_rate == want["dup_rate"]
    assert cfg.model.dropout == want["dropout"]
    assert choice(cfg, "head") == want["head"]
    if want["queue_size"] is None:
        assert choice(cfg, "negatives") is None and cfg.get("negatives") is None
    else:
        assert choice(cfg, "negatives") == "momentum"
        assert (cfg.negatives.queue_size, cfg.negatives.momentum) == (want["queue_size"], 0.995)
        assert cfg.negatives.convention == "paper"
    if want["weight"] is None:
        assert choice(cfg, "auxiliary") is None and cfg.get("auxiliary") is None
    else:
        assert choice(cfg, "auxiliary") == "sncse"
        margin = cfg.auxiliary.sncse
        assert (margin.weight, margin.alpha, margin.beta) == (want["weight"], 0.1, 0.3)
        assert cfg.auxiliary.sncse.source == "rule" and cfg.auxiliary.sncse.convention == "paper"
        assert cfg.auxiliary.sncse.lookup_quirk is None, "the paper convention's lookup"
        assert (cfg.pooling.template, cfg.pooling.positive_template) == (ANCHOR_TEMPLATE, POSITIVE_TEMPLATE)
        assert cfg.pooling.mlp == "train"


@pytest.mark.parametrize("name", sorted(n for n in [*PRESETS, *DIFFCSE_DCLR, *FOCAL_ON] if not n.startswith("hicl/")))
def test_non_hicl_presets_cut_at_32_tokens(name, tmp_path):
    cfg = compose_train([f"experiment={name}"], tmp_path)
    assert cfg.data.max_length == 32
    if cfg.pooling.name == "prompt":  # SNCSE: the whole templated row ≤ 32 tokens
        assert cfg.pooling.max_length == 32


@pytest.mark.parametrize("name", sorted(n for n in PRESETS if n.startswith("hicl/")))
def test_hicl_presets_start_from_a4(name, tmp_path):
    cfg = compose_train([f"experiment={name}"], tmp_path)
    assert (cfg.pooling.alpha, cfg.pooling.slice_len, cfg.data.max_length) == (0.05, 32, 512)
    assert cfg.pooling.entailment_beta == 0.0, "HiCL, not HiCLv2"
    assert cfg.pooling.prompt is name.startswith("hicl/sncse_"), "the prompt on every segment with SNCSE only"


@pytest.mark.parametrize("name", sorted(SARCSE))
def test_sarcse_presets_hold_section_3_1(name, tmp_path):
    head = compose_train([f"experiment=sarcse/{name}"], tmp_path).head
    assert (head.theta, head.lam, head.alpha, head.beta, head.gamma) == (0.1, 50.0, 1.0, 2.5e-4, 2.5e-4)
    assert (head.co_t, head.co_c, head.weighting) == (500, 3, "self_adaptive")


@pytest.mark.parametrize("backbone", sorted(DIFFCSE))
def test_diffcse_presets_hold_the_released_script(backbone, tmp_path):
    want, name = DIFFCSE[backbone], f"diffcse/{backbone}"
    cfg = compose_train([f"experiment={name}"], tmp_path)
    assert choice(cfg, "experiment") == name and cfg.task_name == run_folder(name)
    assert cfg.model.name_or_path == want["model"]
    assert (cfg.data.batch_size, cfg.optimizer.lr, cfg.trainer.max_epochs) == (
        want["batch"],
        want["lr"],
        want["epochs"],
    )
    assert choice(cfg, "pooling") == "cls" and cfg.pooling.mlp == "none", "the projector takes the MLP's place"
    assert choice(cfg, "head") == "diffcse" and choice(cfg, "loss") == "infonce" and cfg.loss.tau == 0.05
    head = cfg.head
    assert (head.generator, head.masking_ratio, head.weight) == (
        want["generator"],
        want["masking_ratio"],
        want["weight"],
    )
    assert head.convention == "paper"
    assert cfg.trainer.precision == FP16 and cfg.eval.every_n_steps == 125 and cfg.eval.select == "stsb_dev"
    assert cfg.get("negatives") is None and cfg.get("auxiliary") is None


@pytest.mark.parametrize("backbone", sorted(DIFFCSE_UNVERIFIED))
def test_diffcse_roberta_marks_what_the_released_code_does_not_give(backbone):
    lines = (CONF_DIR / "experiment" / "diffcse" / f"{backbone}.yaml").read_text(encoding="utf-8").splitlines()
    for key, mark in DIFFCSE_UNVERIFIED[backbone].items():
        (line,) = [x for x in lines if re.match(rf"^\s+{key}:", x)]
        assert mark in line, f"{key}: {line.strip()} does not say {mark}"


@pytest.mark.parametrize("backbone", sorted(DCLR))
def test_dclr_presets_hold_the_released_script(backbone, tmp_path):
    want, name = DCLR[backbone], f"dclr/{backbone}"
    cfg = compose_train([f"experiment={name}"], tmp_path)
    assert choice(cfg, "experiment") == name and cfg.task_name == run_folder(name)
    assert cfg.model.name_or_path == want["model"]
    assert (cfg.data.batch_size, cfg.optimizer.lr, cfg.trainer.max_epochs) == (
        want["batch"],
        want["lr"],
        want["epochs"],
    )
    assert choice(cfg, "pooling") == "cls" and cfg.pooling.mlp == "train"
    assert choice(cfg, "loss") == "infonce" and cfg.loss.tau == 0.05 and cfg.trainer.precision == FP32
    assert choice(cfg, "negatives") == "dclr"
    negatives = cfg.negatives
    assert (negatives.phi, negatives.noise_times) == (want["phi"], want["noise_times"])
    assert (negatives.ascent_steps, negatives.step_size) == (4, 1e-3)
    assert (negatives.complementary, negatives.convention) == (want["complementary"], "paper")
    # DCLR selects on the average of STS-B and SICK-R dev, which sentemb has not: STS-B dev selects, SICK-R is scored
    assert (cfg.eval.every_n_steps, cfg.eval.select, cfg.eval.score_sickr_dev) == (125, "stsb_dev", True)
    assert choice(cfg, "head") is None and cfg.get("auxiliary") is None


@pytest.mark.parametrize("name", sorted(FOCAL_ON))
def test_focal_on_a_method_is_the_method_with_focal_infonce(name, tmp_path):
    method, backbone = FOCAL_ON[name]
    focal = compose_train([f"experiment={name}"], tmp_path)
    base = compose_train([f"experiment={method}/{backbone}"], tmp_path)
    table_1 = compose_train([f"experiment=focal/{backbone}"], tmp_path)
    assert choice(focal, "experiment") == name and focal.task_name == run_folder(name)
    assert choice(focal, "loss") == focal.loss.name == "focal"
    assert (focal.loss.tau, focal.loss.m) == FOCAL[backbone] == (table_1.loss.tau, table_1.loss.m)
    assert (focal.loss.symmetric, focal.loss.convention) == (False, "paper")
    for group in ("model", "pooling", "head", "negatives", "auxiliary"):
        assert choice(focal, group) == choice(base, group), group
    small, large = flat(focal), flat(base)
    changed = {k for k in small.keys() | large.keys() if small.get(k) != large.get(k)}
    assert {k for k in changed if not k.startswith("loss.")} == {"task_name"}, f"{name} changes {sorted(changed)}"


@pytest.mark.parametrize("name", sorted(TINY))
def test_tiny_preset_is_its_base_preset_at_toy_size(name, tmp_path):
    base, model = TINY[name]
    tiny = compose_train([f"experiment={name}"], tmp_path)
    full = compose_train([f"experiment={base}", f"model={model}"], tmp_path)
    assert choice(tiny, "model") == model and tiny.task_name == run_folder(name)
    assert (tiny.data.batch_size, tiny.trainer.precision) == (16, FP32)
    assert 0 < tiny.trainer.max_steps <= 20 and 0 < tiny.eval.every_n_steps <= tiny.trainer.max_steps
    for group in ("pooling", "loss", "negatives", "auxiliary", "head"):
        assert choice(tiny, group) == choice(full, group), group
    if choice(tiny, "negatives") == "momentum":
        assert tiny.negatives.queue_size == 40, "ESimCSE's 2.5 × the batch"
    if choice(tiny, "negatives") == "dclr":
        assert tiny.negatives.complementary == "initial", "offline"
    if choice(tiny, "head") == "diffcse":
        assert tiny.head.generator in ("tiny", "uniform"), "offline"
    if tiny.get("auxiliary"):
        assert tiny.auxiliary.sncse.source == "rule", "offline"
    small, large = flat(tiny), flat(full)
    changed = {k for k in small.keys() | large.keys() if small.get(k) != large.get(k)}
    assert changed <= TINY_CHANGES, f"{name} changes {sorted(changed - TINY_CHANGES)} of {base}"


@pytest.mark.parametrize("name", sorted([*PRESETS, *DIFFCSE_DCLR, *FOCAL_ON, *TINY]))
def test_every_value_of_a_method_preset_names_its_source(name):
    path = CONF_DIR / "experiment" / f"{name}.yaml"
    lines = path.read_text(encoding="utf-8").splitlines()
    assert lines[0] == "# @package _global_"
    assert any(line.startswith(f"# python -m sentemb.train experiment={name}") for line in lines), "a command"
    for number, line in enumerate(lines):
        if re.match(r"^\s+[A-Za-z_]+:\s*[^\s#]", line):  # an indented key with a value
            commented = " # " in line or lines[number - 1].strip().startswith("#")
            assert commented, f"{path.name}:{number + 1}: {line.strip()} has no comment naming its source"


def test_hicl_stage_1_sweeps_alpha_on_sickr_dev(tmp_path):
    cfg = compose_train(["experiment=hicl/sncse_bert_base", "hparams_search=hicl_table13"], tmp_path)
    assert str(cfg.hydra.mode) == "RunMode.MULTIRUN"
    assert dict(cfg.hydra.sweeper.params) == {"pooling.alpha": "0.01,0.05,0.15"}
    assert cfg.eval.select == "stsb_dev" and cfg.eval.score_sickr_dev  # A.4 fn. 3: checkpoints on STS-B dev
    assert cfg.optimized_metric == SICKR_DEV_SPEARMAN_BEST_RESCORED  # ... hyper-parameters on their SICK-R dev
    assert cfg.optimizer.lr == 1e-5, "A.4: α is tuned at the preset's learning rate"
    assert cfg.pooling.prompt is True, "the experiment's HiCL settings are kept"
    assert check_sweep(cfg) == {"pooling.alpha": ALPHAS}


@pytest.mark.parametrize("method", sorted(LR_GRIDS))
def test_hicl_stage_2_sweeps_the_methods_learning_rates_on_sickr_dev(method, tmp_path):
    overrides = [f"experiment=hicl/{method}_bert_large", f"hparams_search=hicl_table13_lr_{method}"]
    cfg = compose_train([*overrides, "from_sweep=multirun/stage-1"], tmp_path)
    assert str(cfg.hydra.mode) == "RunMode.MULTIRUN"
    assert list(cfg.hydra.sweeper.params) == ["optimizer.lr"]
    assert cfg.eval.select == "stsb_dev" and cfg.eval.score_sickr_dev  # A.4 fn. 3: checkpoints on STS-B dev
    assert cfg.optimized_metric == SICKR_DEV_SPEARMAN_BEST_RESCORED  # ... hyper-parameters on their SICK-R dev
    assert choice(cfg, "experiment") == f"hicl/{method}_bert_large" and cfg.pooling.alpha == 0.05
    assert check_sweep(cfg) == {"optimizer.lr": LR_GRIDS[method]}


@pytest.mark.parametrize("search", ["hicl_table13", *(f"hicl_table13_lr_{m}" for m in sorted(LR_GRIDS))])
def test_hicl_searches_are_hicls_without_an_experiment(search, tmp_path):
    cfg = compose_train([f"hparams_search={search}", "model=tiny"], tmp_path)
    assert choice(cfg, "pooling") == "hicl" and cfg.pooling.name == "hicl"
    assert check_sweep(cfg)
    text = (CONF_DIR / "hparams_search" / f"{search}.yaml").read_text(encoding="utf-8")
    assert "# @package _global_" in text and "python -m sentemb.train experiment=hicl/" in text, "its commands"
