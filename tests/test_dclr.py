"""DCLR (negatives=dclr): the noise's gradient ascent, the false negatives, the released code's loss, each against a
naive loop; the complementary model kept out of the state, the optimizer and training, and rebuilt on resume; real
Trainer runs of both conventions; the refusals before any model loads."""

from __future__ import annotations

import csv
import math
import os
from pathlib import Path

import lightning as L
import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader
from transformers import AutoModel, BertConfig, BertModel

from sentemb.common.errors import SentembConfigError
from sentemb.common.hydra_plumbing import resolved_container
from sentemb.common.metric_names import TEST_SPEARMAN
from sentemb.encoders.models.backbones import tiny_roberta_tokenizer
from sentemb.training.checks import check_parts
from sentemb.training.module import SentembModule
from sentemb.training.negatives.dclr import EXCLUDED_SHARE, DCLRNegatives, PoolerOutput, TrainingRepresentation
from sentemb.training.sharding import STRATEGY_TARGET
from tests.conftest import compose_train
from tests.test_ddp_gradients import StepLoss, rank_rows, spawned
from tests.test_momentum import PARTS
from tests.test_resume import resumed_losses, stopped_and_resumed
from tests.test_train import run

SENTENCES = [
    "a man is playing a guitar .", "the cat sits on the mat", "two dogs run through a field of grass",
    "a woman slices an onion", "stocks fell sharply on monday", "hi", "the weather is nice today",
    "children are playing football in the park near the school",
]  # fmt: skip
# the part (float32) against a loop in float64: apart by float32 rounding, ~1e-7 of values ~1
FLOAT32 = {"rtol": 1e-5, "atol": 1e-5}


def module_of(overrides: list[str], tmp_path: Path) -> SentembModule:
    torch.manual_seed(0)  # the same weights wherever it is built
    return SentembModule.from_config(compose_train(["model=tiny", "negatives=dclr", *overrides], tmp_path))


def tokens(module: SentembModule, sentences: list[str]) -> dict[str, torch.Tensor]:
    return dict(module.encoder.tokenizer(sentences, padding=True, return_tensors="pt"))


def views(seed: int, n: int = 4, d: int = 3) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    z1 = torch.randn(n, d, generator=gen)
    return z1, z1 + 0.5 * torch.randn(n, d, generator=gen)


# ---- the noise negatives


def unit(row: list[float]) -> list[float]:
    norm = math.sqrt(sum(x * x for x in row))
    return [x / norm for x in row]


def dot(a: list[float], b: list[float]) -> float:
    return sum(x * y for x, y in zip(a, b, strict=True))


def naive_ascent(z1, z2, noise, tau: float, steps: int, step_size: float) -> torch.Tensor:
    """The released `pgd` loop in Python floats, with the gradient of the mean cross-entropy written out per element:
    ∂L/∂n_k = (1/N) Σ_i P_{i,N+k} (h_i/‖n_k‖ − (h_i·n_k) n_k/‖n_k‖³)/τ."""
    h1, h2 = [unit(r) for r in z1.tolist()], [unit(r) for r in z2.tolist()]
    n = noise.double().tolist()
    for _ in range(steps):
        gradient = [[0.0] * len(row) for row in n]
        for h in h1:
            logits = [dot(h, c) / tau for c in h2] + [dot(h, unit(row)) / tau for row in n]
            total = sum(math.exp(x) for x in logits)
            for k, row in enumerate(n):
                p = math.exp(logits[len(h2) + k]) / total
                norm, c = math.sqrt(dot(row, row)), dot(h, row)
                for d in range(len(row)):
                    gradient[k][d] += p * (h[d] / norm - c * row[d] / norm**3) / tau / len(h1)
        n = [
            [x + step_size * g / math.sqrt(dot(grad, grad)) for x, g in zip(row, grad, strict=True)]
            for row, grad in zip(n, gradient, strict=True)
        ]
    return torch.tensor(n, dtype=torch.float64)


