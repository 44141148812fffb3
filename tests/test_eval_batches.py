"""The evaluation loop's batch size: images in batches of 128 on a CPU, logits equal bit for bit to batches of 512."""

from __future__ import annotations

import pytest
import torch

from common.evaluate import eval_batch_size, predict_logits
from common.models import build_model


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
