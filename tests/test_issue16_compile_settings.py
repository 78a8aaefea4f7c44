"""Issue 16, items 3 and 8: compile settings a script already has, and TF32 settings.

The torch checks run the installed torch in a subprocess each (process-wide settings and
`torch.compile` state must not leak into other tests); compiling is lazy, so building a
wrapper without calling it is enough to read its state_dict keys.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

from optimizer_codemod import rewrite


def _torch(code: str) -> dict:
    """Run `code` with torch in a fresh interpreter; it prints one JSON object. The code runs
    from a file: TorchScript reads the source of what it compiles."""
    pytest.importorskip("torch")
    with tempfile.TemporaryDirectory() as folder:
        script = Path(folder) / "probe.py"
        script.write_text(textwrap.dedent(code), encoding="utf-8")
        done = subprocess.run(
            [sys.executable, "-W", "always", str(script)],
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


# OPT409 -------------------------------------------------------------------------------------
def test_item_inside_compiled_code_splits_the_graph_and_settings_exist() -> None:
    found = _torch("""
        import json, torch, torch._dynamo, torch._inductor
        def step(x):
            y = (x * 2).sum()
            if y.item() > 0:
                x = x + 1
            return (x * 3).sum()
        explained = torch._dynamo.explain(step)(torch.randn(4))
        modes = torch._inductor.list_mode_options()

        @torch.jit.script
        def scripted(x):
            return x * torch.sigmoid(1.702 * x)

        class Model(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.layer = torch.nn.Linear(4, 4)

            def forward(self, x):
                return self.layer(scripted(self.layer(x))).sum()

        with_script = torch._dynamo.explain(Model())(torch.randn(2, 4))
        print(json.dumps({
            "graphs": explained.graph_count,
            "reason": str(explained.break_reasons[0].reason),
            "suppress_errors": torch._dynamo.config.suppress_errors,
            "script_graphs": [with_script.graph_count, with_script.graph_break_count],
            "graph_modes": sorted(
                m for m, o in modes.items() if o.get("triton.cudagraphs")),
        }))
    """)
    # `.item()` breaks the compiled code in two: what OPT409 says of a CUDA-graph mode.
    assert found["graphs"] == 2 and "item()" in found["reason"]
    assert found["suppress_errors"] is False  # the default; OPT409 reports a literal True
    # A TorchScript function called from a compiled model: one graph, no break, in torch
    # 2.13. Issue 16 listed `torch.jit.script` inside a compiled model as a cost; this is why
    # OPT409 does not report it.
    assert found["script_graphs"] == [1, 0]
    # The modes OPT409 and OPT502 treat as capturing CUDA graphs.
    from optimizer_codemod.analysis.cuda_graphs import CUDA_GRAPH_MODES

    assert sorted(CUDA_GRAPH_MODES) == found["graph_modes"]


def test_each_compile_setting_is_reported_once_with_its_reason() -> None:
    source = textwrap.dedent("""\
        import torch
        from torch.nn.utils.rnn import pad_sequence

        torch._dynamo.config.suppress_errors = True
        model = torch.compile(model, mode="reduce-overhead", dynamic=True)
        batch = pad_sequence(items, batch_first=True)
        loss = model(batch).sum()
        loss.backward()
        """)
    result = rewrite(source, select=["OPT409"])
    assert result.source == source
    messages = sorted(d.message for d in result.diagnostics if d.code == "OPT409")
    assert len(messages) == 3
    assert "suppress_errors = True" in messages[2]
    assert messages[0].startswith("`dynamic=True`")
    assert messages[1].startswith('`mode="reduce-overhead"` uses CUDA graphs, but batches')
    assert "pytorch/pytorch#188150" in messages[1]


# TF32 settings (issue 16, item 8): why no rule rewrites `allow_tf32 = True` ---------------
def test_fp32_precision_api_breaks_legacy_readers_in_installed_torch() -> None:
    """`torch.backends.cuda.matmul.allow_tf32 = True` -> `...matmul.fp32_precision = "tf32"`
    is not a sound rewrite on torch 2.13: after the new-style write, the legacy readers that
    torch itself still calls (`torch.get_float32_matmul_precision()`, read by Inductor's
    autotuning cache keys) raise; the old flag alone emits no warning here."""
    old = _torch("""
        import json, warnings, torch
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.backends.cuda.matmul.allow_tf32 = True
            torch.backends.cudnn.allow_tf32 = True
            legacy = torch.get_float32_matmul_precision()
        print(json.dumps({"warnings": [str(w.message) for w in caught], "legacy": legacy}))
    """)
    # The rewritten script: the new spelling instead of the old, in a fresh process.
    new = _torch("""
        import json, torch
        torch.backends.cuda.matmul.fp32_precision = "tf32"
        torch.backends.cudnn.conv.fp32_precision = "tf32"
        accepted = torch.backends.cuda.matmul.fp32_precision
        try:
            torch.get_float32_matmul_precision()
            raised = None
        except RuntimeError as error:
            raised = str(error)
        print(json.dumps({"accepted": accepted, "raised": raised}))
    """)
    found = {**old, **new}
    assert found["warnings"] == [] and found["legacy"] == "high"
    assert found["accepted"] == "tf32"
    assert found["raised"] is not None and "mix of the legacy and new APIs" in found["raised"]


def test_opt301_leaves_scripts_that_set_either_tf32_api() -> None:
    for setting in (
        "torch.backends.cuda.matmul.allow_tf32 = True",
        'torch.backends.cuda.matmul.fp32_precision = "tf32"',
    ):
        source = f"import torch\n\n{setting}\nloss = model(x).sum()\nloss.backward()\n"
        assert rewrite(source, select=["OPT301"]).source == source
