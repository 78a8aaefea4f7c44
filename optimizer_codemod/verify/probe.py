"""Run a training script unchanged and record its losses, step times and peak memory.

    python -m optimizer_codemod.verify.probe --steps 20 --out result.json -- train.py --epochs 1

The script runs as `__main__` (with `sys.argv` and `sys.path[0]` as `python train.py ...` would
set them) after these hooks are installed:

- `torch.autograd.backward` and `Tensor.backward`: each call on a one-element tensor records that
  tensor as a loss. A tensor returned by `GradScaler.scale` remembers the loss it scaled, so a
  float16 script's losses are recorded unscaled. Losses are kept on their device as detached
  copies and read once at the end: reading them per step would synchronise the device.
- steps are training iterations (see `Recorder`): the line that calls backward tells them
  apart, whatever number of optimizers steps in one, or none. The start of each iteration is
  recorded; the device is synchronised only at the two edges of the measured window (the start
  of the first timed iteration and of the one after the last), so the window's total is exact
  while per-step intervals inside it are host-side times: exact on CPU, and on an accelerator
  right on average but not per step (the host runs ahead of the device until its queue fills).
- when iteration `--steps` + 1 begins, the hook raises `StopProbe` (a BaseException, so a
  script's `except Exception:` does not swallow it); the probe catches it, writes the result,
  and lets the script's DataLoader iterators be collected so their workers shut down.
- the window's first edge waits until Inductor's compile workers, if a compile started them,
  are up (`settle_seconds`): their start takes cores from the training process for a second
  or more, which is compile time, not step time.
- optimizer step pre- and post-hooks drive the local-error check and the perturbation of
  reference runs (checks.py), when asked for.

Under torchrun every process runs the probe and stops after the same step (DDP keeps the
ranks in step, so no collective is left waiting); each then destroys the process group the
script left. Rank 0 (env RANK) writes `--out`, rank N writes `--out` + `.rankN`.

The JSON result holds `losses`, `step_times` (seconds, measured steps only), `steps`, `warmup`,
`measured_seconds` (synchronised window), `step_time` (the figure to compare, see `_step_time`),
`settle_seconds` (waited for compile workers before the window, or null), `device`, `torch`, `peak_memory` with `peak_memory_kind`, `flops_per_step` (with `--count-flops`:
the floating-point operations of the second iteration, counted by `torch.utils.flop_counter`; that step
is a warm-up step, left out of the timing, so at least 2 warm-up steps are needed), `status`
(`stopped` after the requested steps, `finished` when the script ended first, `error`, `exit`)
and `error` (the traceback).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import gc
import json
import os
import platform
import runpy
import statistics
import sys
import threading
import time
import traceback
from typing import Any, Dict, List, Optional, Sequence, Tuple

UNSCALED_ATTRIBUTE = "_optcodemod_unscaled"
# How long the timed window may wait for Inductor's compile workers to finish starting.
COMPILE_WORKERS_TIMEOUT = 60.0
# With --count-flops, the operations between the end of step 1 and the end of step 2 are counted:
# step 1 has already built lazily created state (optimizer moments, caches).
FLOP_COUNTED_STEP = 2


class StopProbe(BaseException):
    """Raised from the optimizer-step hook once the requested steps have run."""


class Recorder:
    """What the hooks record while the script runs.

    A step is one training iteration, whatever number of optimizers steps in it (or none, for
    hand-written updates): iterations are told apart by the line that calls backward. The first
    such line seen a second time is the anchor; each call from it starts an iteration, and the
    backward calls between two of them (a GAN's discriminator and generator losses) belong to
    one iteration. Every backward call on a one-element tensor records a loss.
    """

    def __init__(
        self,
        torch: Any,
        steps: int,
        warmup: int,
        count_flops: bool = False,
        check: Optional[Any] = None,
        perturbation: Optional[Any] = None,
    ) -> None:
        self.torch = torch
        # The counter slows the step it watches: only a warm-up step may be counted.
        self.count_flops = count_flops and warmup >= FLOP_COUNTED_STEP
        self.flops_per_step: Optional[int] = None
        self._flop_counter: Optional[Any] = None
        self.max_steps = steps
        self.warmup = warmup
        self.check = check
        self.check_error: Optional[str] = None
        self.perturbation = perturbation
        self.losses: List[Any] = []  # detached device tensors; converted once, at the end
        self.backward_calls = 0
        self.iterations = 0  # iterations started (known once the anchor line is known)
        self.optimizer_steps = 0
        self.device: Optional[str] = None
        self.started = time.perf_counter()
        self.stamps: List[float] = []  # perf_counter at the start of each iteration
        self.settle_seconds: Optional[float] = None  # waited for compile workers, if any
        self._anchor: Optional[Tuple[str, int]] = None
        self._first_seen: Dict[Tuple[str, int], float] = {}
        self._local = threading.local()

    @property
    def steps(self) -> int:
        """Completed iterations: all started ones once the script has ended on its own."""
        return self.iterations

    @contextlib.contextmanager
    def backward_call(self, tensors: Any):
        # Tensor.backward calls torch.autograd.backward: record the outer call only.
        if getattr(self._local, "inside", False):
            yield
            return
        self._local.inside = True
        try:
            self._begin_iteration_if_anchor(_caller_site())
            self.backward_calls += 1
            self._record_loss(tensors)
            yield
            if self.perturbation is not None:
                self.perturbation.after_backward()
        finally:
            self._local.inside = False

    def _begin_iteration_if_anchor(self, site: Tuple[str, int]) -> None:
        now = time.perf_counter()
        if self._anchor is None:
            if site not in self._first_seen:
                self._first_seen[site] = now
                return
            # The first line seen twice: its first call started iteration 1, this one starts 2.
            self._anchor = site
            self.iterations = 1
            self.stamps.append(self._first_seen[site])
        elif site != self._anchor:
            return
        self.iterations += 1
        started = self.iterations
        if started - 1 >= self.max_steps:
            self.iterations = self.max_steps
            self.synchronize()
            self.stamps.append(time.perf_counter())
            if self.check is not None:
                self._safely(self.check.iteration_started, started)
            self._count_flops_around(started)
            raise StopProbe(self.max_steps)
        if started == self.warmup + 1:
            self.settle_seconds = settle_compile_workers()
            self.synchronize()
            now = time.perf_counter()
        self.stamps.append(now)
        if self.check is not None:
            self._safely(self.check.iteration_started, started)
        self._count_flops_around(started)

    def _safely(self, event: Any, *args: Any) -> None:
        """A failing check is reported in the result; it never breaks the script."""
        try:
            event(*args)
        except Exception:
            if self.check_error is None:
                self.check_error = traceback.format_exc()
            self.check = None

    def _record_loss(self, tensors: Any) -> None:
        torch = self.torch
        if isinstance(tensors, (list, tuple)) and len(tensors) == 1:
            tensors = tensors[0]
        if not isinstance(tensors, torch.Tensor):
            return
        try:
            if tensors.numel() != 1:
                return
            loss = getattr(tensors, UNSCALED_ATTRIBUTE, tensors)
            # A copy: the script may update the loss tensor in place after backward.
            self.losses.append(loss.detach().clone())
            if self.check is not None:
                self._safely(self.check.loss, loss)
            if self.device is None:
                self.device = loss.device.type
        except Exception:  # recording must never break the script
            pass

    def before_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if self.check is not None:
            self._safely(self.check.optimizer_pre_step, optimizer)

    def on_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self.optimizer_steps += 1
        if self.check is not None:
            self._safely(self.check.optimizer_post_step, optimizer)
        if self.perturbation is not None:
            self.perturbation.after_optimizer_step(optimizer)

    def _count_flops_around(self, started: int) -> None:
        """Count from the start of iteration 2 to the start of iteration 3: one whole iteration."""
        if not self.count_flops:
            return
        if started == FLOP_COUNTED_STEP and self._flop_counter is None:
            try:
                from torch.utils.flop_counter import FlopCounterMode

                self._flop_counter = FlopCounterMode(display=False)
                self._flop_counter.__enter__()
            except Exception:  # counting is an extra: never break the script for it
                self._flop_counter = None
                self.count_flops = False
        elif started == FLOP_COUNTED_STEP + 1:
            self.stop_counting_flops(keep=True)

    def stop_counting_flops(self, keep: bool = False) -> None:
        counter, self._flop_counter = self._flop_counter, None
        if counter is None:
            return
        try:
            counter.__exit__(None, None, None)
            if keep:
                self.flops_per_step = int(counter.get_total_flops())
        except Exception:
            pass

    def synchronize(self) -> None:
        torch = self.torch
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.synchronize()
        if self.device not in (None, "cpu", "cuda"):
            synchronize = getattr(getattr(torch, self.device, None), "synchronize", None)
            if callable(synchronize):
                synchronize()

    def result(self, ended_on_its_own: bool = False) -> Dict[str, Any]:
        self.stop_counting_flops()  # the script ended inside the counted step
        self.synchronize()
        if self._anchor is None and self._first_seen:
            self.iterations = 1  # one backward line, called once: one iteration
            self.stamps = [min(self._first_seen.values())]
        edges = list(self.stamps)
        if ended_on_its_own and len(edges) == self.iterations:
            edges.append(time.perf_counter())  # the last iteration ran until the script ended
        window = edges[self.warmup : self.iterations + 1] if self.steps > self.warmup else []
        step_times = [b - a for a, b in zip(window, window[1:])]
        device = self.device or ("cuda" if _cuda_used(self.torch) else "cpu")
        peak, kind = _peak_memory(self.torch, device)
        return {
            "losses": [_to_float(loss) for loss in self.losses],
            "step_times": step_times,
            "steps": self.steps,
            "warmup": self.warmup,
            "measured_seconds": (window[-1] - window[0]) if len(window) > 1 else None,
            "step_time": _step_time(device, step_times),
            "settle_seconds": self.settle_seconds,
            "backward_calls": self.backward_calls,
            "optimizer_steps": self.optimizer_steps,
            "device": device,
            "device_name": _device_name(self.torch, device),
            "torch": self.torch.__version__,
            "python": platform.python_version(),
            "peak_memory": peak,
            "peak_memory_kind": kind,
            "flops_per_step": self.flops_per_step,
            "check": self.check.result() if self.check is not None else None,
            "check_error": self.check_error,
        }


def settle_compile_workers(timeout: float = COMPILE_WORKERS_TIMEOUT) -> Optional[float]:
    """Wait until Inductor's compile workers have started; the seconds waited, or None.

    With Triton, importing Inductor starts a sidecar process that imports torch, and the first
    compile has it fork a worker per core. Until they are up they hold cores that the training
    process's parallel CPU operations (a batched loader's indexing) wait for, one scheduler
    slice each: on a 16-core H200 machine (torch 2.11.0+cu130, 2026-11-30) sgld_mnist's
    compiled 1.9 ms step took 24 ms for its first 27 steps, so a 20-step bench called it 8x
    slower than the original. Their start belongs to compile time: the window opens once the
    pool answers (1.9 ms a step then, after waiting 0.3 s).
    """
    module = sys.modules.get("torch._inductor.async_compile")
    compiler = getattr(module, "AsyncCompile", None)
    try:
        if compiler is None or not compiler.process_pool.cache_info().currsize:
            return None  # nothing compiled with Triton: no workers started
        started = time.perf_counter()
        compiler.wait_pool_ready(timeout=timeout)
        return time.perf_counter() - started
    except Exception:  # a private API: never break the run for it, measure as before
        return None


def _caller_site() -> Tuple[str, int]:
    """The line that called backward: the first frame outside this module and contextlib."""
    frame = sys._getframe(1)
    skipped = (os.path.abspath(__file__), os.path.abspath(contextlib.__file__))
    while frame is not None and os.path.abspath(frame.f_code.co_filename) in skipped:
        frame = frame.f_back
    if frame is None:  # pragma: no cover - called from nowhere
        return ("?", 0)
    return (frame.f_code.co_filename, frame.f_lineno)


def _step_time(device: str, step_times: Sequence[float]) -> Optional[float]:
    """The step time to compare between runs.

    On CPU every interval is exact, so the median (robust to a stray slow step). On an
    accelerator only the window's total is synchronised, so the mean over the window.
    """
    if not step_times:
        return None
    if device == "cpu":
        return statistics.median(step_times)
    return sum(step_times) / len(step_times)


def _to_float(tensor: Any) -> float:
    try:
        return float(tensor.float().item())
    except Exception:
        return float("nan")


def _cuda_used(torch: Any) -> bool:
    return bool(torch.cuda.is_available() and torch.cuda.is_initialized())


def _device_name(torch: Any, device: str) -> str:
    if device == "cuda" and _cuda_used(torch):
        return torch.cuda.get_device_name()
    from optimizer_codemod.verify.doctor import cpu_model

    return cpu_model()


def _peak_memory(torch: Any, device: str):
    if device == "cuda" and _cuda_used(torch):
        return int(torch.cuda.max_memory_allocated()), "cuda max_memory_allocated"
    return _max_rss_bytes(), "host max RSS"


def _max_rss_bytes() -> Optional[int]:
    try:
        import resource
    except ImportError:  # pragma: no cover - Windows
        return None
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(rss if sys.platform == "darwin" else rss * 1024)  # bytes on macOS, KiB elsewhere


def install_hooks(torch: Any, recorder: Recorder) -> None:
    """Patch backward and GradScaler.scale, and register the step post-hook."""
    autograd_backward = torch.autograd.backward

    @functools.wraps(autograd_backward)
    def backward(tensors, *args, **kwargs):
        with recorder.backward_call(tensors):
            return autograd_backward(tensors, *args, **kwargs)

    torch.autograd.backward = backward
    tensor_backward = torch.Tensor.backward

    @functools.wraps(tensor_backward)
    def tensor_backward_hook(self, *args, **kwargs):
        with recorder.backward_call(self):
            return tensor_backward(self, *args, **kwargs)

    torch.Tensor.backward = tensor_backward_hook
    for scaler in _grad_scaler_classes(torch):
        _remember_unscaled(torch, scaler)
    from torch.optim.optimizer import (
        register_optimizer_step_post_hook,
        register_optimizer_step_pre_hook,
    )

    register_optimizer_step_pre_hook(recorder.before_step)
    register_optimizer_step_post_hook(recorder.on_step)


def _grad_scaler_classes(torch: Any) -> List[type]:
    classes = []
    for owner in ("amp", "cuda.amp", "cpu.amp"):
        module: Any = torch
        for part in owner.split("."):
            module = getattr(module, part, None)
        scaler = getattr(module, "GradScaler", None)
        # torch.cuda.amp.GradScaler subclasses torch.amp.GradScaler without its own `scale`.
        if isinstance(scaler, type) and "scale" in scaler.__dict__ and scaler not in classes:
            classes.append(scaler)
    return classes


def _remember_unscaled(torch: Any, scaler: type) -> None:
    original = scaler.__dict__["scale"]

    @functools.wraps(original)
    def scale(self, outputs, *args, **kwargs):
        scaled = original(self, outputs, *args, **kwargs)
        if isinstance(outputs, torch.Tensor) and isinstance(scaled, torch.Tensor):
            if scaled is not outputs:
                try:
                    setattr(scaled, UNSCALED_ATTRIBUTE, outputs.detach())
                except Exception:
                    pass
        return scaled

    scaler.scale = scale


def seed_everything(seed: int, torch: Any) -> None:
    """Seed the global generators, so a script that seeds nothing is still comparable."""
    import random

    random.seed(seed)
    torch.manual_seed(seed)
    try:
        import numpy
    except ImportError:
        return
    numpy.random.seed(seed)


def _script_traceback(exc: BaseException, script: str) -> str:
    """The traceback from the script's first frame on, as `python script.py` would print it."""
    tb = exc.__traceback__
    while tb is not None and os.path.abspath(tb.tb_frame.f_code.co_filename) != script:
        tb = tb.tb_next
    return "".join(traceback.format_exception(type(exc), exc, tb or exc.__traceback__))