@pytest.mark.parametrize(("steps", "step_size", "tau"), [(1, 0.3, 0.05), (3, 0.3, 0.05), (4, 1e-3, 0.05), (2, 0.5, 1)])
def test_the_noise_after_k_ascent_steps_is_the_naive_loops(steps, step_size, tau):
    z1, z2 = views(0)
    part = DCLRNegatives(noise_times=1.5, ascent_steps=steps, step_size=step_size)
    torch.manual_seed(7)
    noise = part.noise_negatives(z1, z2, tau)
    torch.manual_seed(7)
    drawn = torch.randn(6, 3)  # M = int(4 · 1.5), from the global RNG as the part draws it
    assert noise.shape == (6, 3) and noise.dtype == torch.float32 and not noise.requires_grad
    torch.testing.assert_close(noise.double(), naive_ascent(z1, z2, drawn, tau, steps, step_size), **FLOAT32)
    # each step moves every row by step_size (a unit direction): the ascent did happen
    assert (noise - drawn).norm(dim=1).max() > 0.5 * step_size
    part.ascent_steps = 0
    torch.manual_seed(7)
    assert torch.equal(part.noise_negatives(z1, z2, tau), drawn), "no ascent: the Gaussian draw itself"


def test_a_zero_gradient_row_becomes_zero_as_the_released_code_sets_nan_to_zero():
    _, z2 = views(1)
    noise = DCLRNegatives(ascent_steps=2, step_size=0.1).noise_negatives(torch.zeros_like(z2), z2, 0.05)
    assert torch.equal(noise, torch.zeros_like(noise)), "g = 0: g/‖g‖ is NaN, and n ← 0 where NaN"


def test_the_ascent_touches_no_parameter_gradient_and_runs_in_float32_under_autocast():
    layer = nn.Linear(3, 3)
    x1, x2 = views(2)
    part = DCLRNegatives(noise_times=2.0)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        noise = part.noise_negatives(layer(x1), layer(x2), 0.05)
    assert layer.weight.grad is None and layer.bias.grad is None
    assert noise.shape == (8, 3) and noise.dtype == torch.float32 and not noise.requires_grad
    assert DCLRNegatives(noise_times=0).noise_negatives(x1, x2, 0.05).shape == (0, 3)


# ---- the false negatives


def test_false_negatives_are_exactly_those_above_phi_never_at_phi_nor_the_diagonal():
    c2 = torch.tensor([[1.0, 0, 0], [3, 4, 0], [4, 3, 0]])  # cos with e1: 1, 0.6 (exactly, in float32), 0.8
    c1 = torch.tensor([[1.0, 0, 0], [0, 0, 1], [2, 0, 0]])
    flagged = DCLRNegatives(phi=0.6).false_negatives(c1, c2)
    expected = [[False, False, True], [False, False, False], [True, False, False]]  # (2, 2): 0.8 but the diagonal
    assert flagged.tolist() == expected
    assert DCLRNegatives(phi=0.79).false_negatives(c1, c2).tolist() == expected
    assert DCLRNegatives(phi=0.8).false_negatives(c1, c2).tolist() == [[False] * 3, [False] * 3, [True, False, False]]
    assert not DCLRNegatives(phi=1.0).false_negatives(c1, c2).any(), "nothing is above 1"


def test_the_reference_threshold_is_the_released_codes_cos_over_tau_above_twenty_phi():
    c1, c2 = views(3, n=8, d=4)
    part = DCLRNegatives(phi=0.3, convention="reference")
    cos = torch.nn.functional.cosine_similarity(c1[:, None], c2[None], dim=-1)
    for tau in (0.05, 0.02):
        expected = (cos / tau > 20 * 0.3).fill_diagonal_(False)
        assert torch.equal(part.false_negatives(c1, c2, tau), expected)
    assert part.false_negatives(c1, c2, 0.05).any(), "τ = 0.05: the paper's threshold"
    assert torch.equal(part.false_negatives(c1, c2, 0.05), DCLRNegatives(phi=0.3).false_negatives(c1, c2))
    with pytest.raises(ValueError, match="give tau"):
        part.false_negatives(c1, c2)


# ---- the released code's loss


def naive_reference_loss(z1, z2, noise, excluded, tau) -> float:
    """Spec §4 in Python floats: P = row-softmax([S | Sⁿ] ⊙ [W | 1]); mean over all N × (N + M) entries of the
    binary cross-entropy against the identity."""
    h1 = [unit(r) for r in z1.tolist()]
    candidates = [unit(r) for r in torch.cat((z2, noise)).tolist()]
    drop = excluded.tolist()
    total, count = 0.0, 0
    for i, h in enumerate(h1):
        logits = [dot(h, c) / tau * (0.0 if drop[i][j] else 1.0) for j, c in enumerate(candidates)]
        denominator = sum(math.exp(x) for x in logits)
        for j, x in enumerate(logits):
            p = math.exp(x) / denominator
            total += -math.log(p) if j == i else -math.log(1.0 - p)
            count += 1
    return total / count


