"""format=onnx: one graph from token ids to the sentence embedding, the pooling inside it.

ONNX Runtime agrees with sentemb's encode() for every pooling the graph holds, on batches of several
sizes and lengths; the folder embeds in a process that imports neither torch nor sentemb; int8 stays
close to fp32; sentemb.evaluate scores the artefact as deployed; what cannot be one graph is refused
before any model loads.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from sentemb.common.errors import SentembConfigError
from sentemb.common.hydra_plumbing import compose_config
from sentemb.common.parts import lookup, names
from sentemb.encoders.build import build_encoder
from sentemb.encoders.poolings.templates import real_ids
from sentemb.encoders.serving.onnx_embedder import OnnxEncoder
from sentemb.encoders.serving.onnx_graph import write_onnx_folder
from sentemb.eval.suite import evaluate
from sentemb.export import export
from tests.conftest import CONF_DIR
from tests.parts import TINY_BERT, TINY_ROBERTA
from tests.test_export import SENTENCES, compose_export

# a literal mask token (prompt pooling makes it [UNK]), a repeated sentence, an empty one (no tokens at all in a
# tokenizer without BOS) and lengths from 1 word to ~30 tokens
MORE = ["This sentence : [MASK] is literal .", "hi", "", "a b c d e f g h i j k l m n o p q r s t u v w"]
BATCHES = [(SENTENCES + MORE, 32), (SENTENCES + MORE, 3), (MORE[:1], 1), (SENTENCES[:2], 2)]
# ORT and torch run different float32 kernels on the same weights: last-bit differences, bounded by the 1e-5
TOLERANCE = 1e-5


def conf(group: str, name: str, **changes) -> dict:
    node = yaml.safe_load((CONF_DIR / group / f"{name}.yaml").read_text())
    return {**node, **changes}


LATENT = conf("pooling", "latent", num_latents=16, num_heads=2)  # NV-Embed's shape, small
# name → (model config, pooling config); the fast set covers the mask position read in the graph and a left-padded
# decoder with EOS appended; make test-slow runs every pooling on every family
GRAPHS = {
    "bert-prompt": (TINY_BERT, conf("pooling", "prompt", max_length=16)),  # the template's own cut, too
    "llama-last_token": (conf("model", "tiny-llama"), conf("pooling", "last_token")),
}
# every pooling that serves decoders, from the registry (latent has its own small shape above)
DECODER_POOLINGS = [
    name for name in names("pooling") if lookup("pooling", name).fits(decoder=True) and name != "latent"
]
SLOW_GRAPHS = {
    "llama-latent": (conf("model", "tiny-llama"), LATENT),
    "bert-cls": (TINY_BERT, conf("pooling", "cls")),
    "bert-mean": (TINY_BERT, conf("pooling", "mean")),
    "roberta-cls": (TINY_ROBERTA, conf("pooling", "cls")),
    "roberta-mean": (TINY_ROBERTA, conf("pooling", "mean")),
    "roberta-prompt": (TINY_ROBERTA, conf("pooling", "prompt")),
    "bert-prompt-whole": (TINY_BERT, conf("pooling", "prompt")),
    "llama-prompt_eol-cut": (conf("model", "tiny-llama"), conf("pooling", "prompt_eol", max_length=26)),
    "bert-cls-mlp-always": (TINY_BERT, conf("pooling", "cls", mlp="always")),
    **{
        f"{family}-{pooling}": (conf("model", f"tiny-{family}"), conf("pooling", pooling))
        for family in ("llama", "mistral", "qwen2", "qwen3")
        for pooling in DECODER_POOLINGS
    },
}


def prepared_ids(encoder, sentences: list[str]) -> list[list[int]]:
    """The rows sentemb's encode() gives the backbone: tokenised, padded, prepared by the pooling, padding dropped."""
    batch = encoder.tokenizer(sentences, padding=True, return_tensors="pt")
    return real_ids(encoder.pooling.prepare(batch, encoder.tokenizer))


def assert_graph_matches_encode(model: dict, pooling: dict, folder: Path) -> None:
    encoder = build_encoder(model, pooling).eval()
    write_onnx_folder(encoder, folder, quantize=None)
    graph = OnnxEncoder(folder)
    sentences = SENTENCES + MORE
    assert graph.rows(sentences) == prepared_ids(encoder, sentences), "the loader's rows are encode()'s, exactly"
    for sentences, batch_size in BATCHES:
        expected = encoder.encode(sentences, batch_size=batch_size)
        np.testing.assert_allclose(graph.encode(sentences, batch_size=batch_size), expected, atol=TOLERANCE, rtol=0)
    # truncated as encode() truncates (the template's sentence cut to fit, never the template)
    truncated = encoder.encode(SENTENCES, max_length=8)
    np.testing.assert_allclose(graph.encode(SENTENCES, max_length=8), truncated, atol=TOLERANCE, rtol=0)


@pytest.mark.parametrize("name", GRAPHS)
def test_onnx_runtime_agrees_with_encode(name, tmp_path):
    assert_graph_matches_encode(*GRAPHS[name], tmp_path)


