"""GradCache: a cached step equals the plain step (dropout 0), and replays the dropout masks exactly (dropout on)."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
import torch

from sentemb.common.errors import SentembConfigError
from sentemb.training.checks import prepare_run
from sentemb.training.grad_cache import GradCache, row_chunks, take_rows, token_chunks
from sentemb.training.module import SentembModule
from tests.conftest import compose_train

BATCH, CHUNK = 32, 8
TOKENS = 150  # real tokens a chunk: ~6-10 rows of these sentences, so a batch of 64 rows makes several chunks
VARIANTS = {
    "cls": [],
    "mean": ["pooling=mean"],
    "prompt": ["pooling=prompt"],
    "hicl": ["pooling=hicl", "pooling.slice_len=6", "pooling.entailment_beta=0.1"],  # several segments a sentence
    "sarcse": ["head=sarcse", "loss=focal"],
    "hicl+sarcse": ["pooling=hicl", "pooling.slice_len=6", "head=sarcse"],
}


@pytest.fixture(scope="module")
def sentences(data_root: Path) -> list[str]:
    lines = (data_root / "wiki" / "wiki1m_head.txt").read_text(encoding="utf-8").splitlines()
    return [line for line in lines if line.strip()][:BATCH]


def build(overrides: list[str], tmp_path: Path, grad_cache: int | str | None) -> SentembModule:
    """`grad_cache`: a sentence count, an override (e.g. 'grad_cache.tokens=150') or None (plain steps)."""
    chunking = grad_cache if isinstance(grad_cache, str) else f"grad_cache={grad_cache or 'null'}"
    cfg = compose_train(["model=tiny", *overrides, chunking], tmp_path)
    torch.manual_seed(0)  # the same weights for the plain and the cached module
    module = SentembModule.from_config(cfg)
    module.on_fit_start()  # SARCSE's token frequencies
    return module


def step(module: SentembModule, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    backward, total, _ = module.step_loss(batch)
    module.backward(backward)
    return total.detach(), {name: p.grad.clone() for name, p in module.named_parameters() if p.grad is not None}


def assert_same_step(got, expected, label: str) -> None:
    # rows computed in chunks of 16 instead of one batch of 64 (and padding trimmed per chunk): float32
    # GEMM blocking moves the last bits (~1e-7 relative); asked: 1e-5
    torch.testing.assert_close(got[0], expected[0], rtol=1e-5, atol=1e-5, msg=f"{label}: loss")
    assert got[1].keys() == expected[1].keys(), label
    for name, grad in got[1].items():
        torch.testing.assert_close(grad, expected[1][name], rtol=1e-5, atol=1e-5, msg=lambda m, n=name: f"{n}: {m}")


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_cached_step_equals_plain_step_without_dropout(variant, sentences, small_corpus, tmp_path):
    overrides = [*VARIANTS[variant], "model.dropout=0.0", f"data.corpus={small_corpus}"]
    plain, cached = build(overrides, tmp_path, None), build(overrides, tmp_path, CHUNK)
    batch = dict(plain.encoder.tokenizer(sentences, padding=True, return_tensors="pt"))
    assert len(row_chunks(cached.encoder.training_batch(batch), 2 * CHUNK)) >= 4, "the batch is really chunked"
    assert_same_step(step(cached, batch), step(plain, batch), variant)


def replayed_rows_equal_the_first_pass(module: SentembModule) -> None:
    pending = module.grad_cache.pending
    for chunk, index, context in zip(pending.chunks, pending.indices, pending.contexts, strict=True):
        with context.replay(), torch.no_grad():
            replayed = module.encoder.training_rows(chunk)
        for name, rows in replayed.items():  # the same masks: bit for bit, not merely close
            assert torch.equal(rows, pending.rows[name][index]), name


@pytest.mark.parametrize("chunking", ["sentences", "tokens"])
@pytest.mark.parametrize("variant", ["cls", "hicl+sarcse"])
def test_replay_redraws_no_mask_and_gradients_equal_the_chunked_forward_with_graph(
    variant, chunking, sentences, small_corpus, tmp_path
):
    overrides = [*VARIANTS[variant], "model.dropout=0.2", f"data.corpus={small_corpus}"]
    module = build(overrides, tmp_path, CHUNK if chunking == "sentences" else f"grad_cache.tokens={TOKENS}")
    batch = dict(module.encoder.tokenizer(sentences, padding=True, return_tensors="pt"))
    assert_replay_equals_the_chunked_forward_with_graph(module, batch)


def assert_replay_equals_the_chunked_forward_with_graph(module: SentembModule, batch: dict[str, torch.Tensor]) -> None:
    """A cached step from seed 7 redraws no mask in its replay, and its loss and gradients are those of the same chunks
    encoded from the same RNG state with a graph, one backward through all of them (on the module's device)."""
    torch.manual_seed(7)  # CUDA's generators too
    backward, total, _ = module.step_loss(batch)
    replayed_rows_equal_the_first_pass(module)
    module.backward(backward)
    cached = {name: p.grad.clone() for name, p in module.named_parameters() if p.grad is not None}

    module.zero_grad()
    torch.manual_seed(7)
    prepared = module.encoder.training_batch(batch)
    indices = module.grad_cache.chunk_indices(prepared)
    outputs = [module.encoder.training_rows(take_rows(prepared, index)) for index in indices]
    where = torch.argsort(torch.cat(indices)).to(prepared["input_ids"].device)  # chunk order → row order
    rows = {name: torch.cat([out[name] for out in outputs])[where] for name in outputs[0]}
    views = module.encoder.pooling.training_views(rows, prepared, batch["input_ids"].shape[0])
    reference = views.global_weight * module.loss(views.z1, views.z2).loss
    for weight, value in views.own_terms.values():  # added one by one, as step_loss does (float sums: same order)
        reference = reference + weight * value
    reference.backward()
    torch.testing.assert_close(total.detach(), reference.detach(), rtol=0, atol=0)  # one computation, twice
    for name, grad in cached.items():
        # per-chunk parameter gradients summed by us vs by autograd's accumulation: float32 order, ~1e-7
        torch.testing.assert_close(grad, module.get_parameter(name).grad, rtol=1e-5, atol=1e-6, msg=name)


def test_replay_runs_under_the_first_pass_autocast(sentences, tmp_path):
    # Lightning runs training_step under autocast but backward outside it: the replay must restore it
    module = build(["model.dropout=0.2"], tmp_path, CHUNK)
    batch = dict(module.encoder.tokenizer(sentences, padding=True, return_tensors="pt"))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        backward, _, _ = module.step_loss(batch)
    assert module.grad_cache.pending.rows["embedding"].dtype == torch.bfloat16
    replayed_rows_equal_the_first_pass(module)
    module.backward(backward)
    assert all(torch.isfinite(p.grad).all() for p in module.parameters() if p.grad is not None)


def test_training_run_with_grad_cache_follows_the_plain_run(tiny_overrides, tmp_path):
    from tests.test_train import run

    losses = {}
    for name, extra in (("plain", []), ("cached", ["grad_cache=4"])):
        run([*tiny_overrides, "model.dropout=0.0", *extra], tmp_path / name)
        rows = csv.DictReader((tmp_path / name / "csv" / "version_0" / "metrics.csv").open())
        losses[name] = [float(r["train/loss"]) for r in rows if r.get("train/loss")]
    assert len(losses["plain"]) == 4
    # Lightning's backward hook, clipping and AdamW over 4 steps: the chunks' last-bit differences stay ~1e-7
    assert losses["cached"] == pytest.approx(losses["plain"], rel=1e-5)


def test_distributed_accumulation_equals_direct_accumulation(sentences, tmp_path):
    # under DDP the chunks' gradients are summed first and accumulated once (one reducer hook per parameter)
    overrides = ["pooling=hicl", "pooling.slice_len=6", "model.dropout=0.1"]
    grads = []
    for distributed in (False, True):
        module = build(overrides, tmp_path, CHUNK)
        batch = dict(module.encoder.tokenizer(sentences, padding=True, return_tensors="pt"))
        torch.manual_seed(3)
        backward, _, _ = module.step_loss(batch)
        backward.backward()
        module.grad_cache.replay_backward(module.encoder, distributed=distributed)
        grads.append({name: p.grad.clone() for name, p in module.named_parameters() if p.grad is not None})
    assert grads[0].keys() == grads[1].keys()
    for name, grad in grads[0].items():
        # the same chunk gradients, summed in another order: float32 rounding, ~1e-7
        torch.testing.assert_close(grad, grads[1][name], rtol=1e-5, atol=1e-6, msg=name)


def test_the_global_rng_moves_on_as_after_the_first_pass(sentences, tmp_path):
    module = build(["model.dropout=0.1"], tmp_path, CHUNK)
    batch = dict(module.encoder.tokenizer(sentences, padding=True, return_tensors="pt"))
    torch.manual_seed(5)
    backward, _, _ = module.step_loss(batch)
    after_first_pass = torch.get_rng_state()
    module.backward(backward)
    assert torch.equal(torch.get_rng_state(), after_first_pass), "the replay leaves the global RNG untouched"


@pytest.mark.parametrize("value", ["0", "-4", "true", "2.5"])
def test_bad_grad_cache_is_refused_before_loading(value, tmp_path):
    with pytest.raises(SentembConfigError, match=rf"grad_cache={value if value != 'true' else 'True'}\b"):
        prepare_run(compose_train(["model=tiny", f"grad_cache={value}"], tmp_path))


def test_token_chunks_are_sorted_dense_and_cover_every_row_once():
    lengths = torch.tensor([3, 9, 4, 12, 2, 7, 30, 5])
    mask = (torch.arange(30)[None, :] < lengths[:, None]).long()
    chunks = token_chunks(mask, budget=16)
    assert sorted(torch.cat(chunks).tolist()) == list(range(8))
    assert [lengths[c].tolist() for c in chunks] == [[30], [12], [9, 7], [5, 4, 3, 2]]  # longest first, greedy
    assert all(lengths[c].sum() <= 16 or len(c) == 1 for c in chunks), "over budget only as a row alone"


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_token_budget_step_equals_plain_step_without_dropout(variant, sentences, small_corpus, tmp_path):
    overrides = [*VARIANTS[variant], "model.dropout=0.0", f"data.corpus={small_corpus}"]
    plain, cached = build(overrides, tmp_path, None), build(overrides, tmp_path, f"grad_cache.tokens={TOKENS}")
    batch = dict(plain.encoder.tokenizer(sentences, padding=True, return_tensors="pt"))
    indices = cached.grad_cache.chunk_indices(cached.encoder.training_batch(batch))
    assert len(indices) >= 4, "the batch is really chunked"
    assert not torch.equal(torch.cat(indices), torch.arange(sum(map(len, indices)))), "rows really reordered"
    assert_same_step(step(cached, batch), step(plain, batch), variant)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("grad_cache.tokens=0", r"grad_cache.tokens=0 must be a whole number of real tokens"),
        ("+grad_cache.rows=4", r"grad_cache.rows: unknown key"),
    ],
)
def test_bad_token_budget_is_refused_before_loading(override, message, tmp_path):
    with pytest.raises(SentembConfigError, match=message):
        prepare_run(compose_train(["model=tiny", override], tmp_path))


def test_sentences_and_tokens_together_are_refused(tmp_path):
    cfg = compose_train(["model=tiny", "grad_cache.sentences=8", "grad_cache.tokens=100"], tmp_path)
    with pytest.raises(SentembConfigError, match=r"chunk by one of them"):
        prepare_run(cfg)
    assert GradCache.from_config({"sentences": None, "tokens": None}) is None
    assert GradCache.from_config(8).sentences == 8  # the short form grad_cache=8, and checkpoints written with it
