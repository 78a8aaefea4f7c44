"""Fault injection: runs killed at random points, files edited mid-run, unprivileged users.

Whatever happens to a run, every file is either its original or its complete rewrite, no
temporary file is left behind, no worker outlives the run, and an edit saved during the run
is kept. The kill points are random; the invariants checked must hold at every one of them.
OPTCODEMOD_FAULT_ROUNDS=N repeats each kill scenario N times with other kill points.
"""

from __future__ import annotations

import os
import random
import re
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import pytest

from conftest import TRAINING_SCRIPT
from optimizer_codemod import sources

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="reads process groups from /proc (Linux)"
)

REPO = Path(__file__).resolve().parent.parent
ROUNDS = int(os.environ.get("OPTCODEMOD_FAULT_ROUNDS", "1"))
FILES = 240
OLD, NEW = b"lr=1e-3)", b"lr=1e-3, fused=True)"  # what OPT501 does to every file
EDIT = b"\n# saved while optcodemod was running\n"
# The command line, with worker processes even for this small tree, and a pause between a
# temporary file's creation and its rename: a kill lands in that window far more often.
HARNESS = """
import sys, time
from optimizer_codemod import runner, sources
runner.PARALLEL_THRESHOLD_BYTES = 0
check = sources._check_unchanged
def slower(*args):
    time.sleep(0.003)
    return check(*args)
sources._check_unchanged = slower
from optimizer_codemod.cli import main
main(sys.argv[1:], prog_name="optcodemod")
"""


def make_tree(root: Path) -> Dict[Path, bytes]:
    originals = {}
    for index in range(FILES):
        path = root / f"pkg{index % 12}" / f"train_{index}.py"
        path.parent.mkdir(parents=True, exist_ok=True)
        text = TRAINING_SCRIPT.replace(b"Linear(4, 2)", f"Linear({index + 4}, 2)".encode())
        path.write_bytes(text)
        originals[path] = text
    return originals


def start(root: Path, *args: str) -> subprocess.Popen:
    # A session of its own: its process group holds the run and its workers, and nothing else.
    return subprocess.Popen(
        [sys.executable, "-c", HARNESS, "apply", "--select", "OPT501", *args, "."],
        cwd=root,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )


def wait_for_first_rewrite(originals: Dict[Path, bytes], run: subprocess.Popen) -> None:
    deadline = time.monotonic() + 120
    while run.poll() is None and time.monotonic() < deadline:
        if any(p.read_bytes() != text for p, text in originals.items()):
            return
        time.sleep(0.01)


def live_group_members(group: int) -> List[int]:
    """Processes of the group that are not zombies (a zombie holds no pipe and runs nothing)."""
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()  # after the command name, which may hold spaces
        if fields[0] != "Z" and int(fields[2]) == group:
            members.append(int(entry))
    return members


def assert_no_survivor(group: int) -> None:
    # Workers get SIGTERM from the kernel when their parent dies; this only waits for that
    # to be delivered, and fails if it never is.
    deadline = time.monotonic() + 60
    while live_group_members(group) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not live_group_members(group), "a worker outlived the run"


def file_states(originals: Dict[Path, bytes]) -> Tuple[List[Path], List[Path]]:
    """(rewritten files, untouched files); fails on any file that is neither."""
    rewritten, untouched = [], []
    for path, text in originals.items():
        now = path.read_bytes()
        if now == text:
            untouched.append(path)
        elif now == text.replace(OLD, NEW):
            rewritten.append(path)
        else:
            raise AssertionError(f"{path} is neither its original nor its rewrite:\n{now!r}")
    return rewritten, untouched


def temporaries(root: Path) -> List[Path]:
    return [p for p in root.rglob("*") if p.name.startswith(sources.TEMP_PREFIX)]


def listed_as_written(stderr: str, root: Path) -> List[Path]:
    section = stderr.split("already rewritten:\n", 1)
    if len(section) == 1:
        return []
    paths = []
    for line in section[1].splitlines():
        if not line.startswith("  "):
            break
        paths.append(root / line.strip())
    return paths


SCENARIOS = [
    (signal.SIGKILL, "-j2"),
    (signal.SIGTERM, "-j2"),
    (signal.SIGINT, "-j2"),
    (signal.SIGKILL, "-j1"),
    (signal.SIGTERM, "-j1"),
    (signal.SIGINT, "-j1"),
]


