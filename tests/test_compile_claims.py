"""The torch behaviours OPT402 declines on, run on the installed torch: if a torch release
changes them, these fail and the rule's reasons must be revisited (transforms/opt402_...).

A counting backend stands in for inductor: it records each graph Dynamo hands it and runs the
graph eagerly, so nothing is compiled to machine code and the tests stay fast on CPU."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn


class _CountingBackend:
    def __init__(self) -> None:
        self.graphs = 0

    def __call__(self, graph_module, example_inputs):
        self.graphs += 1
        return graph_module.forward


class _AutogradCountingBackend(_CountingBackend):
    """Through AOTAutograd, as inductor is: the backward is a compiled function too."""

    def __call__(self, graph_module, example_inputs):
        from functorch.compile import make_boxed_func
        from torch._dynamo.backends.common import aot_autograd

        self.graphs += 1
        run_eagerly = aot_autograd(fw_compiler=lambda graph, inputs: make_boxed_func(graph.forward))
        return run_eagerly(graph_module, example_inputs)


class _Mlp(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.hidden = nn.Linear(8, 16)
        self.out = nn.Linear(16, 1)

    def forward(self, x):
        return self.out(torch.tanh(self.hidden(x)))


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def test_module_compile_compiles_a_module_class_of_the_script() -> None:
    backend = _CountingBackend()
    model = _Mlp()
    model.compile(backend=backend)
    model(torch.randn(4, 8))
    assert backend.graphs >= 1


def test_module_compile_compiles_nothing_in_a_module_of_torchs_own_layers() -> None:
    backend = _CountingBackend()
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
    model.compile(backend=backend)
    model(torch.randn(4, 8))
    assert backend.graphs == 0, "Module.compile() now compiles torch's own modules: OPT402 may"
    # The same module through torch.compile(model) is compiled: the skip is Module.compile's.
    torch.compile(model, backend=backend)(torch.randn(4, 8))
    assert backend.graphs >= 1


def test_differentiating_the_backward_of_a_compiled_module_again_raises() -> None:
    backend = _AutogradCountingBackend()
    model = _Mlp()
    model.compile(backend=backend)
    x = torch.randn(4, 8, requires_grad=True)
    scores = model(x)
    (gradient,) = torch.autograd.grad(scores.sum(), x, create_graph=True)
    assert backend.graphs >= 1
    penalty = ((gradient.norm(2, dim=1) - 1) ** 2).mean()
    with pytest.raises(RuntimeError, match="double backward"):
        (scores.mean() + penalty).backward()


def test_the_same_penalty_in_eager_mode_trains() -> None:
    model = _Mlp()
    x = torch.randn(4, 8, requires_grad=True)
    scores = model(x)
    (gradient,) = torch.autograd.grad(scores.sum(), x, create_graph=True)
    ((gradient.norm(2, dim=1) - 1) ** 2).mean().backward()
    assert model.hidden.weight.grad is not None
    assert model.hidden.weight.grad.abs().sum() > 0


def test_numpy_noise_in_a_legacy_typed_constructor_raises_under_compile() -> None:
    """PyTorch-GAN's UNIT encoder: `Tensor(np.random.normal(...))` in the forward. Eager mode
    runs it; Dynamo traces the numpy draw into a float64 tensor, which the float32
    constructor refuses while tracing (OPT402 declines such models)."""
    np = pytest.importorskip("numpy")

    class Encoder(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.mean = nn.Linear(4, 4)

        def forward(self, x):
            mu = self.mean(x)
            return mu + torch.FloatTensor(np.random.normal(0, 1, mu.shape))

    model = Encoder()
    model(torch.randn(2, 4))
    model.compile(backend=_CountingBackend())
    with pytest.raises(torch._dynamo.exc.TorchRuntimeError):
        model(torch.randn(2, 4))


def test_a_compiled_dropout_draws_another_mask_under_the_same_seed() -> None:
    """Why OPT402's fix is `behavior` for a model that applies dropout: Inductor's kernels
    draw their own random numbers (torch._inductor.config.fallback_random is False)."""
    dropout = nn.Dropout(0.5)
    x = torch.ones(1000)
    torch.manual_seed(0)
    eager = dropout(x)
    compiled = torch.compile(dropout)
    torch.manual_seed(0)
    assert not torch.equal(eager, compiled(x))
