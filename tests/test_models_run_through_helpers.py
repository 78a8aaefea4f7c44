"""OPT402 declines to compile a model the file runs only through methods that bypass
`__call__` (`model.encode(x)`), also when the model is handed to helpers of the file that
do no more with it (hkproj's `run_validation(model, ...)` calling `greedy_decode(model, ...)`),
and when another function has a parameter of the same name. Anything else done with the
model (calling it, reading an attribute, passing it on to code the file does not define)
leaves the question open, and the model is compiled as before."""

from __future__ import annotations

import textwrap

import pytest

from optimizer_codemod import rewrite
from optimizer_codemod.diagnostics import Status

SCRIPT = textwrap.dedent("""\
    import torch
    import torch.nn as nn


    class Seq2Seq(nn.Module):
        def __init__(self):
            super().__init__()
            self.encoder = nn.Linear(8, 8)
            self.head = nn.Linear(8, 2)

        def encode(self, x):
            return self.encoder(x)

        def project(self, h):
            return self.head(h)

        def forward(self, x):
            return self.project(self.encode(x))


    def decode(model, x):
        return model.project(model.encode(x))


    def validate(model, x):
        model.eval()
        out = decode(model, x)
        model.train()
        return out


    def main():
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        model = Seq2Seq().to(device)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for step in range(3):
            x = torch.randn(4, 8, device=device)
            loss = model.project(model.encode(x)).square().mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            validate(model, x)


    if __name__ == "__main__":
        main()
    """)

DECLINED = "`model` is never called itself, only through `model.project(...)`"


def _opt402(source: str):
    result = rewrite(source, select=["OPT402"], why_not=True)
    return next(d for d in result.diagnostics if d.code == "OPT402")


@pytest.mark.parametrize(
    "change",
    [
        ("", ""),
        ("        validate(model, x)", "        validate(x=x, model=model)"),
        ("    out = decode(model, x)", "    out = decode(x=x, model=model)"),
        ("def validate(model, x):", "def validate(model, x, *rest):"),
    ],
    ids=["handed to helpers", "by keyword", "on by keyword", "a helper taking *rest too"],
)
def test_a_model_run_only_through_methods_in_helpers_is_not_compiled(change) -> None:
    source = SCRIPT.replace(*change)
    assert change == ("", "") or source != SCRIPT
    finding = _opt402(source)
    assert finding.status is Status.DECLINED and DECLINED in finding.message, finding.message


@pytest.mark.parametrize(
    "change",
    [
        ("return model.project(model.encode(x))", "return model(x)"),
        ("    model.eval()\n", "    model.eval()\n    print(model.encoder)\n"),
        ("    out = decode(model, x)", "    out = decode(model, x)\n    print(model)"),
        ("        validate(model, x)", "        validate(model, x)\n        summary(model)"),
    ],
    ids=["a helper calls it", "reads a submodule", "hands it to print", "to a function of no file"],
)
def test_a_model_a_helper_may_call_is_compiled(change) -> None:
    source = SCRIPT.replace(*change)
    assert source != SCRIPT
    if "summary(model)" in source:
        source = source.replace(
            "import torch.nn as nn\n", "import torch.nn as nn\nfrom torchinfo import summary\n"
        )
    finding = _opt402(source)
    assert finding.status is Status.FIXED, finding.message


def test_a_same_named_parameter_of_an_unrelated_function_does_not_hide_the_model() -> None:
    # `report(model)` is never handed this model; its own `model.encode` is its parameter's.
    source = SCRIPT.replace(
        "def main():", "def report(model):\n    return model.encode(torch.ones(8))\n\n\ndef main():"
    )
    finding = _opt402(source)
    assert finding.status is Status.DECLINED and DECLINED in finding.message, finding.message
