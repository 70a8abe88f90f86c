"""The paradigm code's training recipe: its MLP (form and initialisation) and frozen lower layers."""

from __future__ import annotations

import lightning as L
import pytest
import torch

from sentemb.common.errors import SentembConfigError
from sentemb.encoders.poolings.encoder_poolings import CLSPooling, PromptPooling
from sentemb.training.checks import prepare_run
from sentemb.training.module import SentembModule
from tests.conftest import compose_train
from tests.test_train import run


def test_mlp_forms_and_their_training_only_use():
    torch.manual_seed(0)
    hidden, batch = torch.randn(2, 3, 4), {"attention_mask": torch.ones(2, 3)}
    before, linear_only = CLSPooling(4, mlp_activation="before"), CLSPooling(4, mlp_activation="none")
    # exact: the pooling runs these very ops on the same CLS rows
    assert torch.equal(before(hidden, batch, train_head=True), before.mlp[1](torch.tanh(hidden[:, 0])))
    assert torch.equal(linear_only(hidden, batch, train_head=True), linear_only.mlp[0](hidden[:, 0]))
    assert torch.equal(before(hidden, batch), hidden[:, 0]) and torch.equal(linear_only(hidden, batch), hidden[:, 0])
    assert [type(m).__name__ for m in PromptPooling(4, mlp_activation="before").mlp] == ["Tanh", "Linear"]


def test_mlp_init_std_draws_weight_and_bias_from_the_codes_normal():
    torch.manual_seed(0)
    linear = CLSPooling(768, mlp_init_std=6e-3).mlp[0]
    # 589,824 weights: the sample std is within 0.5% of σ; 768 biases: within ~10% (5 standard errors)
    assert linear.weight.std().item() == pytest.approx(6e-3, rel=5e-3)
    assert linear.bias.std().item() == pytest.approx(6e-3, rel=0.13)
    assert abs(linear.weight.mean().item()) < 1e-4
    default = CLSPooling(768).mlp[0].weight.std().item()  # nn.Linear's own: U(±1/√768), std 0.0104
    assert default == pytest.approx(1 / (768**0.5 * 3**0.5), rel=5e-3)
    with pytest.raises(SentembConfigError, match="pooling.mlp_activation='sigmoid'"):
        CLSPooling(4, mlp_activation="sigmoid")
    with pytest.raises(SentembConfigError, match="pooling.mlp_init_std=0"):
        CLSPooling(4, mlp_init_std=0)


def test_trainable_layers_freeze_the_embeddings_and_the_lower_layers(tiny_overrides, tmp_path):
    overrides = [
        *tiny_overrides, "model.trainable_layers=1", "pooling.mlp_activation=before", "pooling.mlp_init_std=0.006",
        "trainer.max_steps=2", "eval.every_n_steps=2",
    ]  # fmt: skip
    cfg = compose_train(overrides, tmp_path / "initial")
    L.seed_everything(cfg.seed, workers=True)  # what train() does right before it builds the module
    initial = SentembModule.from_config(cfg).state_dict()
    trained = torch.load(run(overrides, tmp_path)["best_checkpoint"], weights_only=True)["state_dict"]
    frozen = [k for k in initial if ".embeddings." in k or ".encoder.layer.0." in k]
    trainable = [k for k in initial if ".encoder.layer.1." in k or k.startswith("encoder.pooling.mlp.")]
    assert frozen and trainable and len(frozen) + len(trainable) == len(initial)
    for key in frozen:  # exact: a parameter without gradient is never touched by AdamW
        assert torch.equal(trained[key], initial[key]), key
    for key in trainable:
        assert not torch.equal(trained[key], initial[key]), key


@pytest.mark.parametrize(
    "override, message",
    [
        ("model.trainable_layers=0", "model.trainable_layers=0 must be a whole number"),
        ("pooling.mlp_activation=sigmoid", "pooling.mlp_activation='sigmoid'"),
        ("pooling.mlp_init_std=-1", "pooling.mlp_init_std=-1 must be a number > 0"),
    ],
)
def test_recipe_options_are_checked_before_anything_loads(override, message, tiny_overrides, tmp_path):
    with pytest.raises(SentembConfigError, match=message):
        prepare_run(compose_train([*tiny_overrides, override], tmp_path))
