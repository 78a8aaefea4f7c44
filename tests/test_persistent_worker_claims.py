"""Why OPT102 and OPT103 leave alone a loader iterated again inside its own loop, run on the
installed torch: with `persistent_workers=True` the second `iter(loader)` resets the one
iterator the loader keeps, and the outer loop ends early without an error."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("torch")

SCRIPT = textwrap.dedent("""\
    import torch
    from torch.utils.data import DataLoader

    def seen(persistent):
        loader = DataLoader(torch.arange(40), batch_size=8, num_workers=1,
                            persistent_workers=persistent)
        items = []
        for step, batch in enumerate(loader):
            items += batch.tolist()
            if step == 1:
                sum(int(b.sum()) for b in loader)  # an evaluation over the same loader
        return len(items)

    if __name__ == "__main__":
        print(seen(False), seen(True))
    """)


def _printed_numbers(tmp_path, text: str):
    """Run `text` as a script (worker processes need a real `__main__` file) and return the
    integers it prints."""
    script = tmp_path / "claim.py"
    script.write_text(text)
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    return [int(word) for word in done.stdout.split()]


def test_a_nested_iteration_cuts_a_persistent_loaders_epoch_short(tmp_path) -> None:
    plain, persistent = _printed_numbers(tmp_path, SCRIPT)
    assert plain == 40
    assert persistent < 40


RANDOM_PICKS = textwrap.dedent("""\
    import random
    import torch
    from torch.utils.data import DataLoader, Dataset

    class Picks(Dataset):
        def __init__(self):
            self.rng = random.Random(911)

        def __len__(self):
            return 8

        def __getitem__(self, i):
            return self.rng.randint(0, 10**9)

    if __name__ == "__main__":
        for workers in (0, 2):
            picks = [int(x) for b in DataLoader(Picks(), batch_size=4, num_workers=workers)
                     for x in b]
            print(len(set(picks)))
    """)


def test_workers_copy_a_datasets_own_generator_and_repeat_its_draws(tmp_path) -> None:
    """Why OPT102 leaves alone a dataset that keeps its own random generator: PyTorch seeds
    each worker's `random` module, not the dataset's `random.Random`."""
    in_process, in_workers = _printed_numbers(tmp_path, RANDOM_PICKS)
    assert in_process == 8
    assert in_workers == 4  # each of the two workers drew the same four numbers
