"""DapperFL's `dapperfl-variant`: `paper` (the paper's equations) against `official` (the authors' public code as it
runs) on hand-made tensors: fusion, pruned positions (Eq. 6 or zeros), which layers are pruned, the DAR term."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from common.config import ConfigError, parse_run_config
from common.learning.models import ResNetBody, SplitModel
from common.learning.train import LossContext, TrainSettings, train
from common.methods.channels import channel_groups, recover
from common.methods.dapperfl import (
    COLUMNS,
    IN_OUT,
    OFFICIAL,
    OUT,
    PAPER,
    SCALE,
    aggregate,
    dar_loss,
    official_plan,
    official_prune,
    pruning_input,
)


def test_the_default_is_paper_and_an_unknown_variant_is_rejected() -> None:
    assert parse_run_config({"algorithm": "dapperfl"}).params.dapperfl_variant == PAPER
    assert parse_run_config({"algorithm": "dapperfl", "dapperfl-variant": "official"}).params.dapperfl_variant == (
        OFFICIAL
    )
    with pytest.raises(ConfigError) as error:
        parse_run_config({"algorithm": "dapperfl", "dapperfl-variant": "authors"})
    assert str(error.value) == "run-config 'dapperfl-variant' = 'authors' is not valid; allowed values: paper, official"


def test_paper_prunes_the_fusion_and_official_the_fine_tuned_model() -> None:
    global_state = {"w": torch.tensor([1.0, 1.0]), "n": torch.tensor(7)}
    tuned = {"w": torch.tensor([3.0, -1.0]), "n": torch.tensor(2)}
    fused = pruning_input(PAPER, global_state, tuned, alpha=0.25)  # Eq. 1: 0.25 W + 0.75 w_hat
    assert fused["w"].tolist() == [2.5, -0.5] and int(fused["n"]) == 2
    unfused = pruning_input(OFFICIAL, global_state, tuned, alpha=0.25)
    assert unfused["w"].tolist() == [3.0, -1.0] and int(unfused["n"]) == 2


def _resnet(width: int = 2) -> SplitModel:
    torch.manual_seed(0)
    body = ResNetBody(3, width)
    return SplitModel(body, nn.Linear(body.features, 10))


def test_paper_prunes_each_blocks_first_conv_and_official_every_conv_but_the_stem() -> None:
    model = _resnet()
    assert [g.scorer for g in channel_groups(model)] == [f"body.layers.{i}.conv1" for i in range(4)]
    plan = official_plan(model)
    convs = [(name, how) for name, how in plan if isinstance(model.get_submodule(name), nn.Conv2d)]
    assert convs == [
        ("body.layers.0.conv1", OUT),
        ("body.layers.0.conv2", IN_OUT),
        ("body.layers.1.conv1", IN_OUT),
        ("body.layers.1.conv2", IN_OUT),
        ("body.layers.1.shortcut.0", OUT),
        ("body.layers.2.conv1", IN_OUT),
        ("body.layers.2.conv2", IN_OUT),
        ("body.layers.2.shortcut.0", IN_OUT),
        ("body.layers.3.conv1", IN_OUT),
        ("body.layers.3.conv2", IN_OUT),
        ("body.layers.3.shortcut.0", IN_OUT),
    ]
    norms = [name for name, how in plan if how == SCALE]
    assert "body.stem.1" not in norms and len(norms) == 11  # bn1, bn2 of 4 blocks and 3 shortcut norms
    assert [name for name, how in plan if how == COLUMNS] == ["head"]


def test_official_zeroes_the_shortcut_convs_smallest_filters_and_leaves_the_stem() -> None:
    model = _resnet()
    names = list(model.state_dict())
    stem = model.body.stem[0].weight.detach().clone()
    first = model.body.layers[1].shortcut[0]  # 2 -> 4 channels: output channels only
    first.weight.data = torch.tensor([3.0, 1.0, 4.0, 2.0]).view(4, 1, 1, 1) * torch.tensor([1.0, -1.0]).view(1, 2, 1, 1)
    later = model.body.layers[2].shortcut[0]  # 4 -> 8 channels: input channels, then output channels
    scale = torch.tensor([1.0, -3.0, 0.5, 2.0])
    later.weight.data = torch.arange(1.0, 9.0).view(8, 1, 1, 1) * scale.view(1, 4, 1, 1)
    masks = official_prune(model, 0.5)
    expected_first = torch.tensor([[3.0, -3.0], [0.0, 0.0], [4.0, -4.0], [0.0, 0.0]]).view(4, 2, 1, 1)
    assert torch.equal(first.weight.detach(), expected_first)
    # input channels 0 and 2 (l1 norms 36 and 18 of 36, 108, 18, 72), then the four filters of smallest norm
    expected_later = torch.arange(1.0, 9.0).view(8, 1) * torch.tensor([0.0, -3.0, 0.0, 2.0]).view(1, 4)
    expected_later[:4] = 0.0
    assert torch.equal(later.weight.detach(), expected_later.view(8, 4, 1, 1))
    assert torch.equal(masks["body.layers.2.shortcut.0.weight"], expected_later.view(8, 4, 1, 1) != 0)
    assert torch.equal(model.body.stem[0].weight.detach(), stem) and "body.stem.0.weight" not in masks
    assert all(not hasattr(m, "weight_orig") for m in model.modules()), "a plain model again, no pruning hooks"
    assert list(model.state_dict()) == names, "entries in their order (arrays travel by position)"


def _linear_model() -> SplitModel:
    model = SplitModel(nn.Identity(), nn.Linear(4, 2, bias=False))
    model.head.weight.data = torch.tensor([[1.0, 0.0, 3.0, 0.5], [1.0, 0.1, -4.0, 0.5]])
    return model


def test_pruned_positions_come_from_the_global_model_in_paper_and_stay_zero_in_official() -> None:
    previous = np.array([[10.0, 20.0, 30.0, 40.0], [50.0, 60.0, 70.0, 80.0]], np.float32)
    # paper (Eq. 6): a narrow upload keeping input columns 0 and 2; the others come from the previous global model
    kept = np.array([[1.5, 2.5], [3.5, 4.5]], np.float32)
    assert recover(kept, previous, {1: np.array([0, 2])}).tolist() == [[1.5, 20.0, 2.5, 40.0], [3.5, 60.0, 4.5, 80.0]]
    # official: the columns of smallest l2 norm (0.1 and 0.707 of 1.41, 0.1, 5, 0.707) are zeroed, then trained
    model = _linear_model()
    masks = official_prune(model, 0.5)
    assert model.head.weight.tolist() == [[1.0, 0.0, 3.0, 0.0], [1.0, 0.0, -4.0, 0.0]]
    settings = TrainSettings(epochs=1, batch_size=4, optimizer="sgd", lr=0.1, momentum=0.9, weight_decay=1e-5)
    x, y = torch.tensor([[1.0, 2.0, -1.0, 3.0]] * 4), torch.tensor([0, 1, 1, 0])
    train(model, x, y, settings, torch.Generator().manual_seed(0), update_masks=masks)
    upload = model.head.weight.detach().numpy()
    assert upload[:, [1, 3]].tolist() == [[0.0, 0.0], [0.0, 0.0]]
    assert not np.array_equal(upload[:, [0, 2]], [[1.0, 3.0], [1.0, -4.0]]), "the kept columns trained"
    # the full-shape upload is averaged as it is: its zeros, not the previous global model, at the pruned columns
    other = np.full((2, 4), 4.0, np.float32)
    out = aggregate([previous], ["head.weight"], [{"head.weight": upload}, {"head.weight": other}], [{}, {}], [3, 1])
    np.testing.assert_allclose(out[0][:, [1, 3]], np.full((2, 2), 1.0))
    np.testing.assert_allclose(out[0][:, [0, 2]], (3 * upload[:, [0, 2]] + 4.0) / 4, rtol=1e-6)


def test_dar_is_the_mean_squared_norm_in_paper_and_the_mean_norm_in_official() -> None:
    z = torch.tensor([[3.0, 4.0], [1.0, 0.0]], requires_grad=True)
    ctx = LossContext(nn.Identity(), torch.zeros(2), torch.zeros(2), z, torch.zeros(2, 10))
    assert float(dar_loss(0.01, PAPER)(ctx).detach()) == pytest.approx(0.01 * (25 + 1) / 2)
    loss = dar_loss(0.01, OFFICIAL)(ctx)
    assert float(loss.detach()) == pytest.approx(0.01 * (5 + 1) / 2)
    loss.backward()
    torch.testing.assert_close(z.grad, 0.01 * torch.tensor([[0.6, 0.8], [1.0, 0.0]]) / 2)


def test_an_official_round_uploads_full_shape_models_with_zeros_and_averages_them() -> None:
    from .inprocess import InProcessFederation

    raw = {
        "algorithm": "dapperfl",
        "dapperfl-variant": "official",
        "dataset": "digits",
        "num-rounds": 2,
        "fraction-train": 1.0,
        "local-epochs": 2,
    }
    fed = InProcessFederation(raw, 5)
    replies = fed.train_round(1)
    assert fed.round_log.train["used"] == 5
    names = fed.strategy.names
    uploads = {pid: [r.array_records["arrays"][n].numpy() for n in names] for pid, r in replies.items()}
    head = names.index("head.weight")
    zero_columns = {pid: int((np.abs(a[head]).sum(axis=0) == 0).sum()) for pid, a in uploads.items()}
    assert zero_columns == {0: 0, 1: 26, 2: 51, 3: 77, 4: 102}  # round(ratio * 128), ratios 0 .. 0.8
    assert all("masks" not in r.array_records for r in replies.values())
    weights = [replies[pid].metric_records["metrics"]["num-examples"] for pid in range(5)]
    for i in range(len(names)):
        expected = sum(w * uploads[pid][i].astype(np.float64) for pid, w in enumerate(weights)) / sum(weights)
        np.testing.assert_allclose(fed.strategy.global_arrays[i], expected, rtol=1e-5, atol=1e-7)
    evaluation = fed.evaluate(1)
    assert {"acc-shift-0", "global-acc-shift-0"} <= set(evaluation[0].metric_records["metrics"])
