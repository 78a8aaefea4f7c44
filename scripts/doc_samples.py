"""The sample outputs shown in the docs, written from real runs so they cannot go stale.

    python scripts/doc_samples.py            # run the commands, rewrite every sample block

A sample in a page is a fenced block between two markers:

    <!-- sample NAME: written by scripts/doc_samples.py from a real run; do not edit -->
    ```text
    $ the command
    its output
    ```
    <!-- /sample -->

`tests/test_doc_samples.py` runs the commands again and compares what cannot change between
runs or machines (for `verify`: the fixes, the step and loss counts, the report's lines and
the verdict; not timings), and, for `doctor`, renders the machine facts recorded in
`docs/samples/doctor.json` with the current rules and verdict table, which must give the block
exactly: a change to either makes the sample stale until this script is run again.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Tuple

ROOT = Path(__file__).resolve().parent.parent
DOCTOR_FACTS = ROOT / "docs" / "samples" / "doctor.json"


@dataclass(frozen=True)
class Sample:
    page: Path
    command: Tuple[str, ...]  # as shown, after `$ `; run as `python -m optimizer_codemod ...`


SAMPLES: Dict[str, Sample] = {
    "verify": Sample(
        ROOT / "docs" / "verify.md",
        (
            "optcodemod",
            "verify",
            "train.py",
            "--steps",
            "3",
            "--repeats",
            "1",
            "--",
            "--epochs",
            "1",
        ),
    ),
    "doctor": Sample(ROOT / "docs" / "verify.md", ("optcodemod", "doctor")),
}


def _markers(name: str) -> "re.Pattern[str]":
    return re.compile(
        rf"(<!-- sample {re.escape(name)}: [^\n]*-->\n```text\n)(.*?)(```\n<!-- /sample -->)", re.S
    )


def block(name: str, text: str = "") -> Tuple[str, str]:
    """(command, output) of sample `name` as its page shows it."""
    text = text or SAMPLES[name].page.read_text(encoding="utf-8")
    match = _markers(name).search(text)
    if match is None:
        raise LookupError(f"no sample block {name!r} in {SAMPLES[name].page}")
    command, _, output = match.group(2).partition("\n")
    assert command.startswith("$ "), command
    return command[2:], output


def run(name: str, folder: Path, *extra: str) -> str:
    """The stdout of sample `name`'s command, run for real in `folder` (with examples/train.py)."""
    shutil.copy(ROOT / "examples" / "train.py", folder / "train.py")
    _, *args = SAMPLES[name].command
    done = subprocess.run(
        [sys.executable, "-m", "optimizer_codemod", *args, *extra],
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=900,
    )
    if done.returncode not in (0, 1):
        raise RuntimeError(f"{' '.join(SAMPLES[name].command)} failed:\n{done.stderr}")
    return done.stdout


# --- what must agree between the docs and a run -------------------------------------------


def verify_parts(report: str) -> Dict[str, object]:
    """What a verify report of examples/train.py says the same on every run and machine."""
    lines = report.splitlines()
    rows = {}
    for line in lines:
        cells = re.split(r"\s{2,}", line.strip())
        if cells[0] in ("steps", "losses"):
            rows[cells[0]] = cells[1:3]
    # The kind of each line: its label before the first colon, or its first word. Notes depend
    # on how this CPU rounds bfloat16, timings on the machine's load: neither is compared.
    kinds = [
        re.split(r"[:(]", line, maxsplit=1)[0].split()[0]
        for line in lines
        if line.strip() and not line.startswith("note:")
    ]
    runs = next((line for line in lines if line.startswith("runs:")), "")
    return {
        "fixes": lines[0] if lines else "",
        # Without the device and torch version (the last part): those are the machine's.
        "runs": ";".join(runs.split(";")[:2]),
        "counts": rows,
        "kinds": kinds,
        "verdict": kinds[-1] if kinds else "",
    }


def doctor_output(facts: dict) -> str:
    """What `optcodemod doctor` prints on the machine `facts` describes, with today's rules."""
    from optimizer_codemod.registry import all_rules
    from optimizer_codemod.verify.doctor import CudaDevice, Machine, assess, render

    values = dict(facts)
    values["devices"] = [
        CudaDevice(d["name"], tuple(d["capability"]), d["memory_gib"]) for d in facts["devices"]
    ]
    machine = Machine(**values)
    return render(machine, assess(machine, all_rules()))


# --- writing ---------------------------------------------------------------------------------


def _write(name: str, output: str) -> None:
    sample = SAMPLES[name]
    text = sample.page.read_text(encoding="utf-8")
    body = "$ " + " ".join(sample.command) + "\n" + output
    if not body.endswith("\n"):
        body += "\n"
    new, count = _markers(name).subn(lambda m: m.group(1) + body + m.group(3), text)
    if count != 1:
        raise LookupError(f"expected one sample block {name!r} in {sample.page}, found {count}")
    sample.page.write_text(new, encoding="utf-8")


def main(argv: List[str]) -> int:
    with tempfile.TemporaryDirectory() as folder:
        report = json.loads(run("doctor", Path(folder), "--output-format", "json"))
        DOCTOR_FACTS.parent.mkdir(exist_ok=True)
        DOCTOR_FACTS.write_text(json.dumps(report["machine"], indent=2) + "\n", encoding="utf-8")
        _write("doctor", doctor_output(report["machine"]))
        _write("verify", run("verify", Path(folder)))
    for name, sample in SAMPLES.items():
        print(f"wrote sample {name} in {sample.page.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
