"""Models: the McMahan CNN's size, body/head split, seeded init, clear errors for mismatched data."""

from __future__ import annotations

import copy

import pytest
import torch

from common.config import ConfigError
from common.learning.models import MaxPool2d, array_specs, build_model, get_arrays, set_arrays


def test_mcmahan_cnn_shape_and_size() -> None:
    model = build_model("auto", "mnist", (1, 28, 28), 10, seed=0)
    assert sum(p.numel() for p in model.parameters()) == 1_663_370
    assert model(torch.zeros(2, 1, 28, 28)).shape == (2, 10)
    assert model.head_names() == ["head.weight", "head.bias"]
    assert len(model.body_names()) == 6


def test_cifar_cnn_forward() -> None:
    model = build_model("auto", "cifar10", (3, 32, 32), 10, seed=0)
    assert model(torch.zeros(2, 3, 32, 32)).shape == (2, 10)


def test_unpadded_cnn_on_mnist_is_the_582k_parameter_cnn_of_other_pfl_libraries() -> None:
    model = build_model("cnn-cifar", "mnist", (1, 28, 28), 10, seed=0)
    assert sum(p.numel() for p in model.parameters()) == 582_026  # 5x5 convs, no padding: 1024 -> 512 -> 10
    assert [tuple(p.shape) for p in model.parameters()][-4] == (512, 1024)


def test_init_depends_only_on_seed() -> None:
    a = get_arrays(build_model("mlp", "digits", (1, 8, 8), 10, seed=3))
    b = get_arrays(build_model("mlp", "digits", (1, 8, 8), 10, seed=3))
    c = get_arrays(build_model("mlp", "digits", (1, 8, 8), 10, seed=4))
    assert all((x == y).all() for x, y in zip(a, b))
    assert any((x != y).any() for x, y in zip(a, c))


def test_arrays_round_trip() -> None:
    model = build_model("mlp", "digits", (1, 8, 8), 10, seed=0)
    other = build_model("mlp", "digits", (1, 8, 8), 10, seed=1)
    set_arrays(other, get_arrays(model))
    assert all((x == y).all() for x, y in zip(get_arrays(model), get_arrays(other)))
    assert [name for name, _ in array_specs(model)] == list(model.state_dict())


def test_cnn_on_tiny_images_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="needs larger images"):
        build_model("cnn-mnist", "digits", (1, 4, 4), 10, seed=0)


def test_max_pool_gives_torch_results_in_both_modes() -> None:
    x = torch.randn(3, 8, 10, 10)
    x[0, 0, :2, :2] = 1.0  # a tie: both kernels pick the first position
    ours, torchs = MaxPool2d(2), torch.nn.MaxPool2d(2)
    with torch.no_grad():
        fast = ours(x)
        assert torch.equal(fast, torchs(x)) and fast.is_contiguous()
    leaf_a, leaf_b = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    ours(leaf_a).pow(2).sum().backward()
    torchs(leaf_b).pow(2).sum().backward()
    assert torch.equal(leaf_a.grad, leaf_b.grad)


def test_cnn_trains_bit_for_bit_as_with_torchs_pooling() -> None:
    ours = build_model("cnn-cifar", "cifar10", (3, 32, 32), 10, seed=0)
    torchs = copy.deepcopy(ours)
    for index, module in enumerate(torchs.body):
        if isinstance(module, MaxPool2d):
            torchs.body[index] = torch.nn.MaxPool2d(2)
    generator = torch.Generator().manual_seed(1)
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9) for m in (ours, torchs)]
    for _ in range(3):
        x, y = torch.randn(16, 3, 32, 32, generator=generator), torch.randint(0, 10, (16,), generator=generator)
        for model, optimizer in zip((ours, torchs), optimizers, strict=True):
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            optimizer.step()
    assert all(torch.equal(a, b) for a, b in zip(ours.state_dict().values(), torchs.state_dict().values()))
    with torch.no_grad():
        assert torch.equal(ours(x), torchs(x))


def test_the_model_registry_is_what_the_run_config_offers_and_what_builds() -> None:
    """A model is one MODEL_SPECS entry naming its builder: the key's choices, `auto`'s picks and the input checks
    come from the registry."""
    from common.config import AUTO_MODEL, MODELS, ConfigError
    from common.learning import models
    from common.learning.model_specs import MODEL_SPECS

    assert MODELS == ("auto", *MODEL_SPECS) and set(AUTO_MODEL.values()) <= set(MODEL_SPECS)
    for spec in MODEL_SPECS.values():
        assert callable(getattr(models, spec.builder)), spec.name
    built = models.build_model("cnn-mnist-bn", "mnist", (1, 28, 28), 10, seed=0)
    assert any(isinstance(m, torch.nn.BatchNorm2d) for m in built.modules())  # the spec's kwargs reach the builder
    with pytest.raises(ConfigError, match="needs image input"):
        models.build_model("resnet10-s", "har", (9, 128), 6, seed=0)
    with pytest.raises(ConfigError, match="needs larger images"):
        models.build_model("cnn-cifar", "digits", (1, 8, 8), 10, seed=0)
    with pytest.raises(ConfigError, match="allowed values: auto, mlp"):
        models.build_model("vgg", "digits", (1, 8, 8), 10, seed=0)


@pytest.mark.parametrize(
    "name, shape",
    [("mlp", (1, 8, 8)), ("cnn-mnist-bn", (1, 28, 28)), ("resnet10-s", (3, 32, 32)), ("dnn-har-bn", (9, 128))],
)
def test_a_model_built_from_arrays_is_what_a_deep_copy_and_set_arrays_make(name: str, shape: tuple[int, ...]) -> None:
    template = build_model(name, "mnist", shape, 10, seed=0)
    arrays = [a + 1 for a in get_arrays(build_model(name, "mnist", shape, 10, seed=1))]
    built = build_model(name, "mnist", shape, 10, seed=0, arrays=arrays)
    expected = copy.deepcopy(template)
    set_arrays(expected, arrays)
    assert [type(m) for m in built.modules()] == [type(m) for m in expected.modules()]
    assert [n for n, _ in built.named_modules()] == [n for n, _ in expected.named_modules()]
    assert all(torch.equal(a, b) for a, b in zip(built.state_dict().values(), expected.state_dict().values()))
    assert [p.requires_grad for p in built.parameters()] == [p.requires_grad for p in expected.parameters()]
    x = torch.randn((4, *shape))
    built.eval(), expected.eval()
    assert torch.equal(built(x), expected(x))
    # nothing shared with the process's template or another build: parameters, buffers, containers, hooks
    again = build_model(name, "mnist", shape, 10, seed=0, arrays=arrays)
    for a, b in zip(built.state_dict().values(), again.state_dict().values()):
        assert a.data_ptr() != b.data_ptr()
    fresh = build_model(name, "mnist", shape, 10, seed=0)
    built.train()
    assert not fresh.training or all(m.training for m in fresh.modules())
    built.register_forward_hook(lambda *args: None)
    assert not again._forward_hooks and not fresh._forward_hooks
    next(iter(built.parameters())).data.add_(1.0)
    assert torch.equal(next(iter(fresh.parameters())), next(iter(template.parameters())))
