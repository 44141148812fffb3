"""DapperFL's core on hand-made tensors: the fusion schedule, l1 channel selection, physically pruned models,
Eq. 6 recovery, Eq. 7 aggregation of uploads of different widths, the DAR term."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from common.learning.models import build_model, get_arrays
from common.learning.train import LossContext
from common.methods.channels import (
    channel_groups,
    entry_indices,
    keep_count,
    pruned_model,
    pruned_shapes,
    recover,
    take,
)
from common.methods.dapperfl import aggregate, channel_scores, dar_loss, fuse, fusion_factor, keep_mask, select_channels


def test_fusion_factor_schedule() -> None:
    assert fusion_factor(1, 0.9, 0.1, 0.2) == pytest.approx(0.9)
    assert fusion_factor(2, 0.9, 0.1, 0.2) == pytest.approx(0.72)
    assert fusion_factor(3, 0.9, 0.1, 0.2) == pytest.approx(0.576)
    # 0.9 * 0.8^(t-1) < 0.1 from t = 11 on (0.8^10 = 0.107 -> 0.0966)
    assert fusion_factor(10, 0.9, 0.1, 0.2) == pytest.approx(0.9 * 0.8**9)
    assert fusion_factor(11, 0.9, 0.1, 0.2) == 0.1 and fusion_factor(500, 0.9, 0.1, 0.2) == 0.1
    with pytest.raises(ValueError):
        fusion_factor(0, 0.9, 0.1, 0.2)


def test_fusion_mixes_floats_and_keeps_counters() -> None:
    fused = fuse(
        {"w": torch.tensor([1.0, 1.0]), "n": torch.tensor(7)},
        {"w": torch.tensor([3.0, -1.0]), "n": torch.tensor(2)},
        alpha=0.25,
    )
    torch.testing.assert_close(fused["w"], torch.tensor([2.5, -0.5]))
    assert int(fused["n"]) == 2


def test_fusion_follows_the_local_models_device() -> None:
    # the global snapshot is taken on the CPU before training moves the model to its device (a GPU on a Jetson):
    # fusion must bring it to the local model's device, not fail there ('meta' stands in for a GPU here)
    fused = fuse({"w": torch.ones(3)}, {"w": torch.ones(3, device="meta")}, alpha=0.5)
    assert fused["w"].device.type == "meta"


def test_l1_selection_keeps_the_largest_channels_and_breaks_ties_by_lower_index() -> None:
    weight = np.array([[1.0, -1.0], [0.5, 0.0], [3.0, 0.0], [-2.0, 0.0], [0.0, 0.5]], np.float32)
    np.testing.assert_allclose(channel_scores(weight), [2.0, 0.5, 3.0, 2.0, 0.5])
    # ratio 0.4 of 5 channels: floor(2) dropped; channels 1 and 4 tie at 0.5 and both go
    assert keep_mask(channel_scores(weight), 0.4).tolist() == [True, False, True, True, False]
    # ratio 0.6: three dropped; of the 2.0-tie (channels 0 and 3) the lower index stays
    assert keep_mask(channel_scores(weight), 0.6).tolist() == [True, False, True, False, False]
    assert keep_mask(np.zeros(4), 0.5).tolist() == [True, True, False, False]
    assert keep_mask(np.ones(3), 0.0).all() and keep_count(3, 0.9) == 1
    with pytest.raises(ValueError):
        keep_count(3, 1.0)


def _cnn() -> nn.Module:
    return build_model("cnn-mnist", "mnist", (1, 28, 28), 10, seed=0)


def test_groups_of_the_mnist_cnn_cover_its_layers() -> None:
    groups = channel_groups(_cnn())
    assert [(g.size, g.out, g.into) for g in groups] == [
        (32, ("body.0",), (("body.3", 1),)),
        (64, ("body.3",), (("body.7", 49),)),
        (512, ("body.7",), (("head", 1),)),
    ]


def _cnn_parameters(c1: int, c2: int, fc: int) -> int:
    """conv 5x5 (1 -> c1), conv 5x5 (c1 -> c2), linear (c2 * 7 * 7 -> fc), head (fc -> 10), with biases."""
    return (25 * c1 + c1) + (25 * c1 * c2 + c2) + (49 * c2 * fc + fc) + (10 * fc + 10)


@pytest.mark.parametrize(
    "ratio, kept",
    [(0.0, (32, 64, 512)), (0.2, (26, 52, 410)), (0.4, (20, 39, 308)), (0.6, (13, 26, 205)), (0.8, (7, 13, 103))],
)
def test_a_pruned_model_is_physically_smaller(ratio: float, kept: tuple[int, int, int]) -> None:
    expected = _cnn_parameters(*kept)
    assert _cnn_parameters(32, 64, 512) == 1_663_370
    model = _cnn()
    groups = channel_groups(model)
    keep = select_channels(dict(zip(model.state_dict(), get_arrays(model))), groups, ratio)
    small = pruned_model(model, groups, keep)
    assert sum(p.numel() for p in small.parameters()) == expected
    assert small(torch.zeros(2, 1, 28, 28)).shape == (2, 10)
    # the kept channels carry exactly the full model's weights
    specs = [(k, tuple(v.shape)) for k, v in model.state_dict().items()]
    indices = entry_indices(groups, keep, specs)
    assert pruned_shapes(specs, indices) == [(k, tuple(v.shape)) for k, v in small.state_dict().items()]
    for (name, full), value in zip(model.state_dict().items(), small.state_dict().values()):
        np.testing.assert_array_equal(take(full.numpy(), indices.get(name, {})), value.numpy())


def test_pruning_keeps_batch_norm_statistics_of_the_kept_channels() -> None:
    model = build_model("cnn-mnist-bn", "mnist", (1, 28, 28), 10, seed=0)
    model.body[1].running_mean.copy_(torch.arange(32, dtype=torch.float32))
    groups = channel_groups(model)
    assert groups[0].out == ("body.0", "body.1")
    keep = [np.arange(g.size) % 2 == 0 for g in groups]
    small = pruned_model(model, groups, keep)
    torch.testing.assert_close(small.body[1].running_mean, torch.arange(0, 32, 2, dtype=torch.float32))
    assert small(torch.zeros(3, 1, 28, 28)).shape == (3, 10)


def test_recovery_restores_exactly_the_pruned_positions_from_the_previous_global_model() -> None:
    reference = np.arange(24, dtype=np.float32).reshape(4, 6)
    dims = {0: np.array([1, 3]), 1: np.array([0, 2, 3])}
    local = -np.ones((2, 3), np.float32)
    out = recover(local, reference, dims)
    assert out[np.ix_([1, 3], [0, 2, 3])].tolist() == local.tolist()
    untouched = np.ones_like(reference, dtype=bool)
    untouched[np.ix_([1, 3], [0, 2, 3])] = False
    np.testing.assert_array_equal(out[untouched], reference[untouched])
    np.testing.assert_array_equal(recover(np.full((4, 6), 5.0), reference, {}), np.full((4, 6), 5.0))


def test_aggregation_of_uploads_of_different_widths() -> None:
    previous = [np.array([10.0, 20.0, 30.0], np.float32), np.array([[1.0, 1.0, 1.0]], np.float32)]
    names = ["a.weight", "b.weight"]
    full = {"a.weight": np.array([1.0, 2.0, 3.0], np.float32), "b.weight": np.array([[4.0, 5.0, 6.0]], np.float32)}
    narrow = {"a.weight": np.array([7.0], np.float32), "b.weight": np.array([[8.0]], np.float32)}
    narrow_index = {"a.weight": {0: np.array([2])}, "b.weight": {1: np.array([2])}}
    out = aggregate(previous, names, [full, narrow], [{}, narrow_index], [3, 1])
    # the narrow client's pruned positions come from the previous global model (Eq. 6), then 3:1 (Eq. 7)
    np.testing.assert_allclose(out[0], [(3 * 1 + 10) / 4, (3 * 2 + 20) / 4, (3 * 3 + 7) / 4])
    np.testing.assert_allclose(out[1], [[(3 * 4 + 1) / 4, (3 * 5 + 1) / 4, (3 * 6 + 8) / 4]])


def test_dar_is_gamma_times_the_mean_squared_norm_of_the_representation() -> None:
    z = torch.tensor([[3.0, 4.0], [1.0, 0.0]], requires_grad=True)
    ctx = LossContext(nn.Identity(), torch.zeros(2), torch.zeros(2), z, torch.zeros(2, 10))
    loss = dar_loss(0.01)(ctx)
    assert float(loss.detach()) == pytest.approx(0.01 * (25 + 1) / 2)
    loss.backward()
    torch.testing.assert_close(z.grad, 0.01 * 2 * z.detach() / 2)


# ----- through the round runner -----------------------------------------------------------------------------
def _federation(**extra):

    from .inprocess import InProcessFederation

    raw = {
        "algorithm": "dapperfl",
        "dataset": "digits",
        "num-rounds": 2,
        "fraction-train": 1.0,
        "local-epochs": 2,
        **extra,
    }
    return InProcessFederation(raw, 5)


def test_each_device_uploads_a_model_of_its_ratio_and_the_server_recovers_full_shape() -> None:
    fed = _federation()
    before = [a.copy() for a in fed.strategy.global_arrays]
    replies = fed.train_round(1)
    assert fed.round_log.train["used"] == 5
    hidden = {pid: r.array_records["arrays"]["head.weight"].shape[1] for pid, r in replies.items()}
    assert hidden == {0: 128, 1: 103, 2: 77, 3: 52, 4: 26}  # 128 - floor(ratio * 128), ratios 0 .. 0.8
    masks = {pid: r.array_records["masks"]["group-0"].numpy() for pid, r in replies.items()}
    assert all(int(m.sum()) == hidden[pid] for pid, m in masks.items())
    flops = [
        replies[pid].metric_records["metrics"]["train-flops"] / replies[pid].metric_records["metrics"]["num-examples"]
        for pid in range(5)
    ]  # per training sample
    assert flops == sorted(flops, reverse=True) and flops[4] < 0.75 * flops[0]
    up = fed.round_log.per_client_bytes
    assert up[4]["up"] < 0.4 * up[0]["up"], "a device at ratio 0.8 sends far fewer bytes"
    assert up[4]["down"] == up[0]["down"], "every device receives the whole global model"
    assert [a.shape for a in fed.strategy.global_arrays] == [a.shape for a in before]
    # a channel no client kept keeps its previous global value in the hidden layer's bias (Eq. 6 everywhere)
    kept_by_any = np.any(np.stack(list(masks.values())), axis=0)
    bias = fed.strategy.names.index("body.1.bias")
    np.testing.assert_array_equal(fed.strategy.global_arrays[bias][~kept_by_any], before[bias][~kept_by_any])
    evaluation = fed.evaluate(1)
    assert {"acc-shift-0", "global-acc-shift-0"} <= set(evaluation[0].metric_records["metrics"])


def test_a_device_cannot_keep_more_channels_than_its_ratio(caplog) -> None:
    import logging

    from flwr.app import MessageType

    from client_app.algorithms import answer
    from client_app.algorithms.dapperfl import mask_record

    from .fakes import FakeReply

    fed = _federation()
    content = fed.runner.message_contents(1, [4], MessageType.TRAIN)[0]
    honest_ratio_zero = answer(
        fed.client(0), MessageType.TRAIN, 1, fed.runner.message_contents(1, [0], MessageType.TRAIN)[0]
    )
    lying = answer(fed.client(4), MessageType.TRAIN, 1, content)
    lying["arrays"], lying["masks"] = honest_ratio_zero["arrays"], mask_record([np.ones(128, bool)])
    with caplog.at_level(logging.WARNING, logger="flwr"):
        fed.runner.aggregate_train(1, [FakeReply(1004, lying)])
    assert fed.round_log.train["rejected"] == 1
    assert "keeps 128 of 128 channels; the client's pruning ratio 0.8 keeps 26" in caplog.text


def test_ablations_switch_fusion_and_regularization_off() -> None:
    from common.config import ConfigError, parse_run_config

    plain = _federation(**{"dapperfl-mfp": False, "dapperfl-dar": False})
    plain.train_round(1)
    assert plain.round_log.train["used"] == 5
    with pytest.raises(ConfigError, match="dapperfl-ratios"):
        parse_run_config({"algorithm": "dapperfl", "dapperfl-ratios": "0,1.0"})
    assert parse_run_config({"algorithm": "dapperfl", "dapperfl-ratios": "0.5,0,0.5"}).params.dapperfl_ratios == (
        0.5,
        0.0,
        0.5,
    )


def test_resnet10_prunes_each_blocks_inner_channels() -> None:
    model = build_model("resnet10-s", "digit-domains", (3, 32, 32), 10, seed=0)
    groups = channel_groups(model)
    assert [g.size for g in groups] == [16, 32, 64, 128]
    keep = select_channels(dict(zip(model.state_dict(), get_arrays(model))), groups, 0.5)
    small = pruned_model(model, groups, keep)
    assert small(torch.zeros(2, 3, 32, 32)).shape == (2, 10)
    # per block: conv1 (c_in x k x 3 x 3), bn1 (2k), conv2 (k x c x 3 x 3) lose c - k channels each
    removed = sum((c_in * 9 + 2 + c * 9) * (c - c // 2) for c_in, c in ((16, 16), (16, 32), (32, 64), (64, 128)))
    full, pruned = (sum(p.numel() for p in m.parameters()) for m in (model, small))
    assert full - pruned == removed
