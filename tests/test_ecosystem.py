"""The ecosystem check's own logic (scripts/ecosystem.py), on a local fake corpus: no network."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

# one project: a loader data.py returns, copied to the device by train.py
from test_project_settles import DATA, TRAIN

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("ecosystem", ROOT / "scripts" / "ecosystem.py")
ecosystem = importlib.util.module_from_spec(_spec)
sys.modules["ecosystem"] = ecosystem  # dataclasses look their module up
_spec.loader.exec_module(ecosystem)


def test_the_pinned_corpus_is_large_enough_and_pinned():
    entries = ecosystem.load_corpus(ecosystem.DEFAULT_CORPUS)
    assert len(entries) >= 40
    assert len({e.repo for e in entries}) >= 12
    assert all(len(e.commit) == 40 for e in entries)
    assert len({(e.repo, e.path) for e in entries}) == len(entries)


def test_an_edit_with_its_finding_passes():
    before = b"import torch\nopt = make(lr=1)\nprint(1)\n"
    after = b"import torch\nopt = make(lr=1, fused=True)\nprint(1)\n"
    check = ecosystem.check_lines(before, after, [("OPT501", 2, 2)])
    assert [(h.start, h.end, h.rules) for h in check.hunks] == [(2, 3, ["OPT501"])]
    assert not check.whitespace_changes and not check.away_from_findings
    assert not check.trailing_whitespace and not check.newline_changes


def test_a_line_whose_bytes_change_but_not_its_text_is_caught():
    before = b"a = 1\r\nb = f(x)\r\nc = 3\r\n"
    after = b"a = 1\r\nb = f(x, y)\r\nc = 3\n"  # the line ending of line 3 changed
    check = ecosystem.check_lines(before, after, [("OPT1", 2, 2)])
    assert check.whitespace_changes == [(3, 3)]
    assert check.newline_changes == [3]
    spaced = ecosystem.check_lines(b"x = g( 1 )\n", b"x = g(1)\n", [])
    assert spaced.whitespace_changes == [(1, 1)]


def test_a_bom_that_goes_is_caught():
    check = ecosystem.check_lines(b"\xef\xbb\xbfa = 1\n", b"a = 1\n", [])
    assert check.whitespace_changes


def test_reindented_lines_and_edits_away_from_findings_are_listed_not_failed():
    before = b"for x in xs:\n    y = m(x)\n    s = y.sum()\nprint(s / n)\n"
    after = (
        b"for x in xs:\n    with ac():\n        y = m(x)\n    s = y.sum()\nprint(float(s) / n)\n"
    )
    check = ecosystem.check_lines(before, after, [("OPT302", 2, 2)])
    assert check.reindented == [(2, 3)]
    assert [h.start for h in check.away_from_findings] == [4]
    assert not check.whitespace_changes


def test_trailing_whitespace_on_an_added_line_is_caught():
    before = b"o = A(\n    p, lr=1\n)\n"
    after = b"o = A(\n    p, lr=1, \nfused=True)\n"
    check = ecosystem.check_lines(before, after, [("OPT501", 1, 3)])
    assert check.trailing_whitespace == [2]


def test_trailing_whitespace_an_edited_line_already_had_is_not_counted():
    # yunjey's pytorch-tutorial: `...lr=learning_rate)  ` keeps its two spaces when edited.
    before = b"o = A(p, lr=1)  \nl = D(d, \n      shuffle=True)\n"
    after = b"o = A(p, lr=1, fused=True)  \nl = D(d, \n      shuffle=True, \n      pin=True)\n"
    check = ecosystem.check_lines(before, after, [("OPT501", 1, 1), ("OPT101", 2, 3)])
    assert check.trailing_whitespace == [3]  # `shuffle=True, `: added by the edit


SCRIPT = b"""import torch

model = torch.nn.Linear(4, 2)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
for step in range(3):
    loss = model(torch.randn(8, 4)).sum()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