@pytest.mark.slow  # one export each (~4 s): every pooling on every tiny family
@pytest.mark.parametrize("name", SLOW_GRAPHS)
def test_onnx_runtime_agrees_with_encode_for_every_pooling(name, tmp_path):
    assert_graph_matches_encode(*SLOW_GRAPHS[name], tmp_path)


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> Path:
    """`python -m sentemb.export model=tiny pooling=mean format=onnx export.quantize=int8`, measured on STS-B."""
    out = tmp_path_factory.mktemp("onnx") / "tiny-mean"
    export(compose_export(["model=tiny", "pooling=mean", "format=onnx", "export.quantize=int8", f"out={out}"]))
    return out


FRESH = """
import json, sys
import numpy as np
sys.path.insert(0, sys.argv[1])
from sentemb_onnx import load
sentences = json.loads(sys.argv[2])
for name, file in (("fp32", None), ("int8", "onnx/model_qint8.onnx")):
    np.save(sys.argv[1] + f"/{name}.npy", load(sys.argv[1], file=file).embed(sentences))
imported = sorted(m for m in ("torch", "sentemb", "transformers", "sentence_transformers") if m in sys.modules)
assert not imported, f"the folder's loader imported {imported}"
"""


def test_an_onnx_folder_embeds_in_a_fresh_process_without_torch_or_sentemb(exported):
    sentences = SENTENCES + MORE
    result = subprocess.run(
        [sys.executable, "-I", "-c", FRESH, str(exported), json.dumps(sentences)], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr[-3000:]
    from sentence_transformers import SentenceTransformer

    # the folder's torch form (its sentence-transformers modules: the same weights, mean pooling)
    reference = SentenceTransformer(str(exported), device="cpu")
    fp32, int8 = np.load(exported / "fp32.npy"), np.load(exported / "int8.npy")
    np.testing.assert_allclose(fp32, reference.encode(sentences), atol=TOLERANCE, rtol=0)
    cosine = (fp32 * int8).sum(1) / np.linalg.norm(fp32, axis=1) / np.linalg.norm(int8, axis=1)
    assert cosine.min() >= 0.99, cosine  # the bound for dynamic int8 on a fixed set


def test_the_card_holds_the_measured_table_and_evaluate_scores_the_deployed_graph(exported, tmp_path):
    card = (exported / "README.md").read_text()
    assert "## ONNX: the pooling inside the graph" in card and "from sentemb_onnx import load" in card
    assert "backend='onnx'" in card, "mean pooling in sentence-transformers' modules: its ONNX layout"
    rows = {line.split("|")[1].strip(): line.split("|") for line in card.splitlines() if line.startswith("| onnx ")}
    assert set(rows) == {"onnx fp32", "onnx int8"}, card
    fp32_min = float(rows["onnx fp32"][4].split("/")[0])
    assert fp32_min >= 0.99999, "fp32 ONNX against torch fp32: the same model"
    carded = float(rows["onnx fp32"][5])
    overrides = [f"onnx={exported}", "tasks=[STSBenchmark]", "sts_splits=[test]", "align_uniform_split=null"]
    results = evaluate(compose_config(CONF_DIR, "eval", overrides, tmp_path / "eval"), tmp_path / "eval")
    assert results["source"]["graph"] == "onnx/model.onnx"
    assert results["sts_table"]["STSBenchmark"] == pytest.approx(carded, abs=0.01)  # the card rounds to 2 places
    int8 = [f"onnx={exported}/onnx/model_qint8.onnx", *overrides[1:]]
    results = evaluate(compose_config(CONF_DIR, "eval", int8, tmp_path / "eval8"), tmp_path / "eval8")
    assert results["source"]["graph"] == "onnx/model_qint8.onnx"
    assert "ONNX Runtime" in (tmp_path / "eval8" / "results.md").read_text()
    # the same sentences in the same batches as the card's measurement: int8's activation scales are the same too
    assert results["sts_table"]["STSBenchmark"] == pytest.approx(float(rows["onnx int8"][5]), abs=0.01)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["pooling=hicl", "format=onnx"], "format=onnx with pooling=hicl: HiCL splits every sentence"),
        (["head=sarcse", "format=onnx"], "format=onnx with head=sarcse: SARCSE's TextCNN"),
        (["format=onnx", "export.quantize=int4"], "export.quantize='int4': use int8"),
        (["export.quantize=int8"], "export.quantize=int8 quantises an ONNX graph. Fix: add format=onnx"),
        (["format=tflite"], "format='tflite': use sentence-transformers"),
    ],
)
def test_what_cannot_be_exported_is_refused_before_any_model_loads(overrides, message, tmp_path, monkeypatch):
    import sentemb.eval.suite as suite

    monkeypatch.setattr(suite, "build_encoder", lambda *a, **k: pytest.fail("a model was loaded"))
    with pytest.raises(SentembConfigError, match=message):
        export(compose_export(["model=tiny", *overrides, f"out={tmp_path / 'out'}"]))
    assert not (tmp_path / "out").exists()


