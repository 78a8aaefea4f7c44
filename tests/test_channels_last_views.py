"""OPT407 and views of tensors that are never channels_last feature maps
(analysis/layouts.py).

A view of a Linear layer's output, of `torch.flatten`/`.reshape`, or of `.contiguous()`
works whatever the model's memory format, so it no longer blocks the conversion
(pytorch-beginner's conv_gan generator views its Linear output as an image). A view of a
feature map is still reported.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from optimizer_codemod import rewrite
from optimizer_codemod.diagnostics import Status

FIXTURE = Path(__file__).parent.parent / "fixtures" / "OPT407" / "fix_views_of_linear_outputs.py"
SOURCE = FIXTURE.read_text()
CONVERTED = FIXTURE.with_name(FIXTURE.stem + ".expected.py").read_text()


def test_torch_views_linear_flatten_and_contiguous_results_of_channels_last_maps() -> None:
    torch = pytest.importorskip("torch")
    conv = torch.nn.Conv2d(3, 8, 3).to(memory_format=torch.channels_last)
    maps = conv(torch.randn(2, 3, 6, 6))
    assert maps.is_contiguous(memory_format=torch.channels_last)
    with pytest.raises(RuntimeError, match="view size is not compatible"):
        maps.view(2, -1)  # the hazard the rule reports
    linear = torch.nn.Linear(4, 5)(maps)  # a Linear over the last dimension of a 4-D map
    assert linear.is_contiguous() and linear.view(2, -1).shape == (2, 8 * 4 * 5)
    for value in (maps.contiguous(), maps.reshape(2, -1), torch.flatten(maps, 1)):
        assert value.view(2, -1).shape == (2, 8 * 4 * 4)


def test_the_converted_fixture_trains_without_a_view_error() -> None:
    torch = pytest.importorskip("torch")
    for source in (SOURCE, CONVERTED):
        torch.manual_seed(0)
        namespace = {"loader": [torch.randn(4, 1, 28, 28) for _ in range(2)]}
        exec(compile(source, str(FIXTURE), "exec"), namespace)
        assert torch.isfinite(namespace["lossG"]).item()
    assert CONVERTED.count("memory_format=torch.channels_last") == 2


def only_opt407(source: str):
    result = rewrite(source, select=["OPT407"], why_not=True)
    return result, [d for d in result.diagnostics if d.code == "OPT407"]


@pytest.mark.parametrize(
    "old, new",
    [
        # the Generator's view reads a feature map once the Linear is gone
        ("        x = self.fc(z)\n", "        x = self.features(z)\n"),
        # assigned only in some runs: the value viewed may be the feature map
        (
            "        x = self.fc(z)\n",
            "        x = z\n        if z.dim() == 2:\n            x = self.fc(z)\n",
        ),
        # a copy kept in channels_last is still channels_last
        ("x.contiguous().view(", "x.contiguous(memory_format=torch.channels_last).view("),
        # a convolution at the end of the Sequential: its output is a feature map
        ("nn.Linear(nz, 56 * 56), nn.ReLU(True)", "nn.Linear(nz, 56 * 56), nn.Conv2d(1, 1, 1)"),
    ],
)
def test_a_view_that_may_see_a_channels_last_map_is_still_reported(old: str, new: str) -> None:
    assert old in SOURCE
    result, findings = only_opt407(SOURCE.replace(old, new))
    reported = [f for f in findings if f.status is Status.REPORTED]
    assert reported and "raises on a channels_last tensor" in reported[0].message, findings


def test_views_of_linear_and_contiguous_results_leave_both_models_converted() -> None:
    result, findings = only_opt407(SOURCE)
    assert [f.status for f in findings] == [Status.FIXED, Status.FIXED]
    assert result.source == CONVERTED


NORMALISED = (Path(__file__).parent.parent / "fixtures" / "OPT407").joinpath(
    "keep_instance_norm_generator.py"
)


def test_torch_instance_norm_returns_nchw_from_a_channels_last_map() -> None:
    torch = pytest.importorskip("torch")
    maps = torch.randn(2, 8, 6, 6).contiguous(memory_format=torch.channels_last)
    for layer in (torch.nn.InstanceNorm2d(8), torch.nn.InstanceNorm2d(8, affine=True)):
        out = layer(maps)
        assert out.is_contiguous() and not out.is_contiguous(memory_format=torch.channels_last)
    # batch norm keeps the layout: the hazard is instance norm's own
    assert torch.nn.BatchNorm2d(8)(maps).is_contiguous(memory_format=torch.channels_last)


@pytest.mark.parametrize(
    "old, new, declined",
    [
        ("", "", True),
        (
            "nn.InstanceNorm2d(32, affine=True)",
            "norm_layer(32)",
            True,
        ),  # handed over as a default argument, a functools.partial
        ("nn.InstanceNorm2d(32, affine=True)", "nn.BatchNorm2d(32)", False),
    ],
)
def test_models_normalised_with_instance_norm_are_declined(old, new, declined) -> None:
    source = NORMALISED.read_text().replace(old, new)
    if "norm_layer" in source:
        source = source.replace(
            "def __init__(self):",
            "def __init__(self, norm_layer=functools.partial(nn.InstanceNorm2d, affine=True)):",
        ).replace("import torch\n", "import functools\n\nimport torch\n", 1)
    result, findings = only_opt407(source)
    assert len(findings) == 1, findings
    if declined:
        assert findings[0].status is Status.DECLINED and result.source == source
        assert "returns NCHW tensors" in findings[0].message
    else:
        assert findings[0].status is Status.FIXED


def test_instance_norm_of_another_class_does_not_decline_this_model() -> None:
    source = NORMALISED.read_text().replace(
        "nn.InstanceNorm2d(32, affine=True)", "nn.BatchNorm2d(32)"
    )
    source = source.replace(
        "\n\nmodel = ",
        "\n\nclass Stylised(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
        "        self.norm = nn.InstanceNorm2d(3)\n\n\nmodel = ",
    )
    assert "InstanceNorm2d" in source
    result, findings = only_opt407(source)
    assert [f.status for f in findings] == [Status.FIXED]


def test_torch_layer_norm_returns_nchw_from_a_channels_last_map() -> None:
    torch = pytest.importorskip("torch")
    maps = torch.randn(2, 8, 6, 6).contiguous(memory_format=torch.channels_last)
    for layer in (torch.nn.LayerNorm([8, 6, 6]), torch.nn.LayerNorm([6, 6])):
        out = layer(maps)
        assert out.is_contiguous() and not out.is_contiguous(memory_format=torch.channels_last)
    # ConvNeXt's: over the channels of an NHWC permute, channels_last once permuted back
    nhwc = torch.nn.LayerNorm(8)(maps.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)
    assert nhwc.is_contiguous(memory_format=torch.channels_last)


@pytest.mark.parametrize(
    "norm, declined",
    [
        ("nn.LayerNorm([32, 28, 28])", True),
        ("nn.LayerNorm((32, 28, 28))", True),
        ("nn.LayerNorm(normalized_shape=[28, 28])", True),
        ("nn.LayerNorm(32)", False),
        ("nn.GroupNorm(4, 32)", False),
    ],
)
def test_models_layer_normalising_feature_maps_are_declined(norm: str, declined: bool) -> None:
    source = NORMALISED.read_text().replace("nn.InstanceNorm2d(32, affine=True)", norm)
    result, findings = only_opt407(source)
    assert len(findings) == 1, findings
    if declined:
        assert findings[0].status is Status.DECLINED and result.source == source
        assert f"normalises with `{norm}`, which returns NCHW tensors" in findings[0].message
    else:
        assert findings[0].status is Status.FIXED
