"""Views as a list: a batch carries any number of views, each under its role, laid out in one forward and read back
by role (sentemb.common.batch_views, TrainingViews)."""

from __future__ import annotations

import pytest
import torch

from sentemb.common.batch_views import prefix, view_roles
from sentemb.data.views import ViewCollator
from sentemb.training.module import SentembModule
from tests.conftest import compose_train

SENTENCES = ["A man plays a guitar.", "Two dogs run on the beach.", "The market fell today.", "It rains."]
OTHERS = ["Nobody plays.", "Cats sleep inside.", "Prices rose.", "The sun is out."]


def batch_with(tokenizer, roles: list[str]) -> dict[str, torch.Tensor]:
    """The anchor's rows and, under each role's prefix, another view's (each padded on its own by the collator)."""
    columns = dict(tokenizer(SENTENCES))
    for number, role in enumerate(roles):
        texts = [f"{s} {'x ' * number}" for s in OTHERS]
        columns.update({f"{prefix(role)}{key}": value for key, value in tokenizer(texts).items()})
    return dict(ViewCollator(tokenizer)([{k: v[i] for k, v in columns.items()} for i in range(len(SENTENCES))]))


@pytest.mark.parametrize("pooling", ["cls", "hicl"])
def test_any_number_of_views_in_one_forward_read_back_by_role(tmp_path, monkeypatch, pooling):
    torch.manual_seed(0)
    module = SentembModule.from_config(compose_train(["model=tiny", f"pooling={pooling}"], tmp_path))
    batch = batch_with(module.encoder.tokenizer, ["hard_negative", "negation"])
    assert view_roles(batch) == ["anchor", "positive", "hard_negative", "negation"], "the positive: the anchor again"
    calls = []
    forward = module.encoder.backbone.forward
    monkeypatch.setattr(module.encoder.backbone, "forward", lambda *a, **kw: calls.append(kw) or forward(*a, **kw))
    views = module.training_views(batch)
    assert len(calls) == 1, "every view in one forward"
    assert views.roles == ("anchor", "positive", "hard_negative", "negation")
    assert [tuple(z.shape) for z in views.embeddings] == [(4, 32)] * 4
    module.eval()  # no dropout: each view's embedding is its sentences' own
    views = module.training_views(batch)
    rows = {key.removeprefix(prefix("negation")): value for key, value in batch.items() if key.startswith("negation_")}
    alone = module.encoder(rows, train_head=True)
    torch.testing.assert_close(views.view("negation", "a test"), alone, rtol=1e-4, atol=1e-5)  # other padding widths


def test_a_view_the_batch_lacks_is_refused_naming_who_reads_it(tmp_path):
    module = SentembModule.from_config(compose_train(["model=tiny"], tmp_path))
    views = module.training_views(batch_with(module.encoder.tokenizer, []))
    with pytest.raises(RuntimeError, match=r"auxiliary=mine reads the training view 'negation'.*anchor, positive"):
        views.view("negation", "auxiliary=mine")