def test_the_reference_loss_is_the_spec_binary_cross_entropy_over_the_weighted_softmax():
    gen = torch.Generator().manual_seed(4)
    z1 = torch.randn(5, 4, generator=gen, dtype=torch.float64)
    z2 = z1 + 0.5 * torch.randn(5, 4, generator=gen, dtype=torch.float64)
    noise = torch.randn(3, 4, generator=gen, dtype=torch.float64)
    excluded = torch.rand(5, 8, generator=gen) < 0.4
    excluded[:, :5].fill_diagonal_(False)
    excluded[:, 5:] = False  # noise columns are never flagged
    part = DCLRNegatives(convention="reference")
    for tau in (0.05, 0.5):
        got = part.reference_loss(z1, z2, noise, excluded, tau).loss.item()
        # float64 on both sides: only the order of summation differs
        assert got == pytest.approx(naive_reference_loss(z1, z2, noise, excluded, tau), rel=1e-12, abs=1e-12)
    out = part.reference_loss(z1, z2, None, excluded[:, :5], 0.05)
    assert out.loss.item() == pytest.approx(naive_reference_loss(z1, z2, noise[:0], excluded[:, :5], 0.05), rel=1e-12)
    assert math.isfinite(out.stats["cos_pos"])


# ---- the complementary model


def snapshot(module: nn.Module) -> dict[str, torch.Tensor]:
    return {name: value.detach().clone() for name, value in module.state_dict().items()}


def same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_the_initial_complementary_model_is_outside_the_state_and_parameters_and_never_trains(tmp_path):
    module = module_of([], tmp_path)
    complementary = module.negatives.frozen[0]
    assert isinstance(complementary, TrainingRepresentation)
    initial = snapshot(complementary.encoder)
    assert same(initial, snapshot(module.encoder)), "a copy of the encoder as built"
    assert not any(key.startswith("negatives") for key in module.state_dict())
    assert {id(p) for p in complementary.parameters()}.isdisjoint(id(p) for p in module.parameters())
    assert not any(p.requires_grad for p in complementary.parameters())
    optimizer = torch.optim.AdamW([p for p in module.parameters() if p.requires_grad], lr=1e-2)
    for sentences in (SENTENCES[:4], SENTENCES[4:], SENTENCES[2:6]):
        optimizer.zero_grad()
        backward, total, logged = module.step_loss(tokens(module, sentences))
        backward.backward()
        optimizer.step()
        assert torch.isfinite(total) and 0 <= float(logged[EXCLUDED_SHARE]) <= 1
    assert same(snapshot(complementary.encoder), initial), "frozen: unchanged by three optimizer steps"
    assert all(p.grad is None for p in complementary.parameters())
    assert not same(snapshot(module.encoder), initial), "the encoder did train"
    # a resume builds the module afresh, then loads its state: the complementary model is the fresh one
    resumed = module_of([], tmp_path / "resumed")
    resumed.load_state_dict(module.state_dict())
    assert same(snapshot(resumed.encoder), snapshot(module.encoder))
    assert same(snapshot(resumed.negatives.frozen[0].encoder), initial)


def test_a_lora_run_keeps_the_complementary_model_out_of_its_checkpoint(tmp_path):
    module = module_of(["adapter=lora"], tmp_path)
    kept = module.trained_keys()
    assert kept and not any(key.startswith("negatives") for key in kept), "only the run's own trained weights"
    complementary = module.negatives.frozen[0]
    assert not any(p.requires_grad for p in complementary.parameters()), "its copies of the LoRA weights are frozen"
    trained = {id(p) for p in module.parameters() if p.requires_grad}
    assert trained.isdisjoint(id(p) for p in complementary.parameters()), "no trained weight is shared with it"


def test_the_complementary_model_embeds_both_views_with_dropout_on(tmp_path):
    module = module_of(["model.dropout=0.0"], tmp_path)
    batch = tokens(module, SENTENCES[:4])
    c1, c2 = module.negatives.complementary_embeddings(batch)
    with torch.no_grad():
        expected = module.encoder(batch, train_head=True)  # the same initial weights, no dropout to differ
    assert torch.equal(c1, expected) and torch.equal(c2, expected)
    module = module_of([], tmp_path / "dropout")  # the tiny model's own dropout, 0.1
    module.eval()  # the module's mode does not reach it: the released complementary model runs in train mode
    c1, c2 = module.negatives.complementary_embeddings(tokens(module, SENTENCES[:4]))
    assert not torch.equal(c1, c2), "train mode: each view its own dropout mask"


