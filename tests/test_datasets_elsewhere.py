"""Issue 15: a DataLoader over a dataset class defined in another module of the run.

The project index summarises each dataset class of a module (and each function returning an
instance of one) for the modules that import it: its kind, whether anything it runs may
place tensors on an accelerator, whether `__init__` keeps an open handle. OPT101 pins such a
loader as it pins one over a class of its own file, and OPT201 then overlaps the copies
(PyTorch-GAN's cyclegan/pix2pix/srgan, pytorch/examples' super_resolution). Whatever the
summary cannot tell leaves the dataset unknown: OPT101 reports instead of fixing.
"""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Dict, List

import pytest
from test_scaling import GROWTH_LIMIT, SLACK_LINES, counted

from optimizer_codemod import runner
from optimizer_codemod.analysis import project as project_module
from optimizer_codemod.analysis.project import project_facts
from optimizer_codemod.config import Settings
from optimizer_codemod.diagnostics import Status

DATASETS = textwrap.dedent("""\
    import torch
    from torch.utils.data import Dataset


    def to_unit_range(image):
        return image.clamp(-1.0, 1.0)


    class ImageDataset(Dataset):
        def __init__(self, count=32):
            self.images = torch.randn(count, 8)

        def __getitem__(self, index):
            image = to_unit_range(self.images[index])
            return {"A": image, "B": image.flip(-1)}

        def __len__(self):
            return len(self.images)
    """)

TRAIN = textwrap.dedent("""\
    import torch
    from torch.utils.data import DataLoader

    from datasets import ImageDataset


    def main():
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        model = torch.nn.Linear(8, 8).to(device)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        loader = DataLoader(ImageDataset(), batch_size=8, num_workers=2)
        for batch in loader:
            loss = (model(batch["A"].to(device)) - batch["B"].to(device)).pow(2).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()


    if __name__ == "__main__":
        main()
    """)
# The same loader without workers: OPT102's case, and one OPT101 leaves to it.
IN_MAIN_PROCESS = TRAIN.replace(", num_workers=2", "")


def outcomes(folder: Path, files: List[str]) -> Dict[str, Dict[str, List[str]]]:
    """{code: [status: message]} of train.py, under --why-not."""
    settings = Settings(root=str(folder), why_not=True, select=["OPT101", "OPT102", "OPT201"])
    paths = [str(folder / name) for name in files]
    found: Dict[str, List[str]] = {}
    for outcome in runner.run(paths, settings, runner.Mode(write=False, diff=True), jobs=1):
        assert outcome.error is None, outcome.error
        if outcome.path.endswith("train.py"):
            for d in outcome.diagnostics:
                found.setdefault(d.code, []).append(f"{d.status.value}: {d.message}")
    return found


def project(tmp_path: Path, datasets: str = DATASETS, train: str = TRAIN) -> Path:
    (tmp_path / "datasets.py").write_text(datasets)
    (tmp_path / "train.py").write_text(train)
    return tmp_path


def pinned(found: Dict[str, List[str]]) -> bool:
    return any(m.startswith(Status.FIXED.value) for m in found.get("OPT101", ()))


def test_a_dataset_class_of_another_module_is_pinned_and_its_copies_overlap(
    tmp_path: Path,
) -> None:
    found = outcomes(project(tmp_path), ["datasets.py", "train.py"])
    assert pinned(found), found
    assert [m for m in found["OPT201"] if m.startswith("fixed")], found
    # Under the main guard, with work per item: OPT102 offers workers (a behaviour-level fix),
    # as for a class of its own file; without them the loader would pin in the training
    # process, so OPT101 waits for them.
    found = outcomes(project(tmp_path, train=IN_MAIN_PROCESS), ["datasets.py", "train.py"])
    assert any(m.startswith(Status.UNSAFE.value) for m in found["OPT102"]), found
    assert not pinned(found)
    assert any("prepares its batches in the training process" in m for m in found["OPT101"])