def _write_json(path: str, data: Dict[str, Any]) -> None:
    temporary = f"{path}.tmp{os.getpid()}"
    with open(temporary, "w", encoding="utf-8") as handle:
        json.dump(data, handle, indent=1)
    os.replace(temporary, path)


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m optimizer_codemod.verify.probe",
        description="Run a training script unchanged; record losses, step times, peak memory.",
    )
    parser.add_argument("--steps", type=int, required=True, help="stop after this many steps")
    parser.add_argument("--warmup", type=int, default=1, help="steps left out of the timing")
    parser.add_argument("--seed", type=int, help="seed random, numpy and torch first")
    parser.add_argument(
        "--count-flops",
        action="store_true",
        help="count the floating-point operations of step 2 (a warm-up step: needs --warmup 2+)",
    )
    parser.add_argument(
        "--check-at",
        type=lambda text: [int(k) for k in text.split(",") if k],
        default=[],
        help="iterations (2 or later) for the local-error check, comma-separated",
    )
    parser.add_argument("--check-dir", help="folder shared by the original's and candidate's runs")
    parser.add_argument(
        "--check-role",
        choices=("record", "compare"),
        help="record: the original writes its states; compare: the candidate steps from them",
    )
    parser.add_argument(
        "--reference-autocast",
        action="store_true",
        help="run the whole script under bfloat16 autocast (the local check's rounding reference)",
    )
    parser.add_argument("--perturb", help="JSON of per-parameter noise norms (o<i>.p<j>: norm)")
    parser.add_argument(
        "--perturb-relative",
        type=float,
        default=0.0,
        help="without --perturb: relative noise on every parameter after each backward",
    )
    parser.add_argument("--perturb-seed", type=int, default=1)
    parser.add_argument("--out", required=True, help="where to write the JSON result")
    parser.add_argument("script")
    parser.add_argument("args", nargs=argparse.REMAINDER)
    ns = parser.parse_args(argv)
    if ns.steps < 1:
        parser.error("--steps must be at least 1")
    if not 0 <= ns.warmup < ns.steps:
        parser.error("--warmup must be at least 0 and less than --steps")
    if ns.args[:1] == ["--"]:
        ns.args = ns.args[1:]
    return ns


