"""LoRA adapters (adapter=lora, peft): what trains, what checkpoints hold, resume, evaluation, export, model.init_from.

One 6-step LoRA run of tiny-llama with latent pooling (`trained`: its pooling has weights, so every
folder and checkpoint below carries the pooling too) serves most tests; the checkpoint-size test
trains a wider model both ways. Tiny random decoders built in-process: no downloads.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import lightning as L
import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from sentemb.common.errors import SentembConfigError
from sentemb.common.hydra_plumbing import compose_config, resolved_container
from sentemb.common.paths import CONF_DIR
from sentemb.encoders.build import build_encoder, load_checkpoint_encoder
from sentemb.encoders.models.adapters import merged
from sentemb.encoders.models.decoders import attends_forward, tiny_decoder, tiny_decoder_tokenizer
from sentemb.eval.suite import load_encoder
from sentemb.export import export
from sentemb.st_modules import SentembEncoder, load_adapter_folder
from sentemb.training.module import SentembModule
from tests.conftest import compose_train
from tests.test_export import SENTENCES, assert_same_embeddings, compose_export, encode_in_fresh_process
from tests.test_resume import StopAfter, logged
from tests.test_safe_loading import sentemb_checkpoint
from tests.test_train import run, train_with

# latent pooling with trained weights of its own, small enough for a 32-wide model
LATENT = ["pooling=latent", "pooling.num_latents=8", "pooling.num_heads=2", "pooling.intermediate_size=64"]
LORA = ["model=tiny-llama", *LATENT, "adapter=lora"]
ADAPTER_WEIGHT = (".lora_A.", ".lora_B.")


def is_adapter_weight(name: str) -> bool:
    return any(part in name for part in ADAPTER_WEIGHT)


def data_overrides(root: Path, data_root: Path) -> list[str]:
    """300 wiki sentences and 200 STS-B dev/test pairs (conftest's small_corpus / small_stsb, for a module fixture)."""
    root.mkdir(parents=True, exist_ok=True)
    lines = (data_root / "wiki" / "wiki1m_head.txt").read_text(encoding="utf-8").splitlines()[:300]
    (root / "corpus.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    stsb = data_root / "senteval" / "downstream" / "STS" / "STSBenchmark"
    (root / "stsb").mkdir(exist_ok=True)
    for split in ("dev", "test"):
        rows = (stsb / f"sts-{split}.csv").read_text(encoding="utf-8").splitlines(keepends=True)[:200]
        (root / "stsb" / f"sts-{split}.csv").write_text("".join(rows), encoding="utf-8")
    # mid-epoch (37 batches an epoch), dropout on (attention 0.1, LoRA 0.05), every step's loss logged
    return [
        "logger=csv", f"data.corpus={root / 'corpus.txt'}", f"eval.stsb_dir={root / 'stsb'}", "data.batch_size=8",
        "trainer.max_steps=6", "eval.every_n_steps=3", "eval.at_start=false", "trainer.log_every_n_steps=1",
    ]  # fmt: skip


class Capture(L.Callback):
    """The module's weights when training starts and ends, what the optimizer updates, and the trained encoder's
    embeddings of SENTENCES (what every loader of its checkpoint must give)."""

    def on_train_start(self, trainer: L.Trainer, module: L.LightningModule) -> None:
        self.start = {k: v.detach().clone() for k, v in module.state_dict().items()}
        names = {id(p): n for n, p in module.named_parameters()}
        self.optimized = {names[id(p)] for group in trainer.optimizers[0].param_groups for p in group["params"]}
        self.trainable = {n for n, p in module.named_parameters() if p.requires_grad}

    def on_train_end(self, trainer: L.Trainer, module: L.LightningModule) -> None:
        self.end = {k: v.detach().clone() for k, v in module.state_dict().items()}
        self.embeddings = module.encoder.encode(SENTENCES)


@dataclass
class TrainedRun:
    overrides: list[str]
    folder: Path
    capture: Capture

    @property
    def last(self) -> Path:
        return self.folder / "checkpoints" / "last.ckpt"


@pytest.fixture(scope="module")
def lora_data(tmp_path_factory, data_root) -> list[str]:
    return data_overrides(tmp_path_factory.mktemp("data"), data_root)


@pytest.fixture(scope="module")
def trained(lora_data, tmp_path_factory) -> TrainedRun:
    """A 6-step LoRA run of tiny-llama (bidirectional, dropout on) with latent pooling; ~4 s."""
    overrides = [*LORA, *lora_data]
    capture = Capture()
    folder = tmp_path_factory.mktemp("lora") / "full"
    train_with(overrides, folder, capture)
    return TrainedRun(overrides, folder, capture)


def model_config(overrides: list[str]) -> tuple[dict, dict, dict | None]:
    cfg = compose_train(overrides)
    return resolved_container(cfg.model), resolved_container(cfg.pooling), resolved_container(cfg.get("adapter"))


# ------------------------------------------------------------------ what trains


@pytest.mark.parametrize(
    "overrides",
    [LORA, ["model=tiny", "pooling=cls", "adapter=lora", "adapter.r=4"]],  # a decoder with latent pooling; BERT + MLP
    ids=["tiny-llama-latent", "tiny-bert-cls-mlp"],
)
def test_only_the_adapter_and_the_pooling_train(overrides):
    module = SentembModule.from_config(compose_train(overrides))
    trainable = {n for n, p in module.named_parameters() if p.requires_grad}
    adapter = {n for n, _ in module.named_parameters() if is_adapter_weight(n)}
    pooling = {n for n, _ in module.named_parameters() if n.startswith("encoder.pooling.")}
    assert adapter and pooling, "the config has adapter and pooling weights"
    assert trainable == adapter | pooling, sorted(trainable ^ (adapter | pooling))[:5]
    # every linear projection has its adapter (LLM2Vec's all-linear), the embeddings none
    adapted = {n.split(".lora_")[0] for n in adapter}
    linears = {
        n.removesuffix(".base_layer")
        for n, m in module.encoder.backbone.named_modules()
        if isinstance(m, torch.nn.Linear) and n.endswith(".base_layer")
    }
    assert adapted == {f"encoder.backbone.{n}" for n in linears} and len(adapted) >= 2 * 4


def test_training_changes_the_adapter_and_the_pooling_only(trained):
    start, end, capture = trained.capture.start, trained.capture.end, trained.capture
    assert capture.optimized == capture.trainable, "the optimizer updates exactly the trainable parameters"
    assert all(is_adapter_weight(n) or n.startswith("encoder.pooling.") for n in capture.optimized)
    changed = {k for k in start if not torch.equal(start[k], end[k])}
    # bit-identical: nothing but the adapter and the pooling was written to (peft froze the base)
    assert changed <= capture.optimized, sorted(changed - capture.optimized)[:5]
    assert any(".lora_B." in k for k in changed) and any(k.startswith("encoder.pooling.") for k in changed)
    base = [k for k in end if k.startswith("encoder.backbone.") and not is_adapter_weight(k)]
    assert base and all(torch.equal(start[k], end[k]) for k in base)
    # and the base is the one the config builds (init_seed), so an adapter checkpoint rebuilds it exactly
    fresh = build_encoder(*model_config(trained.overrides)[:2]).backbone.state_dict()
    for key in base:
        plain = key.removeprefix("encoder.backbone.base_model.model.").replace(".base_layer.", ".")
        assert torch.equal(end[key], fresh[plain]), key


# ------------------------------------------------------------------ checkpoints


def test_the_adapter_checkpoint_holds_the_trained_weights_only_and_is_under_5_percent_of_a_full_one(
    lora_data, tmp_path
):
    """Same model both ways, wide enough that an adapter is small beside it as in a real LLM: hidden 256, r=4
    (r / hidden = 1/64; Qwen3-0.6B at LLM2Vec's r=16 is 1/64 too, its adapter ~1.7% of the model). The default
    tiny-llama is 32 wide, where r=16 gives adapters half the size of the layers: no meaningful ratio. ~6 s."""
    wide = ["model=tiny-llama", "pooling=last_token", "model.backbone.hidden_size=256",
            "model.backbone.intermediate_size=512", "trainer.max_steps=1", "eval.every_n_steps=1"]  # fmt: skip
    run([*lora_data, *wide, "adapter=lora", "adapter.r=4", "adapter.alpha=8"], tmp_path / "lora")
    run([*lora_data, *wide], tmp_path / "full")
    lora, full = (tmp_path / name / "checkpoints" / "last.ckpt" for name in ("lora", "full"))
    ratio = lora.stat().st_size / full.stat().st_size
    assert ratio < 0.05, (
        f"adapter checkpoint {lora.stat().st_size} B is {ratio:.1%} of the full {full.stat().st_size} B"
    )
    checkpoint = torch.load(lora, map_location="cpu", weights_only=True)
    assert checkpoint["state_dict"] and all(is_adapter_weight(k) for k in checkpoint["state_dict"])
    assert checkpoint["base_model"]["name"] == "tiny-decoder" and len(checkpoint["base_model"]["config_sha256"]) == 64


def test_a_run_stopped_after_step_3_and_resumed_equals_the_uninterrupted_run(trained, tmp_path):
    """~5 s: the stopped and the resumed halves (the uninterrupted run is `trained`)."""
    train_with(trained.overrides, tmp_path / "stopped", StopAfter(3))
    last = tmp_path / "stopped" / "checkpoints" / "last.ckpt"
    assert torch.load(last, map_location="cpu", weights_only=True)["global_step"] == 3
    run([*trained.overrides, f"ckpt_path={last}"], tmp_path / "resumed")  # writes last.ckpt where it resumed from

    losses = logged(trained.folder, "train/loss")
    stopped, after = logged(tmp_path / "stopped", "train/loss"), logged(tmp_path / "resumed", "train/loss")
    assert len(losses) == 6 and sorted(stopped) == sorted(losses)[:3] and sorted(after) == sorted(losses)[3:]
    # the same computation on bit-identical base, adapter, optimizer, data position and RNG: equal, not close
    assert {**stopped, **after} == losses
    full, resumed = (torch.load(p, map_location="cpu", weights_only=True) for p in (trained.last, last))
    assert resumed["global_step"] == full["global_step"] == 6
    assert full["state_dict"].keys() == resumed["state_dict"].keys()
    for key, value in full["state_dict"].items():
        assert torch.equal(value, resumed["state_dict"][key]), key
    for key, value in full["optimizer_states"][0]["state"].items():
        for name, tensor in value.items():
            assert torch.equal(tensor, resumed["optimizer_states"][0]["state"][key][name]), (key, name)


def test_the_checkpoint_loads_for_evaluation_as_the_trained_encoder(trained, tmp_path):
    encoder, hparams = load_checkpoint_encoder(trained.last)
    assert hparams["adapter"]["r"] == 16
    # base rebuilt from its config, trained weights from the file: the trained module's computation, bit for bit
    np.testing.assert_array_equal(encoder.encode(SENTENCES), trained.capture.embeddings)
    cfg = compose_config(CONF_DIR, "eval", [f"checkpoint={trained.last}"], tmp_path / "eval")
    through_evaluate, _, _ = load_encoder(cfg, torch.device("cpu"))  # what python -m sentemb.evaluate loads
    np.testing.assert_array_equal(through_evaluate.encode(SENTENCES), trained.capture.embeddings)
    saved = torch.load(trained.last, map_location="cpu", weights_only=True)["state_dict"]
    for key, value in saved.items():
        assert torch.equal(value, trained.capture.end[key]), key


def test_a_checkpoint_of_another_base_is_refused_wherever_it_is_loaded(trained, tmp_path):
    checkpoint = torch.load(trained.last, map_location="cpu", weights_only=True)
    checkpoint["base_model"]["config_sha256"] = "0" * 64  # the adapter of a base whose config differs
    other = tmp_path / "other-base.ckpt"
    torch.save(checkpoint, other)
    refused = "its adapter was trained on a base model whose config differs from tiny-decoder as loaded now"
    with pytest.raises(SentembConfigError, match=f"checkpoint: {refused}") as err:
        load_checkpoint_encoder(other)
    assert "(config fingerprint 000000000000 vs " in str(err.value) and "Fix: load the base model" in str(err.value)
    model, pooling, _ = model_config(trained.overrides)
    with pytest.raises(SentembConfigError, match=f"model.init_from={other}: {refused}"):
        build_encoder({**model, "init_from": str(other)}, pooling)
    for best in Path(trained.last).parent.glob("best-*.ckpt"):  # beside it, as resuming a copied checkpoint needs
        shutil.copy(best, tmp_path)
    with pytest.raises(SentembConfigError, match=f"ckpt_path={other}: {refused}"):  # resuming, through the Trainer
        run([*trained.overrides, f"ckpt_path={other}"], tmp_path / "resumed")


def test_a_base_folder_replaced_by_another_model_is_refused(tmp_path):
    """A pretrained decoder from a folder (model=qwen3-0.6b model.name_or_path=<folder>); the folder then holds a model
    whose config differs: the adapter checkpoint is refused, not loaded onto it. ~2 s."""
    folder = tmp_path / "qwen3"
    tiny_decoder(family="qwen3").save_pretrained(folder)
    tiny_decoder_tokenizer("qwen3").save_pretrained(folder)
    module = SentembModule.from_config(
        compose_train(["model=qwen3-0.6b", f"model.name_or_path={folder}", "pooling=last_token", "adapter=lora"])
    )
    checkpoint = {"state_dict": module.state_dict(), "hyper_parameters": dict(module.hparams)}
    checkpoint |= {"pytorch-lightning_version": L.__version__, "epoch": 0, "global_step": 0}
    module.on_save_checkpoint(checkpoint)
    torch.save(checkpoint, tmp_path / "lora.ckpt")
    encoder, _ = load_checkpoint_encoder(tmp_path / "lora.ckpt")
    np.testing.assert_array_equal(encoder.encode(SENTENCES), module.encoder.encode(SENTENCES))

    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(config | {"rms_norm_eps": 1e-5}))  # another model, same name
    with pytest.raises(SentembConfigError, match="whose config differs from qwen3 as loaded now"):
        load_checkpoint_encoder(tmp_path / "lora.ckpt")


def test_init_from_an_adapter_checkpoint_starts_from_the_base_with_the_adapter_merged(trained):
    model, pooling, adapter = model_config(trained.overrides)
    stage1, _ = load_checkpoint_encoder(trained.last)
    expected = merged(stage1.backbone).state_dict()  # peft's merge_and_unload of the trained adapter
    fresh = tiny_decoder(bidirectional=True).state_dict()
    assert not torch.equal(expected["layers.0.self_attn.q_proj.weight"], fresh["layers.0.self_attn.q_proj.weight"])

    full = build_encoder({**model, "init_from": str(trained.last)}, pooling).backbone  # stage 2: full fine-tuning
    assert full.state_dict().keys() == expected.keys()
    for key, value in full.state_dict().items():  # the same merge of the same weights: equal, not close
        assert torch.equal(value, expected[key]), key
    assert all(p.requires_grad for p in full.parameters()), "stage 2 without an adapter trains the whole model"
    assert not any(is_adapter_weight(n) for n, _ in full.named_parameters())

    lora = build_encoder({**model, "init_from": str(trained.last)}, pooling, adapter=adapter).backbone  # stage 2: LoRA
    base = lora.get_base_model().state_dict()
    for key, value in expected.items():
        assert torch.equal(base[key.replace("_proj.weight", "_proj.base_layer.weight")], value), key
    new = {n: p for n, p in lora.named_parameters() if ".lora_B." in n}
    assert new and all(p.requires_grad and not p.any() for p in new.values()), "a fresh adapter (B = 0)"


# ------------------------------------------------------------------ export


def test_the_merged_export_embeds_as_the_adapter_model_and_loads_bidirectional(trained, tmp_path):
    from sentence_transformers import SentenceTransformer
    from transformers import AutoModel

    cfg = compose_export([f"checkpoint={trained.last}", f"out={tmp_path / 'st'}"])
    folder = export(cfg)
    adapter_model, _, _ = load_encoder(cfg, torch.device("cpu"))
    assert "SentembEncoder" in (folder / "modules.json").read_text()
    assert json.loads((folder / "sentemb_config.json").read_text())["model"] == {
        "loader": "decoder", "bidirectional": True, "padding_side": "left", "padding_free": True,
    }  # fmt: skip
    weights = load_file(folder / "model.safetensors")
    assert "layers.0.self_attn.q_proj.weight" in weights and not any("lora" in k for k in weights), "merged"
    assert set(load_file(folder / "sentemb_pooling.safetensors")) >= {"latents", "mlp.0.weight"}
    assert json.loads((folder / "config.json").read_text())["is_causal"] is False
    assert attends_forward(AutoModel.from_pretrained(folder)), "transformers alone loads the folder bidirectional"

    model = SentenceTransformer(str(folder), device="cpu", trust_remote_code=True)
    assert attends_forward(model[0].encoder.backbone)
    # the adapter's product B·A added into W once (float32): the last bits differ from computing it beside W
    assert_same_embeddings(model.encode(SENTENCES, convert_to_numpy=True), adapter_model.encode(SENTENCES), "merged")
    card = (folder / "README.md").read_text()
    assert "# sentemb-tiny-decoder-latent-lora-infonce-full\n" in card
    assert "Trained with a LoRA adapter (r=16, alpha=32), merged here into the base weights" in card
    assert "Attention: bidirectional, as trained (`is_causal: false` in config.json" in card


@pytest.mark.parametrize(("bidirectional", "pooling"), [(True, "mean"), (False, "last_token")])
def test_decoder_exports_use_sentembs_module_and_keep_their_attention(bidirectional, pooling, tmp_path):
    """Untrained tiny-llama exports: mean pooling too goes through sentemb's module (position ids under left padding);
    the folder's config.json keeps is_causal, and the folder loads the way it was built. ~2 s each."""
    from sentence_transformers import SentenceTransformer
    from transformers import AutoModel

    cfg = compose_export(["model=tiny-llama", f"model.bidirectional={bidirectional}", f"pooling={pooling}",
                          f"out={tmp_path / 'st'}"])  # fmt: skip
    folder = export(cfg)
    assert "SentembEncoder" in (folder / "modules.json").read_text()
    assert json.loads((folder / "config.json").read_text())["is_causal"] is not bidirectional
    assert attends_forward(AutoModel.from_pretrained(folder)) is bidirectional
    model = SentenceTransformer(str(folder), device="cpu", trust_remote_code=True)
    assert attends_forward(model[0].encoder.backbone) is bidirectional
    ours = load_encoder(cfg, torch.device("cpu"))[0].encode(SENTENCES)
    assert_same_embeddings(model.encode(SENTENCES, convert_to_numpy=True), ours, pooling)


@pytest.mark.slow  # a fresh interpreter: ~15 s
def test_exported_lora_and_decoder_folders_load_in_a_fresh_process_without_training_code(trained, tmp_path):
    folders, expected = [], []
    for name, overrides in {
        "merged": [f"checkpoint={trained.last}"],
        "causal": ["model=tiny-llama", "model.bidirectional=false", "pooling=last_token"],
    }.items():
        cfg = compose_export([*overrides, f"out={tmp_path / name}"])
        folders.append(export(cfg))
        expected.append(load_encoder(cfg, torch.device("cpu"))[0].encode(SENTENCES))
    for folder, st, ours in zip(folders, encode_in_fresh_process(folders), expected, strict=True):
        assert_same_embeddings(st, ours, folder.name)


def test_the_adapter_only_export_loads_with_peft_on_its_base_and_embeds_as_the_adapter_model(trained, tmp_path):
    from peft import PeftModel

    folder = export(compose_export([f"checkpoint={trained.last}", "adapter_only=true", f"out={tmp_path / 'adapter'}"]))
    files = {p.name for p in folder.iterdir()}
    assert {"adapter_config.json", "adapter_model.safetensors", "sentemb_config.json", "sentemb_pooling.safetensors",
            "README.md", "tokenizer.json"} <= files  # fmt: skip
    assert not files & {"model.safetensors", "modules.json"}, "no base weights, not a sentence-transformers folder"
    trained_encoder, _ = load_checkpoint_encoder(trained.last)

    # peft alone, on the base built as the run built it (tiny_decoder's init_seed; bidirectional)
    peft_model = PeftModel.from_pretrained(tiny_decoder(bidirectional=True, dropout=0.1), str(folder))
    ours = trained_encoder.backbone.state_dict()
    assert peft_model.state_dict().keys() == ours.keys()
    for key, value in peft_model.state_dict().items():
        assert torch.equal(value, ours[key]), key
    assert attends_forward(peft_model)

    # sentemb's loader: base rebuilt from the folder's config, fingerprint checked, adapter and pooling loaded
    encoder = load_adapter_folder(folder)
    np.testing.assert_array_equal(encoder.encode(SENTENCES), trained.capture.embeddings)  # the same computation
    card = (folder / "README.md").read_text()
    fingerprint = json.loads((folder / "sentemb_config.json").read_text())["base"]["config_sha256"]
    assert "library_name: peft" in card and f"- base model: `tiny-decoder` (config fingerprint `{fingerprint}`" in card
    assert "load_adapter_folder('<this folder>')" in card and "load the base with `is_causal=False`" in card

    with pytest.raises(SentembConfigError, match="holds a LoRA adapter without its base model"):
        SentembEncoder.load(str(folder))  # sentence-transformers' loader names the right one
    config = json.loads((folder / "sentemb_config.json").read_text())
    config["base"]["config_sha256"] = "f" * 64
    (folder / "sentemb_config.json").write_text(json.dumps(config))
    with pytest.raises(SentembConfigError, match=r"sentemb_config.json: the adapter was trained on a base model whose"):
        load_adapter_folder(folder)


def test_adapter_only_without_an_adapter_checkpoint_is_refused_before_any_model_loads(tmp_path, forbid_model_loading):
    with pytest.raises(SentembConfigError, match="adapter_only=true writes the LoRA adapter a run trained: it needs"):
        export(compose_export(["model=tiny", "adapter_only=true", f"out={tmp_path / 'a'}"]))
    checkpoint = sentemb_checkpoint(tmp_path / "full.ckpt")
    with pytest.raises(SentembConfigError, match=r"was trained without an adapter \(adapter: null\).*Fix: drop"):
        export(compose_export([f"checkpoint={checkpoint}", "adapter_only=true", f"out={tmp_path / 'b'}"]))
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_an_exported_folders_model_entry_names_no_code(tmp_path):
    folder = tmp_path / "st"
    folder.mkdir()
    pooling = {"_target_": "sentemb.encoders.poolings.decoder_poolings.LastTokenPooling"}
    for model, message in [
        ({"loader": "os.system"}, "model.loader='os.system' is not one of encoder, decoder"),
        ({"loader": "decoder"}, "model.bidirectional must be true or false for a decoder"),
        ({"loader": "decoder", "bidirectional": True, "_target_": "os.system"}, "model._target_ names code to build"),
        ({"loader": "decoder", "bidirectional": True, "padding_side": "up"}, "model.padding_side='up': left or right"),
    ]:
        (folder / "sentemb_config.json").write_text(json.dumps({"pooling": pooling, "head": None, "model": model}))
        with pytest.raises(SentembConfigError, match=f"{folder / 'sentemb_config.json'}: {message}.*Fix: export"):
            SentembEncoder.load(str(folder))


def test_an_mntp_stage_with_an_adapter_loads_exports_without_its_head_and_starts_the_next_stage(tmp_path):
    """LLM2Vec's first stage (head=mntp with LoRA; tiny-llama ties its lm_head to the embeddings, so the frozen lm_head
    is also pooling.lm_head.weight) in a checkpoint written by SentembModule's own hook, its adapter made non-zero:
    it loads, exports as its pooling alone (MNTP only trains) and starts a SimCSE stage merged. ~3 s."""
    overrides = ["model=tiny-llama", "pooling=mean", "head=mntp", "adapter=lora"]
    module = SentembModule.from_config(compose_train(overrides))
    with torch.no_grad():
        for name, p in module.named_parameters():
            if ".lora_B." in name:
                p.normal_(std=0.05)
    checkpoint = {"state_dict": module.state_dict(), "hyper_parameters": dict(module.hparams)}
    checkpoint |= {"pytorch-lightning_version": L.__version__, "epoch": 0, "global_step": 0}
    module.on_save_checkpoint(checkpoint)
    assert all(is_adapter_weight(k) for k in checkpoint["state_dict"]), "the tied lm_head is the base's: not saved"
    path = tmp_path / "mntp" / "checkpoints" / "last.ckpt"
    path.parent.mkdir(parents=True)
    torch.save(checkpoint, path)
    trained = module.encoder.encode(SENTENCES)
    np.testing.assert_array_equal(load_checkpoint_encoder(path)[0].encode(SENTENCES), trained)

    cfg = compose_export([f"checkpoint={path}", f"out={tmp_path / 'st'}"])
    folder = export(cfg)
    assert json.loads((folder / "sentemb_config.json").read_text())["head"] is None
    assert set(load_file(folder / "sentemb_pooling.safetensors")) == set(), "mean pooling: no weights, no lm_head"
    from sentence_transformers import SentenceTransformer

    st = SentenceTransformer(str(folder), device="cpu", trust_remote_code=True)
    # merged weights (float32 B·A added once) and sentence-transformers' own batches: last bits
    assert_same_embeddings(st.encode(SENTENCES, convert_to_numpy=True), trained, "mntp merged")

    model, pooling, _ = model_config(["model=tiny-llama", "pooling=mean"])
    simcse = build_encoder({**model, "init_from": str(path)}, pooling).backbone
    expected = merged(load_checkpoint_encoder(path)[0].backbone).state_dict()
    for key, value in simcse.state_dict().items():
        assert torch.equal(value, expected[key]), key


class PartState(torch.nn.Module):
    """A part's own state, declared the torch way: a persistent buffer, a non-persistent one, and extra state."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("seen", torch.zeros(3))
        self.register_buffer("scratch", torch.zeros(2), persistent=False)
        self.steps = 0

    def get_extra_state(self) -> dict[str, int]:
        return {"steps": self.steps}

    def set_extra_state(self, state: dict[str, int]) -> None:
        self.steps = state["steps"]


def test_an_adapter_checkpoint_holds_and_restores_every_parts_own_state():
    """An adapter run's checkpoint (the trained weights only) keeps a part's persistent buffers and extra state, and
    loads back without asking for a non-persistent buffer (MNTP's special_token_ids is one). ~2 s."""
    module = SentembModule.from_config(compose_train(["model=tiny-llama", "pooling=mean", "head=mntp", "adapter=lora"]))
    module.encoder.pooling.probe = PartState()
    module.encoder.pooling.probe.seen += 2
    module.encoder.pooling.probe.steps = 7
    checkpoint = {"state_dict": module.state_dict(), "hyper_parameters": dict(module.hparams)}
    module.on_save_checkpoint(checkpoint)
    saved = set(checkpoint["state_dict"])
    assert {"encoder.pooling.probe.seen", "encoder.pooling.probe._extra_state"} <= saved
    assert not {"encoder.pooling.probe.scratch", "encoder.pooling.special_token_ids"} & saved, "not state-dict keys"

    again = SentembModule.from_config(compose_train(["model=tiny-llama", "pooling=mean", "head=mntp", "adapter=lora"]))
    again.encoder.pooling.probe = PartState()
    again.on_load_checkpoint(checkpoint)  # every trained key is there: not refused
    again.load_state_dict(checkpoint["state_dict"], strict=False)
    probe = again.encoder.pooling.probe
    assert probe.steps == 7 and torch.equal(probe.seen, torch.full((3,), 2.0))


@pytest.mark.slow  # three training processes: ~40 s
def test_sigterm_after_step_3_then_the_same_command_ends_as_the_uninterrupted_lora_run(lora_data, tmp_path):
    """issue 22's preemption guarantee with an adapter: SIGTERM writes an adapter-only last.ckpt at step 3, and the
    same command resumes from it to the uninterrupted run's losses and weights."""
    from tests.test_preemption import KILL_AT_3, losses, record, train_command

    job = [*LORA, *lora_data]
    train_command(job, tmp_path / "full")
    preempted = tmp_path / "preempted"
    train_command([*job, *KILL_AT_3], preempted, expect=128 + 15)  # SIGTERM's shell status
    assert record(preempted)["status"] == "preempted" and record(preempted)["step"] == 3
    train_command([*job, *KILL_AT_3], preempted)  # the same command: resumes by itself
    assert record(preempted)["status"] == "ok" and record(preempted)["resumed"] == ["preempted"]
    # the same computation on bit-identical weights, optimizer, data position and RNG: equal, not close
    assert losses(preempted) == losses(tmp_path / "full") and len(losses(preempted)) == 6
    full, resumed = (
        torch.load(folder / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)["state_dict"]
        for folder in (tmp_path / "full", preempted)
    )
    assert full.keys() == resumed.keys() and all(is_adapter_weight(k) or "pooling" in k for k in full)
    for key, value in full.items():
        assert torch.equal(value, resumed[key]), key
