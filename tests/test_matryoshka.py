"""Matryoshka sizes around any loss (sentemb/losses/matryoshka.py): the sum of the loss over each prefix."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest
import torch
from torch import nn

from sentemb.common.errors import SentembConfigError
from sentemb.common.hydra_plumbing import compose_config, resolved_container
from sentemb.common.metric_names import DEV_SPEARMAN_BEST_RESCORED, TEST_SPEARMAN, check_metric_name, sized_metric
from sentemb.encoders.build import encoder_from_checkpoint
from sentemb.encoders.checkpoint import read_checkpoint
from sentemb.eval.cache import EmbeddingCache
from sentemb.eval.sts import correlations, load_sts_task, pairwise_cosine
from sentemb.eval.suite import evaluate, load_encoder
from sentemb.export import export
from sentemb.losses import build
from sentemb.losses.matryoshka import Matryoshka, check_dims
from sentemb.training.checks import prepare_run
from sentemb.training.module import SentembModule
from tests.conftest import CONF_DIR, compose_train
from tests.test_export import SENTENCES
from tests.test_train import run


def views(n: int = 6, d: int = 16, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    z1 = torch.randn(n, d, generator=gen, dtype=torch.float64)
    return (
        z1,
        z1 + 0.5 * torch.randn(n, d, generator=gen, dtype=torch.float64),
        torch.randn(3, d, generator=gen, dtype=torch.float64),
    )


def test_one_size_at_the_full_width_is_the_loss_itself():
    z1, z2, _ = views()
    inner = build("infonce")
    assert torch.equal(Matryoshka(inner, [16])(z1, z2).loss, inner(z1, z2).loss)  # the same computation


@pytest.mark.parametrize("name", ["infonce", "mmhe", "barlow"])
def test_the_loss_is_the_weighted_sum_over_the_prefixes(name):
    z1, z2, _ = views()
    inner = build(name)
    out = Matryoshka(inner, [16, 8, 4], [1.0, 0.5, 0.25])(z1, z2)
    expected = inner(z1, z2).loss + 0.5 * inner(z1[:, :8], z2[:, :8]).loss + 0.25 * inner(z1[:, :4], z2[:, :4]).loss
    # float64, the same terms summed in the same order
    assert torch.equal(out.loss, expected)
    assert set(out.terms) == {"dim_16", "dim_8", "dim_4"}


def test_every_role_is_cut_and_the_masks_kept():
    z1, z2, queue = views()
    hard = (torch.randn(6, 16, dtype=torch.float64),)
    inner = build("infonce", hard_negative_weight=0.5)
    out = Matryoshka(inner, [16, 8])(z1, z2, queue, hard_negatives=hard)
    small = inner(z1[:, :8], z2[:, :8], queue[:, :8], hard_negatives=(hard[0][:, :8],)).loss
    assert torch.equal(out.loss, inner(z1, z2, queue, hard_negatives=hard).loss + small)


def test_what_the_inner_loss_refuses_is_refused():
    z1, z2, queue = views()
    with pytest.raises(SentembConfigError, match="takes no extra negatives"):
        Matryoshka(build("barlow"), [16, 8])(z1, z2, queue)


@pytest.mark.parametrize(
    ("dims", "weights", "width", "message"),
    [
        ([8, 16], None, None, "not strictly descending"),
        ([16, 16], None, None, "not strictly descending"),
        ([32, 8], None, 16, "wider than the sentence vector"),
        ([16, 0], None, None, r"matryoshka.dims\[1\]"),
        ([16, 8.5], None, None, r"matryoshka.dims\[1\]"),
        ([], None, None, "must be a list of sizes"),
        ([16, 8], [1.0], None, "one weight per size"),
        ([16, 8], [0, 0], None, "all 0"),
        ([16, 8], [1.0, -1.0], None, r"matryoshka.weights\[1\]"),
    ],
)
def test_sizes_and_weights_are_checked(dims, weights, width, message):
    with pytest.raises(SentembConfigError, match=message):
        check_dims(dims, weights, width)


def test_a_run_trains_and_logs_every_size(tiny_overrides, tmp_path):
    run([*tiny_overrides, "matryoshka.dims=[32,16,8]", "matryoshka.weights=[1.0,1.0,0.5]"], tmp_path)
    header = next((tmp_path / "csv").rglob("metrics.csv")).read_text().splitlines()[0]
    assert all(f"train/loss/dim_{size}" in header for size in (32, 16, 8))


def test_a_size_wider_than_the_model_is_refused_before_it_loads(tiny_overrides, tmp_path, forbid_model_loading):
    with pytest.raises(SentembConfigError, match=r"64 is wider than the sentence vector \(32\)"):
        prepare_run(compose_train([*tiny_overrides, "matryoshka.dims=[64,16]"], tmp_path))


def test_a_run_scores_at_its_truncate_dim_and_tables_every_trained_size(tiny_overrides, tmp_path, capsys):
    metrics = run([*tiny_overrides, "matryoshka.dims=[32,16,8]", "eval.truncate_dim=16"], tmp_path)
    sizes = {size: (metrics[sized_metric("dev", size)], metrics[sized_metric("test", size)]) for size in (32, 16, 8)}
    # the run's own scores are at 16: the same encoding of each split, cut to 16, as the table's row 16
    assert (metrics[DEV_SPEARMAN_BEST_RESCORED], metrics[TEST_SPEARMAN]) == sizes[16]
    assert sizes[32] != sizes[16] != sizes[8], "each size is its own prefix"
    printed = capsys.readouterr().out
    assert "| size | STS-B dev Spearman | STS-B test Spearman |" in printed
    assert all(f"| {size} | {dev:.2f} | {test:.2f} |" in printed for size, (dev, test) in sizes.items())
    assert check_metric_name(sized_metric("test", 96)) == "stsb/test/spearman_dim_96"  # a sweep may optimise one


@pytest.mark.parametrize(("size", "message"), [(0, "must be a whole number"), (2.5, "must be a whole number"),
                                               ("abc", "must be a whole number"),
                                               (33, r"33 is wider than the sentence vector \(32")])  # fmt: skip
def test_a_bad_truncate_dim_is_refused_before_the_model_loads(size, message, tiny_overrides, tmp_path,
                                                             forbid_model_loading):  # fmt: skip
    with pytest.raises(SentembConfigError, match=f"eval.truncate_dim.*{message}"):
        prepare_run(compose_train([*tiny_overrides, f"eval.truncate_dim={size}"], tmp_path))


def test_evaluate_scores_at_truncate_dim_and_records_it(tmp_path, data_root):
    overrides = ["model=tiny", "pooling=mean", "tasks=[STSBenchmark]", "sts_splits=[test]", "align_uniform_split=null"]
    cfg = compose_config(CONF_DIR, "eval", [*overrides, "eval.truncate_dim=8"], tmp_path / "eval")
    torch.manual_seed(0)  # tiny: random weights from the global seed, built again below
    results = evaluate(cfg, tmp_path / "eval")
    assert json.loads((tmp_path / "eval" / "results.json").read_text())["truncate_dim"] == 8
    assert "first 8 dimensions" in (tmp_path / "eval" / "results.md").read_text()
    # by hand: the same encoder, the same sentences in one pass, cut to 8
    torch.manual_seed(0)
    encoder, _, _ = load_encoder(cfg, torch.device("cpu"))
    pairs = load_sts_task(data_root / "senteval" / "downstream", "STSBenchmark", ["test"])["test"]
    cache = EmbeddingCache(encoder, batch_size=cfg.batch_size, show_progress=False)
    cache.prefetch(pairs.first + pairs.second)
    full = pairwise_cosine(cache(pairs.first), cache(pairs.second))
    cut = pairwise_cosine(cache(pairs.first)[:, :8], cache(pairs.second)[:, :8])
    assert results["sts"]["STSBenchmark"]["subsets"]["test"]["spearman"] == correlations(cut, pairs.gold)["spearman"]
    assert correlations(full, pairs.gold)["spearman"] != correlations(cut, pairs.gold)["spearman"]


@pytest.mark.parametrize(("size", "message"), [(0, "must be a whole number"), (33, "is wider than the sentence")])
def test_evaluate_refuses_a_bad_truncate_dim_before_the_model_loads(size, message, tmp_path, forbid_model_loading):
    cfg = compose_config(CONF_DIR, "eval", ["model=tiny", "tasks=[STSBenchmark]", f"eval.truncate_dim={size}"])
    with pytest.raises(SentembConfigError, match=f"eval.truncate_dim={size} {message}"):
        evaluate(cfg, tmp_path / "eval")


@pytest.fixture
def matryoshka_checkpoint(tiny_overrides, tmp_path) -> str:
    """A tiny mean-pooled run trained with matryoshka.dims=[32,16,8]: its best checkpoint."""
    return run([*tiny_overrides, "pooling=mean", "matryoshka.dims=[32,16,8]", "trainer.max_steps=2"], tmp_path)[
        "best_checkpoint"
    ]


def test_an_export_at_a_size_embeds_as_sentembs_truncated_encoder(matryoshka_checkpoint, tmp_path):
    from sentence_transformers import SentenceTransformer

    from sentemb.encoders.serving.onnx_embedder import OnnxEncoder

    out = tmp_path / "st"
    overrides = [f"checkpoint={matryoshka_checkpoint}", f"out={out}", "truncate_dim=16", "format=onnx"]
    export(compose_config(CONF_DIR, "export", [*overrides, "export.measure=false"]))
    assert json.loads((out / "config_sentence_transformers.json").read_text())["truncate_dim"] == 16
    assert "first 16 dimensions" in (out / "README.md").read_text()
    encoder, _ = encoder_from_checkpoint(read_checkpoint(matryoshka_checkpoint), torch.device("cpu"))
    ours = encoder.encode(SENTENCES)[:, :16]
    st = SentenceTransformer(str(out), device="cpu").encode(SENTENCES, convert_to_numpy=True)
    graph = OnnxEncoder(out).encode(SENTENCES)
    assert st.shape == graph.shape == (len(SENTENCES), 16)
    # other batches (sentence-transformers and ONNX Runtime pad and sort their own way) and ONNX Runtime's kernels:
    # float32 last bits of the same computation, asked: 1e-5
    np.testing.assert_allclose(st, ours, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(graph, ours, rtol=1e-5, atol=1e-5)


def test_an_untrained_size_is_warned_about_and_a_bad_one_refused_before_the_model_loads(
    matryoshka_checkpoint, tmp_path, caplog, request
):
    base = [f"checkpoint={matryoshka_checkpoint}", f"out={tmp_path / 'st'}"]
    with caplog.at_level("WARNING"):
        export(compose_config(CONF_DIR, "export", [*base, "truncate_dim=12"]))
    assert "matryoshka.dims=[32, 16, 8], which do not include 12" in caplog.text
    request.getfixturevalue("forbid_model_loading")  # from here on, a model load fails the test
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("a\nb\n")
    for extra, message in (
        (["truncate_dim=0"], "truncate_dim=0 must be a whole number"),
        (["truncate_dim=64"], r"truncate_dim=64 is wider than the sentence vector \(32"),
        (["truncate_dim=16", f"whitening={corpus}"], "truncate_dim=16 with whitening="),
    ):
        out = f"out={tmp_path / extra[-1].split('=')[1][:2]}"
        with pytest.raises(SentembConfigError, match=message):
            export(compose_config(CONF_DIR, "export", [base[0], out, *extra]))


class FixedColumns(nn.Module):
    """A sentence-transformers module whose forward returns fixed embeddings: column i's features ({"column": i})
    get `columns[i]` (float64 leaves), so sentence-transformers' losses run on the very tensors sentemb's loss gets."""

    def __init__(self, columns: list[torch.Tensor]) -> None:
        super().__init__()
        self.columns = columns

    def forward(self, features: dict) -> dict:
        features["sentence_embedding"] = self.columns[int(features["column"])]
        return features


def fixed_columns(count: int, n: int = 8, d: int = 16) -> list[torch.Tensor]:
    """Anchors, positives near them, then hard negatives, each row of its own norm (so the cosine must normalise)."""
    gen = torch.Generator().manual_seed(3)
    anchors = torch.randn(n, d, generator=gen, dtype=torch.float64)
    columns = [anchors, anchors + 0.7 * torch.randn(n, d, generator=gen, dtype=torch.float64)]
    columns += [torch.randn(n, d, generator=gen, dtype=torch.float64) for _ in range(count - 2)]
    return [(c * torch.rand(n, 1, generator=gen, dtype=torch.float64) * 5 + 0.1).requires_grad_() for c in columns]


@pytest.mark.parametrize("hard_negatives", [0, 1], ids=["pairs", "triplets"])
def test_matryoshka_infonce_equals_sentence_transformers_matryoshka_mnrl(hard_negatives):
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.losses import MatryoshkaLoss, MultipleNegativesRankingLoss

    dims, weights = [16, 8, 4], [1.0, 0.5, 0.25]
    ours_in, theirs_in = fixed_columns(2 + hard_negatives), fixed_columns(2 + hard_negatives)
    hard = tuple(ours_in[2:])
    ours = Matryoshka(build("infonce", tau=0.05), dims, weights)(ours_in[0], ours_in[1], hard_negatives=hard).loss
    ours.backward()
    model = SentenceTransformer(modules=[FixedColumns(theirs_in)], device="cpu")
    # MNRL's cosine (util.cos_sim) × scale 20 = 1/τ; MatryoshkaLoss cuts each column and L2-normalises (shrink)
    loss = MatryoshkaLoss(model, MultipleNegativesRankingLoss(model, scale=20), matryoshka_dims=dims,
                          matryoshka_weights=weights)  # fmt: skip
    theirs = loss([{"column": torch.tensor(i)} for i in range(len(theirs_in))], None)
    theirs.backward()
    # float64, the same sums in another order (ST renormalises each prefix of the previous size's unit vector)
    assert abs(ours.item() - theirs.item()) <= 1e-9
    for mine, st in zip(ours_in, theirs_in, strict=True):
        assert (mine.grad - st.grad).abs().max().item() <= 1e-9
    assert ours.item() != Matryoshka(build("infonce", tau=0.05), [16])(ours_in[0], ours_in[1], hard_negatives=hard).loss


class EncoderColumns(nn.Module):
    """A sentence-transformers module around a sentemb encoder: token ids → its sentence embedding (float64 here)."""

    def __init__(self, encoder: nn.Module) -> None:
        super().__init__()
        self.encoder = encoder

    def forward(self, features: dict) -> dict:
        rows = {key: features[key] for key in ("input_ids", "attention_mask", "token_type_ids") if key in features}
        features["sentence_embedding"] = self.encoder(rows)
        return features


def test_a_grad_cache_step_with_sizes_equals_sentence_transformers_cached_mnrl_in_matryoshka(data_root, tmp_path):
    import copy

    from sentence_transformers import SentenceTransformer
    from sentence_transformers.losses import CachedMultipleNegativesRankingLoss, MatryoshkaLoss

    lines = (data_root / "wiki" / "wiki1m_head.txt").read_text(encoding="utf-8").splitlines()
    texts = list(dict.fromkeys(line for line in lines if line.strip()))[:24]
    overrides = ["model=tiny", "pooling=mean", "model.dropout=0.0", "matryoshka.dims=[32,16,8]", "grad_cache=4"]
    torch.manual_seed(0)
    module = SentembModule.from_config(compose_train(overrides, tmp_path)).double()
    twin = copy.deepcopy(module.encoder)
    tokenizer = module.encoder.tokenizer
    anchors, positives = (dict(tokenizer(part, padding=True, return_tensors="pt")) for part in (texts[:12], texts[12:]))
    backward, total, _ = module.step_loss({**anchors, **{f"positive_{k}": v for k, v in positives.items()}})
    assert module.grad_cache.pending is not None, "the step was cached"
    module.backward(backward)

    model = SentenceTransformer(modules=[EncoderColumns(twin)], device="cpu")
    cached = CachedMultipleNegativesRankingLoss(model, scale=20, mini_batch_size=4)
    theirs = MatryoshkaLoss(model, cached, matryoshka_dims=[32, 16, 8])([anchors, positives], None)
    theirs.backward()
    # float64, dropout off, the same weights: chunks of 4 sentences on both sides; only summation order differs
    assert abs(total.item() - theirs.item()) <= 1e-9
    ours = dict(module.encoder.named_parameters())
    compared = 0
    for name, param in twin.named_parameters():
        if ours[name].grad is None:
            assert param.grad is None or not param.grad.any(), name
            continue
        assert (ours[name].grad - param.grad).abs().max().item() <= 1e-9, name
        compared += 1
    assert compared > 10


# ---- composes: each part beside the sizes trains, every size logged and scored (a step of each, a few seconds)
def triplets(tmp_path, data_root) -> list[str]:
    """data=labelled on 64 STS-B train pairs, another row's first sentence as each one's hard negative."""
    lines = (data_root / "senteval/downstream/STS/STSBenchmark/sts-train.csv").read_text(encoding="utf-8")
    pairs = [(f[5], f[6]) for f in (line.split("\t") for line in lines.splitlines()[:64])]
    path = tmp_path / "triplets.csv"
    with path.open("w", encoding="utf-8", newline="") as handle:
        csv.writer(handle).writerows([["anchor", "positive", "negative"]] +
                                     [[a, b, pairs[(i + 7) % 64][0]] for i, (a, b) in enumerate(pairs)])  # fmt: skip
    return ["data=labelled", f"data.path={path}", "data.batch_size=8"]


COMPOSES = {
    "labelled-hard-negatives": None,  # the triplets above
    "momentum-queue": ["negatives=momentum", "negatives.queue_size=8"],
    "sncse-auxiliary": ["auxiliary=[sncse]"],
    "lora-decoder-padding-free": ["model=tiny-llama", "pooling=last_token", "adapter=lora", "adapter.r=4"],
}


@pytest.mark.parametrize("variant", list(COMPOSES))
def test_sizes_compose_with(variant, tiny_overrides, tmp_path, data_root):
    extra = COMPOSES[variant] or triplets(tmp_path, data_root)
    base = [o for o in tiny_overrides if not (COMPOSES[variant] is None and o.startswith("data."))]
    metrics = run([*base, *extra, "matryoshka.dims=[32,16,8]", "trainer.max_steps=2"], tmp_path)
    header = next((tmp_path / "csv").rglob("metrics.csv")).read_text().splitlines()[0]
    assert all(f"train/loss/dim_{size}" in header for size in (32, 16, 8)), header
    assert all(np.isfinite(metrics[sized_metric(split, 8)]) for split in ("dev", "test"))


def test_a_padding_free_step_with_sizes_has_the_padded_loss_and_gradients(small_corpus, tmp_path):
    lines = small_corpus.read_text(encoding="utf-8").splitlines()[:12]
    results = []
    for padding_free in ("true", "false"):
        overrides = ["model=tiny", "model.dropout=0.0", f"model.padding_free={padding_free}", "matryoshka.dims=[32,8]"]
        torch.manual_seed(0)
        module = SentembModule.from_config(compose_train(overrides, tmp_path))
        backward, total, _ = module.step_loss(dict(module.encoder.tokenizer(lines, padding=True, return_tensors="pt")))
        backward.backward()
        results.append((total.detach(), {n: p.grad for n, p in module.named_parameters() if p.grad is not None}))
    (loss, grads), (padded_loss, padded_grads) = results
    # packed rows vs padded ones: float32 GEMM shapes differ (~1e-7), asked 1e-5 as tests/test_padding_free.py
    torch.testing.assert_close(loss, padded_loss, rtol=1e-5, atol=1e-5)
    assert grads.keys() == padded_grads.keys()
    for name, grad in grads.items():
        torch.testing.assert_close(grad, padded_grads[name], rtol=1e-5, atol=1e-5, msg=name)


@pytest.mark.slow  # two spawned gloo processes (make test-slow)
def test_a_ddp_step_with_sizes_equals_one_process(tmp_path):
    from tests.test_ddp_gradients import SENTENCES as DDP_SENTENCES
    from tests.test_ddp_gradients import assert_ddp_equals_one_process, build

    cfg = compose_train(["model=tiny", "model.dropout=0.0", "matryoshka.dims=[32,16,8]"], tmp_path)
    keys = ("model", "pooling", "loss", "optimizer", "scheduler", "matryoshka")
    configs = {"infonce+sizes": {key: resolved_container(cfg[key]) for key in keys} | {"grad_cache": None}}
    configs["infonce+sizes+grad_cache"] = {**configs["infonce+sizes"], "grad_cache": 2}
    tokenizer = build(configs["infonce+sizes"]).encoder.tokenizer
    assert_ddp_equals_one_process(configs, dict(tokenizer(DDP_SENTENCES, padding=True, return_tensors="pt")))
