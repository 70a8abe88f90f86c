"""Nothing runs that a file names: every value sentemb reads from a file obeys one rule (sentemb.common.file_values).

Each payload would create a file (asserted absent afterwards) or leak an environment value (asserted in no file under
the test's folder) if anything ran or resolved it: a sweep record's winner with a nested `_target_`, with each
resolver sentemb registers and with `oc.env`; checkpoints and adapter folders whose loader options add
`trust_remote_code` for a folder whose `auto_map` names Python code, through every loading command; a tampered
`modules.json`; an ONNX recipe pointing outside its folder. The last tests list every reader of a file in the package
and check each against the rule.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import sentemb
from sentemb.common.errors import SentembConfigError
from sentemb.common.file_values import Shape, checked, read_yaml
from sentemb.common.hydra_plumbing import RESOLVERS, compose_config, resolved_container
from sentemb.common.metric_names import BEST_STEP, DEV_SPEARMAN_BEST_RESCORED
from sentemb.common.paths import CONF_DIR
from sentemb.encoders.build import load_checkpoint_encoder
from sentemb.encoders.models.backbones import pretrained_backbone, tiny_bert
from sentemb.encoders.serving.onnx_embedder import OnnxEncoder
from sentemb.eval.model_card import training_command
from sentemb.runs.record import read_record, write_record
from sentemb.st_modules import checked_modules, load_adapter_folder, read_config
from sentemb.train import train
from tests.conftest import compose_train, tree
from tests.test_safe_loading import sentemb_checkpoint, through_evaluate, through_export

SECRET = "sentemb-test-secret-4f1c9a"


def secret_in_no_file(root: Path) -> None:
    """The environment value reached no file under `root` (names included)."""
    for path in root.rglob("*"):
        assert SECRET not in str(path)
        if path.is_file():
            assert SECRET.encode() not in path.read_bytes(), f"{path} holds the secret"


# --- a sweep's winner (from_sweep=) ---------------------------------------------------------------------------------


def finished_sweep(folder: Path, winner_override: str) -> Path:
    """Two finished jobs of a sweep over optimizer.lr; the better one was run with `winner_override`."""
    for job, (override, dev) in enumerate(((winner_override, 0.9), ("optimizer.lr=0.1", 0.1))):
        record = {
            "status": "ok",
            "message": "",
            "metrics": {DEV_SPEARMAN_BEST_RESCORED: dev, BEST_STEP: 10},
            "overrides": [override],
        }
        write_record(folder / str(job), {**record, "seed": 42})
    return folder


def through_from_sweep(sweep: Path, tmp_path: Path) -> None:
    from sentemb.runs.lifecycle import run_recipe  # the job applies the winner before the recipe's checks

    run_recipe(compose_train(["model=tiny", "logger=csv", f"from_sweep={sweep}"], output_dir=tmp_path / "run"), train)


@pytest.fixture
def resolvers_that_leave_a_mark(monkeypatch, tmp_path):
    """Every resolver sentemb registers replaced by one that creates a file: the proof that a resolver ran."""
    marks = tmp_path / "marks"

    def mark(name):
        return lambda *args: (marks.mkdir(exist_ok=True), (marks / name).touch(), "x")[-1]

    for name, path in RESOLVERS.items():
        module, function = path.rsplit(".", 1)
        monkeypatch.setattr(sys.modules.get(module) or __import__(module, fromlist=[function]), function, mark(name))
    return marks


@pytest.mark.usefixtures("forbid_model_loading")
@pytest.mark.parametrize("resolver", sorted(RESOLVERS))
def test_a_sweep_winner_with_a_resolver_call_is_refused_and_nothing_resolves(
    resolver, resolvers_that_leave_a_mark, tmp_path
):
    sweep = finished_sweep(tmp_path / "sweep", f"optimizer.lr=${{{resolver}:{tmp_path}/made}}")
    with pytest.raises(SentembConfigError) as err:
        through_from_sweep(sweep, tmp_path)
    assert "holds an interpolation" in str(err.value) and "Fix: pass the values" in str(err.value)
    assert not resolvers_that_leave_a_mark.exists() and not (tmp_path / "made").exists()


@pytest.mark.usefixtures("forbid_model_loading")
def test_a_sweep_winner_with_the_real_resolvers_creates_nothing(tmp_path, monkeypatch):
    # the real ones: sqlite_storage creates its folder, packaged_model imports the module it names
    planted = tmp_path / "site"
    planted.mkdir()
    (planted / "sentemb_planted.py").write_text(f"import pathlib\npathlib.Path({str(tmp_path / 'ran')!r}).touch()\n")
    monkeypatch.syspath_prepend(str(planted))
    for payload in (f"${{sqlite_storage:{tmp_path}/storage}}", "${packaged_model:sentemb_planted}"):
        with pytest.raises(SentembConfigError, match="holds an interpolation"):
            through_from_sweep(finished_sweep(tmp_path / payload[2:9], f"optimizer.lr={payload}"), tmp_path)
    assert not (tmp_path / "storage").exists() and not (tmp_path / "ran").exists()


@pytest.mark.usefixtures("forbid_model_loading")
def test_a_sweep_winner_reading_the_environment_leaks_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("SENTEMB_TEST_SECRET", SECRET)
    sweep = finished_sweep(tmp_path / "sweep", "optimizer.lr=${oc.env:SENTEMB_TEST_SECRET}")
    with pytest.raises(SentembConfigError, match="holds an interpolation"):
        through_from_sweep(sweep, tmp_path)
    secret_in_no_file(tmp_path)


@pytest.mark.usefixtures("forbid_model_loading")
@pytest.mark.parametrize(
    "override",
    [
        "optimizer={_target_: os.makedirs, name: MADE}",
        "optimizer.betas=[0.9, {_target_: os.makedirs, name: MADE}]",
        "loss._target_=os.makedirs",
        "loss.name=focal",  # which part is built is the command's group choice, never a record's
        "model.backbone.name=tiny_roberta",
        "optimizer._partial_=false",
        "ckpt_path=MADE",
        "paths.output_dir=MADE",
    ],
)
def test_a_sweep_winner_naming_code_or_run_files_is_refused(override, tmp_path):
    made = tmp_path / "made"
    sweep = finished_sweep(tmp_path / "sweep", override.replace("MADE", str(made)))
    with pytest.raises(SentembConfigError, match=r"from_sweep=.*Fix: pass the values"):
        through_from_sweep(sweep, tmp_path)
    assert not made.exists()


@pytest.mark.parametrize("term", ["/etc/passwd", "../model/tiny", "no_such_loss"])
def test_a_weighted_sum_term_names_a_loss_never_a_path(term):
    from sentemb.losses import build

    with pytest.raises(SentembConfigError, match=rf"no loss named '{term}'"):
        build("sum", terms={"x": {"weight": 1.0, "loss": term}})


def test_a_fresh_process_reading_a_stored_config_finds_every_registered_part():
    # the registry fills wherever a stored config is read, not only where the encoder is built
    code = (
        "from sentemb.encoders.checkpoint import current_part; "
        "print(current_part('pooling', {'_target_': 'sentemb.encoders.pooling.CLSPooling'})['name'], "
        "current_part('loss', {'_target_': 'sentemb.losses.InfoNCE'})['name'])"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.stdout.split() == ["cls", "infonce"], result.stderr[-2000:]


def test_a_sweep_winner_of_plain_values_is_applied(tmp_path):
    sweep = finished_sweep(tmp_path / "sweep", "optimizer.lr=0.5")
    from sentemb.runs.sweeps import apply_sweep_winner

    cfg = compose_train(["model=tiny", f"from_sweep={sweep}"], output_dir=tmp_path / "run")
    assert apply_sweep_winner(cfg) == ["optimizer.lr=0.5"] and cfg.optimizer.lr == 0.5


# --- loader options from files: trust_remote_code ------------------------------------------------------------------


@pytest.fixture
def remote_code_folder(tmp_path) -> tuple[Path, Path]:
    """A saved tiny BERT whose config.json maps AutoModel to Python code in the folder, which creates `mark` when
    imported: what `trust_remote_code=True` would run."""
    folder, mark = tmp_path / "remote", tmp_path / "remote_code_ran"
    torch.manual_seed(0)
    tiny_bert(vocab_size=64, hidden_size=8, num_attention_heads=2, intermediate_size=16).save_pretrained(folder)
    config = json.loads((folder / "config.json").read_text())
    config["auto_map"] = {"AutoConfig": "evil.EvilConfig", "AutoModel": "evil.EvilModel"}
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "evil.py").write_text(f"import pathlib\npathlib.Path({str(mark)!r}).touch()\n")
    return folder, mark


def test_sentembs_loader_never_runs_a_folders_code(remote_code_folder):
    # refused, not loaded with transformers' own class of its model_type: the folder's code says what its model
    # computes, and that class may compute another (issue 51, finding 6: one check of every model folder)
    folder, mark = remote_code_folder
    with pytest.raises(SentembConfigError, match=r"config\.json names code of the folder's own \(auto_map.*Fix: "):
        pretrained_backbone(str(folder))
    assert not mark.exists()


def evil_backbone(folder: Path) -> dict:
    target = "sentemb.encoders.models.backbones.pretrained_backbone"
    return {"_target_": target, "name_or_path": str(folder), "trust_remote_code": True}


def remote_code_checkpoint(path: Path, folder: Path) -> Path:
    model = resolved_container(compose_train(["model=bert-base"]).model)
    model |= {"name_or_path": str(folder), "backbone": evil_backbone(folder)}
    model["tokenizer"] = {**model["tokenizer"], "name_or_path": str(folder)}
    return sentemb_checkpoint(path, model=model)


def through_load_checkpoint_encoder(checkpoint: Path, tmp_path: Path) -> None:
    load_checkpoint_encoder(checkpoint)


def through_export_onnx(checkpoint: Path, tmp_path: Path) -> None:
    through_export(checkpoint, tmp_path, ("format=onnx",))


def through_train_resume(checkpoint: Path, tmp_path: Path) -> None:
    train(compose_train(["model=tiny", "logger=csv", f"ckpt_path={checkpoint}"], output_dir=tmp_path / "run"))


def through_init_from(checkpoint: Path, tmp_path: Path) -> None:
    overrides = ["model=tiny-llama", "pooling=last_token", "logger=csv", f"model.init_from={checkpoint}"]
    train(compose_train(overrides, output_dir=tmp_path / "run"))


@pytest.mark.parametrize(
    "entry",
    [
        through_evaluate,
        through_export,
        through_export_onnx,
        through_load_checkpoint_encoder,
        through_train_resume,
        through_init_from,
    ],
    ids=lambda f: f.__name__,
)
def test_a_checkpoint_adding_trust_remote_code_runs_nothing(entry, remote_code_folder, tmp_path):
    folder, mark = remote_code_folder
    checkpoint = remote_code_checkpoint(tmp_path / "remote.ckpt", folder)
    with pytest.raises(SentembConfigError) as err:
        entry(checkpoint, tmp_path)
    assert "Fix:" in str(err.value)
    assert not mark.exists(), "the folder's code ran"


def test_an_adapter_folder_adding_trust_remote_code_runs_nothing(remote_code_folder, tmp_path):
    folder, mark = remote_code_folder
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    model = resolved_container(compose_train(["model=bert-base"]).model) | {"backbone": evil_backbone(folder)}
    config = {
        "pooling": {"_target_": "sentemb.encoders.pooling.CLSPooling"},
        "head": None,
        "model": {"loader": "encoder", "padding_side": "right", "padding_free": True},
        "base": {"name": "remote", "config_sha256": "0" * 64, "model": model},
    }
    (adapter / "sentemb_config.json").write_text(json.dumps(config))
    (adapter / "adapter_model.safetensors").write_bytes(b"")
    with pytest.raises(SentembConfigError, match=r"sentemb_config\.json: .*trust_remote_code.*Fix:"):
        load_adapter_folder(adapter)
    assert not mark.exists()


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"peft_type": "NOPE"}, "peft_type='NOPE': sentemb reads LoRA adapters only"),
        ({"megatron_core": "sentemb_planted"}, "megatron_core='sentemb_planted': sentemb's adapters leave it"),
        ({"not_an_option": 1}, "not_an_option is not a LoRA option"),
        ({"lora_alpha": "${oc.env:HOME}"}, "holds an interpolation"),
    ],
)
def test_a_tampered_adapter_config_is_refused_naming_the_key(change, message, tmp_path):
    from peft import LoraConfig

    from sentemb.st_modules import adapter_config

    path = tmp_path / "adapter_config.json"
    path.write_text(json.dumps({**LoraConfig(r=4, lora_alpha=8).to_dict(), "peft_type": "LORA", **change}))
    with pytest.raises(SentembConfigError, match=message):
        adapter_config(path)


def test_the_adapter_config_sentemb_writes_reads_back(tmp_path):
    from peft import LoraConfig

    from sentemb.st_modules import adapter_config

    written = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj"], base_model_name_or_path="x").to_dict()
    path = tmp_path / "adapter_config.json"
    path.write_text(json.dumps({**written, "peft_type": "LORA"}, default=sorted))  # peft writes its sets as lists
    config = adapter_config(path)
    assert (config.r, config.lora_alpha, set(config.target_modules)) == (4, 8, {"q_proj"})


# --- exported folders ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "module",
    [
        {"idx": 0, "name": "0", "path": "", "type": "sentemb_planted.Evil"},
        {"idx": 0, "name": "0", "path": "../elsewhere", "type": "sentence_transformers.models.Transformer"},
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Pooling", "_target_": "os.system"},
    ],
)
def test_a_tampered_modules_json_is_refused_before_anything_is_imported(module, tmp_path, monkeypatch):
    planted = tmp_path / "site"
    planted.mkdir()
    (planted / "sentemb_planted.py").write_text(f"import pathlib\npathlib.Path({str(tmp_path / 'ran')!r}).touch()\n")
    monkeypatch.syspath_prepend(str(planted))
    folder = tmp_path / "exported"
    folder.mkdir()
    (folder / "modules.json").write_text(json.dumps([module]))
    with pytest.raises(SentembConfigError, match=r"modules\.json: .*Fix: export the folder again"):
        checked_modules(folder)
    assert not (tmp_path / "ran").exists()


def test_sentembs_module_beside_another_is_refused(tmp_path):
    # trust_remote_code is never passed: a folder sentemb wrote holds its module alone, built by sentemb itself
    folder = tmp_path / "exported"
    folder.mkdir()
    own = {"idx": 0, "name": "0", "path": "", "type": "sentemb.st_modules.SentembEncoder"}
    other = {"idx": 1, "name": "1", "path": "1_Router", "type": "sentence_transformers.base.modules.router.Router"}
    (folder / "modules.json").write_text(json.dumps([own, other]))
    with pytest.raises(
        SentembConfigError, match=r"writes sentemb\.st_modules\.SentembEncoder as a folder's only module"
    ):
        checked_modules(folder)


def test_an_exported_sentemb_module_folder_loads_through_the_checked_loader(tmp_path):
    from sentemb.export import export
    from sentemb.st_modules import load_exported_folder

    folder = export(compose_config(CONF_DIR, "export", ["model=tiny", "pooling=prompt", f"out={tmp_path / 'st'}"]))
    model = load_exported_folder(folder, device="cpu")
    sentences = ["a man plays a guitar .", "hi"]
    expected = model[0].encoder.encode(sentences)  # sentemb's encode() of the module built from the folder
    # padded batches (sentence-transformers) against packed ones (sentemb): the same sums in another order
    assert torch.allclose(torch.as_tensor(model.encode(sentences)), torch.as_tensor(expected), atol=1e-5)


def test_sentembs_own_modules_json_passes(tmp_path):
    folder = tmp_path / "exported"
    folder.mkdir()
    own = [{"idx": 0, "name": "0", "path": "", "type": "sentemb.st_modules.SentembEncoder"}]
    (folder / "modules.json").write_text(json.dumps(own))
    assert checked_modules(folder) is True  # sentemb's module: trust_remote_code, which imports only it


@pytest.mark.parametrize("graph", ["../outside.onnx", "/etc/passwd"])
def test_an_onnx_recipe_pointing_outside_its_folder_reads_nothing_there(graph, tmp_path):
    folder = tmp_path / "onnx-export"
    folder.mkdir()
    (tmp_path / "outside.onnx").write_bytes(b"not a graph")
    recipe = {"format": 1, "graphs": {"fp32": graph}, "rows": {"kind": "plain"}, "dimension": 8}
    (folder / "sentemb_onnx.json").write_text(json.dumps(recipe))
    with pytest.raises(ValueError, match="lies outside"):
        OnnxEncoder(folder)
    evaluate_cfg = compose_config(CONF_DIR, "eval", [f"onnx={folder}", "tasks=[STS12]"], tmp_path / "eval")
    from sentemb.eval.suite import evaluate

    with pytest.raises(SentembConfigError, match=r"lies outside.*Fix: export the folder again"):
        evaluate(evaluate_cfg, tmp_path / "eval")


# --- the rule and its readers --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "shape", "message"),
    [
        ({"a": {"b": ["${oc.env:HOME}"]}}, Shape(), r"a\.b holds an interpolation"),
        ({"a": [{"_target_": "os.system"}]}, Shape(), r"a\._target_ names code to build"),
        (
            {"pooling": {"_target_": "os.system; rm"}},
            Shape(targets=("pooling",)),
            r"pooling\._target_ must be a dotted name",
        ),
        ({"a": {1, 2}}, Shape(), "a holds a set"),
        ({"odd": 1}, Shape(keys={"": ("even",)}), r"odd is not a key sentemb reads there \(even\)"),
    ],
)
def test_the_rule_names_the_file_and_the_key(value, shape, message):
    with pytest.raises(SentembConfigError, match=rf"^saved\.json: {message}.*nothing in it was run\. Fix:"):
        checked(value, "saved.json", shape)


def test_the_rule_lets_plain_values_and_declared_text_through():
    value = {
        "pooling": {"_target_": "sentemb.encoders.pooling.CLSPooling"},
        "overrides": ["a=${b}"],
        "x": [1, None],
    }
    assert checked(value, "f", Shape(targets=("pooling",), text=("overrides",))) is value


def test_yaml_tags_build_nothing_and_name_the_line(tmp_path):
    path = tmp_path / "overrides.yaml"
    path.write_text(f"- a=1\n- !!python/object/apply:os.makedirs [{str(tmp_path / 'made')!r}]\n")
    with pytest.raises(SentembConfigError, match=r"overrides\.yaml:2: not YAML that sentemb reads"):
        read_yaml(path)
    assert not (tmp_path / "made").exists()


def write_text(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def record_reader(tmp_path: Path) -> None:
    write_text(tmp_path / "metrics.json", json.dumps({"status": "ok", "metrics": {"x": "${oc.env:HOME}"}}))
    read_record(tmp_path)


def folder_config_reader(tmp_path: Path) -> None:
    config = {
        "pooling": {
            "_target_": "sentemb.encoders.pooling.CLSPooling",
            "mlp": {"_target_": "os.system"},
        }
    }
    read_config(write_text(tmp_path / "sentemb_config.json", json.dumps({**config, "head": None})))


def checkpoint_reader(tmp_path: Path) -> None:
    load_checkpoint_encoder(sentemb_checkpoint(tmp_path / "c.ckpt", pooling={"_target_": "${oc.env:HOME}"}))


def overrides_reader(tmp_path: Path) -> None:
    write_text(tmp_path / ".hydra" / "overrides.yaml", "- !!python/name:os.system ''\n")
    training_command(str(tmp_path / "checkpoints" / "best.ckpt"))


def results_reader(tmp_path: Path) -> None:
    write_text(tmp_path / "run" / "results.json", json.dumps({"sts": {"_target_": "os.system"}}))
    from sentemb.eval.model_card import own_results
    from sentemb.eval.suite import RESULTS_SHAPE

    own_results(str(tmp_path / "run" / "checkpoints" / "best.ckpt"), RESULTS_SHAPE)  # the card's: beside its checkpoint


def evaluation_folder_reader(tmp_path: Path) -> None:
    from sentemb.runs.contenders import contender

    source = {"checkpoint": "${oc.env:SENTEMB_TEST_SECRET}", "pooling": {"name": "mean"}}
    write_text(tmp_path / "eval" / "results.json", json.dumps({"source": source}))
    contender(str(tmp_path / "eval"))


def optuna_reader(tmp_path: Path) -> None:
    from sentemb.runs.optuna_study import OPTUNA_SWEEPER, optuna_sweep

    sweeper = {"_target_": OPTUNA_SWEEPER, "params": {"loss.tau": "${oc.env:HOME}"}}
    write_text(tmp_path / "0" / ".hydra" / "hydra.yaml", json.dumps({"hydra": {"sweeper": sweeper}}))
    optuna_sweep([(tmp_path / "0", {})])


def multirun_reader(tmp_path: Path) -> None:
    from omegaconf import OmegaConf

    from sentemb.runs.jobs import swept_keys

    write_text(tmp_path / "multirun.yaml", "hydra: !!python/object/new:os.system [echo]\n")
    swept_keys(OmegaConf.create({"mode": "MULTIRUN", "sweep": {"dir": str(tmp_path)}, "sweeper": {}}))


def onnx_recipe_reader(tmp_path: Path) -> None:
    from omegaconf import OmegaConf

    from sentemb.eval.suite import onnx_artefact

    write_text(tmp_path / "sentemb_onnx.json", json.dumps({"format": 1, "graphs": {"fp32": "${oc.env:HOME}"}}))
    onnx_artefact(OmegaConf.create({"onnx": str(tmp_path)}))


def wandb_id_reader(tmp_path: Path) -> None:
    from sentemb.runs.wandb_runs import wandb_run_id

    write_text(tmp_path / "wandb_run_id", "../../etc\n")
    wandb_run_id(tmp_path)


def modules_reader(tmp_path: Path) -> None:
    write_text(tmp_path / "modules.json", json.dumps([{"type": "os.system"}]))
    checked_modules(tmp_path)


def teacher_modules_reader(tmp_path: Path) -> None:
    from sentemb.training.teacher import sentence_transformers_folder

    write_text(tmp_path / "modules.json", json.dumps([{"type": "os.system", "path": "${oc.env:SENTEMB_TEST_SECRET}"}]))
    sentence_transformers_folder(tmp_path)


def model_config_reader(tmp_path: Path) -> None:
    from sentemb.encoders.models.model_files import check_model_files

    write_text(tmp_path / "config.json", "[" * 5000 + "]" * 5000)  # deeper than json's recursion
    check_model_files(tmp_path, "model.name_or_path")


def safetensors_header_reader(tmp_path: Path) -> None:
    from sentemb.encoders.models.model_files import check_model_files

    header = json.dumps({"w": {"dtype": "F32", "shape": [10**9], "data_offsets": [0, 4 * 10**9]}}).encode()
    (tmp_path / "model.safetensors").write_bytes(len(header).to_bytes(8, "little") + header)  # no tensor bytes
    write_text(tmp_path / "config.json", json.dumps({"model_type": "bert"}))
    check_model_files(tmp_path, "model.name_or_path")


def adapter_config_reader(tmp_path: Path) -> None:
    from sentemb.st_modules import adapter_config

    config = {"peft_type": "LORA", "r": {"_target_": 1}}
    adapter_config(write_text(tmp_path / "adapter_config.json", json.dumps(config)))


# every function of sentemb that parses a file (found by `file_parsing_calls`) → a payload its reader refuses, or why
# it has none
READERS = {
    ("sentemb/runs/record.py", "read_record"): record_reader,
    ("sentemb/st_modules.py", "read_config"): folder_config_reader,
    ("sentemb/st_modules.py", "checked_modules"): modules_reader,
    ("sentemb/st_modules.py", "adapter_config"): adapter_config_reader,
    ("sentemb/encoders/checkpoint.py", "read_checkpoint"): checkpoint_reader,
    ("sentemb/eval/model_card.py", "training_command"): overrides_reader,
    ("sentemb/eval/model_card.py", "own_results"): results_reader,
    ("sentemb/runs/contenders.py", "evaluation_folder"): evaluation_folder_reader,
    ("sentemb/runs/optuna_study.py", "optuna_sweep"): optuna_reader,
    ("sentemb/runs/jobs.py", "swept_keys"): multirun_reader,
    ("sentemb/eval/suite.py", "onnx_artefact"): onnx_recipe_reader,
    ("sentemb/runs/wandb_runs.py", "read_head"): wandb_id_reader,
    ("sentemb/encoders/models/model_files.py", "folder_json"): model_config_reader,
    ("sentemb/encoders/models/model_files.py", "safetensors_bytes"): safetensors_header_reader,
    ("sentemb/training/teacher.py", "sentence_transformers_folder"): teacher_modules_reader,
}
NOT_CONFIG = {  # files read that are not configuration, each with why the rule is not theirs
    (
        "sentemb/training/teacher.py",
        "file_sha256",
    ): "a teacher's weight file hashed as bytes (its identity), nothing parsed",
    ("sentemb/data/mining_files.py", "read_pairs"): "data rows (texts), read by the labelled reader's own checks; "
    "no value reaches instantiate, a resolver or from_pretrained",
    ("sentemb/common/file_values.py", "read_json"): "the rule's own reader",
    ("sentemb/common/file_values.py", "parse_yaml"): "the rule's own reader",
    ("sentemb/common/file_values.py", "read_yaml"): "the rule's own reader",
    ("sentemb/common/file_values.py", "parse_json"): "the rule's own parser (its callers pass the value through "
    "`checked` or check its exact shape)",
    (
        "sentemb/encoders/serving/onnx_embedder.py",
        "__init__",
    ): "the shipped loader (numpy + onnxruntime only, no sentemb): "
    "its recipe passes the rule in eval.suite.onnx_artefact first, and it refuses graphs outside its folder itself",
    (
        "sentemb/encoders/heads/sarcse.py",
        "corpus_token_frequency",
    ): "a tensor cache, read with torch.load(weights_only=True)",
    ("sentemb/training/checkpoints.py", "load_checkpoint"): "Lightning's resume of a checkpoint read_checkpoint "
    "checked first, weights_only as Lightning passes it (True from sentemb.train)",
    ("sentemb/runs/offline_wandb.py", "config_and_history"): "W&B's own log, read for analysis (notebooks, tests); "
    "never put into a config or built",
    ("sentemb/runs/offline_wandb.py", "summary"): "W&B's own log, read for analysis",
    ("sentemb/losses/registry.py", "loss_config"): "conf/loss/, the package's own configuration",
    ("sentemb/common/config_fields.py", "options_with"): "conf/, the package's own configuration",
    (
        "sentemb/encoders/models/backbones.py",
        "trained_byte_bpe",
    ): "the packaged MiniLM's vocab.txt (or a copy named by a benchmark), words for a tokenizer",
    ("sentemb/eval/sts.py", "read_sts_subset"): "SentEval's data: its own reader checks every line (file:line)",
    ("sentemb/eval/transfer.py", "_lines"): "SentEval's data: sentences and labels, checked by its reader",
    ("sentemb/common/folder_lock.py", "read_holder"): "a lock's holder (host, PID), shown in a refusal only",
    ("sentemb/eval/deployed.py", "cpu_name"): "/proc/cpuinfo, for the model card's machine line",
    ("sentemb/common/memory.py", "meminfo_available"): "/proc/meminfo's MemAvailable, a number: the memory bound",
    ("sentemb/common/memory.py", "cgroup_room"): "the cgroup's memory limit and usage, numbers: the memory bound",
    ("sentemb/download.py", "download"): "a download's bytes, copied into its staging folder (its length checked)",
    ("sentemb/download.py", "write_head"): "the first bytes of a downloaded corpus, copied as the wiki sample",
    ("sentemb/common/published_files.py", "copy_into"): "sentemb's own temporary file, copied under its name",
    ("sentemb/eval/whitening.py", "whitening_corpus"): "a whitening corpus: sentences, decoded as UTF-8 line by line "
    "and hashed, never configuration",
    ("sentemb/encoders/checkpoint.py", "what_else_it_is"): "the first bytes of a file that is no checkpoint, named in "
    "its refusal",
    ("sentemb/st_modules.py", "card_tags"): "an exported folder's model card: the tags of its front matter "
    "(yaml.safe_load, strings only kept), compared with sentemb's to tell a whole export, never built or applied",
    ("sentemb/data/negation.py", "parse_line"): "SNCSE's negation file: data, each line checked to be a list of two "
    "strings (file:line), never configuration",
    ("sentemb/data/formats/json_lines.py", "json_object"): "a labelled JSON-lines row: data, each field checked to "
    "be a non-empty text or a finite score in range (file:line), never configuration",
    ("sentemb/data/labelled.py", "read_file"): "a labelled file's rows (LabelledFile.read): data, checked as above",
    ("sentemb/data/labelled.py", "read_labelled"): "a labelled set's rows (its data.set part's read): data, checked "
    "as above",
    ("sentemb/data/sets/base.py", "read"): "a labelled file's rows (LabelledFile.read): data, checked as above",
    ("sentemb/export.py", "write_export"): "conf/eval.yaml, sentemb's own shipped config (evaluate=true's settings); "
    "the results.json beside a checkpoint is read by model_card.own_results",
    ("sentemb/eval/model_card.py", "run_data"): "a run's .hydra/config.yaml (PyYAML's safe loader): its data node "
    "alone, written into the model card as it was saved (yaml.safe_dump); nothing built, resolved or applied",
    ("sentemb/eval/suite.py", "run_in_domain_note"): "a run's .hydra/config.yaml (PyYAML's safe loader): its "
    "data.source alone, compared as a string with the built-in sets' names; nothing built, resolved or applied",
}
# ".read": a file object's read (or os.read), how a reader takes a file's first bytes or reads it in blocks
PARSERS = (
    "json.load",
    "json.loads",
    "yaml.safe_load",
    "yaml.load",
    "OmegaConf.load",
    "torch.load",
    "read_text",
    ".read",
)
# the rule's own: a function calling them reads a file too
RULE_READERS = ("read_json", "read_yaml", "parse_yaml", "parse_json")


def file_parsing_calls() -> set[tuple[str, str]]:
    """(module path, enclosing function) of every call in sentemb/ that parses a file or reads one as text."""
    root = Path(sentemb.__file__).parent
    found = set()
    for path in root.rglob("*.py"):
        tree_ = ast.parse(path.read_text())
        for function in ast.walk(tree_):
            if not isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            for node in ast.walk(function):
                if isinstance(node, ast.Call) and ast.unparse(node.func).endswith((*PARSERS, *RULE_READERS)):
                    found.add((str(path.relative_to(root.parent)), function.name))
    return found


def test_every_file_reader_is_listed_with_its_payload_or_its_reason():
    found = file_parsing_calls()
    unlisted = found - set(READERS) - set(NOT_CONFIG)
    assert not unlisted, f"a new reader of files: give it the rule and a payload in READERS, or a reason: {unlisted}"
    assert not (set(READERS) | set(NOT_CONFIG)) - found, "a listed reader reads no file any more: drop it"


@pytest.mark.parametrize(
    "record",
    [[{"status": "ok"}], {"metrics": {}}, {"status": "ok", "metrics": [1]}, {"status": "ok", "overrides": "a=1"}],
    ids=["a list", "no status", "metrics a list", "overrides a string"],
)
def test_a_malformed_record_is_named_by_the_sweep_report_and_auto_resume(record, tmp_path, cli, capsys):
    from sentemb.sweep_report import main as sweep_report

    write_text(tmp_path / "sweep" / "0" / "metrics.json", json.dumps(record))
    assert sweep_report([str(tmp_path / "sweep")]) == 1
    assert f"{tmp_path / 'sweep' / '0' / 'metrics.json'}: " in capsys.readouterr().err
    run = tmp_path / "sweep" / "0"
    before = tree(run)
    with pytest.raises(SystemExit, match=r"metrics\.json: .*Fix: restore the file, or move the run directory"):
        cli(["model=tiny", "logger=csv", f"hydra.run.dir={run}"])
    assert tree(run) == before


@pytest.mark.parametrize("reader", sorted(READERS), ids=lambda r: f"{r[0]}:{r[1]}")
def test_each_reader_refuses_its_payload_naming_the_file(reader, tmp_path, monkeypatch):
    monkeypatch.setenv("SENTEMB_TEST_SECRET", SECRET)
    with pytest.raises(SentembConfigError) as err:
        READERS[reader](tmp_path)
    assert str(tmp_path) in str(err.value) and "Fix:" in str(err.value)
    secret_in_no_file(tmp_path)
    assert tree(tmp_path)  # the payload files are still there: nothing was deleted either


@pytest.mark.parametrize("part", ["loss", "optimizer", "scheduler"])
def test_lightnings_load_from_checkpoint_builds_no_foreign_target(part, tmp_path):
    from sentemb.training.module import SentembModule

    made = tmp_path / "made"
    path = sentemb_checkpoint(tmp_path / "c.ckpt")
    checkpoint = torch.load(path, weights_only=True)
    checkpoint["hyper_parameters"][part] = {"_target_": "os.makedirs", "name": str(made)}
    torch.save(checkpoint, path)
    with pytest.raises(SentembConfigError, match=rf"{part}\._target_='os\.makedirs' is not one of .*Fix:"):
        SentembModule.load_from_checkpoint(path)
    with pytest.raises(SentembConfigError, match="hparams_file is not read"):
        SentembModule.load_from_checkpoint(path, hparams_file=str(tmp_path / "h.yaml"))
    assert not made.exists()