def test_a_step_excludes_the_complementary_models_false_negatives_and_adds_the_noise(tmp_path, monkeypatch):
    module = module_of(["model.dropout=0.0", "negatives.phi=0.9"], tmp_path)
    # the complementary embeddings of 5 sentences: orthogonal but sentence 4's, a copy of sentence 0's
    c = torch.eye(5, 8)
    c[4] = c[0]
    monkeypatch.setattr(module.negatives, "complementary_embeddings", lambda batch, chunk=None: (c, c + 0.01))
    seen = []
    original = type(module.loss).forward
    monkeypatch.setattr(
        type(module.loss),
        "forward",
        lambda self, inputs: seen.append(inputs) or original(self, inputs),
    )
    batch = tokens(module, SENTENCES[:5])
    _, _, logged = module.step_loss(batch)
    negatives, excluded = seen[0].extra, seen[0].excluded  # the loss's inputs by role
    assert negatives.shape == (5, module.encoder.hidden_size), "M = N · noise_times = 5 noise rows"
    assert excluded.shape == (5, 10) and not excluded[:, 5:].any(), "noise columns are never excluded"
    assert excluded[0, 4] and excluded[4, 0] and excluded[:, :5].sum() == 2, "the duplicate, nothing else"
    assert float(logged[EXCLUDED_SHARE]) == pytest.approx(2 / 20)


def test_the_reference_convention_attends_padding_in_both_models(tmp_path, monkeypatch):
    module = module_of(["negatives.convention=reference"], tmp_path)
    batch = tokens(module, SENTENCES[:4])
    assert not batch["attention_mask"].all(), "the batch has padding"
    masks = []
    encoder_views = module.encoder.training_views
    monkeypatch.setattr(
        module.encoder, "training_views", lambda b: masks.append(b["attention_mask"]) or encoder_views(b)
    )
    complementary = module.negatives.frozen[0]
    monkeypatch.setattr(complementary, "forward", lambda rows: masks.append(rows["attention_mask"]) or
                        TrainingRepresentation.forward(complementary, rows))  # fmt: skip
    backward, _, _ = module.step_loss(batch)
    assert len(masks) == 3 and all(mask.all() for mask in masks), "the encoder, then both complementary views"
    assert torch.isfinite(backward)
    assert DCLRNegatives().training_batch(batch) is batch, "paper: the batch as it is"


def test_a_sentemb_checkpoint_and_a_hugging_face_simcse_model_serve_as_the_complementary_model(tmp_path):
    module = module_of(["model.dropout=0.0"], tmp_path)
    batch = tokens(module, SENTENCES[:4])
    # a real (short) fit, saved by Lightning: the optimizer never held the complementary model
    trainer = L.Trainer(max_steps=2, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, default_root_dir=tmp_path)  # fmt: skip
    batches = [tokens(module, SENTENCES[:4]), tokens(module, SENTENCES[4:])]
    trainer.fit(module, train_dataloaders=DataLoader(batches, batch_size=None))
    held = {id(p) for group in trainer.optimizers[0].param_groups for p in group["params"]}
    assert held and held.isdisjoint(id(p) for p in module.negatives.frozen[0].parameters())
    trainer.save_checkpoint(tmp_path / "simcse.ckpt")
    assert not any(k.startswith("negatives") for k in torch.load(tmp_path / "simcse.ckpt")["state_dict"])
    part = DCLRNegatives(complementary=str(tmp_path / "simcse.ckpt"))
    part.track(module.encoder)
    with torch.no_grad():
        expected = module.encoder(batch, train_head=True)  # the trained weights it holds, no dropout
    torch.testing.assert_close(part.complementary_embeddings(batch)[0], expected, rtol=0, atol=0)
    # a Hugging Face SimCSE folder: c is its pooler's output
    config = BertConfig(vocab_size=len(module.encoder.tokenizer), hidden_size=16, num_hidden_layers=1,
                        num_attention_heads=2, intermediate_size=32, hidden_dropout_prob=0.0,
                        attention_probs_dropout_prob=0.0)  # fmt: skip
    BertModel(config, add_pooling_layer=True).save_pretrained(tmp_path / "hf")
    module.encoder.tokenizer.save_pretrained(tmp_path / "hf")
    part = DCLRNegatives(complementary=str(tmp_path / "hf"))
    part.track(module.encoder)
    assert isinstance(part.frozen[0], PoolerOutput)
    with torch.no_grad():
        expected = AutoModel.from_pretrained(tmp_path / "hf")(**batch).pooler_output
    torch.testing.assert_close(part.complementary_embeddings(batch)[1], expected, rtol=0, atol=0)
    # another vocabulary reads this run's ids as other tokens: refused, naming the key
    tiny_roberta_tokenizer().save_pretrained(tmp_path / "hf")
    with pytest.raises(SentembConfigError, match=r"negatives\.complementary=.*vocabulary.*Fix: "):
        DCLRNegatives(complementary=str(tmp_path / "hf")).track(module.encoder)
    # a resumed module (Lightning's load, the same seed) holds the fresh complementary model, not the trained one
    torch.manual_seed(0)
    resumed = SentembModule.load_from_checkpoint(tmp_path / "simcse.ckpt")
    assert same(snapshot(resumed.encoder), snapshot(module.encoder))
    assert same(snapshot(resumed.negatives.frozen[0].encoder), snapshot(module_of([], tmp_path).encoder))