def test_given_alone_the_script_reads_the_module_it_imports(tmp_path: Path) -> None:
    assert outcomes(project(tmp_path), ["train.py"]) == outcomes(
        tmp_path, ["datasets.py", "train.py"]
    )


def test_without_the_module_to_read_the_dataset_stays_unknown(tmp_path: Path) -> None:
    project(tmp_path)
    (tmp_path / "datasets.py").rename(tmp_path / "elsewhere.py")
    found = outcomes(tmp_path, ["train.py"])
    assert not pinned(found)
    assert any("its dataset is defined elsewhere" in m for m in found["OPT101"]), found


ON_DEVICE = {
    "its __getitem__ moves items": (
        DATASETS.replace(
            'return {"A": image', 'image = image.to("cuda")\n        return {"A": image'
        ),
        TRAIN,
    ),
    "a helper of its module moves items": (
        DATASETS.replace("image.clamp(-1.0, 1.0)", "image.clamp(-1.0, 1.0).cuda()"),
        TRAIN,
    ),
    "its module's top level makes a device tensor": (
        DATASETS.replace(
            "def to_unit_range(image):",
            'SHIFT = torch.ones(8, device="cuda")\n\n\ndef to_unit_range(image):',
        ).replace("image.clamp(-1.0, 1.0)", "(image + SHIFT).clamp(-1.0, 1.0)"),
        TRAIN,
    ),
    "the driver passes a device tensor": (
        DATASETS.replace("def __init__(self, count=32):", "def __init__(self, images):").replace(
            "torch.randn(count, 8)", "images"
        ),
        TRAIN.replace("ImageDataset()", "ImageDataset(torch.randn(32, 8, device=device))"),
    ),
}


@pytest.mark.parametrize("case", sorted(ON_DEVICE))
def test_a_dataset_whose_items_may_be_on_the_device_is_not_pinned(
    case: str, tmp_path: Path
) -> None:
    datasets, train = ON_DEVICE[case]
    found = outcomes(project(tmp_path, datasets, train), ["datasets.py", "train.py"])
    assert not pinned(found)
    assert any("may already be on the device" in m for m in found["OPT101"]), found


def test_a_base_from_outside_the_run_leaves_the_dataset_unknown(tmp_path: Path) -> None:
    datasets = DATASETS.replace(
        "from torch.utils.data import Dataset", "from somelib import Dataset"
    )
    found = outcomes(project(tmp_path, datasets), ["datasets.py", "train.py"])
    assert not pinned(found)
    assert any("defined elsewhere" in m for m in found["OPT101"]), found


def test_a_base_in_a_third_module_is_followed(tmp_path: Path) -> None:
    (tmp_path / "base.py").write_text(DATASETS.replace("class ImageDataset", "class Base"))
    datasets = "from base import Base\n\n\nclass ImageDataset(Base):\n    pass\n"
    found = outcomes(project(tmp_path, datasets), ["base.py", "datasets.py", "train.py"])
    assert pinned(found), found
    moving = DATASETS.replace("class ImageDataset", "class Base").replace(
        "image.clamp(-1.0, 1.0)", "image.clamp(-1.0, 1.0).cuda()"
    )
    (tmp_path / "base.py").write_text(moving)
    found = outcomes(project(tmp_path, datasets), ["base.py", "datasets.py", "train.py"])
    assert any("may already be on the device" in m for m in found["OPT101"]), found


def test_an_imported_iterable_dataset_gets_no_workers(tmp_path: Path) -> None:
    datasets = DATASETS.replace("(Dataset)", "(IterableDataset)").replace(
        "import Dataset", "import IterableDataset"
    )
    datasets = datasets.replace(
        "def __getitem__(self, index):", "def __iter__(self):\n        index = 0"
    )
    datasets = datasets.replace('return {"A"', 'yield {"A"')
    found = outcomes(project(tmp_path, datasets), ["datasets.py", "train.py"])
    assert pinned(found), found
    found = outcomes(project(tmp_path, datasets, IN_MAIN_PROCESS), ["datasets.py", "train.py"])
    assert any("IterableDataset" in m for m in found["OPT102"]), found


