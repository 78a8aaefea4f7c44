"""Run every rule micro-benchmark and write results as data (never typed in by hand).

    python benchmarks/rule_gains.py [--device cpu|cuda] [--repeats N] [--only OPT501,...]

A rule may have several benchmarks: its modules name them `OPTxxx` and `OPTxxx:variant`, and
the rule's page shows every one of them.

Writes benchmarks/results/rule-gains-<device>.json and prints a table.
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import json
import os
import pkgutil
import platform
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))


def machine(device: str) -> dict:
    import torch

    info = {
        "device": device,
        "cpu": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "date": datetime.date.today().isoformat(),
    }
    if device.startswith("cuda"):
        info["device_name"] = torch.cuda.get_device_name(0)
    return info


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--only", default="")
    parser.add_argument("--output", default=None)
    args = parser.parse_args()
    import rule_gains

    only = {c.strip().upper() for c in args.only.split(",") if c.strip()}
    results = {}
    for module_info in pkgutil.iter_modules(rule_gains.__path__):
        module = importlib.import_module(f"rule_gains.{module_info.name}")
        # A rule with several benchmarks names them `OPT703`, `OPT703:anomaly`...
        if only and module.CODE.upper() not in only and module.CODE.split(":")[0] not in only:
            continue
        measured = module.measure(args.repeats, args.device)
        measured["speedup"] = measured["before_s"] / measured["after_s"]
        measured["what"] = module.WHAT
        measured["machine"] = machine(args.device)
        results[module.CODE] = measured
        print(
            f"{module.CODE}  before {measured['before_s'] * 1e3:9.3f} ms  "
            f"after {measured['after_s'] * 1e3:9.3f} ms  x{measured['speedup']:.2f}  {module.WHAT}"
        )
    output = Path(args.output or HERE / "results" / f"rule-gains-{args.device}.json")
    previous = json.loads(output.read_text()) if output.exists() else {"results": {}}
    merged = {**previous.get("results", {}), **results}
    output.write_text(json.dumps({"results": merged}, indent=2, sort_keys=True) + "\n")
    print(f"wrote {output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