# ---- real training runs


def logged_names(run_dir: Path) -> set[str]:
    rows = csv.DictReader((run_dir / "csv" / "version_0" / "metrics.csv").open())
    return {name for row in rows for name, value in row.items() if value}


@pytest.mark.parametrize("convention", ["paper", "reference"])
def test_a_tiny_dclr_run_trains_and_logs_its_excluded_share(convention, tiny_overrides, small_stsb, tmp_path):
    overrides = [*tiny_overrides, f"eval.stsb_dir={small_stsb}", "trainer.max_steps=2", "negatives=dclr",
                 f"negatives.convention={convention}"]  # fmt: skip
    run_dir = tmp_path / "run"  # beside small_stsb's folder
    metrics = run(overrides, run_dir)
    assert math.isfinite(metrics[TEST_SPEARMAN])
    assert EXCLUDED_SHARE in logged_names(run_dir)
    state = torch.load(run_dir / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)["state_dict"]
    assert not any(key.startswith("negatives") for key in state), "nothing of DCLR is saved"


@pytest.mark.parametrize("loss", ["mpt", "met", "mat"])
def test_a_loss_without_tau_takes_dclr_with_an_ascent_temperature(loss, tmp_path):
    module = module_of([f"loss={loss}", "negatives.ascent_tau=0.05"], tmp_path)
    check_parts(compose_train(["model=tiny", "negatives=dclr", f"loss={loss}", "negatives.ascent_tau=0.05"], tmp_path))
    backward, total, logged = module.step_loss(tokens(module, SENTENCES))
    backward.backward()
    assert torch.isfinite(total) and 0 <= float(logged[EXCLUDED_SHARE]) <= 1


# ---- refusals before any model loads


@pytest.mark.parametrize(
    ("overrides", "reason"),
    [
        (["loss=barlow"], "negatives=dclr with loss=barlow: .*no negatives' denominator"),
        (["loss=vicreg"], "loss=vicreg takes no extra negatives"),
        (["loss=paradigm", "loss.convention=reference"], "convention=reference takes no extra negatives"),
        (["loss=mpt"], "loss=mpt: the loss has no temperature loss.tau.*negatives.ascent_tau=0.05"),
        (["negatives.ascent_tau=0"], "negatives.ascent_tau=0"),
        (["loss=sum", "loss.terms={infonce: {weight: 1.0}}"], "loss=sum: the loss has no temperature"),
        (["negatives.convention=reference", "loss=focal"], "negatives.convention=reference with loss=focal"),
        (["negatives.convention=reference", "loss.symmetric=true"], "loss.symmetric=true"),
        (["negatives.convention=code"], "negatives.convention='code' is not one of paper, reference"),
        (["negatives.noise_times=-1"], "negatives.noise_times=-1"),
        (["negatives.ascent_steps=1.5"], "negatives.ascent_steps=1.5"),
        (["negatives.step_size=-0.1"], "negatives.step_size=-0.1"),
        (["negatives.phi=0"], "negatives.phi=0"),
        (["negatives.phi=1.5"], "negatives.phi=1.5"),
        (["+negatives.noise=2"], "noise"),
        (["negatives.complementary=/nowhere/simcse.ckpt"], "negatives.complementary=/nowhere/simcse.ckpt: no such"),
        (
            ["negatives.complementary=/nowhere/simcse"],
            r"complementary=/nowhere/simcse: no such folder.*Or negatives\.complementary=initial",
        ),
    ],
)
def test_refused_combinations_name_their_reason_and_fix_before_any_model_loads(
    overrides, reason, tmp_path, forbid_model_loading
):
    cfg = compose_train(["model=tiny", "negatives=dclr", *overrides], tmp_path)
    with pytest.raises(SentembConfigError, match=reason) as err:
        check_parts(cfg)
    assert "Fix: " in str(err.value)


