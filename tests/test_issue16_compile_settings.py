"""Issue 16, items 3 and 8: compile settings a script already has, and TF32 settings.

The torch checks run the installed torch in a subprocess each (process-wide settings and
`torch.compile` state must not leak into other tests); compiling is lazy, so building a
wrapper without calling it is enough to read its state_dict keys.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from optimizer_codemod import rewrite


def _torch(code: str) -> dict:
    """Run `code` with torch in a fresh interpreter; it prints one JSON object."""
    pytest.importorskip("torch")
    done = subprocess.run(
        [sys.executable, "-W", "always", "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


# OPT408 -------------------------------------------------------------------------------------
def test_compile_wrapper_prefixes_keys_and_in_place_compile_does_not() -> None:
    found = _torch("""
        import json, torch, torch.nn as nn
        wrapped = torch.compile(nn.Sequential(nn.Linear(2, 2)), mode="max-autotune")
        in_place = nn.Sequential(nn.Linear(2, 2))
        returned = in_place.compile(mode="max-autotune")
        fresh = nn.Sequential(nn.Linear(2, 2))
        fresh.load_state_dict(in_place.state_dict())  # loads into the plain class
        try:
            fresh.load_state_dict(wrapped.state_dict())
            loads = True
        except RuntimeError:
            loads = False
        in_place.eval()
        print(json.dumps({
            "wrapped": sorted(wrapped.state_dict()),
            "in_place": sorted(in_place.state_dict()),
            "wrapped_loads_into_plain": loads,
            "returned": repr(returned),
            "type": type(in_place).__name__,
            "training": in_place.training,
            "same_parameters": [p is q for p, q in zip(
                in_place.parameters(), in_place._modules["0"].parameters())],
        }))
    """)
    assert found["wrapped"] == ["_orig_mod.0.bias", "_orig_mod.0.weight"]
    assert found["in_place"] == ["0.bias", "0.weight"]
    assert found["wrapped_loads_into_plain"] is False
    # `model.compile()` returns None: the rewrite emits it as a statement, never `x = ...`.
    assert found["returned"] == "None"
    assert found["type"] == "Sequential" and found["training"] is False
    assert found["same_parameters"] == [True, True]


def test_rewritten_script_compiles_in_place_with_the_same_arguments() -> None:
    source = (
        "import torch\n\nmodel = Net()\n"
        'model = torch.compile(model, mode="max-autotune", fullgraph=True)\n'
        "opt = torch.optim.SGD(model.parameters())\nloss = model(x).sum()\nloss.backward()\n"
        'torch.save(model.state_dict(), "m.pt")\n'
    )
    out = rewrite(source, select=["OPT408"], unsafe_fixes=True).source
    assert 'model.compile(mode="max-autotune", fullgraph=True)\n' in out
    assert "torch.compile" not in out
    # `behavior`: not applied without --unsafe-fixes.
    assert rewrite(source, select=["OPT408"]).source == source
