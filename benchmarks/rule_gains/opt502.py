"""OPT502: zero_grad + backward, `zero_grad(set_to_none=False)` vs the default (None).

On CPU the outcome depends on the C allocator as much as on the saved zero-fill: with None,
the gradients are freed at every zero_grad and backward allocates them again, and glibc may
hand that memory back to the OS in between, so each step page-faults fresh pages in. The
minor page faults per step are recorded next to the times to tell the two effects apart.
"""

from __future__ import annotations

CODE = "OPT502"
WHAT = "zero_grad() + backward of an MLP with 8.4M parameters (8 tensors), batch 32, CPU"


def _minor_faults() -> int:
    try:
        import resource
    except ImportError:  # not on Windows
        return 0
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def measure(repeats: int, device: str = "cpu") -> dict:
    import statistics

    import torch

    from _timing import median_time

    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(1024, 1024) for _ in range(8)]).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(32, 1024, device=device)
    faults = {"before": 0, "after": 0}
    steps = {"before": 0, "after": 0}

    def step(label, **options):
        def run():
            start = _minor_faults()
            optimizer.zero_grad(**options)
            model(x).sum().backward()
            faults[label] += _minor_faults() - start
            steps[label] += 1

        return run

    zero_filled, dropped = step("before", set_to_none=False), step("after")
    # Alternate short runs of each so that drifting machine load hits both alike.
    before, after = [], []
    for _ in range(max(1, repeats // 5)):
        before.append(median_time(zero_filled, 5, device, warmup=1))
        after.append(median_time(dropped, 5, device, warmup=1))
    return {
        "before_s": statistics.median(before),
        "after_s": statistics.median(after),
        "before_minor_faults_per_step": faults["before"] / steps["before"],
        "after_minor_faults_per_step": faults["after"] / steps["after"],
    }
