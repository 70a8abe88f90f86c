"""Checkpoints and exported folders written before parts had registry names still load, and embed the same.

Up to commit c963d51 every part config named its class or loader by Python path (`_target_`); today's
name registry names (`name: cls`, sentemb/common/parts.py), and the one migration of stored configs
(`current_part`, sentemb/encoders/checkpoint.py) reads the old paths. The old files are made here from
today's: a tiny run's checkpoint and exported folders, rewritten by `as_written_by_c963d51`.

The table and the rewrite were checked against artefacts c963d51 itself wrote (tiny runs with pooling=cls,
pooling=prompt, pooling=hicl head=sarcse and adapter=lora, and their exports, adapter_only included):
`as_written_by_c963d51` of today's files gives exactly the old checkpoints' hyper_parameters (the same
keys in the same order, `_target_` where `name` stands now; the optimizer and scheduler were `_target_`s
then too and are unchanged) and, byte for byte, the old folders' sentemb_config.json: `_target_` at
pooling and head, and in an adapter_only folder at base.model.backbone and base.model.tokenizer; the
folder's own `model` entry named no code then either. modules.json is unchanged.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

from sentemb.encoders.build import load_checkpoint_encoder
from sentemb.export import export
from sentemb.st_modules import load_adapter_folder, load_exported_folder
from sentemb.training.module import SentembModule
from tests.test_export import compose_export
from tests.test_train import run

# registry name → the `_target_` c963d51 wrote for it, per kind (the loss by its package's re-export, as written)
C963D51_TARGETS = {
    "model.backbone": {"tiny_bert": "sentemb.encoders.backbones.tiny_bert"},
    "model.tokenizer": {"pretrained_tokenizer": "sentemb.encoders.backbones.pretrained_tokenizer"},
    "pooling": {
        "cls": "sentemb.encoders.pooling.CLSPooling",
        "prompt": "sentemb.encoders.pooling.PromptPooling",
        "hicl": "sentemb.encoders.hicl.HiCLPooling",
    },
    "head": {"sarcse": "sentemb.encoders.sarcse.SARCSEHead"},
    "loss": {"infonce": "sentemb.losses.InfoNCE"},
}
SENTENCES = [
    "a man is playing a guitar .", "hi", "two dogs run through a field",
    "Stocks fell sharply on Monday after the central bank raised interest rates for the third time this year.",
]  # fmt: skip
# head=sarcse: a stored head config beside the pooling's; exports as sentemb's own module (sentemb_config.json)
PARTS = ["head=sarcse"]


def old_part(kind: str, node: Any) -> Any:
    """A part config as c963d51 wrote it: its `_target_` where today's `name` stands, the options unchanged."""
    if not isinstance(node, dict):
        return node
    return {
        ("_target_" if k == "name" else k): (C963D51_TARGETS[kind][v] if k == "name" else v) for k, v in node.items()
    }


def old_model(model: Any) -> Any:
    """A model config as c963d51 wrote it: its backbone and tokenizer loaders by `_target_` (a folder's own `model`
    entry, which names no loaders, is left as it is)."""
    if not isinstance(model, dict) or "backbone" not in model:
        return model
    return {k: old_part(f"model.{k}", v) if k in ("backbone", "tokenizer") else v for k, v in model.items()}


def as_written_by_c963d51(config: dict[str, Any]) -> dict[str, Any]:
    """A checkpoint's hyper_parameters (or an exported folder's sentemb_config.json) as c963d51 wrote them."""
    old = {k: old_part(k, v) if k in ("pooling", "head", "loss") else v for k, v in config.items()}
    old["model"] = old_model(old["model"])
    if isinstance(old.get("base"), dict):  # an adapter_only folder: the base's model config
        old["base"] = {**old["base"], "model": old_model(old["base"].get("model"))}
    return old


def rewrite_as_c963d51(path: Path, keep: Path) -> None:
    """The checkpoint at `path` with its hyper_parameters as c963d51 wrote them (today's file kept as `keep`)."""
    checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    path.rename(keep)
    checkpoint["hyper_parameters"] = as_written_by_c963d51(checkpoint["hyper_parameters"])
    torch.save(checkpoint, path)


