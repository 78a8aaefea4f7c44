"""Installing optcodemod on a fresh machine, as the README and the guide say.

From a clone: the README's first command, as written, in a copy of this checkout (a fresh
virtual environment without torch; its dependencies come from the package index pip is
configured with). From a wheel built with `python -m build`, installed into another fresh
environment that has torch, where verify and doctor must work from the installed files.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Dict, List

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from conftest import ROOT, TRAINING_SCRIPT, copy_working_tree
from optimizer_codemod import __version__

WHEEL = f"optcodemod-{__version__}-py3-none-any.whl"
NEEDS_TORCH = (
    "optcodemod {} needs torch: pip install torch "
    "(the build for your machine: https://pytorch.org/get-started/locally/)\n"
)


def readme_first_command() -> str:
    block = re.search(r"^```sh\n(.*?)^```", (ROOT / "README.md").read_text(), re.S | re.M)
    return block.group(1).splitlines()[0]


def _env(venv: Path) -> Dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    env["PATH"] = str(venv / "bin") + os.pathsep + env.get("PATH", "")
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return env


def _run(args: List[str], venv: Path, cwd: Path, timeout: float = 240):
    return subprocess.run(
        args, cwd=cwd, env=_env(venv), capture_output=True, text=True, timeout=timeout
    )


@pytest.fixture(scope="module")
def clone(tmp_path_factory) -> Path:
    return copy_working_tree(tmp_path_factory.mktemp("install") / "optcodemod")


def test_the_readme_first_command_installs_and_runs_without_torch(clone: Path, tmp_path) -> None:
    command = readme_first_command()
    assert command.startswith("python3 -m venv .venv && .venv/bin/pip install . && ")
    # The interpreter running the tests stands for the reader's `python3`.
    command = shlex.quote(sys.executable) + command[len("python3") :]
    venv = clone / ".venv"
    done = subprocess.run(
        command, shell=True, cwd=clone, env=_env(venv), capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]  # 1: would change
    # pip's progress comes first on stdout, then the diff.
    assert "\n--- a/examples/train.py\n+++ b/examples/train.py\n@@" in done.stdout
    assert "fused=True" in done.stdout and "Would fix" in done.stderr
    python = str(venv / "bin" / "python")
    # Run outside the clone, so that nothing is imported from its folder by accident.
    probe = (
        "import importlib.util, optimizer_codemod\n"
        "print(optimizer_codemod.__file__)\n"
        "print([n for n in ('torch', 'transforms', 'fixtures') if importlib.util.find_spec(n)])\n"
    )
    where, found = _run([python, "-c", probe], venv, tmp_path).stdout.splitlines()
    assert where.startswith(str(venv / "lib")) and found == "[]"
    version = _run([str(venv / "bin" / "optcodemod"), "--version"], venv, tmp_path)
    assert version.stdout == f"optcodemod, version {__version__}\n"
    script = tmp_path / "train.py"
    script.write_bytes(TRAINING_SCRIPT)
    for args in (["verify", str(script)], ["doctor"], ["bench", str(clone / "reference_models")]):
        refused = _run([str(venv / "bin" / "optcodemod"), *args], venv, tmp_path)
        assert (refused.returncode, refused.stderr) == (2, NEEDS_TORCH.format(args[0]))
        assert "Traceback" not in refused.stdout + refused.stderr


def _torch_of_this_environment(farm: Path) -> None:
    """Links to torch (and what it needs) as installed here, in the folder `farm`.

    A .pth line naming the folder then gives a fresh environment this torch the way
    --system-site-packages gives it a system one, without unpacking 900 MB again; nothing
    else of this environment (libcst, click, this checkout) becomes visible.
    """
    farm.mkdir()
    seen, todo = set(), ["torch", "numpy"]
    while todo:
        name = canonicalize_name(todo.pop())
        if name in seen:
            continue
        seen.add(name)
        dist = metadata.distribution(name)
        for line in dist.requires or ():
            requirement = Requirement(line)
            if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
                todo.append(requirement.name)
        site = Path(dist.locate_file(""))
        for top in {Path(file).parts[0] for file in dist.files or ()}:
            if top != ".." and not (farm / top).exists() and (site / top).exists():
                (farm / top).symlink_to(site / top)


def test_a_built_wheel_installs_next_to_torch_and_verifies(clone: Path, tmp_path) -> None:
    dist = tmp_path / "dist"
    built = subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", dist, clone],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    assert [wheel.name for wheel in dist.iterdir()] == [WHEEL]
    assert f"dist/{WHEEL}" in (ROOT / "docs" / "getting-started.md").read_text()
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", venv], check=True, timeout=120)
    [site] = (venv / "lib").glob("python3*/site-packages")
    _torch_of_this_environment(tmp_path / "torch-here")
    (site / "torch_of_the_test_environment.pth").write_text(str(tmp_path / "torch-here") + "\n")
    pip = _run([str(venv / "bin" / "pip"), "install", "-q", str(dist / WHEEL)], venv, tmp_path)
    assert pip.returncode == 0, pip.stdout[-3000:] + pip.stderr[-3000:]
    optcodemod = str(venv / "bin" / "optcodemod")
    doctor = _run([optcodemod, "doctor", "--compile-timeout", "0"], venv, tmp_path)
    assert doctor.returncode == 0, doctor.stdout + doctor.stderr
    assert "torch       2." in doctor.stdout and "OPT501 optimizer-without-fused-kernel" in (
        doctor.stdout
    )
    # What verify runs, twice per version: the installed probe, in a process with torch.
    script = tmp_path / "train.py"
    script.write_bytes(TRAINING_SCRIPT)
    python = str(venv / "bin" / "python")
    probe = [python, "-m", "optimizer_codemod.verify.probe", "--steps", "2", "--out", "run.json"]
    ran = _run([*probe, "--", str(script)], venv, tmp_path, timeout=300)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    record = json.loads((tmp_path / "run.json").read_text())
    assert len(record["losses"]) == 2, record
    # The probe verify started is the installed one, not this checkout's.
    imported = _run(
        [
            str(venv / "bin" / "python"),
            "-c",
            "import optimizer_codemod; print(optimizer_codemod.__file__)",
        ],
        venv,
        tmp_path,
    )
    assert imported.stdout.startswith(str(site))