def test_a_dataset_that_opens_a_handle_when_built_gets_no_workers(tmp_path: Path) -> None:
    datasets = DATASETS.replace(
        "self.images = torch.randn(count, 8)",
        'self.images = torch.randn(count, 8)\n        self.log = open("items.txt")',
    )
    found = outcomes(project(tmp_path, datasets, IN_MAIN_PROCESS), ["datasets.py", "train.py"])
    assert any("opens a file handle" in m for m in found["OPT102"]), found


def test_a_dataset_keeping_its_own_generator_gets_no_workers(tmp_path: Path) -> None:
    # LoRA's FT_Dataset (data_utils.py) draws padding items from `self.rng`: each worker
    # would draw the same numbers from its copy of one state.
    datasets = DATASETS.replace("import torch\n", "import random\n\nimport torch\n").replace(
        "self.images = torch.randn(count, 8)",
        "self.images = torch.randn(count, 8)\n        self.rng = random.Random(911)",
    )
    found = outcomes(project(tmp_path, datasets, IN_MAIN_PROCESS), ["datasets.py", "train.py"])
    assert any("its own random generator (`random.Random(911)`)" in m for m in found["OPT102"])
    assert not any(m.startswith(Status.UNSAFE.value) for m in found["OPT102"]), found


def test_a_function_returning_a_dataset_of_a_third_module(tmp_path: Path) -> None:
    # pytorch/examples super_resolution: main.py -> data.get_training_set -> dataset.py.
    (tmp_path / "data.py").write_text(
        "from datasets import ImageDataset\n\n\ndef get_training_set(count):\n"
        "    return ImageDataset(count)\n"
    )
    train = TRAIN.replace("from datasets import ImageDataset", "import data").replace(
        "ImageDataset()", "data.get_training_set(16)"
    )
    files = ["data.py", "datasets.py", "train.py"]
    found = outcomes(project(tmp_path, train=train), files)
    assert pinned(found), found
    facts = project_facts(str(tmp_path / f) for f in files)
    summary = facts[str(tmp_path / "train.py")].imported_dataset("data.get_training_set")
    assert (summary.kind, summary.places_on_accelerator) == ("per-item", False)
    assert project_module.from_json(project_module.to_json(facts)) == facts


def test_a_function_whose_returns_disagree_leaves_the_dataset_unknown(tmp_path: Path) -> None:
    (tmp_path / "data.py").write_text(
        "import torch\nfrom datasets import ImageDataset\n\n\ndef get_training_set(count):\n"
        "    if count:\n        return ImageDataset(count)\n"
        "    return torch.utils.data.TensorDataset(torch.randn(4, 8))\n"
    )
    train = TRAIN.replace("from datasets import ImageDataset", "import data").replace(
        "ImageDataset()", "data.get_training_set(16)"
    )
    found = outcomes(project(tmp_path, train=train), ["data.py", "datasets.py", "train.py"])
    assert not pinned(found)


def test_the_dataset_summaries_grow_linearly_with_the_project(tmp_path: Path) -> None:
    def lines(count: int) -> int:
        folder = tmp_path / f"n{count}"
        folder.mkdir()
        for index in range(count):
            (folder / f"datasets_{index}.py").write_text(DATASETS)
            train = TRAIN.replace("from datasets import", f"from datasets_{index} import")
            (folder / f"train_{index}.py").write_text(train)
        paths = sorted(str(p) for p in folder.glob("*.py"))
        counts, facts = counted(lambda: project_facts(paths))
        assert len([f for f in facts.values() if f.imported_datasets]) == count
        return sum(counts.values())

    small, large = lines(3), lines(12)
    assert large <= GROWTH_LIMIT * small + SLACK_LINES, (small, large)  # 4 times the files
