"""Edits the ecosystem review (benchmarks/results/ecosystem.md) found a user could not trust,
now declined with a reason or lowered to `behavior`: OPT302 and OPT402 on recurrent models,
OPT402 on sparse tensors, OPT301 on scripts that never name an accelerator, OPT501 where the
device may be an XLA one."""

from __future__ import annotations

import textwrap

import pytest

from optimizer_codemod import rewrite
from optimizer_codemod.diagnostics import Status

RECURRENT = textwrap.dedent("""\
    import torch
    import torch.nn as nn


    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.rnn = nn.{layer}(28, 64, batch_first=True)
            self.fc = nn.Linear(64, 10)

        def forward(self, x):
            output, _ = self.rnn(x)
            return self.fc(output[:, -1])


    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = Net().to(device)
    optimizer = torch.optim.Adam(model.parameters())
    for x, y in loader:
        x, y = x.to(device), y.to(device)
        loss = nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    """)


def _only(source: str, code: str, **options):
    result = rewrite(source, select=[code], why_not=True, **options)
    findings = [d for d in result.diagnostics if d.code == code]
    assert len(findings) == 1, findings
    return result, findings[0]


@pytest.mark.parametrize("layer", ["LSTM", "GRU", "RNN"])
def test_recurrent_models_get_no_bfloat16_autocast_and_no_compile(layer: str) -> None:
    source = RECURRENT.replace("{layer}", layer)
    result, finding = _only(source, "OPT302")
    assert result.source == source and finding.status is Status.DECLINED
    assert "float16 whatever dtype" in finding.message and f"nn.{layer}(" in finding.message
    result, finding = _only(source, "OPT402")
    assert result.source == source and finding.status is Status.DECLINED
    assert "graph-breaks on RNN, GRU and LSTM" in finding.message


def test_recurrent_model_under_float16_gets_autocast_and_a_scaler() -> None:
    source = RECURRENT.replace("{layer}", "LSTM")
    result, finding = _only(source, "OPT302", precision="fp16")
    assert finding.status is Status.FIXED
    assert "dtype=torch.float16" in result.source and "GradScaler" in result.source


def test_a_linear_model_is_still_compiled_and_autocast() -> None:
    source = RECURRENT.replace("nn.{layer}(28, 64, batch_first=True)", "nn.Linear(28, 64)")
    for code in ("OPT302", "OPT402"):
        assert _only(source, code)[1].status is Status.FIXED


LINEAR = (
    RECURRENT.replace("nn.{layer}(28, 64, batch_first=True)", "nn.Linear(28, 64)")
    .replace("output, _ = self.rnn(x)", "output = self.rnn(x)")
    .replace("self.fc(output[:, -1])", "self.fc(output)")
)


@pytest.mark.parametrize(
    "before, after",
    [
        ("        output = self.rnn(x)\n", "        output = torch.spmm(adj, self.rnn(x))\n"),
        (
            "    x, y = x.to(device)",
            "    x = torch.sparse_coo_tensor(i, x, (4, 4))\n    x, y = x.to(device)",
        ),
        ("    x, y = x.to(device)", "    x = x.to_sparse()\n    x, y = x.to(device)"),
    ],
)
def test_sparse_tensors_in_the_model_or_its_loop_get_no_compile(before: str, after: str) -> None:
    source = LINEAR.replace(before, after)
    assert source != LINEAR
    result, finding = _only(source, "OPT402")
    assert result.source == source and finding.status is Status.DECLINED
    assert "sparse" in finding.message


def test_sparse_preprocessing_that_ends_dense_still_compiles() -> None:
    # pytorch/examples gat/main.py: features scaled by a sparse diagonal, then dense.
    source = LINEAR.replace(
        "model = Net()", "scale = torch.diag(weights).to_sparse()\nmodel = Net()"
    )
    assert _only(source, "OPT402")[1].status is Status.FIXED


CPU_SCRIPT = textwrap.dedent("""\
    import torch

    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)


    def main():
        for step in range(100):
            x = torch.randn(32, 4)
            loss = (model(x) - x.sum(1, keepdim=True)).pow(2).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()


    if __name__ == "__main__":
        main()
    """)


