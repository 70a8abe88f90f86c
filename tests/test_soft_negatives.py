"""SNCSE's soft negatives: the margin loss's equation, the third view in the same forward, templates, refusals."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from sentemb.common.batch_views import POSITIVE, prefix
from sentemb.common.errors import SentembConfigError
from sentemb.common.file_values import checked
from sentemb.common.hydra_plumbing import resolved_container
from sentemb.data.negation import negate_offline
from sentemb.data.view_makers.negation import NEGATION
from sentemb.encoders.checkpoint import HPARAMS, HPARAMS_SHAPE
from sentemb.encoders.poolings.templates import PROMPTBERT_TEMPLATE, SNCSE_POSITIVE_TEMPLATE
from sentemb.training.auxiliary.sncse import bidirectional_margin
from sentemb.training.checks import check_parts
from sentemb.training.module import SentembModule
from tests.conftest import compose_train

SENTENCES = ["a man is playing a guitar .", "the cat sits on the mat", "stocks fell sharply on monday", "hi"]
SNCSE = ["auxiliary=sncse", "pooling=prompt", f"pooling.positive_template='{SNCSE_POSITIVE_TEMPLATE}'"]


def test_bml_is_the_spec_equation():
    gen = torch.Generator().manual_seed(0)
    z, pos, neg = (torch.randn(6, 5, generator=gen, dtype=torch.float64) for _ in range(3))
    alpha, beta = 0.1, 0.3
    total = 0.0
    for i in range(6):  # Δ_i = cos(z_i, neg_i) − cos(z_i, pos_i); ReLU(Δ + α) + ReLU(−Δ − β)
        delta = float(F.cosine_similarity(z[i], neg[i], dim=0) - F.cosine_similarity(z[i], pos[i], dim=0))
        total += max(delta + alpha, 0.0) + max(-delta - beta, 0.0)
    # float64 both sides; only the order of the mean's sum differs
    assert bidirectional_margin(z, pos, neg, alpha, beta).item() == pytest.approx(total / 6, rel=1e-12)


def test_bml_is_zero_inside_the_band_and_finite_at_cos_one():
    z = torch.tensor([[1.0, 0.0]])
    pos, neg = torch.tensor([[1.0, 0.0]]), torch.tensor([[0.8, 0.6]])  # cos(pos) − cos(neg) = 0.2 ∈ [0.1, 0.3]
    assert bidirectional_margin(z, pos, neg, 0.1, 0.3).item() == 0.0
    same = bidirectional_margin(z, z, z, 0.1, 0.3)  # every view identical: Δ = 0, the lower hinge pushes
    assert torch.isfinite(same) and same.item() == pytest.approx(0.1)


def batch_with_negations(module: SentembModule) -> dict[str, torch.Tensor]:
    tokenizer = module.encoder.tokenizer
    batch = dict(tokenizer(SENTENCES, padding=True, return_tensors="pt"))
    negations = dict(tokenizer([negate_offline(s) for s in SENTENCES], padding=True, return_tensors="pt"))
    return {**batch, **{f"{prefix(NEGATION)}{key}": value for key, value in negations.items()}}


def sncse_module(tmp_path, extra: list[str] = ()) -> SentembModule:
    torch.manual_seed(0)
    return SentembModule.from_config(compose_train(["model=tiny", *SNCSE, *extra], tmp_path))


def test_the_third_view_goes_through_the_same_forward_with_the_positive_template(tmp_path, monkeypatch):
    module = sncse_module(tmp_path)
    batch = batch_with_negations(module)
    calls = []
    forward = module.encoder.backbone.forward
    monkeypatch.setattr(module.encoder.backbone, "forward", lambda **kw: calls.append(kw) or forward(**kw))
    views = module.training_views(batch)
    assert len(calls) == 1, "one forward over the 3B rows"
    assert views.view(NEGATION, "a test").shape == views.z1.shape
    tokenizer = module.encoder.tokenizer
    prepared = module.encoder.training_batch(batch)
    rows = zip(prepared["input_ids"], prepared["attention_mask"], strict=True)
    texts = [tokenizer.decode(ids[mask.bool()]) for ids, mask in rows]
    assert len(texts) == 12
    assert all('sentence : "' in t for t in texts[:4]), "the anchors in SNCSE's view-0 template"
    assert all('sentence of "' in t for t in texts[4:]), "the positives and negations in its other template"
    assert "not" in texts[8] or "Not" in texts[8] or "not" in texts[9], texts[8:]


def test_a_training_step_adds_lambda_times_bml_beside_the_loss(tmp_path):
    module = sncse_module(tmp_path, ["model.dropout=0.0"])
    batch = batch_with_negations(module)
    backward, total, logged = module.step_loss(batch)
    views = module.training_views(batch)
    expected_bml = bidirectional_margin(views.z1, views.z2, views.view(NEGATION, "a test"), 0.1, 0.3)
    expected = module.loss(views.z1, views.z2).loss + 1e-3 * expected_bml
    # dropout 0: the same rows in the same forward twice; float32 sums
    torch.testing.assert_close(total, expected, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(torch.as_tensor(logged["train/loss/soft_negative"]), expected_bml, rtol=1e-6, atol=1e-7)


def test_grad_cache_chunks_the_third_view_and_gives_the_plain_gradient(tmp_path):
    def gradient(extra: list[str]) -> dict[str, torch.Tensor]:
        module = sncse_module(tmp_path / str(len(extra)), ["model.dropout=0.0", *extra])
        backward, _, _ = module.step_loss(batch_with_negations(module))
        if module.grad_cache is not None:
            module.backward(backward)  # the loss's backward, then GradCache's replay of its chunks
        else:
            backward.backward()
        return {n: p.grad.clone() for n, p in module.named_parameters() if p.grad is not None}

    plain, cached = gradient([]), gradient(["grad_cache=3"])
    assert plain.keys() == cached.keys()
    for name in plain:  # other chunk shapes: float32 apart by ~1e-7
        torch.testing.assert_close(cached[name], plain[name], rtol=1e-5, atol=1e-6, msg=name)


def test_hicl_slices_all_three_views_and_composes_with_the_queue(tmp_path):
    module = sncse_module(
        tmp_path,
        ["pooling=hicl", "pooling.prompt=true", "pooling.slice_len=4", "negatives=momentum", "negatives.queue_size=8",
         f"pooling.positive_template='{SNCSE_POSITIVE_TEMPLATE}'"],
    )  # fmt: skip
    batch = batch_with_negations(module)
    batch = {**batch, **{f"{prefix(POSITIVE)}{k}": batch[k] for k in ("input_ids", "attention_mask", "token_type_ids")}}
    views = module.training_views(batch)
    assert views.view(NEGATION, "a test").shape == views.z1.shape == (4, 32)
    logged = module.step_loss(batch)[2]
    assert {"train/loss/local", "train/loss/soft_negative", "train/loss/global"} <= set(logged)
    module.step_loss(batch)
    assert module.negatives.queue.shape[0] == 8
    assert module.encoder.pooling.segment_pooling.template == PROMPTBERT_TEMPLATE


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        (["auxiliary.sncse.alpha=0.5"], "auxiliary.sncse.alpha"),
        (["auxiliary.sncse.weight=-1"], "auxiliary.sncse.weight"),
        (["auxiliary.sncse.source=oracle"], "auxiliary.sncse.source"),
        (["auxiliary.sncse.source=file"], "path"),
        (["auxiliary.sncse.source=file", "auxiliary.sncse.path=/no/such/negations.jsonl"], "negations.jsonl"),
        (["pooling.positive_template='no mask here'"], "pooling.positive_template"),
    ],
)
def test_bad_soft_negative_settings_are_refused_before_any_model_loads(overrides, key, tmp_path, forbid_model_loading):
    cfg = compose_train(["model=tiny", *SNCSE, *overrides], tmp_path)
    with pytest.raises(SentembConfigError, match=key):
        check_parts(cfg)


def test_a_checkpoint_written_with_the_soft_negatives_name_builds_its_margin_term(tmp_path):
    """Checkpoints before auxiliary= stored SNCSE's node as `soft_negatives`: read as today's auxiliary=sncse."""
    cfg = compose_train(["model=tiny", *SNCSE], tmp_path)
    hparams = {key: resolved_container(cfg.get(key)) for key in HPARAMS}
    hparams["soft_negatives"] = hparams.pop("auxiliary")
    checked(hparams, "hyper_parameters", HPARAMS_SHAPE)  # what read_checkpoint accepts
    module = SentembModule(**hparams)
    assert [type(term).__name__ for term in module.auxiliary] == ["SoftNegativeMargin"]
    assert module.data_views()["negation"]["source"] == "rule"
    with pytest.raises(TypeError, match=r"unexpected keyword arguments \['auxiliaries'\]"):
        SentembModule(**{**hparams, "auxiliaries": None})
