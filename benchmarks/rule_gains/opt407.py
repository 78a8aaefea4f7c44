"""OPT407: one SGD training step of a small ResNet-like network, NCHW vs channels_last model.

Only the model is converted, as the rule does; the batch stays a contiguous NCHW tensor and
the first convolution returns a channels_last output.
"""

from __future__ import annotations

CODE = "OPT407"
WHAT = (
    "SGD training step (forward, backward, step) of a 4-block ResNet-like network, "
    "batch 32x3x64x64 float32, model NCHW vs channels_last, CPU, 1 thread"
)


def build(torch):
    nn = torch.nn

    class Block(nn.Module):
        def __init__(self, cin, cout, stride):
            super().__init__()
            self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(cout)
            self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
            self.bn2 = nn.BatchNorm2d(cout)
            self.skip = nn.Sequential()
            if stride != 1 or cin != cout:
                self.skip = nn.Sequential(
                    nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout)
                )

        def forward(self, x):
            out = torch.relu(self.bn1(self.conv1(x)))
            return torch.relu(self.bn2(self.conv2(out)) + self.skip(x))

    return nn.Sequential(
        nn.Conv2d(3, 32, 3, 1, 1, bias=False),
        nn.BatchNorm2d(32),
        nn.ReLU(),
        Block(32, 32, 1),
        Block(32, 64, 2),
        Block(64, 128, 2),
        Block(128, 128, 2),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(128, 10),
    )


def measure(repeats: int, device: str = "cpu") -> dict:
    import copy
    import statistics

    import torch

    from _timing import median_time

    torch.manual_seed(0)
    nchw = build(torch).to(device)
    nhwc = copy.deepcopy(nchw).to(memory_format=torch.channels_last)
    images = torch.randn(32, 3, 64, 64, device=device)
    labels = torch.randint(0, 10, (32,), device=device)

    def stepper(model):
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

        def step():
            optimizer.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(images), labels)
            loss.backward()
            optimizer.step()

        return step

    # One thread: on a shared 2-core machine, a parallel region waits for a descheduled
    # worker and the times jump by whole scheduler ticks, hiding the difference.
    threads = torch.get_num_threads()
    if device == "cpu":
        torch.set_num_threads(1)
    # Alternate short runs of each so that drifting machine load hits both alike.
    before, after = [], []
    step_nchw, step_nhwc = stepper(nchw), stepper(nhwc)
    try:
        for _ in range(max(1, repeats // 5)):
            before.append(median_time(step_nchw, 5, device, warmup=2))
            after.append(median_time(step_nhwc, 5, device, warmup=2))
    finally:
        torch.set_num_threads(threads)
    return {"before_s": statistics.median(before), "after_s": statistics.median(after)}