def test_a_checkpoint_written_by_c963d51_loads_embeds_alike_and_resumes(tiny_overrides, small_stsb, tmp_path):
    overrides = [*tiny_overrides, *PARTS, "trainer.max_steps=2", f"eval.stsb_dir={small_stsb}"]
    run(overrides, tmp_path / "run")
    old, new = tmp_path / "run" / "checkpoints" / "last.ckpt", tmp_path / "today.ckpt"
    rewrite_as_c963d51(old, keep=new)
    stored = torch.load(old, map_location="cpu", weights_only=True)["hyper_parameters"]
    assert stored["pooling"]["_target_"] == "sentemb.encoders.pooling.CLSPooling" and "name" not in stored["pooling"]
    assert stored["loss"]["_target_"] == "sentemb.losses.InfoNCE"

    encoder, _ = load_checkpoint_encoder(old)
    reference, _ = load_checkpoint_encoder(new)
    assert type(encoder.pooling) is type(reference.pooling)
    assert torch.equal(torch.as_tensor(encoder.encode(SENTENCES)), torch.as_tensor(reference.encode(SENTENCES)))

    module = SentembModule.load_from_checkpoint(old, map_location="cpu", weights_only=True)
    assert type(module.loss).__name__ == "InfoNCE" and module.loss.tau == 0.05

    # the same command resumed from the old-format last.ckpt: one more step, written beside it in today's names
    run([*overrides, "trainer.max_steps=3", f"ckpt_path={old}"], tmp_path / "resumed")
    resumed = torch.load(old, map_location="cpu", weights_only=True)
    assert resumed["global_step"] == 3
    assert resumed["hyper_parameters"]["pooling"]["name"] == "cls"


def in_c963d51_format(folder: Path, out: Path) -> Path:
    """A copy of an exported `folder` at `out`, its sentemb_config.json as c963d51 wrote it."""
    shutil.copytree(folder, out)
    config = json.loads((folder / "sentemb_config.json").read_text())
    (out / "sentemb_config.json").write_text(json.dumps(as_written_by_c963d51(config), indent=2) + "\n")
    return out


# tiny_bert has no init seed of its own (tiny_decoder has): a LoRA run's base, redrawn when its best checkpoint is
# rescored, is another one, so the rescore differs from the logged score; nothing here reads that score
@pytest.mark.filterwarnings("ignore:the best checkpoint scores STS-B dev")
def test_exported_folders_written_by_c963d51_load_and_embed_alike(tiny_overrides, small_stsb, tmp_path):
    overrides = [*tiny_overrides, *PARTS, "adapter=lora", "trainer.max_steps=2", f"eval.stsb_dir={small_stsb}"]
    checkpoint = run(overrides, tmp_path / "run")["best_checkpoint"]
    new = export(compose_export([f"checkpoint={checkpoint}", f"out={tmp_path / 'new'}"]))
    assert json.loads((new / "modules.json").read_text())[0]["type"] == "sentemb.st_modules.SentembEncoder"
    old = in_c963d51_format(new, tmp_path / "old")
    assert json.loads((old / "sentemb_config.json").read_text())["head"]["_target_"] == (
        "sentemb.encoders.sarcse.SARCSEHead"
    )
    # the same module, the same sentences in the same batches: one computation, the same floats
    embedded = load_exported_folder(old).encode(SENTENCES, convert_to_tensor=True)
    assert torch.equal(embedded, load_exported_folder(new).encode(SENTENCES, convert_to_tensor=True))

    # adapter_only: the base model's config (backbone and tokenizer loaders) is stored in the folder too
    new = export(compose_export([f"checkpoint={checkpoint}", "adapter_only=true", f"out={tmp_path / 'new_adapter'}"]))
    old = in_c963d51_format(new, tmp_path / "old_adapter")
    base = json.loads((old / "sentemb_config.json").read_text())["base"]["model"]
    assert base["backbone"]["_target_"] == "sentemb.encoders.backbones.tiny_bert"
    embedded = []
    for folder in (old, new):
        torch.manual_seed(0)  # tiny_bert's base is drawn from torch's generator (a real base is a model's folder)
        embedded.append(torch.as_tensor(load_adapter_folder(folder).encode(SENTENCES)))
    assert torch.equal(*embedded)