@pytest.mark.parametrize("round_", range(ROUNDS), ids=lambda r: f"round{r}")
@pytest.mark.parametrize(
    "signum, jobs", SCENARIOS, ids=[f"{signal.Signals(s).name}{j}" for s, j in SCENARIOS]
)
def test_a_killed_run_leaves_every_file_whole(tmp_path: Path, signum, jobs, round_) -> None:
    originals = make_tree(tmp_path)
    kill_at = random.Random(f"{signum}{jobs}{round_}").uniform(0.0, 0.4)
    run = start(tmp_path, jobs)
    wait_for_first_rewrite(originals, run)
    time.sleep(kill_at)
    if signum == signal.SIGINT:
        os.killpg(run.pid, signum)  # Ctrl-C in a terminal reaches the whole group
    else:
        os.kill(run.pid, signum)  # a CI runner or pre-commit stopping the command
    # The pipes reach end-of-file only once no worker holds them.
    _, err = run.communicate(timeout=120)
    assert_no_survivor(run.pid)
    rewritten, untouched = file_states(originals)
    left = temporaries(tmp_path)
    if signum == signal.SIGINT:
        stderr = err.decode()
        assert run.returncode == 130 or (run.returncode == 1 and not untouched), stderr
        if run.returncode == 130:
            assert "Traceback" not in stderr
            assert sorted(listed_as_written(stderr, tmp_path)) == sorted(rewritten), stderr
            assert "Every other file is untouched." in stderr
    else:
        assert run.returncode in (-signum, 1), err.decode()
    if signum == signal.SIGKILL and jobs == "-j1":
        # Nothing can stop SIGKILL between the temporary file and its rename; the next run
        # removes what such a run left.
        assert len(left) <= 1
        assert all(f"{sources.TEMP_PREFIX}{run.pid}-" in p.name for p in left)
    else:
        assert not left, left
    if left or (signum, jobs) == (signal.SIGINT, "-j2"):
        # The next run removes what was left and finishes the job (a full run costs a few
        # seconds, so not after every kill).
        again = start(tmp_path, "-j2")
        again.communicate(timeout=300)
        assert again.returncode == (1 if untouched else 0)
        rewritten, untouched = file_states(originals)
        assert not untouched and not temporaries(tmp_path)


def listed_in_flight(stderr: str, root: Path) -> List[Path]:
    section = stderr.split("when the workers were stopped; each is either untouched or ", 1)
    if len(section) == 1:
        return []
    return listed_as_written("already rewritten:\n" + section[1].split("\n", 1)[1], root)


@pytest.mark.parametrize("round_", range(ROUNDS), ids=lambda r: f"round{r}")
def test_a_second_ctrl_c_stops_the_workers_and_every_file_stays_whole(
    tmp_path: Path, round_
) -> None:
    originals = make_tree(tmp_path)
    chooser = random.Random(f"twice{round_}")
    run = start(tmp_path, "-j2")
    wait_for_first_rewrite(originals, run)
    time.sleep(chooser.uniform(0.0, 0.2))
    os.killpg(run.pid, signal.SIGINT)
    time.sleep(0.02)  # two signals pending at once are delivered as one
    os.killpg(run.pid, signal.SIGINT)
    _, err = run.communicate(timeout=120)
    stderr = err.decode()
    assert_no_survivor(run.pid)
    assert run.returncode == 130 or run.returncode == 1, stderr
    assert "Traceback" not in stderr and not temporaries(tmp_path)
    rewritten, untouched = file_states(originals)
    if run.returncode == 130:
        written = set(listed_as_written(stderr, tmp_path))
        # a worker stopped after its rename but before it reported leaves its file rewritten
        assert written <= set(rewritten) <= written | set(listed_in_flight(stderr, tmp_path))
        assert "Every other file is untouched." in stderr
    else:
        assert not untouched


def test_an_edit_saved_during_a_run_is_kept(tmp_path: Path) -> None:
    originals = make_tree(tmp_path)
    chooser = random.Random(13)
    targets = chooser.sample(sorted(originals), 40)
    run = start(tmp_path, "-j1")
    wait_for_first_rewrite(originals, run)
    for path in targets:  # each edit lands before the file's read, after its rename, or between
        with open(path, "ab") as handle:
            handle.write(EDIT)
        time.sleep(chooser.uniform(0.0, 0.05))
    _, err = run.communicate(timeout=300)
    stderr = err.decode()
    assert run.returncode in (1, 2), stderr
    for path in targets:
        assert path.read_bytes().endswith(EDIT), f"{path}: the edit was lost"
    refused = re.findall(
        r"^(\S+): changed on disk while optcodemod was working on it", stderr, re.M
    )
    assert {tmp_path / p for p in refused} <= set(targets)
    assert "Traceback" not in stderr and not temporaries(tmp_path)
    for path, text in originals.items():
        if path not in targets:
            assert path.read_bytes() == text.replace(OLD, NEW)


