"""The post-hoc baselines of Focal-InfoNCE's Table 2 as poolings: first_last_avg and avg_top2, against transformers'
own `output_hidden_states` on the packaged MiniLM."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModel, AutoTokenizer

from sentemb.common.errors import SentembConfigError
from sentemb.common.hydra_plumbing import resolved_container
from sentemb.encoders.build import build_encoder
from tests.conftest import compose_train

SENTENCES = ["A man is playing a guitar.", "hi", "The weather in the mountains changes quickly in spring."]
LAYERS = {"first_last_avg": (1, -1), "first_last_avg+embeddings": (0, -1), "avg_top2": (-2, -1)}


def reference(folder: str, layers: tuple[int, int]) -> torch.Tensor:
    """transformers' hidden_states of the two layers, averaged, then averaged over the real tokens (padded batch)."""
    tokenizer, model = AutoTokenizer.from_pretrained(folder), AutoModel.from_pretrained(folder).eval()
    tokens = tokenizer(SENTENCES, padding=True, return_tensors="pt")
    with torch.no_grad():
        states = model(**tokens, output_hidden_states=True).hidden_states
    hidden = (states[layers[0]] + states[layers[1]]) / 2
    mask = tokens["attention_mask"].unsqueeze(-1).float()
    return (hidden * mask).sum(1) / mask.sum(1)


@pytest.mark.parametrize("padding_free", [True, False])
@pytest.mark.parametrize("variant", sorted(LAYERS))
def test_the_pooling_equals_transformers_hidden_states_on_minilm(variant, padding_free, tmp_path):
    name, _, first = variant.partition("+")
    overrides = [f"pooling={name}", f"model.padding_free={str(padding_free).lower()}"]
    cfg = compose_train([*overrides, *([f"pooling.first={first}"] if first else [])], tmp_path)
    encoder = build_encoder(resolved_container(cfg.model), resolved_container(cfg.pooling)).eval()
    got = torch.from_numpy(encoder.encode(SENTENCES))
    # padding-free attention (or padded SDPA) against transformers' eager padded attention: float32 sums apart ~1e-6
    torch.testing.assert_close(got, reference(cfg.model.name_or_path, LAYERS[variant]), rtol=1e-4, atol=1e-5)


def test_a_bad_first_layer_is_refused(tmp_path):
    from sentemb.encoders.poolings.encoder_poolings import FirstLastAvgPooling

    with pytest.raises(SentembConfigError, match="pooling.first"):
        FirstLastAvgPooling(8, first="middle")