def test_the_defaults_pass_and_fsdp_is_refused(tmp_path, forbid_model_loading):
    check_parts(compose_train(["model=tiny", "negatives=dclr"], tmp_path))
    check_parts(compose_train(["model=tiny", "negatives=dclr", "negatives.convention=reference"], tmp_path))
    cfg = {
        "negatives": {"name": "dclr"},
        "loss": {"name": "infonce"},
        "trainer": {"strategy": {"_target_": STRATEGY_TARGET}},
    }
    with pytest.raises(SentembConfigError, match="negatives=dclr with trainer=fsdp: .*Fix: trainer=ddp"):
        DCLRNegatives().check_config(cfg)


# ---- DDP: 2 gloo processes equal one process on the concatenated batch


def _worker(rank: int, world: int, port: int, config: dict, batches: list, out: dict) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    module = SentembModule.from_config(config)
    ddp = torch.nn.parallel.DistributedDataParallel(StepLoss(module))
    for step, batch in enumerate(batches):
        module.zero_grad()
        torch.manual_seed(100 + step + rank)  # the ranks' own streams: rank 0's noise is every rank's
        backward, total = ddp(rank_rows(batch, rank, world))
        module.backward(backward)
        out[(rank, step)] = (total.detach(), {name: p.grad.clone() for name, p in module.named_parameters()})
    dist.destroy_process_group()


@pytest.mark.slow  # two spawned gloo processes (make test-slow)
@pytest.mark.parametrize("convention", ["paper", "reference"])
def test_ddp_with_dclr_equals_one_process_on_the_concatenated_batch(convention, tmp_path):
    overrides = ["model=tiny", "model.dropout=0.0", "negatives=dclr", f"negatives.convention={convention}",
                 "negatives.phi=0.9999"]  # fmt: skip
    cfg = compose_train(overrides, tmp_path)
    config = {key: resolved_container(cfg.get(key)) for key in PARTS}
    torch.manual_seed(0)
    single = SentembModule.from_config(config)
    batches = [tokens(single, SENTENCES), tokens(single, SENTENCES[::-1])]
    out = spawned(_worker, config, batches)
    for step, batch in enumerate(batches):
        single.zero_grad()
        torch.manual_seed(100 + step)  # rank 0's stream: the same noise
        backward, total, _ = single.step_loss(batch)
        backward.backward()
        for rank in (0, 1):
            loss, grads = out[(rank, step)]
            # other batch shapes (4 vs 8 rows) and DDP's all-reduce order: float32 apart by ~1e-7, asked: 1e-5
            torch.testing.assert_close(loss, total.detach(), rtol=1e-5, atol=1e-5)
            for name, p in single.named_parameters():
                torch.testing.assert_close(grads[name], p.grad, rtol=1e-5, atol=1e-5, msg=name)


@pytest.mark.slow  # three training runs (make test-slow); the complementary model's rebuild is tested above
def test_a_resumed_dclr_run_equals_the_uninterrupted_run(tiny_overrides, small_stsb, tmp_path):
    """The noise comes from the global RNG (restored), the complementary model is rebuilt from the initial weights:
    the resumed run's losses are the uninterrupted run's, bit for bit."""
    job = [*tiny_overrides, f"eval.stsb_dir={small_stsb}", "trainer.max_steps=4", "eval.every_n_steps=2",
           "negatives=dclr", "negatives.phi=0.9999"]  # fmt: skip
    stopped_and_resumed(job, tmp_path, stop_after=2)
    losses, resumed = resumed_losses(tmp_path)
    assert len(losses) == 4 and resumed == losses
