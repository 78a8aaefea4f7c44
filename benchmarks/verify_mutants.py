"""The mutant benchmark of `optcodemod verify`: does it catch wrong edits and pass correct ones?

    .venv/bin/python benchmarks/verify_mutants.py [--only NAME...] [--quick] [--output DIR]

Each case is an original script (the reference) and a candidate text made from it:

- a MUTANT is a deliberately wrong edit, one a person could plausibly make while optimizing
  (a causal mask dropped, the wrong attention scale, `zero_grad` after `backward`...), written
  as exact text substitutions on the original or on its optimized rewrite
  (`train.optimized.py`, what `optcodemod apply` writes); `verify` must call it different;
- a CORRECT case is the engine's own rewrite of a workload (for CUDA, and for the CPU where that
  differs), or a correct edit written by hand; `verify` must call it equivalent.

Each case is judged at the safety level its edit claims, the level of the fix it pretends to
be: edits that claim to change nothing at all (moving or dropping a `zero_grad` or a
`p.grad = None`, removing a clone, adding a `.detach()`, a `_foreach` update) at `safe`; edits of the rewrite, and
other edits made while optimizing, at `numerics`, the level of the engine's rewrites (a mutant
caught at `numerics` hides in bfloat16-sized rounding and is the harder to catch); the engine's
rewrites at the most permissive level among their fixes.

Every case runs `verify_pair(original, candidate, level=...)` once (repeats=1) under the probe
on the CPU (CUDA hidden). The benchmark prints a table, the detection rate (mutants caught /
mutants) and the false-alarm rate (correct cases failed / correct cases), and writes
`verify-mutants-cpu.json` and `.md` in the output folder, default benchmarks/results/, with
the machine, torch version and date (`verify-mutants-cpu-quick.*` with `--quick`,
`...-partial.*` with `--only`: only a full run writes the file of record). The results
files are rewritten after each case, so a run cut short keeps what it measured.

Substitutions must each apply exactly once (tests/test_verify_mutants.py checks them against
the current files without training), and every mutated script must still run: a crash is an
error, not a detection.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from optimizer_codemod.rule import Safety  # noqa: E402

MUTANT, CORRECT = "mutant", "correct"
# What a candidate is made from: the script itself, its checked-in rewrite (train.optimized.py),
# or the engine's rewrite of it for a target device (made afresh, as `apply` would).
ORIGINAL, OPTIMIZED, ENGINE_CUDA, ENGINE_CPU = "original", "optimized", "engine:cuda", "engine:cpu"
DEFAULT_STEPS = 30
TIMEOUT = 900.0
NAME = "verify-mutants-cpu"

Substitution = Tuple[str, str]


@dataclass(frozen=True)
class Case:
    name: str
    kind: str  # MUTANT or CORRECT
    script: str  # the original, relative to the repository root
    what: str  # one line: the edit, and why it is (not) correct
    base: str = ORIGINAL
    subs: Tuple[Substitution, ...] = ()
    # The safety level the candidate claims; None: the engine's (most permissive fix applied).
    level: Optional[Safety] = Safety.NUMERICS
    steps: int = DEFAULT_STEPS
    quick: Optional[int] = None  # steps with --quick; default a tenth, at least 5

    @property
    def path(self) -> Path:
        return ROOT / self.script

    @property
    def reference_workload(self) -> bool:
        return self.script.startswith("reference_models/")

    def args(self, steps: int) -> List[str]:
        size = ["--size", "cpu"] if self.reference_workload else []
        return size + ["--steps", str(steps)]

    def quick_steps(self) -> int:
        return self.quick or max(5, self.steps // 10)


def _ref(workload: str) -> str:
    return f"reference_models/{workload}/train.py"


# mmdit_ddp steps its optimizer after every 4th backward: a quick run of 8 holds two steps.
MMDIT_QUICK = 8
GAN = "benchmarks/verify_cases/gan.py"
MANUAL = "benchmarks/verify_cases/manual_sgd.py"

MUTANTS: List[Case] = [
    Case(
        "naive_gpt-sdpa-no-causal-mask",
        MUTANT,
        _ref("naive_gpt"),
        "is_causal=True dropped from SDPA in the rewrite: every token sees the future",
        OPTIMIZED,
        (("q, k, v, is_causal=True, scale=", "q, k, v, scale="),),
    ),
    Case(
        "naive_gpt-sdpa-wrong-scale",
        MUTANT,
        _ref("naive_gpt"),
        "SDPA scale 1/d instead of 1/sqrt(d) in the rewrite (the sqrt forgotten)",
        OPTIMIZED,
        (("scale=1.0 / math.sqrt(k.size(-1))", "scale=1.0 / k.size(-1)"),),
    ),
    Case(
        "vision_bdh-zero-grad-after-backward",
        MUTANT,
        _ref("vision_bdh"),
        "zero_grad moved after backward: every step applies a zero gradient (weight decay only)",
        ORIGINAL,
        (
            (
                "            optimizer.zero_grad()\n            loss.backward()\n",
                "            loss.backward()\n            optimizer.zero_grad()\n",
            ),
        ),
        level=Safety.SAFE,
    ),
    Case(
        "gan-ema-clone-removed",
        MUTANT,
        GAN,
        "the .clone() of the generator's EMA copy removed as needless: the EMA update then "
        "shrinks the live weights in place",
        ORIGINAL,
        (
            (
                "ema = [p.detach().clone() for p in generator.parameters()]",
                "ema = [p.detach() for p in generator.parameters()]",
            ),
        ),
        steps=160,
        level=Safety.SAFE,
    ),
    Case(
        "gan-opt-d-zero-grad-dropped",
        MUTANT,
        GAN,
        "opt_d.zero_grad() dropped: the discriminator's step also applies the gradient that "
        "the previous generator loss left on it",
        ORIGINAL,
        (("        opt_d.zero_grad()\n", ""),),
        steps=160,
        level=Safety.SAFE,
    ),
    Case(
        "mmdit_ddp-gradscaler-no-unscale",
        MUTANT,
        _ref("mmdit_ddp"),
        "GradScaler enabled on every device and scaler.unscale_ dropped: gradients are clipped "
        "while still multiplied by the loss scale (65536)",
        OPTIMIZED,
        (
            (
                'scaler = torch.amp.GradScaler("cuda", enabled=torch.cuda.is_available())',
                "scaler = torch.amp.GradScaler(device.type)",
            ),
            ("                scaler.unscale_(optimizer)\n", ""),
        ),
        quick=MMDIT_QUICK,
    ),
    Case(
        "mmdit_ddp-loss-divided-twice",
        MUTANT,
        _ref("mmdit_ddp"),
        "the loss divided by the accumulation steps twice (in the loss line and at backward)",
        OPTIMIZED,
        (
            (
                "loss = flow_matching_loss(model, batch_images, batch_captions)\n",
                "loss = flow_matching_loss(model, batch_images, batch_captions) / ACCUMULATION\n",
            ),
        ),
        quick=MMDIT_QUICK,
    ),
    Case(
        "char_transformer-eval-mode-in-training",
        MUTANT,
        _ref("char_transformer"),
        "model.eval() instead of model.train() before the training loop (for the fast path of "
        "nn.TransformerEncoder): dropout is off while training",
        ORIGINAL,
        (("        model.train()\n", "        model.eval()\n"),),
    ),
    Case(
        "sudoku_diffusion-detached-embedding",
        MUTANT,
        _ref("sudoku_diffusion"),
        ".detach() on the box embeddings in the forward (their index is a buffer, but the "
        "embedding is a parameter): the box table stops learning",
        ORIGINAL,
        (("x = x + self.boxes(self.box)\n", "x = x + self.boxes(self.box).detach()\n"),),
        level=Safety.SAFE,
    ),
    Case(
        "char_transformer-wrong-lr",
        MUTANT,
        _ref("char_transformer"),
        "lr 3e-3 instead of 3e-4 typed while adding fused=True to the rewrite's optimizer",
        OPTIMIZED,
        (
            (
                "AdamW(model.parameters(), lr=3e-4, weight_decay=0.1, fused=True)",
                "AdamW(model.parameters(), lr=3e-3, weight_decay=0.1, fused=True)",
            ),
        ),
    ),
    Case(
        "resnet_cifar-skipped-step",
        MUTANT,
        _ref("resnet_cifar"),
        "every 5th optimizer step skipped (an off-by-one accumulation condition)",
        ORIGINAL,
        (
            (
                "            scaler.step(optimizer)\n",
                "            if step % 5 != 4:\n                scaler.step(optimizer)\n",
            ),
        ),
    ),
    Case(
        "resnet_cifar-batchnorm-eval",
        MUTANT,
        _ref("resnet_cifar"),
        "model.eval() in the training loop of the rewrite: BatchNorm normalises with its "
        "running statistics instead of the batch's",
        OPTIMIZED,
        (("        model.train()\n", "        model.eval()\n"),),
    ),
    Case(
        "char_transformer-label-shift",
        MUTANT,
        _ref("char_transformer"),
        "targets not shifted by one (chunk[:-1] for both): the model learns to copy its input",
        ORIGINAL,
        (("return chunk[:-1], chunk[1:]", "return chunk[:-1], chunk[:-1]"),),
    ),
    Case(
        "sudoku_diffusion-softmax-wrong-dim",
        MUTANT,
        _ref("sudoku_diffusion"),
        "attention softmax over the queries (dim=-2) instead of the keys",
        ORIGINAL,
        (
            (
                "/ math.sqrt(q.size(-1)), dim=-1)",
                "/ math.sqrt(q.size(-1)), dim=-2)",
            ),
        ),
    ),
    Case(
        "manual_sgd-grad-not-reset",
        MUTANT,
        MANUAL,
        "p.grad = None dropped from the hand-written update: gradients accumulate over steps",
        ORIGINAL,
        (("                p.grad = None\n", ""),),
        steps=100,
        level=Safety.SAFE,
    ),
]

ENGINE_WORKLOADS = (
    "char_transformer",
    "mmdit_ddp",
    "naive_gpt",
    "resnet_cifar",
    "sgld_mnist",
    "sudoku_diffusion",
    "vision_bdh",
)

CORRECT_CASES: List[Case] = [
    Case(
        f"{workload}-engine-{device}",
        CORRECT,
        _ref(workload),
        f"the engine's rewrite for target device {device} (every rule at the default levels)",
        base,
        level=None,
        quick=MMDIT_QUICK if workload == "mmdit_ddp" else None,
    )
    for workload in ENGINE_WORKLOADS
    for device, base in (("cuda", ENGINE_CUDA), ("cpu", ENGINE_CPU))
] + [
    Case(
        "naive_gpt-engine-cuda-300-steps",
        CORRECT,
        _ref("naive_gpt"),
        "the engine's CUDA rewrite (SDPA, bf16 autocast, fused AdamW) over 300 steps",
        ENGINE_CUDA,
        level=None,
        steps=300,
    ),
    Case(
        "gan-fused-adam",
        CORRECT,
        GAN,
        "fused=True on both Adams alone: a correct rewrite whose rounding the GAN amplifies",
        ORIGINAL,
        (
            (
                "opt_d = torch.optim.Adam(discriminator.parameters(), lr=2e-2, betas=(0.0, 0.99))",
                "opt_d = torch.optim.Adam(\n"
                "        discriminator.parameters(), lr=2e-2, betas=(0.0, 0.99), fused=True\n"
                "    )",
            ),
            (
                "opt_g = torch.optim.Adam(generator.parameters(), lr=2e-2, betas=(0.0, 0.99))",
                "opt_g = torch.optim.Adam(\n"
                "        generator.parameters(), lr=2e-2, betas=(0.0, 0.99), fused=True\n"
                "    )",
            ),
        ),
        steps=160,
    ),
    Case(
        "gan-engine-cuda",
        CORRECT,
        GAN,
        "the engine's CUDA rewrite of the GAN (fused Adam, float32 matmul precision 'high')",
        ENGINE_CUDA,
        level=None,
        steps=160,
    ),
    Case(
        "manual_sgd-foreach-update",
        CORRECT,
        MANUAL,
        "the per-parameter update loop replaced by torch._foreach_add_ (same arithmetic)",
        ORIGINAL,
        (
            (
                "            for p in model.parameters():\n"
                "                p.add_(p.grad, alpha=-lr)\n"
                "                p.grad = None\n",
                "            params = list(model.parameters())\n"
                "            torch._foreach_add_(params, [p.grad for p in params], alpha=-lr)\n"
                "            for p in params:\n"
                "                p.grad = None\n",
            ),
        ),
        level=Safety.SAFE,
        steps=100,
    ),
    Case(
        "naive_gpt-loss-detach-accumulation",
        CORRECT,
        _ref("naive_gpt"),
        "running_loss accumulated with loss.detach() instead of loss.item() (no sync per step)",
        ORIGINAL,
        (
            ("running_loss += loss.item()", "running_loss += loss.detach()"),
            ("{running_loss / 50:.4f}", "{float(running_loss) / 50:.4f}"),
        ),
        level=Safety.SAFE,
    ),
    Case(
        "resnet_cifar-set-to-none",
        CORRECT,
        _ref("resnet_cifar"),
        "zero_grad(set_to_none=True) instead of set_to_none=False",
        ORIGINAL,
        (("optimizer.zero_grad(set_to_none=False)", "optimizer.zero_grad(set_to_none=True)"),),
        level=Safety.SAFE,
    ),
    Case(
        "vision_bdh-zero-grad-after-step",
        CORRECT,
        _ref("vision_bdh"),
        "zero_grad moved from before backward to after step (the same gradients reach step)",
        ORIGINAL,
        (
            (
                "            optimizer.zero_grad()\n"
                "            loss.backward()\n"
                "            optimizer.step()\n",
                "            loss.backward()\n"
                "            optimizer.step()\n"
                "            optimizer.zero_grad()\n",
            ),
        ),
        level=Safety.SAFE,
    ),
    Case(
        "sudoku_diffusion-needless-clone-removed",
        CORRECT,
        _ref("sudoku_diffusion"),
        "target = x0 instead of x0.clone() (nothing writes to x0 or target afterwards)",
        ORIGINAL,
        (("target = x0.clone()", "target = x0"),),
        level=Safety.SAFE,
    ),
    Case(
        "mmdit_ddp-gradscaler-on-cpu",
        CORRECT,
        _ref("mmdit_ddp"),
        "the rewrite's GradScaler enabled on every device, unscale_ kept before clipping "
        "(the mutant's twin: scaling by a power of two is exact)",
        OPTIMIZED,
        (
            (
                'scaler = torch.amp.GradScaler("cuda", enabled=torch.cuda.is_available())',
                "scaler = torch.amp.GradScaler(device.type)",
            ),
        ),
        quick=MMDIT_QUICK,
    ),
]

CASES: List[Case] = MUTANTS + CORRECT_CASES


def apply_substitutions(text: str, subs: Sequence[Substitution], where: str = "") -> str:
    """`text` with each (old, new) replaced; each `old` must occur exactly once."""
    for old, new in subs:
        count = text.count(old)
        if count != 1:
            raise ValueError(f"{where}: {old!r} occurs {count} times, not once")
        text = text.replace(old, new)
    return text


def base_text(case: Case) -> Tuple[str, Optional[Safety], List[str]]:
    """The text the substitutions apply to, the engine's level (None when no engine rewrite)
    and the codes of the engine's fixes."""
    if case.base == ORIGINAL:
        return case.path.read_text(encoding="utf-8"), None, []
    if case.base == OPTIMIZED:
        snapshot = case.path.with_name("train.optimized.py")
        return snapshot.read_text(encoding="utf-8"), None, []
    from optimizer_codemod.diagnostics import Status
    from optimizer_codemod.verify.bench import rewrite_workload

    device = case.base.split(":", 1)[1]
    result = rewrite_workload(str(case.path), target_device=device)
    fixed = [d for d in result.diagnostics if d.status is Status.FIXED]
    if not result.changed:
        raise ValueError(f"{case.name}: the engine leaves {case.script} unchanged")
    level = max(d.safety for d in fixed) if fixed else Safety.SAFE
    return result.new.decode("utf-8"), level, [d.code for d in fixed]


