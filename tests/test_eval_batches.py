"""The evaluation loop's batch size: images in batches of 128 on a CPU, logits equal bit for bit to batches of 512."""

from __future__ import annotations

import pytest
import torch

from common.learning.evaluate import eval_batch_size, predict_logits
from common.learning.models import build_model


def test_images_on_a_cpu_go_in_batches_of_128_and_other_inputs_in_512() -> None:
    assert eval_batch_size(torch.zeros(3, 1, 28, 28), "cpu") == 128
    assert eval_batch_size(torch.zeros(3, 64), "cpu") == 512
    assert eval_batch_size(torch.zeros(3, 1, 28, 28), "cuda") == 512


@pytest.mark.parametrize(
    ("name", "dataset", "shape"), [("cnn-mnist", "mnist", (1, 28, 28)), ("cnn-cifar", "cifar10", (3, 32, 32))]
)
def test_the_cpu_image_batch_gives_the_logits_of_batches_of_512(
    name: str, dataset: str, shape: tuple[int, ...]
) -> None:
    torch.set_num_threads(1)  # as the engine's workers run
    model = build_model(name, dataset, shape, 10, 0)
    x = torch.randn(700, *shape, generator=torch.Generator().manual_seed(0))
    calls: list[int] = []
    model.register_forward_pre_hook(lambda _, args: calls.append(len(args[0])))
    default = predict_logits(model, x)
    assert calls == [128] * 5 + [60]
    assert torch.equal(default, predict_logits(model, x, batch_size=512))


def test_a_client_is_evaluated_in_one_pass_over_its_test_set_and_its_draws() -> None:
    import numpy as np

    from common.data.federated import ClientData
    from common.data.shift import make_shift_plan, shifted_correct
    from common.learning.evaluate import evaluate_client

    torch.set_num_threads(1)
    model = build_model("cnn-mnist", "mnist", (1, 28, 28), 10, 0)
    gen = torch.Generator().manual_seed(1)
    test_x, shift_x = torch.randn(20, 1, 28, 28, generator=gen), torch.randn(20, 1, 28, 28, generator=gen)
    test_y, shift_y = torch.randint(0, 10, (20,), generator=gen), torch.randint(0, 10, (20,), generator=gen)
    test_y[:8] = predict_logits(model, test_x[:8]).argmax(1)  # some right answers, at both kinds of rows
    shift_y[:5] = predict_logits(model, shift_x[:5]).argmax(1)
    plan = make_shift_plan(np.arange(20), np.arange(100, 200), 0)
    data = ClientData(0, 10, (1, 28, 28), test_x, test_y, test_x, test_y, shift_x, shift_y, plan, 4)
    calls: list[int] = []
    model.register_forward_pre_hook(lambda _, args: calls.append(len(args[0])))
    degrees = (0.0, 0.5, 1.0)
    result = evaluate_client(model, data, degrees)
    assert calls == [40], "the test set and the draws together, in one batch"
    own = (predict_logits(model, test_x).argmax(1) == test_y).numpy()
    drawn = (predict_logits(model, shift_x).argmax(1) == shift_y).numpy()
    assert result.shift_accuracy == shifted_correct(plan, own, drawn, degrees)
    assert result.accuracy == pytest.approx(own.mean()) and result.shift_accuracy[1.0] == drawn.mean()
    calls.clear()
    evaluate_client(model, data, (0.0,))
    assert calls == [20], "no shifted degree: the test set alone"
