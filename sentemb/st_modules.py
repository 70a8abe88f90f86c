"""A sentence-transformers module for the sentemb encoders that have no sentence-transformers counterpart.

Prompt ([MASK] state of a template), HiCL (segment aggregation) and SARCSE (TextCNN head) rewrite
the token ids or pool them in their own way, so the exported folder keeps sentemb's own
`SentenceEncoder`: `SentenceTransformer(dir)` imports this class (from the installed `sentemb`
package), rebuilds the pooling/head from the saved config (sentemb's own parts only: a `_target_` in
the JSON is looked up in a closed registry, never imported) and loads the saved weights. The
forward is sentemb's `encode()` computation, so the embeddings agree with it. Loading a folder
builds the encoder through `sentemb.encoders.build`, which imports no training code (no Lightning).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from sentence_transformers.base.modules.input_module import InputModule

from sentemb.common.errors import SentembConfigError
from sentemb.encoders.build import build_encoder

CONFIG = "sentemb_config.json"
POOLING_WEIGHTS = "sentemb_pooling.safetensors"


class SentembEncoder(InputModule):
    """Tokenizer + backbone + sentemb pooling (and head), saved in the model folder's root."""

    save_in_root = True

    def __init__(self, encoder: torch.nn.Module, pooling: dict[str, Any], head: dict[str, Any] | None) -> None:
        super().__init__()
        self.encoder = encoder
        self.tokenizer = encoder.tokenizer
        self.pooling_config, self.head_config = pooling, head

    @property
    def max_seq_length(self) -> int:
        return self.tokenizer.model_max_length

    def get_embedding_dimension(self) -> int:
        return int(self.encoder.encode(["a"]).shape[1])

    def preprocess(self, inputs: Sequence[str], prompt: str | None = None, **kwargs: Any) -> dict[str, torch.Tensor]:
        texts = [prompt + text for text in inputs] if prompt else list(inputs)
        return dict(self.tokenizer(texts, padding=True, return_tensors="pt"))

    def forward(self, features: dict[str, torch.Tensor], **kwargs: Any) -> dict[str, torch.Tensor]:
        batch = {k: v for k, v in features.items() if k in ("input_ids", "attention_mask", "token_type_ids")}
        features["sentence_embedding"] = self.encoder(batch).float()  # float32, as sentemb's encode()
        return features

    def save(self, output_path: str, *args: Any, safe_serialization: bool = True, **kwargs: Any) -> None:
        folder = Path(output_path)
        self.encoder.backbone.save_pretrained(folder)
        self.tokenizer.save_pretrained(folder)
        pooling = {k: v.contiguous() for k, v in self.encoder.pooling.state_dict().items()}
        save_file(pooling, folder / POOLING_WEIGHTS)
        config = {"pooling": self.pooling_config, "head": self.head_config}
        (folder / CONFIG).write_text(json.dumps(config, indent=2) + "\n")

    @classmethod
    def load(cls, model_name_or_path: str, subfolder: str = "", **kwargs: Any) -> SentembEncoder:
        folder = str(Path(model_name_or_path) / subfolder)
        pooling, head = read_config(Path(folder) / CONFIG)
        model = {
            "backbone": {"_target_": "sentemb.encoders.backbones.pretrained_backbone", "name_or_path": folder},
            "tokenizer": {"_target_": "sentemb.encoders.backbones.pretrained_tokenizer", "name_or_path": folder},
        }
        try:  # sentemb's own parts only, built from plain options (encoders.build.PARTS): the JSON names no code
            encoder = build_encoder(model, pooling, head)
        except SentembConfigError as err:
            raise SentembConfigError(f"{Path(folder) / CONFIG}: {err}") from None
        encoder.pooling.load_state_dict(load_file(Path(folder) / POOLING_WEIGHTS))
        return cls(encoder.eval(), pooling, head)


def read_config(path: Path) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """The pooling and head configs of an exported folder's sentemb_config.json, checked for their shape."""
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise SentembConfigError(
            f"{path}: unreadable ({err}). Fix: export the folder again (python -m sentemb.export)"
        ) from None
    pooling, head = (config.get("pooling"), config.get("head")) if isinstance(config, dict) else (None, None)
    if not isinstance(pooling, dict) or not isinstance(head, dict | None):
        raise SentembConfigError(
            f"{path}: expected {{'pooling': {{...}}, 'head': {{...}} or null}}. Fix: export the folder again "
            "(python -m sentemb.export)"
        )
    return pooling, head