def candidate(case: Case) -> Tuple[str, Safety, List[str]]:
    """The candidate text, the safety level it is judged at and the engine fixes it holds."""
    text, engine_level, fixed = base_text(case)
    text = apply_substitutions(text, case.subs, case.name)
    if case.base == ORIGINAL and not case.subs:
        raise ValueError(f"{case.name}: no substitution, the candidate is the original")
    level = case.level if case.level is not None else engine_level
    if level is None:
        raise ValueError(f"{case.name}: no level, and no engine rewrite to take one from")
    return text, level, fixed


def _margin(report: Any) -> Optional[float]:
    """Threshold over measured (above 1 passes): the judgment's own figure when it gives one,
    else that of the loss-curve comparison."""
    margin = getattr(report, "margin", None)
    if margin is not None:
        return float(margin)
    comparison = getattr(report, "comparison", None)
    threshold = getattr(report, "effective_rtol", None)
    if comparison is None or threshold is None or not comparison.lengths_match:
        return None
    measured = comparison.max_relative
    return float("inf") if measured == 0 else threshold / measured


def _decided_by(report: Any) -> Optional[str]:
    decided = getattr(report, "decided_by", None)
    if decided is not None:
        return str(decided)
    if getattr(report, "comparison", None) is not None:
        return "loss curves (fixed tolerance)"
    return None