@pytest.mark.parametrize(
    "change",
    [
        ("torch.randn(32, 4)", "torch.randn(32, 4).to(args.device)"),
        ("torch.randn(32, 4)", "torch.randn(32, 4).cuda()"),
        ("torch.randn(32, 4)", "to_device(torch.randn(32, 4))"),
        ("    main()\n", "    main()\n    print(torch.cuda.max_memory_allocated())\n"),
        ("import torch\n", "import torch\nfrom accelerate import Accelerator\n"),
        ("model = torch.nn.Linear(4, 1)", "model = torch.nn.Linear(4, 1)\nuse_gpu = True"),
    ],
)
def test_tf32_needs_a_script_that_names_an_accelerator(change) -> None:
    result, finding = _only(CPU_SCRIPT, "OPT301")
    assert result.source == CPU_SCRIPT and finding.status is Status.DECLINED
    assert "trains on the CPU" in finding.message
    source = CPU_SCRIPT.replace(*change)
    assert _only(source, "OPT301")[1].status is Status.FIXED


def test_tf32_in_an_importable_module_is_still_reported() -> None:
    library = CPU_SCRIPT[: CPU_SCRIPT.index("\n\nif __name__")] + "\n"
    result, finding = _only(library, "OPT301")
    assert result.source == library and finding.status is Status.REPORTED
    assert "importable module" in finding.message


def test_words_that_only_contain_a_device_name_do_not_count() -> None:
    source = CPU_SCRIPT.replace("    main()\n", "    main()\n    plt.xlabel(json.dumps({}))\n")
    assert _only(source, "OPT301")[1].status is Status.DECLINED


OPTIMIZER = textwrap.dedent("""\
    import torch
    {imports}
    model = Net()
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-5)
    """)


def test_fused_under_accelerate_is_behavior_and_under_torch_xla_declined() -> None:
    accelerate = OPTIMIZER.replace("{imports}", "from accelerate import Accelerator\n")
    result, finding = _only(accelerate, "OPT501")
    assert result.source == accelerate and finding.status is Status.UNSAFE
    assert "TPU (XLA)" in finding.message
    applied = rewrite(accelerate, select=["OPT501"], unsafe_fixes=True).source
    assert "lr=2e-5, fused=True)" in applied
    xla = OPTIMIZER.replace("{imports}", "import torch_xla.core.xla_model as xm\n")
    result, finding = _only(xla, "OPT501", unsafe_fixes=True)
    assert result.source == xla and finding.status is Status.DECLINED
    assert "no XLA kernel" in finding.message
    plain = OPTIMIZER.replace("{imports}", "")
    assert _only(plain, "OPT501")[1].status is Status.FIXED


CPU_TRAINING = """\
import torch
import torch.nn as nn


def train_model(model, loader, epochs=1, device="cpu"):
    model.to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-6)
    for epoch in range(epochs):
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            loss = nn.functional.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()


train_model(nn.Linear(8, 2), loader, device={device})
"""


@pytest.mark.parametrize(
    "device, target, autocast",
    [
        # llama-recipes' prompt_guard notebook trains on the CPU by every call's argument.
        ('"cpu"', "cuda", False),
        ('"cuda"', "cuda", True),
        ('"cpu"', "cpu", True),
    ],
)
def test_no_cuda_autocast_for_a_model_every_call_trains_on_the_cpu(
    device: str, target: str, autocast: bool
) -> None:
    source = CPU_TRAINING.format(device=device)
    result = rewrite(source, select=["OPT302"], target_device=target, why_not=True)
    assert ("torch.autocast" in result.source) is autocast
    if not autocast:
        (finding,) = result.diagnostics
        assert finding.status is Status.DECLINED
        assert "every call of `train_model` passes the CPU" in finding.message
    literal = source.replace("model.to(device)", 'model.to("cpu")')
    assert "torch.autocast" not in rewrite(literal, select=["OPT302"], target_device="cuda").source
