"""The leakage audit's attacks (experiments/audit): on a dense single-step update of the digits MLP, iDLG reads the
labels exactly and Inverting Gradients recovers the images; the same attack on a 10%-density upload recovers less."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from common.config import parse_run_config
from common.data.federated import dataset_for
from common.learning.models import build_model
from experiments.audit.attacks import Attack, KnownRound, idlg_labels, invert, label_counts, local_update, observed
from experiments.audit.scores import image_scores, label_accuracy

pytest.importorskip("torchmetrics")


def _setting(batch: int) -> tuple:
    data = dataset_for(parse_run_config({"dataset": "digits"}).data)
    mean, std = data.mean[0], data.std[0]
    x = torch.tensor((data.x[:batch].astype(np.float32) / data.scale - mean) / std)
    y = torch.tensor(data.y[:batch])
    bounds = ((0 - mean) / std, (1 - mean) / std)
    model = build_model("auto", "digits", data.input_shape, data.num_classes, 0)
    params = {name: value.detach() for name, value in model.named_parameters()}
    update = {name: value.detach() for name, value in local_update(model, params, x, y, 0.05, 1).items()}
    return model, params, update, x, y, bounds


def _attack(batch: int, density: float, method: str = "ig") -> tuple[float, float]:
    model, params, update, x, y, bounds = _setting(batch)
    generator = torch.Generator().manual_seed(1)
    masks = {k: None if density == 1 else torch.rand(v.shape, generator=generator) < density for k, v in params.items()}
    labels = idlg_labels(update["head.bias"], batch)
    attack = Attack(method, 300 if method == "ig" else 100, 0.1 if method == "ig" else 1.0)
    known = KnownRound(0.05, 1, bounds)
    rebuilt, _ = invert(model, params, observed(update, masks), masks, labels, tuple(x.shape), known, attack, 0)
    return float(np.mean(image_scores(x, rebuilt, bounds).psnr)), label_accuracy(y, labels)


def test_idlg_reads_the_labels_of_a_batch_with_distinct_labels_exactly() -> None:
    *_, update, x, y, _ = _setting(4)
    assert len(set(y.tolist())) == 4
    assert label_accuracy(y, idlg_labels(update["head.bias"], 4)) == 1.0
    assert label_accuracy(torch.tensor([1, 1, 2]), torch.tensor([1, 2, 3])) == pytest.approx(2 / 3)


@pytest.mark.parametrize("method", ["ig", "dlg"])
def test_a_dense_single_step_update_gives_its_image_away(method: str) -> None:
    psnr, labels = _attack(1, 1.0, method)
    assert labels == 1.0 and psnr > 30.0, psnr  # 30 dB: visually the same 8x8 digit


def test_a_ten_percent_upload_gives_away_less_than_a_dense_one() -> None:
    dense, _ = _attack(4, 1.0)
    sparse, _ = _attack(4, 0.1)
    assert sparse < dense - 5.0, (dense, sparse)


def test_the_scores_match_images_regardless_of_order() -> None:
    true = torch.rand(3, 1, 8, 8)
    shuffled = true[[2, 0, 1]]
    scores = image_scores(true, shuffled, (0.0, 1.0))
    assert scores.psnr == [100.0] * 3 and scores.ssim == pytest.approx([1.0] * 3)  # each found its own
    assert observed({"w": torch.arange(4.0)}, {"w": torch.tensor([True, False, True, False])})["w"].tolist() == [0, 2]
    assert observed({"w": torch.ones(2), "p": torch.ones(2)}, {"w": None}).keys() == {"w"}  # the personal part


def test_the_audit_command_writes_its_table_scores_and_figure(tmp_path, capsys) -> None:
    import json

    from experiments import cli

    argv = ["privacy", "--uploads", "dense,sparse:0.2", "--batch-sizes", "1", "--attacks", "dlg", "--seeds", "0"]
    assert cli.main([*argv, "--clients", "1", "--iterations", "50", "--out", str(tmp_path)]) == 0
    text = (tmp_path / "audit.md").read_text()
    assert "| dense | 1 | dlg | " in text and "| sparse:0.2 | 1 | dlg | " in text
    assert "`pflower privacy --dataset digits --uploads dense,sparse:0.2 --batch-sizes 1 --attacks dlg" in text
    rows = json.loads((tmp_path / "audit.json").read_text())
    assert [(r["upload"], len(r["psnr"]), r["labels"]) for r in rows] == [("dense", 1, [1.0]), ("sparse:0.2", 1, [1.0])]
    assert (tmp_path / "reconstructions.png").stat().st_size > 2_000
    assert f"audit: {tmp_path / 'audit.md'}" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("option", "message"),
    [
        (["--uploads", "sparse:2"], "the density must be a number in (0, 1]"),
        (["--uploads", "pruned:1"], "the ratio must be in [0, 1)"),
        (["--uploads", "pruned"], "pruned:RATIO"),
        (["--uploads", "everything"], "one of dense, sparse:DENSITY"),
        (["--attacks", "magic"], "ig, dlg or both"),
        (["--batch-sizes", "0"], "each 1 or more"),
        (["--seeds", "a"], "comma-separated whole numbers"),
    ],
)
def test_bad_audit_options_are_one_line(option: list[str], message: str, capsys) -> None:
    from experiments import cli

    assert cli.main(["privacy", *option]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and message in err[0]


def test_local_dp_noise_on_the_upload_defeats_the_attack_the_plain_upload_loses_to() -> None:
    from experiments.audit.run import Private, audit

    def psnr(private: Private | None) -> float:
        rows, _, _ = audit("digits", "", ["dense"], [1], ["ig"], [0], 2, 1, 0.05, 300, lambda _: None, private)
        assert rows[0].upload == ("dense+dp(z=1,C=0.05)" if private else "dense")
        return float(np.mean(rows[0].psnr))

    plain, noised = psnr(None), psnr(Private(0.05, 1.0))
    assert plain > 30.0 and noised < plain - 15.0, (plain, noised)


def test_a_batch_larger_than_the_classes_gets_a_label_for_every_image() -> None:
    """iDLG reads which classes a batch holds, not how many of each: with 32 images of 10 classes every class is
    taken, then again from the largest update, so the attack has one label per dummy image."""
    bias_update = torch.tensor([0.3, -0.1, 0.2, 0.0, 0.5, -0.2, 0.1, 0.05, -0.3, 0.4])
    labels = idlg_labels(bias_update, 32)
    assert labels.shape == (32,) and set(labels.tolist()) == set(range(10))
    assert labels.tolist().count(4) == 4 and labels.tolist().count(8) == 3  # the largest first, the smallest last
    assert idlg_labels(bias_update, 3).tolist() == [0, 4, 9]


def test_a_pruned_upload_carries_whole_channels_as_dapperfl_sends_them() -> None:
    """pruned:R: the kept channels' rows in the producing layer and their columns in the consuming one, whole."""
    from experiments.audit.run import upload_masks

    model, params, *_ = _setting(1)
    masks = upload_masks("pruned:0.5", params, [], model)
    carried = {name: mask for name, mask in masks.items() if mask is not None}
    assert carried, "pruning touches some layers"
    for name, mask in carried.items():
        kept = mask.numpy()
        if kept.ndim == 2:  # a row or a column is carried whole or not at all
            rows, cols = kept.any(axis=1), kept.any(axis=0)
            assert np.array_equal(kept, np.outer(rows, cols)), name
    first = next(m for n, m in carried.items() if n.endswith(".weight") and m.numpy().any(axis=1).mean() < 1)
    assert first.numpy().any(axis=1).mean() == pytest.approx(0.5, abs=0.05), "half the output channels kept"