def verdict(kind: str, exit_code: int) -> str:
    if exit_code == 2:
        return "error"
    if kind == MUTANT:
        return "caught" if exit_code == 1 else "MISSED"
    return "passed" if exit_code == 0 else "FALSE ALARM"


def run_case(case: Case, steps: int, timeout: float) -> Dict[str, Any]:
    from optimizer_codemod.verify.equivalence import verify_pair

    started = time.monotonic()
    record: Dict[str, Any] = {
        "name": case.name,
        "kind": case.kind,
        "script": case.script,
        "base": case.base,
        "what": case.what,
        "steps": steps,
    }
    try:
        text, level, fixed = candidate(case)
    except (OSError, ValueError) as problem:
        record.update(level=None, exit_code=2, error=str(problem), verdict="error")
        record["seconds"] = time.monotonic() - started
        return record
    try:
        report = verify_pair(
            str(case.path),
            text.encode("utf-8"),
            level=level,
            fixed=fixed,
            args=case.args(steps),
            steps=steps,
            repeats=1,
            timeout=timeout,
        )
    except Exception as problem:  # noqa: BLE001 - one case's failure must not end the run
        record.update(
            level=level.label,
            exit_code=2,
            error="".join(traceback.format_exception_only(type(problem), problem)).strip(),
            verdict="error",
            seconds=time.monotonic() - started,
        )
        return record
    exit_code = report.exit_code
    record.update(
        level=level.label,
        fixed=sorted(set(fixed)),
        exit_code=exit_code,
        equivalent=report.equivalent,
        verdict=verdict(case.kind, exit_code),
        margin=_margin(report),
        decided_by=_decided_by(report),
        error=report.error,
        report=report.render(),
        seconds=time.monotonic() - started,
    )
    return record