def test_a_failed_export_leaves_its_folder_empty_so_the_command_can_run_again(tmp_path, monkeypatch):
    import sentemb.encoders.serving.onnx_graph as onnx_graph

    def failing_export(*args, **kwargs):
        raise RuntimeError("the exporter failed")

    monkeypatch.setattr(onnx_graph, "export_graph", failing_export)
    (tmp_path / "out").mkdir()
    with pytest.raises(RuntimeError, match="the exporter failed"):
        export(compose_export(["model=tiny", "format=onnx", "export.measure=false", f"out={tmp_path / 'out'}"]))
    assert list((tmp_path / "out").iterdir()) == []


def test_missing_stsb_files_are_named_before_the_export_starts(tmp_path, monkeypatch):
    import sentemb.eval.suite as suite

    (tmp_path / "data" / "senteval").mkdir(parents=True)  # a data folder without STS-B in it
    monkeypatch.setenv("SENTEMB_DATA", str(tmp_path / "data"))
    monkeypatch.setattr(suite, "build_encoder", lambda *a, **k: pytest.fail("a model was loaded"))
    with pytest.raises(SentembConfigError, match="sts-dev.csv"):
        export(compose_export(["model=tiny", "format=onnx", f"out={tmp_path / 'out'}"]))


@pytest.mark.parametrize("target", ["missing", "plain-folder", "with-checkpoint"])
def test_evaluate_refuses_what_is_not_an_onnx_export(target, tmp_path):
    (tmp_path / "plain-folder").mkdir()
    overrides = {
        "missing": [f"onnx={tmp_path / 'missing'}"],
        "plain-folder": [f"onnx={tmp_path / 'plain-folder'}"],
        "with-checkpoint": [f"onnx={tmp_path / 'plain-folder'}", f"checkpoint={tmp_path / 'x.ckpt'}"],
    }[target]
    cfg = compose_config(CONF_DIR, "eval", [*overrides, "tasks=[STSBenchmark]"], tmp_path / "eval")
    message = "evaluate one of them" if target == "with-checkpoint" else "not a folder written by"
    with pytest.raises(SentembConfigError, match=message):
        evaluate(cfg, tmp_path / "eval")


@pytest.mark.slow  # MiniLM exported and scored on STS-B test twice (~1 min)
def test_minilm_mean_onnx_scores_the_sentence_transformers_figure_and_int8_stays_within_half_a_point(tmp_path):
    out = tmp_path / "minilm"
    overrides = ["model=minilm", "pooling=mean", "format=onnx", "export.quantize=int8", "export.measure=false"]
    export(compose_export([*overrides, f"out={out}"]))
    scores = {}
    for name, target in (("fp32", out), ("int8", out / "onnx" / "model_qint8.onnx")):
        cfg = compose_config(CONF_DIR, "eval", [f"onnx={target}", "tasks=[STSBenchmark]"], tmp_path / name)
        scores[name] = evaluate(cfg, tmp_path / name)["sts_table"]["STSBenchmark"]
    # sentence-transformers' and SentEval's figure for all-MiniLM-L6-v2 + mean pooling (tests/test_eval_anchor.py)
    assert scores["fp32"] == pytest.approx(82.03, abs=0.01), scores
    assert scores["int8"] == pytest.approx(82.03, abs=0.5), scores


ST_ONNX = """
import json, sys
import numpy as np
from sentence_transformers import SentenceTransformer
sys.path.insert(0, sys.argv[1])
from sentemb_onnx import load
sentences = json.loads(sys.argv[2])
for file in ("onnx/model.onnx", "onnx/model_qint8.onnx"):
    st = SentenceTransformer(sys.argv[1], backend="onnx", device="cpu", model_kwargs={"file_name": file})
    ours = load(sys.argv[1], file=file).embed(sentences)
    difference = float(np.abs(st.encode(sentences) - ours).max())
    assert difference < 1e-5, (file, difference)  # the same graph; sentence-transformers pools in torch
"""


def st_onnx_python(root: Path) -> str:
    """A Python with `sentence-transformers[onnx]`: optimum-onnx 0.1.0 requires transformers < 4.58, which
    sentence-transformers 6 and sentemb refuse, so it lives in its own venv (built once, from the registry)."""
    python = root / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(root)], check=True)
        pip = [str(python), "-m", "pip", "install", "-q"]
        subprocess.run([*pip, "torch==2.13.0"], check=True)  # the CPU wheel first: nothing pulls CUDA builds
        subprocess.run([*pip, "sentence-transformers[onnx]<6"], check=True)
    return str(python)


@pytest.mark.slow  # builds a separate venv the first time (~2 min)
@pytest.mark.parametrize("pooling", ["cls", "mean"])
def test_sentence_transformers_onnx_backend_reads_a_cls_or_mean_folder(pooling, tmp_path):
    out = tmp_path / pooling
    export(compose_export(["model=tiny", f"pooling={pooling}", "format=onnx", "export.quantize=int8", f"out={out}"]))
    python = st_onnx_python(Path.home() / ".cache" / "sentemb" / "st-onnx-venv")
    command = [python, "-c", ST_ONNX, str(out), json.dumps(SENTENCES + MORE)]
    result = subprocess.run(command, capture_output=True, text=True, env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin"})
    assert result.returncode == 0, result.stderr[-3000:]
