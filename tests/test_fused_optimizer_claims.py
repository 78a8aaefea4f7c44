"""The torch behaviours OPT501 declines on, run on the installed torch: if a release changes
them, these fail and the rule's reasons must be revisited (transforms/opt501_...).

Each runs in a fresh interpreter with a one-rank gloo group (a HashStore: no port), so no
process group outlives the test."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")

ONE_RANK = """\
import torch, torch.nn as nn, torch.distributed as dist
dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
"""


def _run(body: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", ONE_RANK + textwrap.dedent(body)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_fused_sgd_and_adagrad_raise_on_dtensor_parameters_adam_and_adamw_step() -> None:
    out = _run("""
        from torch.distributed.tensor import distribute_tensor, Shard
        from torch.distributed.device_mesh import init_device_mesh
        mesh = init_device_mesh("cpu", (1,))
        for cls in (torch.optim.SGD, torch.optim.Adagrad, torch.optim.Adam, torch.optim.AdamW):
            p = nn.Parameter(distribute_tensor(torch.randn(4, 4), mesh, [Shard(0)]))
            optimizer = cls([p], lr=0.1, fused=True)
            p.grad = distribute_tensor(torch.ones(4, 4), mesh, [Shard(0)])
            try:
                optimizer.step()
                print(cls.__name__, "steps")
            except NotImplementedError as exc:
                print(cls.__name__, "raises", "sharding strategy" in str(exc))
        """)
    assert out.split("\n")[:4] == [
        "SGD raises True",
        "Adagrad raises True",
        "Adam steps",
        "AdamW steps",
    ]


def test_sharded_grad_scaler_all_reduces_the_overflow_flag_only_for_an_unfused_optimizer() -> None:
    out = _run("""
        from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler
        reduced = []
        all_reduce = dist.all_reduce
        dist.all_reduce = lambda *a, **k: (reduced.append(1), all_reduce(*a, **k))[1]
        for fused in (None, True):
            reduced.clear()
            model = nn.Linear(4, 4)
            optimizer = torch.optim.AdamW(model.parameters(), fused=fused)
            scaler = ShardedGradScaler(device="cpu")
            scaler.scale(model(torch.randn(2, 4)).sum()).backward()
            scaler.step(optimizer)
            scaler.update()
            print(fused, len(reduced))
        """)
    assert out.split() == ["None", "1", "True", "0"]


def test_grad_scaler_calls_a_fused_step_even_when_it_skips_the_update() -> None:
    """Accelerate's `step_was_skipped` is True when `GradScaler.step` did not call `step()`."""
    called = {}
    for fused in (None, True):
        model = torch.nn.Linear(5, 5)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1, fused=fused)
        calls = []
        step = optimizer.step
        optimizer.step = lambda *a, **k: (calls.append(1), step(*a, **k))[1]
        scaler = torch.amp.GradScaler("cpu")
        scaler.scale(model(torch.randn(2, 5)).sum()).backward()
        model.weight.grad[0, 0] = float("nan")  # an overflow: the scaler skips this update
        before = model.weight.detach().clone()
        scaler.step(optimizer)
        scaler.update()
        assert torch.equal(before, model.weight)
        called[fused] = bool(calls)
    assert called == {None: False, True: True}


def test_fused_sgd_on_the_cpu_leaves_16_bit_parameters_almost_unchanged() -> None:
    # Why OPT501 declines SGD where parameters may be float16 or bfloat16; Adam is updated.
    out = _run("""
        for dtype in (torch.float16, torch.bfloat16):
            for cls in (torch.optim.SGD, torch.optim.Adam):
                changed = []
                for fused in (False, True):
                    p = nn.Parameter(torch.randn(4096).to(dtype))
                    before = p.detach().clone()
                    optimizer = cls([p], lr=0.1, fused=fused)
                    p.grad = torch.ones_like(p)
                    optimizer.step()
                    changed.append(int((p != before).sum()))
                print(cls.__name__, *changed)
        """)
    lines = out.split("\n")
    for sgd, adam in (lines[0:2], lines[2:4]):
        _, unfused, fused = sgd.split()
        assert int(unfused) > 4000 and int(fused) < 100  # only the tail past the vectors
        assert [int(n) > 4000 for n in adam.split()[1:]] == [True, True]