def summary(records: List[Dict[str, Any]]) -> Dict[str, Any]:
    mutants = [r for r in records if r["kind"] == MUTANT]
    correct = [r for r in records if r["kind"] == CORRECT]
    caught = sum(1 for r in mutants if r["verdict"] == "caught")
    alarms = sum(1 for r in correct if r["exit_code"] != 0)
    margins = [r["margin"] for r in correct if r["exit_code"] == 0 and r.get("margin") is not None]
    return {
        "mutants": len(mutants),
        "caught": caught,
        "detection_rate": caught / len(mutants) if mutants else None,
        "correct": len(correct),
        "failed": alarms,
        "false_alarm_rate": alarms / len(correct) if correct else None,
        "errors": sum(1 for r in records if r["exit_code"] == 2),
        "smallest_margin_of_correct": min(margins) if margins else None,
    }


def _torch_version() -> Optional[str]:
    try:
        from importlib.metadata import version

        return version("torch")
    except Exception:  # noqa: BLE001 - no torch installed: the probe runs would fail anyway
        return None


def results(records: List[Dict[str, Any]], settings: Dict[str, Any]) -> Dict[str, Any]:
    from optimizer_codemod.verify.bench import machine_facts

    return {
        "tool": "benchmarks/verify_mutants.py",
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "device": "cpu",
        "torch": _torch_version(),
        "machine": machine_facts(),
        "settings": settings,
        "summary": summary(records),
        "cases": records,
    }


