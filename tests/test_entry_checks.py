"""Every entry point checks what train checks, before expensive work: a mistyped model folder (train, evaluate,
export), a GPU trainer without a GPU, W&B online without its server, a batch of one, a plain `-m` sweep with a value
the config cannot take. Each is refused with the key and the fix, before any model loads."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from omegaconf import DictConfig, OmegaConf, open_dict, read_write

import sentemb.encoders.models.backbones
import sentemb.evaluate
import sentemb.export
from sentemb.common.errors import SentembConfigError
from sentemb.common.hydra_plumbing import compose_config
from sentemb.common.paths import CONF_DIR
from sentemb.data.datamodule import check_batching
from sentemb.encoders.models.backbones import TOKENIZER_FILES, check_model_source
from sentemb.runs.lifecycle import run_recipe
from sentemb.runs.sweep_check import SweepCheck, check_sweep
from sentemb.runs.wandb_runs import check_wandb_reachable, probe_address
from sentemb.train import train
from sentemb.training.trainer import check_devices, devices_wanted
from tests.conftest import compose_train


@pytest.fixture(autouse=True)
def forbid_model_loading(forbid_model_loading, monkeypatch):
    """conftest's (no backbone or tokenizer loads), and the commands' library calls never reached."""

    def loaded(*args, **kwargs):
        raise AssertionError("the command went on past its checks")

    monkeypatch.setattr(sentemb.evaluate, "evaluate", loaded)
    monkeypatch.setattr(sentemb.export, "export", loaded)


def fails(overrides: list[str], tmp_path: Path) -> str:
    with pytest.raises(SentembConfigError) as err:
        train(compose_train(["model=tiny", "logger=csv", *overrides], output_dir=tmp_path))
    return str(err.value)


# 1. a mistyped local model path: train, evaluate, export


@pytest.mark.parametrize("name", ["./mymodel", "/a/hf/folder", "a/b/c"])
def test_a_path_that_is_no_folder_and_no_hub_name_is_refused(name, tmp_path):
    message = fails([f"model.name_or_path={name}"], tmp_path)
    resolved = Path(name).expanduser().resolve()
    assert message.startswith(f"model.name_or_path={name}: no such folder ({resolved})"), message
    assert "Fix: model.name_or_path=<an existing folder" in message and "model=minilm" in message


def test_a_home_path_is_expanded_in_the_message():
    with pytest.raises(
        SentembConfigError, match=rf"^model.name_or_path=~/no_such_model: no such folder \({Path.home()}/"
    ):
        check_model_source("~/no_such_model")


def test_a_file_is_named_as_a_file(tmp_path):
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(b"")
    message = fails(["model=bert-base", f"model.name_or_path={weights}"], tmp_path)
    assert (
        message.startswith(f"model.name_or_path={weights} is a file")
        and "Fix: model.name_or_path=<the folder" in message
    )


def test_a_folder_without_config_json_is_named_with_the_model_folder_inside_it(tmp_path):
    (tmp_path / "run" / "model").mkdir(parents=True)
    (tmp_path / "run" / "model" / "config.json").write_text("{}")
    message = fails(["model=bert-base", f"model.name_or_path={tmp_path / 'run'}"], tmp_path)
    assert message.startswith(f"model.name_or_path={tmp_path / 'run'}: the folder has no config.json")
    assert f"Fix: model.name_or_path=<the folder that holds config.json> (found in: {tmp_path / 'run' / 'model'})" in (
        message
    )


def test_a_tokenizer_folder_needs_a_tokenizer_file_and_names_its_own_key(tmp_path):
    with pytest.raises(SentembConfigError, match=r"^model.tokenizer.name_or_path=.*no tokenizer_config.json or "):
        check_model_source(str(tmp_path), "model.tokenizer.name_or_path", TOKENIZER_FILES)
    (tmp_path / "tokenizer.json").write_text("{}")
    check_model_source(str(tmp_path), "model.tokenizer.name_or_path", TOKENIZER_FILES)


def command_config(name: str, overrides: list[str]) -> DictConfig:
    return compose_config(CONF_DIR, name, overrides)


@pytest.mark.parametrize(
    ("command", "config", "overrides"),
    [
        (sentemb.evaluate, "eval", ["pooling=mean", "tasks=[STS12]"]),
        (sentemb.export, "export", ["out={tmp}/out"]),
    ],
    ids=["evaluate", "export"],
)
def test_evaluate_and_export_refuse_a_missing_model_folder(command, config, overrides, tmp_path):
    cfg = command_config(config, ["model.name_or_path=/nonexistent", *(o.format(tmp=tmp_path) for o in overrides)])
    with pytest.raises(SystemExit) as stop:
        command.main.__wrapped__(cfg)  # the command's body, without Hydra's argv parsing
    assert str(stop.value.code).startswith("sentemb: model.name_or_path=/nonexistent: no such folder (/nonexistent)")
    assert "Fix: " in str(stop.value.code)
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
@pytest.mark.parametrize("command", ["evaluate", "export"])
def test_the_commands_print_the_refusal_without_a_traceback(command, tmp_path):
    extra = ["pooling=mean", "tasks=[STS12]"] if command == "evaluate" else [f"out={tmp_path}/out"]
    run = [sys.executable, "-m", f"sentemb.{command}", "model.name_or_path=/nonexistent", *extra]
    result = subprocess.run([*run, f"hydra.run.dir={tmp_path}/run"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr[-2000:]
    assert result.stderr.strip().splitlines()[-1].startswith("sentemb: model.name_or_path=/nonexistent: no such folder")
    assert not (tmp_path / "out").exists()


# 2. a GPU trainer without the GPUs


def no_gpu(monkeypatch: pytest.MonkeyPatch, cuda: int = 0, mps: bool = False) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: cuda)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: mps)


@pytest.mark.parametrize("trainer", ["gpu", "ddp"])
def test_a_gpu_trainer_without_a_gpu_is_refused(trainer, tmp_path, monkeypatch):
    no_gpu(monkeypatch)
    message = fails([f"trainer={trainer}"], tmp_path)
    assert message.startswith(
        "trainer.accelerator=gpu (trainer=gpu / trainer=ddp / trainer=fsdp): no CUDA GPU is visible"
    )
    assert "Fix: trainer=default (or trainer=cpu)" in message and "trainer=ddp trainer.accelerator=cpu" in message


def test_more_gpus_than_visible_are_refused(tmp_path, monkeypatch):
    no_gpu(monkeypatch, cuda=1)
    message = fails(["trainer=ddp"], tmp_path)  # devices: 2
    assert message.startswith("trainer.devices=2 needs 2 gpu devices but 1 is visible. Fix: trainer.devices=1")


def test_mps_without_mps_is_refused(monkeypatch):
    no_gpu(monkeypatch)
    with pytest.raises(SentembConfigError, match=r"^trainer.accelerator=mps: .*Fix: trainer=default"):
        check_devices({"accelerator": "mps", "devices": 1})


def test_cpu_trainers_pass_without_a_gpu(monkeypatch):
    no_gpu(monkeypatch)
    ddp_on_cpu = compose_train(["trainer=ddp", "trainer.accelerator=cpu"]).trainer  # the tests' DDP
    for trainer in (ddp_on_cpu, {"accelerator": "cpu", "devices": 1}, {"accelerator": "auto", "devices": 1}):
        check_devices(trainer)
    no_gpu(monkeypatch, cuda=2)
    check_devices({**OmegaConf.to_container(ddp_on_cpu), "accelerator": "gpu"})


@pytest.mark.parametrize(
    ("devices", "wanted"), [(1, 1), (2, 2), (-1, 0), ("auto", 0), ("3", 3), ("0,3", 4), ([1], 2), (None, 0)]
)
def test_devices_wanted(devices, wanted):
    assert devices_wanted(devices) == wanted


# 3. W&B online without its server


@pytest.fixture
def wandb_online(monkeypatch: pytest.MonkeyPatch) -> str:
    """W&B configured online by an API key in the environment, no proxy; returns the (fake) key."""
    for name in ("WANDB_MODE", "HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    key = "fake0key0for0the0test0only"
    monkeypatch.setenv("WANDB_API_KEY", key)
    return key


def closed_port() -> int:
    """A local port nobody listens on: connecting is refused at once."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_wandb_online_without_its_server_is_refused_at_once(wandb_online, monkeypatch):
    port = closed_port()
    monkeypatch.setenv("WANDB_BASE_URL", f"http://127.0.0.1:{port}")
    cfg = compose_train(["model=tiny"])  # logger=wandb, mode ${wandb_mode:}: online with the key
    started = time.perf_counter()
    with pytest.raises(SentembConfigError) as err:
        check_wandb_reachable(cfg.logger)
    assert time.perf_counter() - started < 1.0
    message = str(err.value)
    assert message.startswith("logger.wandb logs online (WANDB_API_KEY is set and WANDB_MODE is not)")
    assert f"(127.0.0.1:{port}) does not answer" in message
    assert "Fix: WANDB_MODE=offline" in message and "wandb sync" in message and "logger=csv" in message
    assert wandb_online not in message