def main(argv: Optional[Sequence[str]] = None) -> int:
    ns = parse_args(argv)
    script = os.path.abspath(ns.script)
    import torch

    from optimizer_codemod.verify.checks import LocalCheck, load_perturbation

    rank = os.environ.get("RANK", "0")  # set by torchrun: every process writes its own result
    check = None
    if ns.check_role and ns.check_dir:
        check = LocalCheck(torch, ns.check_role, ns.check_dir, ns.check_at, rank, ns.steps)
    recorder = Recorder(
        torch,
        ns.steps,
        ns.warmup,
        count_flops=ns.count_flops,
        check=check,
        perturbation=load_perturbation(torch, ns.perturb, ns.perturb_relative, ns.perturb_seed),
    )
    install_hooks(torch, recorder)
    if ns.seed is not None:
        seed_everything(ns.seed, torch)
    if ns.reference_autocast:
        # The original's own sensitivity to bfloat16 rounding: matrix products and
        # convolutions in bfloat16 everywhere, as the autocast a numerics rewrite adds.
        device_type = "cuda" if torch.cuda.is_available() else "cpu"
        # No cast cache: it would keep bfloat16 copies of weights the optimizer changes in place.
        torch.autocast(device_type, dtype=torch.bfloat16, cache_enabled=False).__enter__()
    sys.argv = [ns.script, *ns.args]
    sys.path[0] = os.path.dirname(script)
    status, code, error = "finished", 0, None
    started = time.perf_counter()
    try:
        runpy.run_path(script, run_name="__main__")
    except StopProbe:
        status = "stopped"
    except SystemExit as exiting:
        if exiting.code not in (None, 0):
            status = "exit"
            code = exiting.code if isinstance(exiting.code, int) else 1
            if not isinstance(exiting.code, int):
                error = str(exiting.code)
    except BaseException as exc:  # the script's own error (or Ctrl-C): report it, as Python would
        status, code = "error", 1
        error = _script_traceback(exc, script)
        del exc
    result = recorder.result(ended_on_its_own=status == "finished")
    result.update(
        status=status,
        error=error,
        exit_code=code,
        requested_steps=ns.steps,
        seed=ns.seed,
        wall_seconds=time.perf_counter() - started,
        ended_at=time.time(),  # so a caller can see how long the shutdown after it took
        script=ns.script,
        args=list(ns.args),
    )
    result["rank"] = int(rank) if rank.isdigit() else rank
    _write_json(ns.out if rank == "0" else f"{ns.out}.rank{rank}", result)
    if error:
        sys.stderr.write(error if error.endswith("\n") else error + "\n")
    shut_down_data_loader_workers()
    if status in ("stopped", "finished"):
        tear_down_process_group(torch)
    del recorder
    gc.collect()
    return code


