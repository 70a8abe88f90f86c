"""export whitening=<corpus>: BERT-whitening shipped as the sentence-transformers folder's last module (a Dense) and as
the ONNX graph's last op; both embed as `Whitening.transform(encoder.encode(s))`; bad settings are refused before any
model loads (or, for the embedding's size, before the corpus is embedded); a tampered whitening is refused on load.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from datetime import datetime
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from sentemb.common.errors import SentembConfigError
from sentemb.encoders.serving.onnx_embedder import OnnxEncoder
from sentemb.eval.suite import load_encoder
from sentemb.eval.whitening import Whitening, corpus_sentences
from sentemb.eval.whitening_export import WHITENING
from sentemb.export import export
from sentemb.st_modules import load_exported_folder
from tests.test_export import SENTENCES, compose_export
from tests.test_onnx import MORE

# tiny BERT (D = 32) ends with a LayerNorm whose weights are 1 and 0 at init, so its mean-pooled embeddings sum to 0
# over their dimensions: one direction has no variance and export refuses to whiten it; 31 keeps all the others
TINY_DIM = 31
# whitening divides each direction by its standard deviation: the float32 differences of two computations of the
# embedding (~1e-6 here; 1e-5 bounds them unwhitened, tests/test_onnx.py) grow by up to W's largest column norm;
# measured 1.3e-6 to 4.8e-6 on these models' whitened, unit-variance coordinates: 5e-5 leaves 10x room
TOLERANCE = 5e-5


@pytest.fixture(scope="module")
def corpus(tmp_path_factory, data_root) -> Path:
    """200 sentences of the wiki sample (more than D + 1 = 33), one per line."""
    lines = (data_root / "wiki" / "wiki1m_head.txt").read_text(encoding="utf-8").splitlines()[:200]
    path = tmp_path_factory.mktemp("corpus") / "wiki200.txt"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def reference(overrides: list[str], corpus: Path, dim: int | None, sentences: list[str]) -> np.ndarray:
    """Whitening.transform(encoder.encode(sentences)), the map fitted on encode() of the corpus: the encoder rebuilt
    as export builds it (the tiny models' random weights come from the global seed)."""
    torch.manual_seed(0)
    encoder = load_encoder(compose_export([*overrides, "out=unused"]), torch.device("cpu"))[0].eval()
    return Whitening.fit(encoder.encode(corpus_sentences(corpus)), dim).transform(encoder.encode(sentences))


TINY = ["model=tiny", "pooling=mean"]


@pytest.fixture(scope="module")
def exported(tmp_path_factory, corpus) -> Path:
    """python -m sentemb.export model=tiny pooling=mean whitening=<corpus> whitening_dim=31 format=onnx
    export.quantize=int8"""
    out = tmp_path_factory.mktemp("whitened") / "tiny"
    overrides = ["format=onnx", "export.quantize=int8", "export.measure=false", f"out={out}"]
    torch.manual_seed(0)
    export(compose_export([*TINY, f"whitening={corpus}", f"whitening_dim={TINY_DIM}", *overrides]))
    return out


def test_the_folder_ends_with_sentence_transformers_dense_and_embeds_as_the_whitened_encoder(exported, corpus):
    from sentence_transformers import SentenceTransformer

    modules = json.loads((exported / "modules.json").read_text())
    assert [m["type"] for m in modules] == [
        "sentence_transformers.base.modules.transformer.Transformer",
        "sentence_transformers.sentence_transformer.modules.pooling.Pooling",
        "sentence_transformers.base.modules.dense.Dense",
    ], "sentence-transformers' modules only: no sentemb, no trust_remote_code"
    config = json.loads((exported / "2_Dense" / "config.json").read_text())
    assert (config["in_features"], config["out_features"], config["bias"]) == (32, TINY_DIM, True)
    assert config["activation_function"] == "torch.nn.modules.linear.Identity"
    assert sorted(p.name for p in (exported / "2_Dense").iterdir()) == ["config.json", "model.safetensors"]
    record = json.loads((exported / WHITENING).read_text())
    assert record["module"] == "2_Dense" and (record["input_dim"], record["dim"]) == (32, TINY_DIM)
    assert record["corpus"] == "wiki200.txt" and record["sentences"] == 200
    assert record["corpus_sha256"] == hashlib.sha256(corpus.read_bytes()).hexdigest()
    assert datetime.fromisoformat(record["fitted"]).tzinfo is not None
    card = (exported / "README.md").read_text()
    assert "## Whitening" in card and record["corpus_sha256"] in card and "`2_Dense`" in card

    sentences = SENTENCES + MORE
    expected = reference(TINY, corpus, TINY_DIM, sentences)
    plain = SentenceTransformer(str(exported), device="cpu", trust_remote_code=False).encode(sentences)
    assert plain.shape == (len(sentences), TINY_DIM)
    np.testing.assert_allclose(plain, expected, atol=TOLERANCE, rtol=0)
    checked = load_exported_folder(exported, device="cpu").encode(sentences)
    np.testing.assert_allclose(checked, plain, atol=1e-6, rtol=0)  # the same modules, loaded after the checks


def test_the_onnx_graph_ends_with_the_same_map(exported, corpus):
    import onnx
    from sentence_transformers import SentenceTransformer

    sentences = SENTENCES + MORE
    graph = OnnxEncoder(exported).embed(sentences)
    assert graph.shape == (len(sentences), TINY_DIM)
    st = SentenceTransformer(str(exported), device="cpu").encode(sentences)
    np.testing.assert_allclose(graph, st, atol=TOLERANCE, rtol=0)
    np.testing.assert_allclose(graph, reference(TINY, corpus, TINY_DIM, sentences), atol=TOLERANCE, rtol=0)
    # int8: the backbone quantised, the whitening kept float32 (ONNX Runtime's quantiser splits its Gemm into a float
    # MatMul of the transposed weight and an Add)
    for file, ops in (("onnx/model.onnx", {"Gemm"}), ("onnx/model_qint8.onnx", {"MatMul"})):
        nodes = onnx.load(str(exported / file), load_external_data=False).graph.node
        assert {n.op_type for n in nodes for i in n.input if i.startswith("whitening.weight")} == ops, file
        assert any(n.op_type == "MatMulInteger" for n in nodes) == (ops == {"MatMul"}), "the backbone is int8"
    int8 = OnnxEncoder(exported, file="onnx/model_qint8.onnx").embed(sentences)
    cosine = (graph * int8).sum(1) / np.linalg.norm(graph, axis=1) / np.linalg.norm(int8, axis=1)
    assert cosine.min() >= 0.99, cosine  # test_onnx.py's bound for dynamic int8


LLAMA = ["model=tiny-llama", "pooling=mean"]  # sentemb's own module (a decoder), then the whitening's Dense


def test_whitening_dim_keeps_k_columns_after_sentembs_own_module(tmp_path, corpus):
    from sentence_transformers import SentenceTransformer

    out = tmp_path / "llama"
    export(compose_export([*LLAMA, f"whitening={corpus}", "whitening_dim=8", f"out={out}"]))
    modules = json.loads((out / "modules.json").read_text())
    listed = [(m["type"].rsplit(".", 1)[-1], m["path"]) for m in modules]
    assert listed == [("SentembEncoder", ""), ("Dense", "1_Dense")]
    expected = reference(LLAMA, corpus, 8, SENTENCES)
    checked = load_exported_folder(out, device="cpu").encode(SENTENCES)
    assert checked.shape == (len(SENTENCES), 8)
    np.testing.assert_allclose(checked, expected, atol=TOLERANCE, rtol=0)
    trusted = SentenceTransformer(str(out), device="cpu", trust_remote_code=True).encode(SENTENCES)
    np.testing.assert_allclose(trusted, checked, atol=1e-6, rtol=0)


def write_lines(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(f"{line}\n" for line in lines), encoding="utf-8")
    return path


BEFORE_ANY_MODEL = {  # overrides (a corpus of n sentences as {corpus}) → the refusal
    "task": (["whitening=task"], r"whitening=task fits one map per STS task .* Fix: whitening=<a text file"),
    "missing": (["whitening={tmp}/none.txt"], r"whitening=.*none\.txt: no such file\. Fix:"),
    "a folder": (["whitening={tmp}"], "no such file"),
    "empty": (["whitening={corpus0}"], r"0 sentence\(s\); a whitening needs at least 2"),
    "one sentence": (["whitening={corpus1}"], r"1 sentence\(s\); a whitening needs at least 2"),
    "k + 1 sentences": (["whitening={corpus20}", "whitening_dim=20"], r"20 distinct sentences, .* at least 21"),
    "dim 0": (["whitening={corpus20}", "whitening_dim=0"], r"whitening_dim=0: the number of directions"),
    "dim text": (["whitening={corpus20}", "whitening_dim=all"], r"whitening_dim='all': the number of directions"),
    "dim alone": (["whitening_dim=4"], r"whitening_dim=4 without whitening=.*Fix:"),
    "adapter": (["whitening={corpus20}", "adapter_only=true"], r"adapter_only=true: peft's adapter folder"),
}


def corpora(tmp_path: Path, data_root: Path) -> dict[str, str]:
    lines = (data_root / "wiki" / "wiki1m_head.txt").read_text(encoding="utf-8").splitlines()[:20]
    return {
        "tmp": str(tmp_path),
        **{f"corpus{n}": str(write_lines(tmp_path / f"c{n}.txt", lines[:n] or ["", "  "])) for n in (0, 1, 20)},
    }


@pytest.mark.parametrize("case", BEFORE_ANY_MODEL)
def test_bad_whitening_settings_are_refused_before_any_model_loads(case, tmp_path, data_root, monkeypatch):
    import sentemb.eval.suite as suite

    overrides, message = BEFORE_ANY_MODEL[case]
    names = corpora(tmp_path, data_root)
    monkeypatch.setattr(suite, "build_encoder", lambda *a, **k: pytest.fail("a model was loaded"))
    with pytest.raises(SentembConfigError, match=message):
        export(compose_export(["model=tiny", *(o.format(**names) for o in overrides), f"out={tmp_path / 'out'}"]))
    assert not (tmp_path / "out").exists()


AFTER_THE_MODEL = {  # refusals that need the embedding's size D (32): before the corpus is embedded or fitted
    "dim over D": ("corpus200", ["whitening_dim=33"], r"whitening_dim=33: more than the embedding's 32 dimensions"),
    "all D, too few": ("corpus20", [], r"whitening_dim=null \(all of the embedding's 32\) keeps 32 .* at least 33"),
}


@pytest.mark.parametrize("case", AFTER_THE_MODEL)
def test_whitening_dim_against_the_embeddings_size_is_refused_before_the_fit(case, tmp_path, corpus, monkeypatch):
    name, overrides, message = AFTER_THE_MODEL[case]
    source = corpus if name == "corpus200" else write_lines(tmp_path / "c20.txt", corpus_sentences(corpus)[:20])
    monkeypatch.setattr(Whitening, "fit", lambda *a, **k: pytest.fail("the corpus was fitted"))
    (tmp_path / "out").mkdir()
    with pytest.raises(SentembConfigError, match=message):
        export(compose_export([*TINY, f"whitening={source}", *overrides, f"out={tmp_path / 'out'}"]))
    assert list((tmp_path / "out").iterdir()) == [], "nothing written: the command can run again"


def test_a_direction_without_variance_is_refused_with_the_dim_that_fits(tmp_path, corpus):
    # tiny BERT's final LayerNorm: its mean-pooled embeddings have no variance along (1, ..., 1)
    message = r"no variance in 1 of the 32 directions .* whitening_dim=<at most 31>"
    with pytest.raises(SentembConfigError, match=message):
        export(compose_export([*TINY, f"whitening={corpus}", f"out={tmp_path / 'out'}"]))
    assert not (tmp_path / "out").exists()


def test_a_folder_that_is_not_empty_is_left_as_it_was(tmp_path, corpus):
    (tmp_path / "keep.txt").write_text("results")
    with pytest.raises(SentembConfigError, match="is not empty: nothing is overwritten"):
        export(compose_export([*TINY, f"whitening={corpus}", f"out={tmp_path}"]))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["keep.txt"]


def tamper_weights(folder: Path, change) -> None:
    path = folder / "2_Dense" / "model.safetensors"
    tensors = load_file(path)
    change(tensors)
    save_file(tensors, path)


def tamper_json(path: Path, **changes) -> None:
    path.write_text(json.dumps(json.loads(path.read_text()) | changes))


def nan_weight(tensors):
    tensors["linear.weight"][3, 5] = float("nan")


def inf_bias(tensors):
    tensors["linear.bias"][0] = float("inf")


def narrower_weight(tensors):
    tensors["linear.weight"] = tensors["linear.weight"][:, :30].contiguous()


def pickled_beside(folder: Path) -> None:
    torch.save({"linear.weight": torch.zeros(1)}, folder / "2_Dense" / "pytorch_model.bin")


TAMPERED = {  # a change to the exported folder → the file the refusal names, and what it says
    "non-finite matrix": (lambda f: tamper_weights(f, nan_weight), "2_Dense/model.safetensors", "non-finite"),
    "non-finite bias": (lambda f: tamper_weights(f, inf_bias), "2_Dense/model.safetensors", "non-finite"),
    "wrong shape": (lambda f: tamper_weights(f, narrower_weight), "2_Dense/model.safetensors", r"\(31, 30\)"),
    "config and weights disagree": (
        lambda f: tamper_json(f / "2_Dense" / "config.json", out_features=16),
        "2_Dense/model.safetensors",
        r"expected \{'linear.weight': \(16, 32\)",
    ),
    "record's dim": (lambda f: tamper_json(f / WHITENING, dim=16), WHITENING, r"maps 32 to 16 dimensions"),
    "record's module": (lambda f: tamper_json(f / WHITENING, module="1_Pooling"), WHITENING, "not one Dense module"),
    "an activation": (
        lambda f: tamper_json(f / "2_Dense" / "config.json", activation_function="torch.nn.modules.activation.ReLU"),
        "2_Dense/config.json",
        "activation_function='torch.nn.modules.activation.ReLU'",
    ),
    "a pickle": (pickled_beside, "2_Dense/model.safetensors", "safetensors only"),
}


@pytest.mark.parametrize("case", TAMPERED)
def test_a_tampered_whitening_is_refused_on_load_naming_the_file(case, exported, tmp_path):
    folder = tmp_path / "copy"
    shutil.copytree(exported, folder, ignore=shutil.ignore_patterns("onnx"))
    change, file, message = TAMPERED[case]
    change(folder)
    with pytest.raises(SentembConfigError, match=rf"{folder / file}: .*{message}.*Fix: export the folder again"):
        load_exported_folder(folder, device="cpu")


BLOCKED = """
import sys
class NoSentemb:  # sentemb is not installed, as far as this process can tell
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "sentemb":
            raise ImportError("sentemb is not installed")
sys.meta_path.insert(0, NoSentemb())
import numpy as np
from sentence_transformers import SentenceTransformer
np.save(sys.argv[2], SentenceTransformer(sys.argv[1], device="cpu", trust_remote_code=False).encode(sys.argv[3:]))
"""


@pytest.mark.slow  # a fresh interpreter importing sentence-transformers (~10 s)
def test_the_whitened_folder_loads_where_sentemb_is_not_installed(exported, corpus, tmp_path):
    command = [sys.executable, "-c", BLOCKED, str(exported), str(tmp_path / "e.npy"), *SENTENCES]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    expected = reference(TINY, corpus, TINY_DIM, SENTENCES)
    np.testing.assert_allclose(np.load(tmp_path / "e.npy"), expected, atol=TOLERANCE, rtol=0)


# ---- an export stopped part-way: never a half folder at out=, never one accepted as a model ----


def test_a_folder_an_export_left_part_way_is_refused_by_the_loader_and_by_compare(exported, tmp_path):
    import argparse

    import sentemb.compare

    half = tmp_path / "half"  # what an export killed before its card used to leave: modules, no card, no record
    shutil.copytree(exported, half, ignore=shutil.ignore_patterns("README.md", WHITENING, "onnx"))
    message = rf"{half}: no model card of sentemb's \(README\.md tagged 'sentemb'\).*Fix: export the model again"
    with pytest.raises(SentembConfigError, match=message):
        load_exported_folder(half, device="cpu")
    args = argparse.Namespace(contenders=[str(exported), str(half)], tasks="STSBenchmark", out=tmp_path / "cmp",
                              resamples=10, seed=1, level=0.95, batch_size=8, device="cpu", data_dir=None)  # fmt: skip
    with pytest.raises(SentembConfigError, match=message):
        sentemb.compare.compare(args)
    assert not (tmp_path / "cmp").exists()


KILLED_EXPORT = """
import os, sys
import sentemb.eval.whitening_export, sentemb.export
# SIGKILL there (no handler, no finally); export imports it where it writes the folder: replaced in its own module
sentemb.eval.whitening_export.write_whitening_record = lambda out, record: os._exit(137)
sys.argv = ["sentemb.export", *sys.argv[1:]]
sentemb.export.main()
"""


def test_an_export_killed_part_way_leaves_out_as_it_was_and_the_same_command_runs_again(corpus, tmp_path):
    # a kill no Python code sees needs a process of its own (~10 s: sentemb's imports and a tiny model's export)
    out = tmp_path / "out"
    overrides = [*TINY, f"whitening={corpus}", f"whitening_dim={TINY_DIM}", f"out={out}"]
    done = subprocess.run([sys.executable, "-c", KILLED_EXPORT, *overrides], capture_output=True, text=True,
                          timeout=600)  # fmt: skip
    assert done.returncode == 137, done.stderr[-3000:]
    assert [p.name for p in out.iterdir()] == [".sentemb.lock"], "no module, no weights: nothing of the export"
    with pytest.raises(SentembConfigError, match="no model card of sentemb's"):
        load_exported_folder(out, device="cpu")
    staged = [p.name for p in tmp_path.iterdir() if p.name.startswith(".out.")]
    assert len(staged) == 1 and staged[0].endswith(".staging"), "the killed export's staging folder, beside out"
    torch.manual_seed(0)
    export(compose_export(overrides))  # not refused as "not empty"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"], "the staging folder of the killed one removed"
    assert (out / "README.md").is_file() and (out / WHITENING).is_file() and not (out / ".sentemb.lock").exists()
    assert load_exported_folder(out, device="cpu").encode(SENTENCES).shape == (len(SENTENCES), TINY_DIM)