def _fmt_margin(value: Optional[float]) -> str:
    if value is None:
        return "n/a"
    if value == float("inf"):
        return "inf"
    return f"{value:.3g}"


def _pct(value: Optional[float]) -> str:
    return "n/a" if value is None else f"{value:.0%}"


COLUMNS = ("case", "kind", "level", "steps", "verdict", "margin", "decided by", "seconds")


def table_rows(records: List[Dict[str, Any]]) -> List[Tuple[str, ...]]:
    return [
        (
            r["name"],
            r["kind"],
            r.get("level") or "n/a",
            str(r["steps"]),
            r["verdict"],
            _fmt_margin(r.get("margin")),
            r.get("decided_by") or ("; ".join((r.get("error") or "").splitlines()[:1]) or "n/a"),
            f"{r['seconds']:.1f}",
        )
        for r in records
    ]


def rates_lines(s: Dict[str, Any]) -> List[str]:
    return [
        f"detection rate: {s['caught']}/{s['mutants']} mutants caught ({_pct(s['detection_rate'])})",
        f"false-alarm rate: {s['failed']}/{s['correct']} correct cases failed "
        f"({_pct(s['false_alarm_rate'])})",
        f"smallest margin of a passing correct case: {_fmt_margin(s['smallest_margin_of_correct'])}"
        " (goal: at least 5)",
    ]