def tear_down_process_group(torch: Any) -> None:
    """Destroy the process group a stopped script left behind (torchrun runs).

    Every rank stops after the same optimizer step, where DDP has no collective in flight, so
    destroying the group is local and exits cleanly (nccl warns about a group left alive).
    After a failure it is left alone: the launcher ends the other ranks.
    """
    try:
        distributed = torch.distributed
        if distributed.is_available() and distributed.is_initialized():
            distributed.destroy_process_group()
    except Exception:  # teardown must not turn a measured run into a failure
        pass


def shut_down_data_loader_workers() -> None:
    """Stop the workers of every DataLoader iterator the stopped script left behind.

    The interrupted script's frames and globals still hold its iterators. Left to the garbage
    collector, an iterator's queues can be finalised before the iterator itself, so its workers
    never receive the stop message and each costs a 5-second join timeout; shutting the
    iterators down while they are intact takes milliseconds.
    """
    try:
        from torch.utils.data.dataloader import _MultiProcessingDataLoaderIter
    except ImportError:  # pragma: no cover - a torch without it
        return
    for obj in gc.get_objects():
        # type(), not isinstance(): some objects warn when their __class__ is read.
        if issubclass(type(obj), _MultiProcessingDataLoaderIter) and not obj.__dict__.get(
            "_shutdown", True
        ):
            try:
                obj._shutdown_workers()
            except Exception:
                pass


if __name__ == "__main__":
    sys.exit(main())
