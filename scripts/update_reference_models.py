"""Regenerate reference_models/*/train.optimized.py from train.py with the current rules.

    .venv/bin/python scripts/update_reference_models.py [--check]

Each snapshot is exactly what `optcodemod apply` writes for that train.py (every rule at the
default levels: `optimizer_codemod.verify.bench.rewrite_workload`, the rewrite that
`optcodemod bench` measures by default). tests/test_reference_models.py fails when one is stale.
With --check: write nothing, list the stale snapshots, exit 1 when there are any.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import List, Tuple

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from optimizer_codemod.verify.bench import SCRIPT, SNAPSHOT, rewrite_workload  # noqa: E402

REFERENCE = ROOT / "reference_models"


def snapshots() -> List[Tuple[Path, bytes]]:
    """(snapshot path, expected bytes) for every reference workload."""
    found = []
    for folder in sorted(p for p in REFERENCE.iterdir() if (p / SCRIPT).is_file()):
        found.append((folder / SNAPSHOT, rewrite_workload(str(folder / SCRIPT)).new))
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if stale")
    check = parser.parse_args().check
    stale = 0
    for path, expected in snapshots():
        current = path.read_bytes() if path.exists() else None
        if current == expected:
            continue
        stale += 1
        relative = os.path.relpath(path, ROOT)
        if check:
            print(f"{relative}: stale")
        else:
            path.write_bytes(expected)
            print(f"wrote {relative}")
    if check:
        return 1 if stale else 0
    if not stale:
        print("all snapshots up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