def render_text(records: List[Dict[str, Any]]) -> str:
    rows = [COLUMNS] + table_rows(records)
    widths = [max(len(row[i]) for row in rows) for i in range(len(COLUMNS))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)) for row in rows]
    return "\n".join(lines + [""] + rates_lines(summary(records)))


def render_markdown(data: Dict[str, Any]) -> str:
    machine = data["machine"]
    lines = [
        "# verify mutant benchmark (CPU)",
        "",
        f"{data['date']}, torch {data['torch']}, {machine['cpu']} ({machine['cpu_count']} cores), "
        f"{machine['platform']}. Command: `{data['settings']['command']}`.",
        "",
        *[f"- {line}" for line in rates_lines(data["summary"])],
        "",
        "Margin: the judgment's threshold over what it measured, over every check (above 1 "
        "passes). A mutant is caught when verify calls it different (exit 1); an error (exit 2) "
        "is neither a detection nor a pass.",
        "",
        "| " + " | ".join(COLUMNS) + " |",
        "|" + "---|" * len(COLUMNS),
    ]
    lines += ["| " + " | ".join(row) + " |" for row in table_rows(data["cases"])]
    lines += ["", "## Cases", ""]
    lines += [f"- `{r['name']}` ({r['kind']}, {r['base']}): {r['what']}" for r in data["cases"]]
    return "\n".join(lines) + "\n"


def _finite(value: Any) -> Any:
    """JSON has no infinity: an infinite margin (nothing measured apart) is written "inf"."""
    if isinstance(value, float) and value == float("inf"):
        return "inf"
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_finite(item) for item in value]
    return value


def write_results(data: Dict[str, Any], stem: Path) -> None:
    stem.parent.mkdir(parents=True, exist_ok=True)
    temporary = stem.with_name(stem.name + ".json.tmp")
    text = json.dumps(_finite(data), indent=1, allow_nan=False)
    temporary.write_text(text + "\n", encoding="utf-8")
    os.replace(temporary, stem.with_name(stem.name + ".json"))
    stem.with_name(stem.name + ".md").write_text(render_markdown(data), encoding="utf-8")


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="+", metavar="NAME", help="run only these cases")
    parser.add_argument("--quick", action="store_true", help="fewer steps: a smoke run")
    parser.add_argument("--output", default=str(ROOT / "benchmarks" / "results"))
    parser.add_argument("--timeout", type=float, default=TIMEOUT, help="seconds per probe run")
    parser.add_argument("--list", action="store_true", help="list the cases and exit")
    args = parser.parse_args(argv)

    if args.list:
        for case in CASES:
            print(f"{case.name:<42} {case.kind:<8} {case.steps:>4}  {case.what}")
        return 0
    chosen = CASES
    if args.only:
        known = {case.name for case in CASES}
        unknown = [name for name in args.only if name not in known]
        if unknown:
            print(f"unknown case(s): {', '.join(unknown)} (see --list)", file=sys.stderr)
            return 2
        chosen = [case for case in CASES if case.name in args.only]

    # The scripts pick CUDA when they see it: this benchmark measures the CPU.
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
    command = "python benchmarks/verify_mutants.py" + (" --quick" if args.quick else "")
    if args.only:
        command += " --only " + " ".join(args.only)
    settings = {"quick": args.quick, "repeats": 1, "command": command}
    # Only a full run writes the file of record; a smoke or partial run has its own.
    suffix = ("-quick" if args.quick else "") + ("-partial" if args.only else "")
    stem = Path(args.output) / (NAME + suffix)
    records: List[Dict[str, Any]] = []
    for case in chosen:
        steps = case.quick_steps() if args.quick else case.steps
        print(f"{case.name} ({case.kind}, {steps} steps) ...", file=sys.stderr, flush=True)
        record = run_case(case, steps, args.timeout)
        records.append(record)
        print(f"  {record['verdict']} in {record['seconds']:.1f} s", file=sys.stderr, flush=True)
        if record["verdict"] in ("error", "MISSED", "FALSE ALARM"):
            print(
                "  " + (record.get("report") or record.get("error") or "").replace("\n", "\n  "),
                file=sys.stderr,
            )
        write_results(results(records, settings), stem)
    print(render_text(records))
    print(f"wrote {stem}.json, {stem}.md")
    s = summary(records)
    return 0 if s["caught"] == s["mutants"] and s["failed"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