"""


def _fake_corpus(tmp_path: Path) -> Path:
    cache = tmp_path / "cache"
    script = cache / "someone+trainer" / "train" / "main.py"
    script.parent.mkdir(parents=True)
    script.write_bytes(SCRIPT)
    (cache / "someone+trainer" / "plain.py").write_bytes(b"x = 1\n")
    # A real git mirror (bare) with one commit, read with git show.
    work = tmp_path / "src"
    work.mkdir()
    (work / "loop.py").write_bytes(SCRIPT.replace(b"AdamW", b"Adam"))
    git = ["git", "-C", str(work), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(["git", "init", "-q", str(work)], check=True)
    subprocess.run([*git, "add", "loop.py"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "x"], check=True)
    commit = subprocess.run(
        [*git, "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()
    mirror = tmp_path / "mirror"
    subprocess.run(
        ["git", "clone", "-q", "--bare", str(work), str(mirror / "other+repo" / "repo")],
        check=True,
    )
    corpus = tmp_path / "corpus.toml"
    corpus.write_text(f"""
[[repo]]
name = "someone/trainer"
commit = "{'a' * 40}"
paths = ["train/main.py", "plain.py"]

[[repo]]
name = "other/repo"
commit = "{commit}"
paths = ["loop.py"]

[[repo]]
name = "absent/repo"
commit = "{'b' * 40}"
paths = ["train.py"]
""")
    return corpus


def test_end_to_end_on_a_fake_corpus(tmp_path, capsys):
    corpus = _fake_corpus(tmp_path)
    out = tmp_path / "result.json"
    code = ecosystem.main(
        [
            "--corpus",
            str(corpus),
            "--cache",
            str(tmp_path / "cache"),
            "--mirror",
            str(tmp_path / "mirror"),
            "--json",
            str(out),
        ]
    )
    printed = capsys.readouterr().out
    document = json.loads(out.read_text())
    summary = document["summary"]
    assert code == 0, printed
    assert summary["files"] == 3 and summary["repositories"] == 2
    assert summary["crashes"] == [] and summary["invalid_outputs"] == []
    assert summary["second_run_changes"] == []
    assert summary["fixes_per_rule"].get("OPT501") == 2  # fused=True on AdamW and on Adam
    assert summary["changed_files"] == 2
    assert "absent/repo" in summary["missing_repositories"]
    assert "git clone" in summary["missing_repositories"]["absent/repo"]
    assert "MISSING repositories" in printed and "absent/repo" in printed
    by_path = {f["path"]: f for f in document["files"]}
    assert by_path["train.py"]["status"] == "missing"
    assert by_path["plain.py"]["changed"] is False
    assert any(h["rules"] == ["OPT501"] for h in by_path["train/main.py"]["hunks"])
    assert by_path["train/main.py"]["seconds"] > 0
    assert summary["slowest"][0]["seconds"] >= summary["slowest"][-1]["seconds"]


def test_a_crash_is_counted(tmp_path):
    corpus = _fake_corpus(tmp_path)
    crashing = tmp_path / "crash.py"
    crashing.write_text(
        "import sys\nprint('Traceback (most recent call last):', file=sys.stderr)\n"
    )
    out = tmp_path / "result.json"
    code = ecosystem.main(
        [
            "--corpus",
            str(corpus),
            "--cache",
            str(tmp_path / "cache"),
            "--only",
            "plain.py",
            "--command",
            f"{sys.executable} {crashing}",
            "--json",
            str(out),
        ]
    )
    assert code == 1
    assert json.loads(out.read_text())["summary"]["crashes"] == ["someone/trainer:plain.py"]


@pytest.mark.parametrize("name", ["owner/name"])
def test_the_fetch_hint_names_the_commit(name):
    hint = ecosystem.fetch_hint(name, "c" * 40, [Path("/cache")])
    assert "c" * 40 in hint and "owner+name" in hint and "--cache /cache" in hint


def test_a_hang_is_counted_as_a_crash(tmp_path):
    corpus = _fake_corpus(tmp_path)
    hanging = tmp_path / "hang.py"
    hanging.write_text(
        "import sys, time\nif 'apply' in sys.argv and 'x = 1' not in open(sys.argv[-1]).read():\n    time.sleep(30)\n"
    )
    out = tmp_path / "result.json"
    code = ecosystem.main(
        [
            "--corpus",
            str(corpus),
            "--cache",
            str(tmp_path / "cache"),
            "--only",
            "main.py",
            "--command",
            f"{sys.executable} {hanging}",
            "--timeout",
            "2",
            "--json",
            str(out),
        ]
    )
    assert code == 1
    record = json.loads(out.read_text())["files"][0]
    assert record["status"] == "crash" and "timed out" in record["message"]


DDP_SCRIPT = b"""import torch
from torch.nn.parallel import DistributedDataParallel as DDP
from helpers import zero_grads