def test_dlg_on_a_one_percent_upload_at_batch_8_moves_from_its_start() -> None:
    """L-BFGS with its default tolerances stopped at once on such small updates (the earlier audit's sparse:0.01 rows
    kept the seeded start's PSNRs); on the scale-free loss with the stated stopping rule it iterates and the
    matching loss falls."""
    model, params, update, x, y, bounds = _setting(8)
    generator = torch.Generator().manual_seed(1)
    masks = {k: torch.rand(v.shape, generator=generator) < 0.01 for k, v in params.items()}
    labels = idlg_labels(update["head.bias"], 8)
    known = KnownRound(0.05, 1, bounds)
    _, trace = invert(
        model, params, observed(update, masks), masks, labels, tuple(x.shape), known, Attack("dlg", 50, 1.0), 0
    )
    assert trace.iterations > 5 and trace.moved, trace
    assert trace.final_loss < 0.5 * trace.start_loss and "L-BFGS" in trace.rule


def test_a_row_whose_attack_did_not_move_is_marked_and_never_scored() -> None:
    from experiments.audit.attacks import Trace
    from experiments.audit.run import Row, table

    still = Trace("10 signed Adam steps", 10, 0.5, 0.5)
    row = Row("sparse:0.01", 8, "ig", [], [], [float("nan")], [0.7], [still, still])
    lines = table([row])
    assert "| sparse:0.01 | 8 | ig | not scored: the attack did not move from its start |" in lines[2]
    assert lines[2].endswith("| 0.5 -> 0.5 | 0 of 2 |") and "Stopping rules: 10 signed Adam steps." in lines[-1]
    assert not still.moved and Trace("r", 3, 1.0, 0.98).moved