def test_fused_adam_over_float16_parameters_stays_finite_where_foreach_adam_does_not() -> None:
    """The page says the fix changes more than the last bits over float16 parameters: the
    fused kernel does its arithmetic in float32, while foreach Adam's float16 `eps` (1e-8)
    rounds to 0 and a small gradient's update divides by zero."""
    out = _run("""
        for fused in (False, True):
            p = nn.Parameter(torch.ones(8, dtype=torch.float16))
            if fused:
                optimizer = torch.optim.Adam([p], lr=1e-3, fused=True)
            else:
                optimizer = torch.optim.Adam([p], lr=1e-3, foreach=True)
            for _ in range(3):
                p.grad = torch.full((8,), 1e-5, dtype=torch.float16)
                optimizer.step()
            print("fused" if fused else "foreach", bool(p.isfinite().all()))
        """)
    assert out.split("\n")[:2] == ["foreach False", "fused True"]


def test_sharded_grad_scaler_after_unscale_makes_a_fused_step_raise() -> None:
    """dinov2's step (unscale_, clip, step) with its ShardedGradScaler: unfused it steps, fused
    it raises."""
    out = _run("""
        from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler
        for fused in (None, True):
            model = nn.Linear(4, 4)
            optimizer = torch.optim.AdamW(model.parameters(), fused=fused)
            scaler = ShardedGradScaler(device="cpu")
            scaler.scale(model(torch.randn(2, 4)).sum()).backward()
            scaler.unscale_(optimizer)
            try:
                scaler.step(optimizer)
                print(fused, "steps")
            except RuntimeError:
                print(fused, "raises")
        """)
    assert out.split("\n")[:2] == ["None steps", "True raises"]


def test_a_state_saved_unfused_makes_a_fused_step_under_a_grad_scaler_raise() -> None:
    """A checkpoint written before the fix loads `fused=None` back into the param groups;
    GradScaler still hands the optimizer its scale (the class was built fused), and the
    unfused step refuses it: a resumed run fails on its first step."""
    out = _run("""
        saved = torch.optim.AdamW(nn.Linear(4, 4).parameters()).state_dict()
        for restore in (False, True):
            model = nn.Linear(4, 4)
            optimizer = torch.optim.AdamW(model.parameters(), fused=True)
            if restore:
                optimizer.load_state_dict(saved)
            scaler = torch.amp.GradScaler("cpu")
            scaler.scale(model(torch.randn(2, 4)).sum()).backward()
            try:
                scaler.step(optimizer)
                print(restore, "steps")
            except AssertionError:
                print(restore, "raises", optimizer.param_groups[0]["fused"])
        """)
    assert out.split("\n")[:2] == ["False steps", "True raises None"]


def test_fused_steps_over_gradients_with_other_strides_than_their_parameters_go_wrong() -> None:
    """continual-learning's OWM stores slices of one projected matrix as `.grad`: the
    for-loop and foreach steps read them as strided tensors, the fused CPU kernels as if
    they had their parameters' strides."""
    out = _run("""
        def train(cls, **options):
            torch.manual_seed(0)
            linear = nn.Linear(4, 3)
            optimizer = cls(linear.parameters(), lr=0.1, **options)
            for _ in range(3):
                optimizer.zero_grad()
                linear(torch.randn(5, 4)).sum().backward()
                g = torch.cat((linear.weight.grad, linear.bias.grad[:, None]), -1) * 2
                linear.weight.grad = g[:, :-1]
                linear.bias.grad = g[:, -1]
                optimizer.step()
            return torch.cat([linear.weight.detach().flatten(), linear.bias.detach()])
        for cls in (torch.optim.Adam, torch.optim.SGD):
            loop = train(cls, foreach=False)
            foreach = train(cls, foreach=True)
            fused = train(cls, fused=True)
            print(cls.__name__, (loop - foreach).abs().max().item() < 1e-4,
                  (foreach - fused).abs().max().item() > 0.05)
        """)
    assert out.split("\n")[:2] == ["Adam True True", "SGD True True"]
