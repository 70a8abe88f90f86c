"""Every option the README lists runs: each option of each config group under conf/, found from the files.

Fast part (`make test`): every option composes, names Hydra plugins that import, passes the pre-run checks
(`prepare_run`) with the network refused, and builds its Trainer with its callbacks and loggers; a hub model
is checked as if the hub answered, and without it must fail in seconds naming `model.name_or_path`; a sweep
config's swept keys must exist and its values parse. Slow part (`make test-slow`): every option trains one
step through `sentemb.train.train`. What would download (a hub model) is swapped for the tiny model of its
family where the option is about something else (an experiment's loss, pooling and recipe); what needs a
download or hardware this machine lacks (a hub model of the model group, GPUs, the full corpus) is skipped
there with the reason, having been composed and checked here. README.md's table of groups must list exactly
these options.
"""

from __future__ import annotations

import csv
import functools
import math
import os
import re
import socket
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest
import torch
from huggingface_hub import try_to_load_from_cache
from hydra.utils import get_class
from omegaconf import DictConfig, ListConfig, OmegaConf

import sentemb.encoders.models.backbones
from sentemb.common.errors import SentembConfigError
from sentemb.common.metric_names import DEV_SPEARMAN_BEST_LOGGED, TEST_SPEARMAN
from sentemb.common.parts import BOTH, DECODERS, NATIVE, lookup, names
from sentemb.common.paths import CONF_DIR, resolve_data_root
from sentemb.data.labelled import read_labelled
from sentemb.data.sets.nli import NLI_COLUMNS
from sentemb.losses.inputs import SCORES
from sentemb.losses.registry import available, declared_loss
from sentemb.runs.sweep_check import check_sweep
from sentemb.training.checks import prepare_run
from sentemb.training.sharding import is_sharded
from sentemb.training.trainer import build_trainer
from tests.conftest import compose_train
from tests.test_train import run

# a config group is a directory of conf/; its options are its YAML files, nested ones included
GROUPS = sorted(path.name for path in CONF_DIR.iterdir() if path.is_dir())
OPTIONS = {
    group: sorted(
        path.relative_to(CONF_DIR / group).with_suffix("").as_posix() for path in (CONF_DIR / group).rglob("*.yaml")
    )
    for group in GROUPS
}
CASES = [(group, option) for group in GROUPS for option in OPTIONS[group]]
IDS = [f"{group}={option}" for group, option in CASES]
# conf/local/ holds one machine's own settings (git ignores its files): the one group that may have no option
MACHINE_GROUPS = {"local"}
# options that cannot run without a value only the user can give; without it the checks must name the key
NEEDS_A_VALUE = {("loss", "sum"): ("loss.terms", "loss.terms={infonce: {weight: 1.0}, mmhe: {weight: 0.5}}")}
# options that run only beside another choice, derived from what each part declares: a decoder LLM with a pooling
# that serves decoders (the default cls is refused on decoders), a part that serves decoders alone (MNTP) on the
# tiny decoder with that pooling, a part's declared `companions` (a scored loss's scored data, DiffCSE's no MLP),
# scored data with a loss that reads scores
DECODER_MODELS = [o for o in OPTIONS["model"] if "bidirectional" in (CONF_DIR / "model" / f"{o}.yaml").read_text()]
# the pooling that serves both kinds of backbone and exports as sentence-transformers' own module (mean)
DECODER_POOLING = next(
    name
    for name in names("pooling")
    if lookup("pooling", name).serves == BOTH and lookup("pooling", name).export == NATIVE
)
TINY_DECODER = next(option for option in DECODER_MODELS if option.startswith("tiny-"))
SCORED_LOSS = next(name for name in available() if SCORES in declared_loss({"name": name}).reads)


def declared_companions(group: str, option: str) -> list[str]:
    """What the option's part declares it runs beside (`companions`), and a decoder-only part's decoder."""
    if group in KIND_OF_GROUP and option in names(KIND_OF_GROUP[group]):
        entry = lookup(KIND_OF_GROUP[group], option)
        decoder = [f"model={TINY_DECODER}", f"pooling={DECODER_POOLING}"] if entry.serves == DECODERS else []
        return [*decoder, *entry.companions]
    return []


def holds_scores(option: str) -> bool:
    """Whether a built-in labelled set (data=<option>, a source other than a file) holds scored pairs: its first row
    read as training reads it."""
    data = compose_train([f"data={option}"]).data
    if data.get("source") in (None, "file", "nli"):
        return False
    return read_labelled(OmegaConf.to_container(data, resolve=True), 1).scores is not None