def test_train_refuses_wandb_online_without_its_server_before_the_model_loads(wandb_online, tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_BASE_URL", f"http://127.0.0.1:{closed_port()}")
    with pytest.raises(SentembConfigError, match=r"^logger.wandb logs online .*Fix: WANDB_MODE=offline"):
        run_recipe(compose_train(["model=tiny"], output_dir=tmp_path), train)  # as a job runs it


def test_wandb_online_with_its_server_passes(wandb_online, monkeypatch):
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        monkeypatch.setenv("WANDB_BASE_URL", f"http://127.0.0.1:{server.getsockname()[1]}")
        check_wandb_reachable(compose_train(["model=tiny"]).logger)


@pytest.mark.parametrize("setting", ["no key", "WANDB_MODE=offline", "logger=csv", "logger=none"])
def test_offline_or_no_wandb_is_never_probed(setting, wandb_online, monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("an offline logger opened a connection")

    monkeypatch.setattr(socket, "create_connection", refuse)
    if setting == "no key":
        monkeypatch.delenv("WANDB_API_KEY")
    if setting == "WANDB_MODE=offline":
        monkeypatch.setenv("WANDB_MODE", "offline")
    check_wandb_reachable(compose_train(["model=tiny", *([setting] if setting.startswith("logger") else [])]).logger)


def test_the_probe_goes_to_the_proxy_when_one_is_set(monkeypatch):
    monkeypatch.delenv("no_proxy", raising=False)
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.setenv("https_proxy", "http://proxy.example:3128")
    assert probe_address("https://api.wandb.ai") == ("proxy.example", 3128)
    monkeypatch.delenv("https_proxy")
    monkeypatch.delenv("HTTPS_PROXY", raising=False)
    assert probe_address("https://api.wandb.ai") == ("api.wandb.ai", 443)
    assert probe_address("http://localhost:8080") == ("localhost", 8080)


# 4. a batch of one


def test_a_batch_of_one_is_refused(tmp_path):
    message = fails(["data.batch_size=1"], tmp_path)
    assert message.startswith("data.batch_size=1: the other sentences of a batch are its negatives")
    assert "Fix: data.batch_size=64" in message


def test_batching_limits():
    check_batching(2, 1)
    with pytest.raises(SentembConfigError, match=r"^data.max_length=0 must be >= 1"):
        check_batching(2, 0)
    with pytest.raises(SentembConfigError, match=r"^data.batch_size=0: "):
        check_batching(0, 32)


# 5. a plain -m sweep


def multirun(base: list[str], sweeps: list[str], tmp_path: Path) -> DictConfig:
    """The config `python -m sentemb.train -m <base> <sweeps>` hands its callbacks: composed without the sweeps,
    which Hydra keeps in hydra.overrides.task."""
    cfg = compose_train(base, tmp_path)
    with read_write(cfg.hydra), open_dict(cfg.hydra):
        cfg.hydra.overrides.task = [*base, *sweeps]
    return cfg


def sweep_refused(base: list[str], sweeps: list[str], tmp_path: Path) -> str:
    with pytest.raises(SentembConfigError) as err:
        check_sweep(multirun(base, sweeps, tmp_path))
    return str(err.value)


def test_a_swept_value_the_config_cannot_take_is_refused(tmp_path):
    message = sweep_refused(["model=tiny"], ["loss.tau=0.05,0"], tmp_path)
    assert message.startswith("the command line: the job with loss.tau=0 would fail: loss.tau=0 must be a number > 0")


def test_a_swept_key_the_config_lacks_is_refused(tmp_path):
    message = sweep_refused(["model=tiny"], ["loss.m=0.3,0.4", "seed=1,2"], tmp_path)
    assert message.startswith("the command line sweeps loss.m, which loss=infonce does not have. Fix: a loss with m")


def test_a_plain_sweep_passes_and_lists_its_values(tmp_path):
    values = check_sweep(multirun(["model=tiny"], ["loss.tau=0.05,0.1", "seed=range(1,3)", "+loss.extra=1"], tmp_path))
    assert values == {"loss.tau": [0.05, 0.1], "seed": [1, 2]}


def test_swept_groups_are_composed_and_each_checked(tmp_path):
    assert check_sweep(multirun(["model=tiny"], ["loss=mmhe,mbarlow", "loss.m=0.2,0.4"], tmp_path)) == {
        "loss": ["mmhe", "mbarlow"],
        "loss.m": [0.2, 0.4],
    }


def test_a_key_one_swept_group_option_lacks_is_refused(tmp_path):
    message = sweep_refused(["model=tiny"], ["loss=mmhe,infonce", "loss.m=0.2,0.4"], tmp_path)
    assert message.startswith("the command line sweeps loss.m, which loss=infonce does not have (the jobs with loss")


def test_a_swept_group_option_that_does_not_exist_is_refused(tmp_path):
    message = sweep_refused(["model=tiny"], ["loss=infonce,nope"], tmp_path)
    assert message.startswith("the sweep: the jobs with loss=nope do not compose (") and "Fix: " in message


def test_the_callback_is_registered_once_for_every_training_command(tmp_path):
    for overrides in ([], ["hparams_search=optuna"]):
        callbacks = compose_train(overrides, tmp_path).hydra.callbacks.values()
        targets = [str(c.get("_target_")) for c in callbacks]
        assert targets.count("sentemb.runs.sweep_check.SweepCheck") == 1, targets


def test_the_callback_stops_the_multirun_with_the_message(tmp_path):
    with pytest.raises(SystemExit) as stop:
        SweepCheck().on_multirun_start(multirun(["model=tiny"], ["loss.tau=0.05,0"], tmp_path), config_name="train")
    assert str(stop.value.code).startswith("sentemb: the command line: the job with loss.tau=0 would fail")


@pytest.mark.slow
def test_a_refused_plain_sweep_starts_no_job(tmp_path):
    command = [sys.executable, "-m", "sentemb.train", "-m", "model=tiny", "loss.tau=0.05,0"]
    result = subprocess.run([*command, f"hydra.sweep.dir={tmp_path}/s"], capture_output=True, text=True, timeout=300)
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr[-2000:]
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("sentemb: the command line: the job with loss.tau=0 would fail: loss.tau=0 must be")
    assert not (tmp_path / "s" / "0").exists() and not list(tmp_path.rglob("metrics.json")), "no job started"


def test_the_sweep_check_leaves_the_config_it_checks_as_it_was(tmp_path):
    cfg = multirun(["model=tiny"], ["loss.tau=0.05,0.1"], tmp_path)
    before = OmegaConf.to_yaml(cfg, resolve=False)
    check_sweep(cfg)
    assert OmegaConf.to_yaml(cfg, resolve=False) == before
