"""A training run's state, taken from one run and put into another (inside the probe process).

The local-error check steps the candidate once from the original's exact state. What makes up
that state is found at run time, not from the source, so that any script can be checked:

- the optimizers, in the order they first stepped: their per-parameter state (moments, step
  counts) and the values and gradients of their parameters. The candidate keeps its own
  `param_groups` (its `fused=True`, its learning rate), so a rewrite's own settings stay under test;
- the root `nn.Module`s alive in the process (modules that are no other module's child, seen
  through `torch.compile` and DDP wrappers): their parameters and buffers (BatchNorm
  statistics), matched between the two runs by their state-dict names and shapes;
- GradScaler state (the loss scale), when both runs have one;
- the random generators: torch (CPU and CUDA), Python's `random`, numpy's global one.

Values are copied into the candidate's existing tensors, so a rewrite's memory layout
(channels_last) and wrappers stay as they are.
"""

from __future__ import annotations

import gc
import random
from typing import Any, Dict, List, Optional, Sequence, Tuple

Signature = Tuple[Tuple[str, Tuple[int, ...]], ...]


def root_modules(torch: Any) -> List[Any]:
    """The root modules with state, unwrapped, in a stable order (by signature, then discovery)."""
    module_type = torch.nn.Module
    # type(), not isinstance(): some objects warn when their __class__ is read.
    modules = [obj for obj in gc.get_objects() if issubclass(type(obj), module_type)]
    children = set()
    for module in modules:
        for child in module.__dict__.get("_modules", {}).values():
            if child is not None:
                children.add(id(child))
    roots, seen = [], set()
    for module in modules:
        if id(module) in children:
            continue
        module = _unwrap(module)
        if id(module) in seen:
            continue
        seen.add(id(module))
        if signature(module):
            roots.append(module)
    return sorted(roots, key=signature)


def _unwrap(module: Any) -> Any:
    while True:
        inner = module.__dict__.get("_modules", {}).get("_orig_mod")  # torch.compile's wrapper
        if inner is None and type(module).__name__ in ("DistributedDataParallel", "DataParallel"):
            inner = module.__dict__.get("_modules", {}).get("module")
        if inner is None:
            return module
        module = inner


def signature(module: Any) -> Signature:
    return tuple((name, tuple(t.shape)) for name, t in module.state_dict(keep_vars=True).items())


def rng_state(torch: Any) -> Dict[str, Any]:
    state: Dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    try:
        import numpy
    except ImportError:
        return state
    state["numpy"] = numpy.random.get_state()
    return state


def set_rng_state(torch: Any, state: Dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    if "numpy" in state:
        import numpy

        numpy.random.set_state(state["numpy"])


def grad_scalers(torch: Any) -> List[Any]:
    scaler_type = getattr(getattr(torch, "amp", None), "GradScaler", None)
    if not isinstance(scaler_type, type):
        return []
    return [obj for obj in gc.get_objects() if issubclass(type(obj), scaler_type)]


def parameters_of(optimizer: Any) -> List[Any]:
    return [p for group in optimizer.param_groups for p in group["params"]]


def capture(torch: Any, optimizers: Sequence[Any]) -> Dict[str, Any]:
    """Everything `restore` needs, copied (the run goes on changing its own tensors)."""
    with torch.no_grad():
        roots = root_modules(torch)
        return {
            "optimizers": [
                {
                    "state": _copy(optimizer.state_dict()["state"]),
                    "params": [p.detach().clone() for p in parameters_of(optimizer)],
                    "grads": [
                        None if p.grad is None else p.grad.detach().clone()
                        for p in parameters_of(optimizer)
                    ],
                }
                for optimizer in optimizers
            ],
            "modules": [
                (signature(m), {k: v.detach().clone() for k, v in m.state_dict().items()})
                for m in roots
            ],
            "scalers": [s.state_dict() for s in grad_scalers(torch)],
            "rng": rng_state(torch),
        }


def _copy(value: Any) -> Any:
    if hasattr(value, "detach") and hasattr(value, "clone"):
        return value.detach().clone()
    if isinstance(value, dict):
        return {k: _copy(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_copy(v) for v in value)
    return value


def restore(torch: Any, optimizers: Sequence[Any], state: Dict[str, Any]) -> List[str]:
    """Put `state` into this run; returns what could not be restored (empty: all of it)."""
    missing: List[str] = []
    with torch.no_grad():
        by_signature: Dict[Signature, List[Any]] = {}
        for module in root_modules(torch):
            by_signature.setdefault(signature(module), []).append(module)
        for sig, values in state["modules"]:
            candidates = by_signature.get(sig)
            if not candidates:
                missing.append(f"a module with {len(sig)} tensors")
                continue
            target = candidates.pop(0).state_dict(keep_vars=True)
            for name, value in values.items():
                target[name].copy_(value)
        if len(optimizers) != len(state["optimizers"]):
            missing.append(
                f"optimizers ({len(state['optimizers'])} in the original, {len(optimizers)} here)"
            )
        for optimizer, saved in zip(optimizers, state["optimizers"]):
            params = parameters_of(optimizer)
            if [tuple(p.shape) for p in params] != [tuple(p.shape) for p in saved["params"]]:
                missing.append("an optimizer with other parameters")
                continue
            for param, value, grad in zip(params, saved["params"], saved["grads"]):
                param.copy_(value)
                if grad is None:
                    param.grad = None
                elif param.grad is None:
                    param.grad = param.new_empty_strided(
                        param.size(), param.stride(), dtype=grad.dtype
                    ).copy_(grad)
                else:
                    param.grad.copy_(grad)
            own = optimizer.state_dict()
            own["state"] = _copy(saved["state"])
            optimizer.load_state_dict(own)
            _match_layouts(optimizer, params)
        scalers = grad_scalers(torch)
        for scaler, saved_scaler in zip(scalers, state["scalers"]):
            if saved_scaler:
                scaler.load_state_dict(saved_scaler)
    set_rng_state(torch, state["rng"])
    return missing


def _match_layouts(optimizer: Any, params: Sequence[Any]) -> None:
    """Give per-parameter state its parameter's memory layout, as the optimizer itself would.

    Loaded moments are contiguous; a fused kernel reads a channels_last parameter's moment with
    the parameter's strides, so a contiguous one would be read in the wrong order.
    """
    for param in params:
        state = optimizer.state.get(param, {})
        for key, value in list(state.items()):
            if getattr(value, "shape", None) == param.shape and value.stride() != param.stride():
                laid_out = param.new_empty_strided(param.size(), param.stride(), dtype=value.dtype)
                laid_out.copy_(value)
                state[key] = laid_out


def flat(tensors: Sequence[Any], torch: Any) -> Optional[Any]:
    """One float64 vector of `tensors` on the CPU (None entries count as zeros of no length)."""
    parts = [t.detach().double().flatten().cpu() for t in tensors if t is not None]
    return torch.cat(parts) if parts else None


def relative_distance(a: Any, b: Any) -> Tuple[float, float]:
    """(||a - b||, ||a||) of two vectors of the same length."""
    return float((a - b).norm()), float(a.norm())