KIND_OF_GROUP = {"loss": "loss", "pooling": "pooling", "head": "head", "negatives": "negatives"}
COMPANIONS = (
    {("model", option): [f"pooling={DECODER_POOLING}"] for option in DECODER_MODELS}
    | {
        (group, option): declared_companions(group, option)
        for group in KIND_OF_GROUP
        for option in OPTIONS[group]
        if declared_companions(group, option)
    }
    | {("data", option): [f"loss={SCORED_LOSS}"] for option in OPTIONS["data"] if holds_scores(option)}
)
ONE_STEP = ["trainer.max_steps=1", "eval.every_n_steps=1", "eval.at_start=false", "data.batch_size=8"]


def option_overrides(group: str, option: str, corpus: Path) -> list[str]:
    """The option, the small corpus and CSV logs (unless the option is a corpus or a logger), its required value;
    an option on labelled data: a labelled file in place of its own where it names none or SimCSE's NLI file (not
    reachable here)."""
    overrides = [f"{group}={option}"]
    overrides += [] if group == "logger" else ["logger=csv"]
    source = labelled_source(group, option)
    overrides += [] if group == "data" or source else [f"data.corpus={corpus}"]
    if source in ("file", "nli"):
        overrides.append(f"data.path={labelled_fixture(source)}")
    if (group, option) in NEEDS_A_VALUE:
        overrides.append(NEEDS_A_VALUE[group, option][1])
    return overrides + COMPANIONS.get((group, option), [])


@functools.cache
def labelled_source(group: str, option: str) -> str | None:
    """The labelled data the option trains on (data.source: file, nli, stsb_train, ...), None for a corpus."""
    return compose_train([f"{group}={option}", *COMPANIONS.get((group, option), [])]).data.get("source")