model = DDP(torch.nn.Linear(4, 2).cuda(), device_ids=[0])
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(3):
    zero_grads(model)
    model(torch.randn(8, 4, device="cuda")).sum().backward()
    optimizer.step()
"""
HELPERS = b"""def zero_grads(model):
    for p in model.parameters():
        if p.grad is not None:
            p.grad.detach_()
            p.grad.zero_()
"""


@pytest.mark.parametrize(
    "script, helpers",
    [
        ("train.py", "helpers.py"),
        # guided-diffusion's layout: a script in scripts/ imports the installed package
        ("scripts/train.py", "pkg/helpers.py"),
    ],
)
def test_a_file_is_checked_beside_the_modules_it_imports(tmp_path, script, helpers):
    # `helpers.py` is listed after the script: it must be there when the script is
    # rewritten, or OPT605 would add gradient_as_bucket_view, and `detach_()` then raises.
    repo = tmp_path / "cache" / "someone+ddp"
    (repo / script).parent.mkdir(parents=True, exist_ok=True)
    (repo / helpers).parent.mkdir(parents=True, exist_ok=True)
    module = helpers[: -len(".py")].replace("/", ".")
    (repo / script).write_bytes(DDP_SCRIPT.replace(b"from helpers", f"from {module}".encode()))
    (repo / helpers).write_bytes(HELPERS)
    corpus = tmp_path / "corpus.toml"
    corpus.write_text(
        f'[[repo]]\nname = "someone/ddp"\ncommit = "{"c" * 40}"\n'
        f'paths = ["{script}", "{helpers}"]\n'
    )
    kept = tmp_path / "kept"
    code = ecosystem.main(
        ["--corpus", str(corpus), "--cache", str(tmp_path / "cache"), "--keep", str(kept)]
    )
    assert code == 0
    rewritten = (kept / "someone+ddp" / script).read_text()
    assert "gradient_as_bucket_view" not in rewritten
    assert "fused=True" in rewritten  # kept as the tool left it: the check did rewrite it
    assert (kept / "someone+ddp" / helpers).read_bytes() == HELPERS


def test_a_module_a_pinned_file_imports_is_there_without_being_pinned(tmp_path):
    # consistency_models' cm/train_util.py imports cm/fp16_util.py, which is not pinned:
    # the check reads it from the repository as a clone has it, so OPT605 declines.
    repo = tmp_path / "cache" / "someone+ddp"
    (repo / "pkg").mkdir(parents=True)
    (repo / "pkg" / "__init__.py").write_text("")
    (repo / "pkg" / "train.py").write_bytes(DDP_SCRIPT.replace(b"from helpers", b"from .helpers"))
    (repo / "pkg" / "helpers.py").write_bytes(HELPERS)
    corpus = tmp_path / "corpus.toml"
    corpus.write_text(
        f'[[repo]]\nname = "someone/ddp"\ncommit = "{"c" * 40}"\npaths = ["pkg/train.py"]\n'
    )
    kept = tmp_path / "kept"
    code = ecosystem.main(
        ["--corpus", str(corpus), "--cache", str(tmp_path / "cache"), "--keep", str(kept)]
    )
    assert code == 0
    assert "gradient_as_bucket_view" not in (kept / "someone+ddp" / "pkg" / "train.py").read_text()
    assert (kept / "someone+ddp" / "pkg" / "helpers.py").read_bytes() == HELPERS


def _notebook(*sources: str, outputs=()) -> bytes:
    cells = [
        {"cell_type": "markdown", "metadata": {}, "source": ["# title\n"]},
        *(
            {
                "cell_type": "code",
                "execution_count": 1,
                "metadata": {},
                "outputs": list(outputs),
                "source": source.splitlines(True),
            }
            for source in sources
        ),
    ]
    return json.dumps({"cells": cells, "metadata": {}, "nbformat": 4}, indent=1).encode()


def test_a_notebook_block_wrapped_in_a_with_is_reindented_not_changed():
    # udacity's notebooks: the JSON puts the indentation inside the strings.
    before = _notebook("for x in loader:\n    out = model(x)\n    \n    total += out\n")
    after = _notebook(
        "with torch.inference_mode():\n    for x in loader:\n        out = model(x)\n"
        "        \n        total += out\n"
    )
    check = ecosystem.check_notebook(before, after)
    assert check.whitespace_changes == [] and check.trailing_whitespace == []
    assert len(check.reindented) == 3


def test_a_notebook_whose_outputs_changed_fails_at_that_cell():
    before = _notebook("x = 1\n", "y = 2\n")
    after = json.loads(_notebook("x = 1\n", "y = 3\n"))
    after["cells"][1]["outputs"] = [{"output_type": "stream", "text": ["1\n"]}]
    check = ecosystem.check_notebook(before, json.dumps(after).encode())
    assert check.whitespace_changes == [(0, 2)]


def _project_corpus(tmp_path: Path) -> Path:
    repo = tmp_path / "cache" / "someone+project"
    repo.mkdir(parents=True)
    (repo / "data.py").write_text(DATA)
    (repo / "train.py").write_text(TRAIN)
    corpus = tmp_path / "corpus.toml"
    corpus.write_text(
        f'[[repo]]\nname = "someone/project"\ncommit = "{"d" * 40}"\n'
        'paths = ["train.py", "data.py"]\n'
    )
    return corpus


def test_a_repository_is_also_rewritten_as_a_project(tmp_path):
    corpus = _project_corpus(tmp_path)
    out, kept = tmp_path / "result.json", tmp_path / "kept"
    code = ecosystem.main(
        ["--corpus", str(corpus), "--cache", str(tmp_path / "cache"), "--json", str(out)]
        + ["--keep", str(kept)]
    )
    document = json.loads(out.read_text())
    assert code == 0, document["summary"]["project_failures"]
    [project] = document["projects"]
    assert project["files"] == 2 and project["changed_files"] == 2
    assert not project["second_run_changes"]
    alone = document["summary"]["fixes"]
    # Together, data.py learns that its batches are copied to the device and pins its
    # loader (OPT101), and train.py's copies are then made non-blocking (OPT201, twice).
    assert project["fixes"] == alone + 3
    # --keep keeps each file as its run alone left it, not the project's run
    assert "non_blocking" not in (kept / "someone+project" / "train.py").read_text()


def test_a_project_that_changes_on_a_second_run_fails(tmp_path):
    corpus = _project_corpus(tmp_path)
    flaky = tmp_path / "flaky.py"
    flaky.write_text(
        "import json, sys\n"
        "again = '--check' in sys.argv\n"
        "print(json.dumps({'findings': [], 'changed_files': sys.argv[-1:] if again else []}))\n"
        "sys.exit(1 if again else 0)\n"
    )
    out = tmp_path / "result.json"
    code = ecosystem.main(
        ["--corpus", str(corpus), "--cache", str(tmp_path / "cache"), "--json", str(out)]
        + ["--command", f"{sys.executable} {flaky}"]
    )
    assert code == 1
    [failure] = json.loads(out.read_text())["summary"]["project_failures"]
    assert failure.startswith("someone/project: a second run changes")
