"""The "Measured" part of each rule page's Expected gain, read from committed results files.

Two kinds of file in benchmarks/results/ concern rules, whatever their device:

- `optcodemod bench` results (`reference-*.json`): per workload, the fixes its rewrite applied
  and the speedup of all of them together, and with `--ablate` each applied rule alone;
- `benchmarks/rule_gains.py` results (`rule-gains-*.json`): micro-benchmarks keyed by rule
  code, `OPT703` and variants of it such as `OPT703:anomaly`.

Other files there (tool speed) are skipped. The folder is found in a source checkout only: the
results are not packaged, so an installed copy renders "none in this installation" instead.
Torch-free: it only reads JSON.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

ROOT = Path(__file__).resolve().parent.parent
BENCH_TOOL = "optcodemod bench"
# What the generated text calls the folder: the same in a checkout and for a folder passed in.
FOLDER_LABEL = "benchmarks/results/"


@dataclass(frozen=True)
class Results:
    """The results files of one folder; `folder` is None where there is none (installed)."""

    folder: Optional[Path]
    files: Tuple[Tuple[str, Dict[str, Any]], ...] = ()


@dataclass(frozen=True)
class Measurement:
    """One figure about a rule, with the machine, torch and date it was taken on."""

    what: str
    speedup: Optional[float]
    detail: str
    machine: str
    torch: str
    date: str
    source: str


def default_folder() -> Optional[Path]:
    """benchmarks/results/ of the source checkout this package runs from, if it does."""
    folder = ROOT / "benchmarks" / "results"
    return folder if (ROOT / "pyproject.toml").is_file() and folder.is_dir() else None


def load_results(folder: Optional[Path] = None) -> Results:
    """Every bench or rule-gains JSON file in `folder` (default: the checkout's), by name."""
    folder = folder if folder is not None else default_folder()
    if folder is None or not folder.is_dir():
        return Results(None)
    files = []
    for path in sorted(folder.glob("*.json")):
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except ValueError as error:
            raise ValueError(f"{path}: not valid JSON: {error}") from error
        if _is_bench(data) or _is_rule_gains(data):
            files.append((path.name, data))
    return Results(folder, tuple(files))


def _is_bench(data: Any) -> bool:
    return isinstance(data, dict) and data.get("tool") == BENCH_TOOL


def _is_rule_gains(data: Any) -> bool:
    return isinstance(data, dict) and isinstance(data.get("results"), dict) and "tool" not in data


def measurements_for(code: str, results: Results) -> List[Measurement]:
    """The figures about rule `code`: its micro-benchmarks, then the workloads that timed it
    alone (`bench --ablate`), then those whose rewrite applied it among others; by file name."""
    micro: List[Measurement] = []
    alone: List[Measurement] = []
    together: List[Measurement] = []
    for name, data in results.files:
        if _is_rule_gains(data):
            # `OPT703` and its variants `OPT703:anomaly`..., in key order.
            for key, entry in sorted(data["results"].items()):
                if (key == code or key.startswith(code + ":")) and isinstance(entry, dict):
                    micro.append(_micro(entry, name))
        else:
            by_itself, with_others = _from_bench(code, data, name)
            alone += by_itself
            together += with_others
    return micro + alone + together


def _micro(entry: Dict[str, Any], source: str) -> Measurement:
    machine = entry.get("machine") or {}
    before, after = entry.get("before_s"), entry.get("after_s")
    speedup = entry.get("speedup") or (before / after if before and after else None)
    return Measurement(
        what=f"micro-benchmark: {entry.get('what', 'no description')}",
        speedup=speedup,
        detail=f"{_seconds(before)} before, {_seconds(after)} after" if before and after else "",
        machine=_machine_label(
            machine.get("device", "cpu"),
            machine.get("device_name"),
            machine.get("cpu"),
            machine.get("cpu_count"),
        ),
        torch=str(machine.get("torch", "?")),
        date=str(machine.get("date", "?")),
        source=source,
    )


def _from_bench(
    code: str, data: Dict[str, Any], source: str
) -> Tuple[List[Measurement], List[Measurement]]:
    machine = data.get("machine") or {}
    where = dict(
        machine=_machine_label(
            data.get("device", "cpu"),
            data.get("device_name"),
            machine.get("machine"),
            machine.get("cpu_count"),
        ),
        torch=str(data.get("torch", "?")),
        date=str(data.get("date", "?")),
        source=source,
    )
    levels = (data.get("settings") or {}).get("rewrite", "")
    levels = "unsafe fixes on" if "unsafe" in levels else "default levels"
    alone: List[Measurement] = []
    together: List[Measurement] = []
    for workload in data.get("workloads", []):
        fixed = sorted(set(workload.get("fixed") or []))
        if code not in fixed:
            continue
        name = workload.get("name", "?")
        # A resumed bench measures its workloads at different times; each keeps its own date.
        here = dict(where, date=str(workload.get("date") or where["date"]))
        ablation = (workload.get("ablation") or {}).get(code)
        if ablation is not None:
            alone.append(
                Measurement(
                    what=f"workload `{name}`, this rule alone ({levels})",
                    speedup=None if ablation.get("unchanged") else ablation.get("speedup"),
                    detail=_notes(ablation, unchanged_alone=True),
                    **here,
                )
            )
        if fixed == [code]:
            what = f"workload `{name}`, this rule alone: the only fix that applied ({levels})"
        else:
            what = f"workload `{name}`, all fixes together: {', '.join(fixed)} ({levels})"
        together.append(
            Measurement(what=what, speedup=workload.get("speedup"), detail=_notes(workload), **here)
        )
    return alone, together


def _notes(entry: Dict[str, Any], unchanged_alone: bool = False) -> str:
    if entry.get("error"):
        return "the run failed"
    if unchanged_alone and entry.get("unchanged"):
        return "nothing to change alone: it needs another rule's fix"
    notes = []
    if entry.get("speed_within_noise"):
        notes.append("within noise")
    if entry.get("equivalent") is False:
        notes.append("losses disagree")
    return ", ".join(notes)


def _machine_label(
    device: str, device_name: Optional[str], cpu: Optional[str], cores: Optional[int]
) -> str:
    if str(device).startswith("cuda"):
        return device_name or "CUDA device"
    label = f"{cores}-core {cpu or 'CPU'}" if cores else (cpu or "CPU")
    if device_name and device_name != cpu:
        label += f" ({device_name})"
    return label


def _seconds(value: Optional[float]) -> str:
    if value is None:
        return "n/a"
    if value >= 1:
        return f"{value:.3g} s"
    if value >= 1e-3:
        return f"{value * 1e3:.3g} ms"
    return f"{value * 1e6:.3g} us"


def format_speedup(value: Optional[float]) -> str:
    return "n/a" if value is None else f"x{value:.2f}"


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def render_measured(code: str, results: Results) -> str:
    """Markdown for the end of rule `code`'s Expected gain section."""
    lines = ["### Measured", ""]
    if results.folder is None:
        lines += [
            "No committed measurements in this installation: they live in the source",
            f"repository's `{FOLDER_LABEL}`, and its `docs/rules/` pages show them.",
        ]
        return "\n".join(lines)
    found = measurements_for(code, results)
    if not found:
        lines.append(
            f"No committed measurement yet: no results file in `{FOLDER_LABEL}` concerns {code}."
        )
        return "\n".join(lines)
    lines += [
        f"Generated from the results files committed in `{FOLDER_LABEL}`. Speedup: time before",
        'the rewrite / time after (above 1 is faster); "within noise": the runs\' step times',
        "overlap, as `optcodemod bench` records.",
        "",
        "| What was timed | Speedup | Machine | torch | Date | File |",
        "|---|---|---|---|---|---|",
    ]
    for m in found:
        speedup = format_speedup(m.speedup)
        if m.detail:
            speedup = speedup + f" ({m.detail})" if m.speedup is not None else m.detail
        lines.append(
            f"| {_cell(m.what)} | {_cell(speedup)} | {_cell(m.machine)} | {_cell(m.torch)} "
            f"| {_cell(m.date)} | `{m.source}` |"
        )
    return "\n".join(lines)