@functools.cache
def labelled_fixture(source: str) -> Path:
    """1,024 triplets of the wiki sample's lines (a batch of 512 on each of 2 devices), under SimCSE's NLI header
    for `nli`, `anchor,positive,negative` otherwise."""
    lines = [line for line in (resolve_data_root() / "wiki" / "wiki1m_head.txt").read_text().splitlines() if line]
    header = list(NLI_COLUMNS) if source == "nli" else ["anchor", "positive", "negative"]
    path = Path(tempfile.mkdtemp(prefix="sentemb-labelled-")) / f"{source}.csv"
    with path.open("w", encoding="utf-8", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(header)
        writer.writerows(lines[3 * i : 3 * i + 3] for i in range(1024))
    return path


def hub_models(cfg: DictConfig) -> list[str]:
    """The hub names the model's loaders would read: anything that is not a local folder."""
    sources = [(cfg.model.get(part) or {}).get("name_or_path") for part in ("backbone", "tokenizer")]
    return sorted({str(s) for s in sources if s is not None and not Path(str(s)).expanduser().is_dir()})


def tiny_stand_in(cfg: DictConfig) -> list[str]:
    """The in-process random model of the same family (RoBERTa's tokenizer and embeddings differ from BERT's; a decoder
    LLM's stand-in is tiny-llama, without the hub loader's options an experiment sets, such as torch_dtype)."""
    if "bidirectional" in cfg.model:
        tiny = OmegaConf.load(CONF_DIR / "model" / "tiny-llama.yaml").backbone
        own = OmegaConf.to_container(OmegaConf.load(CONF_DIR / "model" / f"{cfg.hydra.runtime.choices.model}.yaml"))
        own = own["backbone"]
        preset = OmegaConf.to_container(cfg.model.backbone, resolve=False)
        set_by_experiment = [k for k, v in preset.items() if k not in tiny and (k not in own or own[k] != v)]
        return ["model=tiny-llama", *(f"~model.backbone.{k}" for k in set_by_experiment)]
    return ["model=tiny-roberta" if "roberta" in str(cfg.model.get("name_or_path", "")).lower() else "model=tiny"]


def teacher_stand_in(cfg: DictConfig) -> list[str]:
    """Hub teachers (RankCSE's) swapped for the packaged MiniLM: one teacher for one, MiniLM pooled by its mean and by
    its [CLS] state for two (the tiny presets' stand-ins); none where every teacher is local."""
    paths = (cfg.get("teacher") or {}).get("path")
    names = [str(p) for p in (paths if isinstance(paths, ListConfig) else [paths] if paths else [])]
    if all(name == "minilm" or Path(name).expanduser().exists() for name in names):
        return []
    stand_ins = {
        1: ["teacher.path=minilm", "teacher.pooling=null"],
        2: ["teacher.path=[minilm,minilm]", "teacher.pooling=[mean,cls]"],
    }
    return stand_ins[len(names)]  # no preset names more teachers


def gpus_needed(cfg: DictConfig) -> int:
    trainer = cfg.trainer
    if str(trainer.get("accelerator")) not in ("gpu", "cuda"):
        return 0
    devices = trainer.get("devices", 1)
    return (devices if isinstance(devices, int) and devices > 0 else 1) * int(trainer.get("num_nodes", 1))


def corpus_path(cfg: DictConfig) -> Path:
    """data.corpus (labelled data: data.path, a built-in set's the folder it reads) with the data root found as
    `prepare_run` finds it (paths.data_dir may be null until then)."""
    probe = OmegaConf.create({"paths": {"data_dir": str(resolve_data_root(cfg.paths.data_dir))}, "data": cfg.data})
    return Path(str(probe.data.get("path") or probe.data.corpus)).expanduser()


def data_present(cfg: DictConfig) -> bool:
    path = corpus_path(cfg)
    return path.is_dir() if cfg.data.get("source") not in (None, "file", "nli") else path.is_file()


def lacking(cfg: DictConfig) -> str | None:
    """What this machine lacks to run `cfg` (a download or hardware), or None."""
    uncached = [name for name in hub_models(cfg) if not isinstance(try_to_load_from_cache(name, "config.json"), str)]
    if uncached:
        return f"needs the Hugging Face Hub ({', '.join(uncached)} is not in the local cache)"
    if gpus_needed(cfg) > torch.cuda.device_count():
        return f"needs {gpus_needed(cfg)} CUDA GPU(s); this machine has {torch.cuda.device_count()}"
    if not data_present(cfg):
        return f"needs {corpus_path(cfg)}, which is absent (`make data` downloads it)"
    return None


@pytest.fixture
def no_network(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any connection fails the test; the hub is taken as reachable, so a hub model's checks all run offline."""

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError(f"the pre-run checks opened a connection: {args}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(sentemb.encoders.models.backbones, "hub_reachable", lambda timeout=3.0: True)


@pytest.fixture(autouse=True)
def wandb_offline(monkeypatch: pytest.MonkeyPatch) -> None:
    # logger=wandb writes offline runs here even where W&B is configured online
    monkeypatch.setenv("WANDB_MODE", "offline")


README = (CONF_DIR.parent / "README.md").read_text(encoding="utf-8")


def readme_pattern(listed: str) -> re.Pattern:
    """README's name of an option or a family of them: `simcse_*`, `paradigm_table6_<mmhe\\|mmhs>`, `<…>`."""
    parts = re.split(r"(<[^>]*>|\*)", listed)
    regex = ""
    for part in parts:
        if part.startswith("<") and "|" in part:
            regex += "(?:" + "|".join(map(re.escape, part[1:-1].replace("\\|", "|").split("|"))) + ")"
        else:
            regex += "[a-z0-9_]+" if part == "*" or part.startswith("<") else re.escape(part)
    return re.compile(regex)


def is_a_key_or_command(name: str) -> bool:
    """`pooling.mlp=...`, `model.name_or_path`, `make data`: not an option name (`qwen3-0.6b` is one)."""
    return bool(re.search(r"[=\s]", name) or re.fullmatch(r"[a-z_]+(\.[a-z_]+)+", name))


@pytest.mark.parametrize("group", GROUPS)
def test_the_readme_table_lists_exactly_the_options_of_each_group(group):
    row = re.search(rf"^\| `{group}` \| (.*?)(?<!\\) \|", README, re.M)
    assert row, f"README.md's table of groups has no row for `{group}`"
    # option names, not the keys (`pooling.mlp=...`) or commands (`make data`) beside them
    listed = [name for name in re.findall(r"`([^`]+)`", row[1]) if not is_a_key_or_command(name)]
    patterns = [readme_pattern(name) for name in listed]
    machine_own = group in MACHINE_GROUPS  # a machine's own files are not the README's to list
    unlisted = [o for o in OPTIONS[group] if not machine_own and not any(p.fullmatch(o) for p in patterns)]
    assert not unlisted, f"README.md's `{group}` row does not list {unlisted}"
    stale = [name for name, p in zip(listed, patterns, strict=True) if not any(p.fullmatch(o) for o in OPTIONS[group])]
    assert not stale, f"README.md's `{group}` row lists {stale}, which conf/{group}/ does not have"


def test_every_group_and_option_is_enumerated(tmp_path):
    choices = compose_train([], tmp_path).hydra.runtime.choices
    assert {g for g in choices if not g.startswith("hydra/")} == set(GROUPS), "conf/ and conf/train.yaml differ"
    visited = {group for group, _ in CASES}
    assert visited | MACHINE_GROUPS == set(GROUPS), f"groups with no option: {set(GROUPS) - visited}"
    listed = {"model", "data", "pooling", "head", "loss", "trainer", "callbacks", "logger", "eval", "experiment"}
    assert listed | {"hparams_search", "launcher", "paths"} <= visited
    assert "experiment=paradigm/reference/bert" in IDS, "nested options are found"
    assert len(IDS) == len(set(IDS))


@pytest.fixture
def batch_corpus(data_root: Path) -> Path:
    """The wiki sample (11,914 lines): it fills an option's or a swept value's whole batch (512 sentences; 64 on each
    of 2 devices), which the pre-run checks ask of a corpus, as the 300 lines of small_corpus would not."""
    return data_root / "wiki" / "wiki1m_head.txt"


@pytest.mark.parametrize(("group", "option"), CASES, ids=IDS)
def test_option_composes_and_passes_the_pre_run_checks(group, option, batch_corpus, tmp_path, no_network):
    cfg = compose_train(option_overrides(group, option, batch_corpus), tmp_path)
    assert cfg.hydra.runtime.choices[group] == option
    for key in ("model", "pooling", "loss", "data", "trainer", "eval", "paths"):
        assert key in cfg, f"{group}={option} lost the '{key}' group"
    for plugin in ("launcher", "sweeper"):  # launcher=slurm's submitit, hparams_search=optuna's sweeper
        get_class(cfg.hydra[plugin]._target_)
    if group == "hparams_search":
        cfg = compose_train(option_overrides(group, option, batch_corpus) + search_base(option, tmp_path), tmp_path)
    if (group, option) in NEEDS_A_VALUE:
        key = NEEDS_A_VALUE[group, option][0]
        with pytest.raises(SentembConfigError, match=rf"{key}.*Fix: "):
            prepare_run(compose_train([f"{group}={option}", f"data.corpus={batch_corpus}"], tmp_path))
    if not data_present(cfg):  # data=wiki_full before `make data`: refused, naming the corpus
        with pytest.raises(SentembConfigError, match=rf"{corpus_path(cfg).name}.*make data"):
            prepare_run(cfg)
        return
    hardware = {"accelerator": "cpu"} if gpus_needed(cfg) > torch.cuda.device_count() else {}
    if hardware:  # a GPU trainer on a machine without those GPUs: refused before any model loads
        with pytest.raises(SentembConfigError, match=r"^trainer\.(accelerator|devices)=.*Fix: trainer"):
            prepare_run(cfg)
        cfg.trainer.accelerator = "cpu"  # the other checks, as on a GPU machine
    prepare_run(cfg)
    # the real Trainer with the option's callbacks and loggers; a GPU trainer is built for the CPU here
    # (its strategy, devices and precision are still checked by Lightning)
    trainer = build_trainer(cfg, **hardware)
    assert trainer.world_size == int(cfg.trainer.devices) * int(cfg.trainer.get("num_nodes", 1))


@pytest.mark.parametrize("option", OPTIONS["model"])
def test_a_hub_model_without_the_hub_is_refused_in_seconds(option, small_corpus, tmp_path, monkeypatch):
    cfg = compose_train(option_overrides("model", option, small_corpus), tmp_path)
    uncached = [name for name in hub_models(cfg) if not isinstance(try_to_load_from_cache(name, "config.json"), str)]
    monkeypatch.setattr(sentemb.encoders.models.backbones, "hub_reachable", lambda timeout=3.0: False)
    if not uncached:  # a packaged, in-process or cached model needs no hub
        prepare_run(cfg)
        return
    with pytest.raises(SentembConfigError, match=rf"model.name_or_path={uncached[0]}: not a local folder.*Fix: "):
        prepare_run(cfg)


def search_base(option: str, tmp_path: Path) -> list[str]:
    """The first of (the defaults, loss=<each option>) under which `hparams_search=<option>` passes
    `check_sweep`; under each one before it the check must refuse it, naming the search and the fix."""
    for base in [[], *([f"loss={loss}"] for loss in OPTIONS["loss"])]:
        cfg = compose_train([f"hparams_search={option}", "model=tiny", *base], tmp_path)
        try:
            check_sweep(cfg)
        except SentembConfigError as err:
            assert str(err).startswith(f"hparams_search={option}") and "Fix: " in str(err), err
            continue
        return base
    pytest.fail(f"hparams_search={option}: no loss= option has every key it sweeps (a typo in a key?)")


@pytest.mark.parametrize("option", OPTIONS["hparams_search"])
def test_every_swept_key_exists_and_every_value_composes(option, batch_corpus, tmp_path, no_network):
    base = [f"hparams_search={option}", "model=tiny", f"data.corpus={batch_corpus}", *search_base(option, tmp_path)]
    cfg = compose_train(base, tmp_path)
    targets = [str(c.get("_target_")) for c in cfg.hydra.callbacks.values()]
    assert "sentemb.runs.sweep_check.SweepCheck" in targets, "the sweep is checked before its first job"
    values = check_sweep(cfg)
    assert set(values) == {str(k) for k in cfg.hydra.sweeper.params} and all(values.values())
    for key, choices in values.items():
        for value in choices:  # through Hydra's own override parser, as a job of the sweep gets it
            job = compose_train([*base, f"{key}={value}"], tmp_path)
            assert OmegaConf.select(job, key) == value
            prepare_run(job)


def test_a_sweep_whose_keys_the_config_lacks_stops_before_its_first_job(tmp_path):
    # hparams_search=optuna alone: loss=infonce has no m or r; Hydra would fail at the first job, advising +loss.m
    command = [
        sys.executable,
        "-m",
        "sentemb.train",
        "hparams_search=optuna",
        "model=tiny",
        f"hydra.sweep.dir={tmp_path}/s",
    ]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("sentemb: hparams_search=optuna sweeps loss.m, loss.r, which loss=infonce does not have")
    assert "loss=mbarlow / mmhe / mvicreg / paradigm" in last
    assert not list(tmp_path.rglob("metrics.json")), "no job started"


def run_overrides(group: str, option: str, corpus: Path, stsb: Path, tmp_path: Path) -> list[str]:
    """One tiny training step of the option; a hub model is swapped for its tiny stand-in unless the option is it."""
    overrides = option_overrides(group, option, corpus)
    overrides += [] if group == "eval" else [f"eval.stsb_dir={stsb}"]
    if group == "hparams_search":  # one job of the sweep: its base and every swept key's first value
        overrides += search_base(option, tmp_path)
        values = check_sweep(compose_train([*overrides, "model=tiny"], tmp_path))
        overrides += [f"{key}={choices[0]}" for key, choices in values.items()]
    cfg = compose_train(overrides, tmp_path)
    if group != "model" and "model=tiny-llama" not in overrides:
        overrides += tiny_stand_in(cfg)
    if cfg.get("head") and cfg.head.get("generator") not in (None, "uniform", "tiny"):  # DiffCSE's hub masked LM
        overrides.append("head.generator=tiny")
    if cfg.get("negatives") and cfg.negatives.get("complementary") not in (None, "initial"):  # DCLR's hub SimCSE
        overrides.append("negatives.complementary=initial")
    overrides += teacher_stand_in(cfg)  # RankCSE's hub teachers
    if cfg.get("head") and "cache_dir" in cfg.head:  # SARCSE's token-frequency cache, kept out of the home directory
        overrides.append(f"head.cache_dir={tmp_path / 'cache'}")
    # a sweep's job keeps its swept batch size
    return [*(o for o in ONE_STEP if group != "hparams_search" or not o.startswith("data.batch_size")), *overrides]


@pytest.mark.slow
@pytest.mark.parametrize(("group", "option"), CASES, ids=IDS)
def test_option_trains_one_step(group, option, small_corpus, small_stsb, tmp_path):
    overrides = run_overrides(group, option, small_corpus, small_stsb, tmp_path)
    cfg = compose_train(overrides, tmp_path / "run")
    if reason := lacking(cfg):
        pytest.skip(f"{group}={option} {reason}; composed and checked by the fast test")
    if str(cfg.trainer.get("strategy", "")).startswith("ddp") or is_sharded(cfg.trainer):
        # Lightning's DDP (and trainer=fsdp's) launcher re-runs the command it was started by: the training command,
        # not pytest
        command = [sys.executable, "-m", "sentemb.train", *overrides, f"hydra.run.dir={tmp_path / 'run'}"]
        env = {**os.environ, "WANDB_MODE": "offline"}
        result = subprocess.run(command, capture_output=True, text=True, timeout=600, env=env)
        assert result.returncode == 0, result.stderr[-3000:]
        assert "STS-B test Spearman" in result.stdout
        return
    metrics = run(overrides, tmp_path / "run")
    assert math.isfinite(metrics[TEST_SPEARMAN]) and math.isfinite(metrics[DEV_SPEARMAN_BEST_LOGGED])
    keeps_best = bool(cfg.get("callbacks") and cfg.callbacks.get("model_checkpoint"))  # MNTP presets keep no best
    assert metrics["scored_weights"] == ("best" if keeps_best else "final")
