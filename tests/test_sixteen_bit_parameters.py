"""OPT501 leaves SGD unfused where its parameters may be 16-bit and the script may run on
the CPU (torch 2.13's CPU kernel updates only each tensor's tail:
tests/test_fused_optimizer_claims.py), and fuses it where only tensors are cast."""

from __future__ import annotations

import pytest

from optimizer_codemod import rewrite

LOOP = (
    "for step in range(100):\n"
    "    loss = model(x).float().pow(2).mean()\n"
    "    loss.backward()\n"
    "    optimizer.step()\n"
)
SGD = "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"


@pytest.mark.parametrize(
    "setup",
    [
        "model = get_model()\nmodel.bfloat16()\n",  # the optimizer's own model, cast
        "ptdtype = torch.bfloat16\nmodel = torch.nn.Linear(8, 8).to(ptdtype)\n",
        "model = transformers.AutoModel.from_pretrained('m', torch_dtype=torch.float16)\n",
        "torch.set_default_dtype(torch.bfloat16)\nmodel = torch.nn.Linear(8, 8)\n",
    ],
)
def test_sgd_over_parameters_that_may_be_16_bit_is_left_alone(setup: str) -> None:
    source = (
        "import torch\nimport transformers\n\n" + setup + "x = torch.randn(4, 8)\n" + SGD + LOOP
    )
    result = rewrite(source, select=["OPT501"], why_not=True)
    assert result.source == source
    assert any("may be 16-bit" in d.message for d in result.diagnostics)


@pytest.mark.parametrize(
    "setup",
    [
        # a tensor cast, or a module a profiler casts for a benchmark (yolov5's torch_utils)
        "model = torch.nn.Linear(8, 8)\nx = torch.randn(4, 8).half().float()\n",
        "model = torch.nn.Linear(8, 8)\nx = torch.randn(4, 8)\n"
        "def profile(ops):\n    for m in ops:\n        m = m.half()\n",
        # 16-bit parameters on CUDA alone (cifar10-airbench)
        "model = torch.nn.Linear(8, 8).half().cuda()\nx = torch.randn(4, 8).half().cuda()\n",
    ],
)
def test_sgd_is_fused_where_the_cpu_kernel_never_sees_16_bit_parameters(setup: str) -> None:
    source = "import torch\n\n" + setup + SGD + LOOP
    assert "fused=True" in rewrite(source, select=["OPT501"]).source