@pytest.mark.parametrize("algorithm", ["dmpfl", "feddst"])
@pytest.mark.parametrize(("batch", "steps"), [(1, 1), (8, 3)])
def test_the_trained_rows_attack_what_a_real_sparse_client_sends(algorithm: str, batch: int, steps: int) -> None:
    """`trained:ALG` attacks the reply of the algorithm's real client half after its real local training, decoded by
    its real server half: the attack's simulation of the client's steps on its mask, run on the true batch, gives
    back exactly the values the client sent on the positions it trained (regrown positions, uploaded at 0, left
    out), so the attack attacks the wire form and not a stand-in."""
    from experiments.audit.attacks import _distance
    from experiments.audit.trained import trained_round

    _, _, _, x, y, _ = _setting(batch)
    real = trained_round(algorithm, "digits", "", x, y.long(), steps, 0.1, 0)
    simulated = local_update(real.model, real.start, x, y.long(), 0.1, steps, real.trained)
    sent = observed(real.update, real.masks)
    assert _distance({k: v.detach() for k, v in observed(simulated, real.masks).items()}, sent, "dlg") < 1e-10
    sparse = [name for name, mask in real.masks.items() if mask is not None]
    assert any(0 < int(real.masks[n].sum()) < real.masks[n].numel() for n in sparse), "a sparse upload"
    dense_view = local_update(real.model, real.start, x, y.long(), 0.1, steps)  # sparse:D's stand-in
    if steps > 1:  # a dense model's steps move the weights off the mask, which a sparse client's never do
        assert _distance({k: v.detach() for k, v in observed(dense_view, real.masks).items()}, sent, "dlg") > 1e-6


def test_the_audit_refuses_a_trained_form_of_an_algorithm_that_has_none() -> None:
    from common.hparams import ConfigError
    from experiments.audit.run import check_uploads

    check_uploads(["trained:dmpfl", "trained:feddst"])
    for bad in ("trained:fedavg", "trained", "trained:"):
        with pytest.raises(ConfigError, match="trained:dmpfl"):
            check_uploads([bad])


def test_a_trained_dmpfl_upload_at_batch_one_gives_its_image_away() -> None:
    from experiments.audit.run import audit

    rows, _, _ = audit("digits", "", ["trained:dmpfl"], [1], ["dlg"], [0], 1, 1, 0.1, 100, echo=lambda _: None)
    (row,) = rows
    assert row.traces[0].moved and min(row.psnr) > 30


def test_a_secure_sums_mean_update_is_the_union_batchs_single_step_update() -> None:
    model, params, _, x, y, _ = _setting(8)
    parts = [local_update(model, params, xs, ys, 0.05, 1) for xs, ys in zip(x.chunk(4), y.chunk(4), strict=True)]
    union = local_update(model, params, x, y, 0.05, 1)
    for name, value in union.items():
        mean = torch.stack([part[name] for part in parts]).mean(0)
        torch.testing.assert_close(mean, value, atol=1e-6, rtol=1e-5)  # what the server's attack simulates


def test_label_counts_read_repeated_labels_from_the_summed_bias() -> None:
    counts = torch.tensor([5, 0, 2, 2, 0, 0, 1, 0, 0, 6])  # 16 images, repeated labels
    lr, total = 0.05, int(counts.sum())
    bias_update = lr * (counts.double() / total - 0.1)  # one step of a model predicting uniformly
    got = label_counts(bias_update, lr, 1, total)
    assert torch.equal(torch.bincount(got, minlength=10), counts)
    assert label_counts(torch.zeros(10), lr, 1, 25).numel() == 25  # a flat bias still gives the sum's count


def test_the_audit_takes_a_secure_sum_and_refuses_a_bad_count(tmp_path) -> None:
    from common.hparams import ConfigError
    from experiments.audit.run import audit, check_uploads

    check_uploads(["secure:8"])
    for bad in ("secure:0", "secure:x", "secure"):
        with pytest.raises(ConfigError, match="secure"):
            check_uploads([bad])
    rows, shown, _ = audit("digits", "", ["dense", "secure:4"], [2], ["ig"], [0], 1, 1, 0.05, 150, lambda _: None)
    dense, summed = rows
    assert len(summed.psnr) == 8 and len(dense.psnr) == 2  # every image of the 4 clients' union is scored
    assert shown["secure:4|2|ig"].shape[1] == 8
    assert summed.labels[0] >= 0.75  # the union's labels read as counts from the summed bias
