"""SARCSE: self-adaptive reconstruction as an auxiliary head (Liu et al. 2024, arXiv 2402.15153).

Token states X (special tokens removed, (T, d)) → TextCNN encoder, kernels ks ∈ {3, 4, 5} over
the full hidden width with `co_t` channels each, ReLU, masked max over time → H_ks ∈ R^{co_t}
(Eq. 1) → the three scales stacked as a (3, co_t) map → Conv2d 3×2 with `co_c` channels → the
sentence embedding Z ∈ R^{co_c·(co_t−1)} (1497 by default, Eq. 2), used by the contrastive
loss and at inference. Decoder, the encoder mirrored (Eq. 3–5): ConvTranspose2d 3×2 back to the
(3, co_t) map → per scale, max-unpooling (each channel's value returned to the window its max
came from: the exact inverse of the encoder's max over time) and ConvTranspose1d ks back to
(T, d) → the three reconstructions averaged. Shapes the paper leaves open and chosen here so
every equation is consistent: sequences shorter than the largest kernel are zero-padded to it
(one window, padding masked out of the max and of the loss); unpooling keeps positions, so the
reconstruction of different tokens differs (a broadcast vector could only give every interior
token the same reconstruction).

Self-adaptive reconstruction loss (Eq. 8, 9): L_R = (1/N) Σ_i f(w_i)·MSE(x_i, x'_i),
f(w) = max(θ, 1 − λ·freq(w)), freq = the token's share of all tokens of the training corpus
(counted once per corpus + tokenizer and cached on disk); `weighting: mse` gives plain MSE.
Both views reconstruct their own tokens; total α·L_I + β·L_R + γ·L_R⁺ (Eq. 10): α is its
`contrastive_weight`, β·L_R and γ·L_R⁺ its `own_terms` (the Pooling interface, which HiCL
also uses when SARCSE runs on every segment). The tokenizer's special ids (removed before the
TextCNN) come through the constructor.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Sequence
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PreTrainedTokenizerBase

from sentemb.common.errors import SentembConfigError
from sentemb.common.numbers import NON_NEGATIVE, Bounds, require_number, require_whole
from sentemb.common.parts import ENCODERS, part
from sentemb.common.published_files import published
from sentemb.encoders.poolings.base import Pooling

log = logging.getLogger(__name__)
KERNELS = (3, 4, 5)
MAX_CHANNELS = 65536  # 131x the paper's co_t: a TextCNN of 3 x 65536 filters over a 4096-wide model is ~5 GB


@part(
    "head", "sarcse", serves=ENCODERS, why_not="SARCSE replaces an encoder's [CLS] pooling, which decoders do not have"
)
class SARCSEHead(Pooling):
    term_labels = ("reconstruction", "reconstruction_positive")  # β·L_R and γ·L_R⁺ (Eq. 10)
    graph_refusal = (
        "format=onnx with head=sarcse: SARCSE's TextCNN lays out each batch at the width of its longest sentence's "
        "content tokens, a shape read from the data that torch's ONNX exporter cannot keep dynamic. "
        "Fix: export without format=onnx (a sentence-transformers folder)"
    )

    replaces_pooling = (
        "SARCSE builds the sentence vector itself from the token states, so that pooling would be ignored. Fix: "
        "pooling=cls (SARCSE on the whole sentence) or pooling=hicl (SARCSE on every segment, pooling.prompt=false)."
    )

    def __init__(
        self,
        hidden_size: int,
        special_ids: Sequence[int],
        co_t: int = 500,
        co_c: int = 3,
        theta: float = 0.1,
        lam: float = 50.0,
        weighting: str = "self_adaptive",
        alpha: float = 1.0,
        beta: float = 2.5e-4,
        gamma: float = 2.5e-4,
        corpus: str | None = None,
        cache_dir: str | None = None,
    ) -> None:
        super().__init__()
        if weighting not in ("self_adaptive", "mse"):
            raise SentembConfigError(f"head.weighting={weighting!r}: use self_adaptive (SARCSE Eq. 8) or mse")
        # channel counts bounded: each allocates co_t (co_c) filters over the hidden width
        self.co_t = require_whole("head.co_t", co_t, Bounds(2, MAX_CHANNELS), "head.co_t=500 (the paper's)")
        self.co_c = require_whole("head.co_c", co_c, Bounds(1, MAX_CHANNELS), "head.co_c=3 (the paper's)")
        self.theta = require_number("head.theta", theta, Bounds(0.0, 1.0), "head.theta=0.1 (f(w)'s floor)")
        self.lam = require_number("head.lam", lam, NON_NEGATIVE, "head.lam=50")
        self.weighting = weighting
        self.alpha, self.beta, self.gamma = (
            require_number(f"head.{key}", value, NON_NEGATIVE, f"head.{key}={default}")
            for key, value, default in (("alpha", alpha, 1.0), ("beta", beta, 2.5e-4), ("gamma", gamma, 2.5e-4))
        )
        self.corpus, self.cache_dir = corpus, cache_dir
        self.text_cnn = nn.ModuleList(nn.Conv1d(hidden_size, co_t, ks) for ks in KERNELS)
        self.scale_cnn = nn.Conv2d(1, co_c, kernel_size=(len(KERNELS), 2))
        self.scale_decoder = nn.ConvTranspose2d(co_c, 1, kernel_size=(len(KERNELS), 2))
        self.text_decoder = nn.ModuleList(nn.ConvTranspose1d(co_t, hidden_size, ks) for ks in KERNELS)
        # token frequencies of the training corpus, filled by `prepare_training` at fit start (from the disk
        # cache); inference does not need them, so checkpoints do not carry them
        self.register_buffer("token_frequency", torch.zeros(0), persistent=False)
        # the tokenizer's special tokens, removed before the TextCNN (not saved: the tokenizer gives them)
        self.register_buffer("special_token_ids", torch.tensor(sorted(special_ids), dtype=torch.long), persistent=False)

    @property
    def contrastive_weight(self) -> float:
        """α of Eq. 10."""
        return self.alpha

    @property
    def output_size(self) -> int:
        return self.co_c * (self.co_t - 1)

    # ------------------------------------------------------------------ tokens without specials
    @staticmethod
    def content_tokens(
        hidden: torch.Tensor, attention_mask: torch.Tensor, input_ids: torch.Tensor, special_ids: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(B, T', d) states, (B, T') mask and ids of the non-special tokens, left-aligned, T' ≥ max kernel."""
        keep = attention_mask.bool() & ~torch.isin(input_ids, special_ids)
        lengths = keep.sum(dim=1)
        width = max(int(lengths.max()) if lengths.numel() else 0, max(KERNELS))
        order = torch.argsort((~keep).to(torch.int8), dim=1, stable=True)[:, :width]  # kept positions first, in order
        if order.shape[1] < width:
            order = F.pad(order, (0, width - order.shape[1]))
        mask = torch.arange(width, device=hidden.device)[None, :] < lengths[:, None]
        states = hidden.gather(1, order[..., None].expand(-1, -1, hidden.shape[-1])) * mask[..., None]
        return states, mask, input_ids.gather(1, order) * mask

    # ------------------------------------------------------------------ encoder / decoder
    def encode_scales(self, states: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """H (B, 3, co_t) and, per scale, the window index each channel's max came from."""
        x = states.transpose(1, 2)  # (B, d, T)
        lengths = mask.sum(dim=1)
        pooled, argmax = [], []
        for ks, conv in zip(KERNELS, self.text_cnn, strict=True):
            windows = torch.relu(conv(x))  # (B, co_t, T − ks + 1)
            # a window is real if it starts on a real token; a sentence shorter than ks keeps its first window
            valid = torch.arange(windows.shape[-1], device=x.device)[None, :] <= (lengths[:, None] - ks).clamp_min(0)
            values, index = windows.masked_fill(~valid[:, None, :], float("-inf")).max(dim=-1)
            pooled.append(values)
            argmax.append(index)
        return torch.stack(pooled, dim=1), argmax

    def embed(self, scales: torch.Tensor) -> torch.Tensor:
        """Z = flatten(Conv2d_{3×2}(H)): (B, co_c·(co_t − 1))."""
        return self.scale_cnn(scales[:, None]).flatten(1)

    def reconstruct(self, z: torch.Tensor, argmax: list[torch.Tensor], width: int) -> torch.Tensor:
        """X' (B, T', d): transposed CNN, then per scale max-unpooling + transposed TextCNN, averaged."""
        scales = self.scale_decoder(z.view(z.shape[0], self.co_c, 1, self.co_t - 1))[:, 0]  # (B, 3, co_t)
        outputs = []
        for row, (ks, deconv) in enumerate(zip(KERNELS, self.text_decoder, strict=True)):
            windows = scales.new_zeros(z.shape[0], self.co_t, width - ks + 1)
            windows = windows.scatter(2, argmax[row][..., None], scales[:, row, :, None])
            outputs.append(deconv(windows).transpose(1, 2))  # (B, T', d)
        return torch.stack(outputs).mean(dim=0)

    def forward(self, hidden: torch.Tensor, batch: dict[str, torch.Tensor], train_head: bool = False) -> torch.Tensor:
        states, mask, _ = self.content_tokens(
            hidden, batch["attention_mask"], batch["input_ids"], self.special_token_ids
        )
        scales, _ = self.encode_scales(states, mask)
        return self.embed(scales)

    # ------------------------------------------------------------------ training
    def embed_and_reconstruction_loss(
        self, hidden: torch.Tensor, attention_mask: torch.Tensor, input_ids: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Z (B, co_c·(co_t−1)) and each row's L_R (B,) (Eq. 9)."""
        states, mask, ids = self.content_tokens(hidden, attention_mask, input_ids, self.special_token_ids)
        scales, argmax = self.encode_scales(states, mask)
        z = self.embed(scales)
        rebuilt = self.reconstruct(z, argmax, states.shape[1])
        per_token = (rebuilt.float() - states.float()).pow(2).mean(dim=-1)  # MSE(x_i, x'_i) over the hidden width
        weight = self.token_weights(ids) * mask
        return z, (weight * per_token).sum(dim=1) / mask.sum(dim=1).clamp_min(1)

    def training_rows(self, hidden: torch.Tensor, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Each row's Z and its own L_R (Eq. 9): both views reconstruct their own tokens."""
        z, reconstruction = self.embed_and_reconstruction_loss(hidden, batch["attention_mask"], batch["input_ids"])
        return {"embedding": z, "reconstruction": reconstruction}

    def own_terms(self, rows: dict[str, torch.Tensor], half: int) -> dict[str, tuple[float, torch.Tensor]]:
        """β·L_R (first view's rows) and γ·L_R⁺ (second view's rows) of Eq. 10; a view after them
        (e.g. SNCSE's negations) is not reconstructed."""
        per_row = rows["reconstruction"]
        return {
            "reconstruction": (self.beta, per_row[:half].mean()),
            "reconstruction_positive": (self.gamma, per_row[half : 2 * half].mean()),
        }

    def token_weights(self, ids: torch.Tensor) -> torch.Tensor:
        """f(w) = max(θ, 1 − λ·freq(w)) (Eq. 8), or 1 with weighting=mse."""
        if self.weighting == "mse":
            return torch.ones(ids.shape, device=ids.device)
        if self.token_frequency.numel() == 0:
            raise RuntimeError("SARCSEHead.token_frequency is empty: call prepare_training(tokenizer) before training")
        return (1.0 - self.lam * self.token_frequency[ids]).clamp_min(self.theta)

    def prepare_training(self, tokenizer: PreTrainedTokenizerBase) -> None:
        """Fill token_frequency from head.corpus (counted once, cached on disk)."""
        if self.weighting == "mse" or self.token_frequency.numel():
            return
        if not self.corpus:
            raise SentembConfigError("head.corpus is not set: SARCSE's self-adaptive weights need the training corpus")
        self.token_frequency = corpus_token_frequency(Path(self.corpus), tokenizer, self.cache_dir).to(
            self.token_frequency.device
        )


def corpus_token_frequency(corpus: Path, tokenizer: PreTrainedTokenizerBase, cache_dir: str | None) -> torch.Tensor:
    """freq(w) = count(w) / Σ counts over the corpus's tokens (special tokens excluded), cached per corpus+tokenizer."""
    stat = corpus.stat()
    key = json.dumps([str(corpus.resolve()), stat.st_size, stat.st_mtime_ns, tokenizer.name_or_path, len(tokenizer)])
    cache = Path(cache_dir or Path.home() / ".cache" / "sentemb") / "token_frequency"
    path = cache / f"{hashlib.sha256(key.encode()).hexdigest()[:16]}.pt"
    if path.is_file():
        return torch.load(path, weights_only=True)  # a tensor only: a tampered cache file cannot run code
    counts = torch.zeros(len(tokenizer), dtype=torch.float64)
    lines = [line for line in corpus.read_text(encoding="utf-8").splitlines() if line.strip()]
    for start in range(0, len(lines), 10_000):
        for ids in tokenizer(lines[start : start + 10_000], add_special_tokens=False)["input_ids"]:
            counts += torch.bincount(torch.tensor(ids, dtype=torch.long), minlength=len(tokenizer)).double()
    frequency = (counts / counts.sum().clamp_min(1)).float()
    with published(path, "wb") as handle:  # whole, and never through a link (published_files)
        torch.save(frequency, handle)
    log.info("token frequencies of %s cached in %s", corpus, path)
    return frequency