# --- As an unprivileged user ---------------------------------------------------------------


def _unprivileged_command() -> Tuple[Optional[List[str]], str]:
    """A command prefix that runs optcodemod as a user without root's rights, or the reason
    there is none. Already unprivileged: nothing to add."""
    if os.geteuid() != 0:
        return [sys.executable, "-m", "optimizer_codemod"], ""
    switch = None
    if shutil.which("runuser"):
        switch = ["runuser", "-u", "nobody", "--"]
    elif shutil.which("setpriv"):
        switch = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
    if switch is None:
        return None, "neither runuser nor setpriv is installed to drop root's rights"
    # The venv's interpreter may live in root's home, which nobody may enter; an interpreter
    # of the same version elsewhere runs with the venv's packages added.
    version = f"python{sys.version_info[0]}.{sys.version_info[1]}"
    launcher = (
        "import site, sys; "
        f"site.addsitedir({sysconfig.get_paths()['purelib']!r}); "
        f"sys.path.insert(0, {str(REPO)!r}); "
        "from optimizer_codemod.cli import main; "
        "main(sys.argv[1:], prog_name='optcodemod')"
    )
    for interpreter in dict.fromkeys(
        [sys.executable, shutil.which(version), f"/usr/bin/{version}"]
    ):
        if not interpreter:
            continue
        probe = subprocess.run(
            [*switch, interpreter, "-c", launcher, "--version"],
            cwd="/",
            capture_output=True,
        )
        if probe.returncode == 0:
            return [*switch, interpreter, "-c", launcher], ""
    return None, f"no {version} interpreter with this venv's packages is runnable by nobody"


@pytest.fixture
def unprivileged():
    command, reason = _unprivileged_command()
    if command is None:
        pytest.skip(reason)
    return command


@pytest.fixture
def shared_dir():
    # pytest's tmp_path sits in a folder only root may enter.
    folder = Path(tempfile.mkdtemp(prefix="optcodemod-faults-", dir="/tmp"))
    folder.chmod(0o755)
    yield folder
    for path in [folder, *folder.rglob("*")]:
        if path.is_dir():
            path.chmod(0o755)
    shutil.rmtree(folder, ignore_errors=True)


def _give(path: Path, mode: int, to_user: bool) -> None:
    path.chmod(mode)
    if os.geteuid() == 0 and to_user:
        os.chown(path, 65534, 65534)


def test_unprivileged_runs_rewrite_what_they_may_and_explain_the_rest(
    unprivileged: Sequence[str], shared_dir: Path
) -> None:
    mine = shared_dir / "mine"
    mine.mkdir()
    _give(mine, 0o755, to_user=True)
    rewritten = mine / "train.py"
    rewritten.write_bytes(TRAINING_SCRIPT)
    _give(rewritten, 0o644, to_user=True)
    # Writable by everyone, owned by root: replacing it would hand it to nobody.
    foreign = mine / "foreign.py"
    foreign.write_bytes(TRAINING_SCRIPT)
    _give(foreign, 0o666, to_user=False)
    read_only = mine / "read_only.py"
    read_only.write_bytes(TRAINING_SCRIPT)
    _give(read_only, 0o644, to_user=False)
    # The user's own file in a folder it cannot write to: no temporary file can go there.
    locked = shared_dir / "locked"
    locked.mkdir()
    in_locked = locked / "train.py"
    in_locked.write_bytes(TRAINING_SCRIPT)
    _give(in_locked, 0o666, to_user=True)
    _give(locked, 0o555, to_user=False)
    owner_before = os.stat(foreign).st_uid

    done = subprocess.run(
        [*unprivileged, "apply", "-j", "1", "--select", "OPT501", str(mine), str(in_locked)],
        cwd=shared_dir,
        capture_output=True,
        timeout=300,
    )
    stderr = done.stderr.decode()
    assert done.returncode == 2, stderr
    assert "Traceback" not in stderr
    assert TRAINING_SCRIPT.replace(OLD, NEW) == rewritten.read_bytes()
    if os.geteuid() == 0:
        assert os.stat(rewritten).st_uid == 65534
        assert f"{foreign}: belongs to uid {owner_before} gid" in stderr
        assert foreign.read_bytes() == TRAINING_SCRIPT
        assert os.stat(foreign).st_uid == owner_before
        assert f"{read_only}: file is read-only; not rewritten" in stderr
        assert read_only.read_bytes() == TRAINING_SCRIPT
    assert f"{in_locked}: cannot create a temporary file in {locked}: Permission denied" in stderr
    assert in_locked.read_bytes() == TRAINING_SCRIPT
    assert not temporaries(shared_dir)
