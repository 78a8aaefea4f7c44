"""Notebooks: code cells rewritten together, magics kept, only changed cells differ."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import run_cli
from optimizer_codemod.api import rewrite_source
from optimizer_codemod.config import Settings
from optimizer_codemod.errors import NotebookError, SourceParseError

CELLS = [
    ("markdown", "# Training\nA notebook that trains a small model."),
    ("code", "%matplotlib inline\n!pip install tqdm\nimport torch"),
    (
        "code",
        "model = torch.nn.Linear(4, 2)\noptimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)",
    ),
    ("code", "%%time\nfor step in range(3):\n    pass"),
    (
        "code",
        "files = !ls\nfor step in range(3):\n    %time loss = model(torch.randn(8, 4)).sum()\n    loss.backward()\n    optimizer.step()\n",
    ),
    ("code", "model?"),
]


def notebook_json(indent=1, source_as_list=True, ensure_ascii=False, trailing_newline=True) -> str:
    cells = []
    for number, (kind, text) in enumerate(CELLS):
        source = text.splitlines(keepends=True) if source_as_list else text
        cell = {"cell_type": kind, "metadata": {"tags": [f"c{number}"]}, "source": source}
        if kind == "code":
            cell["execution_count"] = number
            cell["outputs"] = [{"output_type": "stream", "name": "stdout", "text": ["ok ✓\n"]}]
        cells.append(cell)
    document = {
        "cells": cells,
        "metadata": {"kernelspec": {"name": "python3", "language": "python"}},
        "nbformat": 4,
        "nbformat_minor": 5,
    }
    text = json.dumps(document, indent=indent, ensure_ascii=ensure_ascii)
    return text + ("\n" if trailing_newline else "")


def rewrite(text: str, path: str = "train.ipynb", **settings):
    settings.setdefault("select", ("OPT501",))
    return rewrite_source(text.encode("utf-8"), path, Settings(**settings).options_for(path))


@pytest.mark.parametrize(
    "layout",
    [
        {},
        {"indent": 2},
        {"indent": 4, "source_as_list": False},
        {"ensure_ascii": True, "trailing_newline": False},
    ],
    ids=["nbformat", "indent-2", "string-sources", "ascii-escaped"],
)
def test_only_the_changed_cell_differs(layout) -> None:
    original = notebook_json(**layout)
    result = rewrite(original)
    assert result.changed
    new_text = result.new.decode("utf-8")
    old_lines, new_lines = original.splitlines(), new_text.splitlines()
    assert len(old_lines) == len(new_lines)
    differing = [(a, b) for a, b in zip(old_lines, new_lines) if a != b]
    assert len(differing) == 1
    old, new = differing[0]
    assert "lr=1e-3)" in old and "lr=1e-3, fused=True)" in new
    assert json.loads(new_text)["cells"][2]["metadata"] == {"tags": ["c2"]}


def test_magics_survive_and_findings_name_the_cell() -> None:
    result = rewrite(notebook_json())
    cells = json.loads(result.new)["cells"]
    assert cells[1]["source"] == ["%matplotlib inline\n", "!pip install tqdm\n", "import torch"]
    assert cells[3]["source"][0] == "%%time\n"
    assert cells[4]["source"][0] == "files = !ls\n"
    assert cells[4]["source"][2] == "    %time loss = model(torch.randn(8, 4)).sum()\n"
    assert cells[5]["source"] == ["model?"]
    [diagnostic] = result.diagnostics
    assert (diagnostic.cell, diagnostic.line) == (3, 2)


def test_cli_reports_notebook_cells_and_diffs_per_cell(tmp_path: Path) -> None:
    path = tmp_path / "train.ipynb"
    path.write_text(notebook_json(), encoding="utf-8")
    result = run_cli(["apply", "--diff", "train.ipynb", "--select", "OPT501"], cwd=tmp_path)
    assert result.exit_code == 1
    assert result.stdout.startswith("--- a/train.ipynb:cell 3\n+++ b/train.ipynb:cell 3\n")
    # The edit is the cell's last line, which has no newline: a cell is no file missing one.
    assert "No newline at end of file" not in result.stdout
    assert (
        "+optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)\n" in result.stdout
    )
    assert "train.ipynb:cell 3:2:13: OPT501" in result.stderr
    run_cli(["apply", str(path), "--select", "OPT501"])
    assert "fused=True" in path.read_text(encoding="utf-8")
    again = run_cli(["apply", str(path), "--select", "OPT501"])
    assert again.exit_code == 0


def single_cell_notebook(*cells: str) -> str:
    document = {
        "cells": [
            {
                "cell_type": "code",
                "metadata": {},
                "outputs": [],
                "execution_count": None,
                "source": text.splitlines(keepends=True),
            }
            for text in cells
        ],
        "metadata": {"kernelspec": {"name": "python3", "language": "python"}},
        "nbformat": 4,
        "nbformat_minor": 5,
    }
    return json.dumps(document, indent=1) + "\n"


TRAINING_CELL = (
    "import torch\nmodel = torch.nn.Linear(4, 2)\n"
    "optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)\n"
)


def test_a_shell_line_continued_over_indented_lines_is_one_magic() -> None:
    # diffusers' sd3_dreambooth_lora_16gb.ipynb: the continuation lines are indented.
    install = "!pip install -q -U \\\n    transformers \\\n    peft\n"
    result = rewrite(single_cell_notebook(install + TRAINING_CELL))
    assert result.changed
    source = json.loads(result.new)["cells"][0]["source"]
    assert source[:3] == ["!pip install -q -U \\\n", "    transformers \\\n", "    peft\n"]
    assert source[5] == "optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)\n"


def test_a_top_level_await_is_valid_in_a_notebook() -> None:
    # IPython runs `await` at the top of a cell (autoawait; llama-recipes' meta_lamini.ipynb).
    cell = "async def evaluate():\n    return 1\n\nresults = await evaluate()\n"
    result = rewrite(single_cell_notebook(cell, TRAINING_CELL))
    assert result.changed
    assert json.loads(result.new)["cells"][0]["source"][3] == "results = await evaluate()\n"
    with pytest.raises(SourceParseError, match="'await' outside function"):
        rewrite_source(cell.encode(), "train.py", Settings().options_for("train.py"))


def test_a_cell_indented_as_a_whole_runs_as_ipython_runs_it() -> None:
    # IPython takes a whole cell's indent off (leading_indent; mrdbourke's course notebooks).
    cell = "  # on the GPU\n  import torch\n  \n" + "".join(
        "  " + line for line in TRAINING_CELL.splitlines(keepends=True)
    )
    result = rewrite(single_cell_notebook(cell), select=("OPT501",))
    source = json.loads(result.new)["cells"][0]["source"]
    assert source[:3] == ["  # on the GPU\n", "  import torch\n", "  \n"]  # kept as written
    assert (
        source[-1] == "  optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)\n"
    )
    [diagnostic] = result.diagnostics
    assert (diagnostic.cell, diagnostic.line, diagnostic.column) == (1, 6, 15)


def test_a_cell_whose_indented_first_line_is_a_comment_reads_as_python_does() -> None:
    result = rewrite(single_cell_notebook("  # a note\n" + TRAINING_CELL))
    source = json.loads(result.new)["cells"][0]["source"]
    assert source[0] == "  # a note\n"
    assert source[-1] == "optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)\n"


def test_syntax_error_names_the_cell() -> None:
    broken = notebook_json().replace(
        "model = torch.nn.Linear(4, 2)", "model = torch.nn.Linear(4, 2"
    )
    with pytest.raises(SourceParseError) as error:
        rewrite(broken)
    assert error.value.cell == 3
    assert "train.ipynb:cell 3:" in error.value.render()


def test_invalid_json_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "broken.ipynb"
    path.write_text('{"cells": [torch.optim.Adam(', encoding="utf-8")
    result = run_cli(["apply", str(path)])
    assert result.exit_code == 2
    assert f"{path}:1:12: not a valid notebook: JSON error" in result.stderr


def test_unreproducible_json_layout_is_refused() -> None:
    squeezed = json.dumps(json.loads(notebook_json()), separators=(",", ":"), sort_keys=True)
    squeezed = squeezed.replace('"cells":', '"cells" :')
    with pytest.raises(NotebookError) as error:
        rewrite(squeezed)
    assert "JSON layout" in str(error.value)


def test_non_python_notebook_is_left_alone() -> None:
    document = json.loads(notebook_json())
    document["metadata"] = {"kernelspec": {"name": "ir", "language": "R"}}
    result = rewrite(json.dumps(document, indent=1))
    assert not result.changed and result.skipped == "no Python code cells"


IN_MEMORY_TRAINING_CELL = (
    "from torch.utils.data import DataLoader, TensorDataset\n"
    "x, y = torch.randn(64, 8), torch.randn(64, 1)\n"
    "model = nn.Linear(8, 1)\n"
    "loader = DataLoader(TensorDataset(x, y), batch_size=16, shuffle=True)\n"
    "for xb, yb in loader:\n"
    "    loss = ((model(xb) - yb) ** 2).mean()\n"
    "    loss.backward()"
)
DISPLAY_CELL = "from IPython.display import Image\nImage('diagram.png')"


@pytest.mark.parametrize(
    "first_cell",
    [
        "import torch\nimport torch.nn as nn",
        "%matplotlib inline\nimport torch\nimport torch.nn as nn",
    ],
    ids=["imports", "magic-then-imports"],
)
def test_a_fix_import_joins_the_first_import_cell_not_a_later_one(first_cell) -> None:
    # The run of imports at the top of the Python text went on into the display cell, whose
    # first line is an import too: a session that skipped that cell raised NameError.
    notebook = single_cell_notebook(first_cell, DISPLAY_CELL, IN_MEMORY_TRAINING_CELL)
    result = rewrite(notebook, select=("OPT104",))
    cells = [cell["source"] for cell in json.loads(result.new)["cells"]]
    assert cells[0][-1] == "from torch.utils.data import BatchSampler, RandomSampler"
    assert "".join(cells[0]).startswith(first_cell + "\n")
    assert cells[1] == DISPLAY_CELL.splitlines(keepends=True)
    assert "sampler=BatchSampler(RandomSampler(" in "".join(cells[2])
    namespace = {}  # the first and last cells alone now run
    exec("".join(cells[0]).replace("%matplotlib inline\n", ""), namespace)
    exec("".join(cells[2]), namespace)


def test_a_fix_import_goes_to_the_first_cell_that_imports() -> None:
    notebook = single_cell_notebook(
        "print('setup')",
        "import torch\nimport torch.nn as nn\n\nprint(torch.__version__)",
        DISPLAY_CELL,
        IN_MEMORY_TRAINING_CELL,
    )
    result = rewrite(notebook, select=("OPT104",))
    cells = [cell["source"] for cell in json.loads(result.new)["cells"]]
    assert cells[0] == ["print('setup')"]
    assert cells[1] == [
        "import torch\n",
        "import torch.nn as nn\n",
        "from torch.utils.data import BatchSampler, RandomSampler\n",
        "\n",
        "print(torch.__version__)",
    ]
    assert cells[2] == DISPLAY_CELL.splitlines(keepends=True)
