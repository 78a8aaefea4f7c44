"""OPT501 declines found reading fresh repositories (round 3): a ShardedGradScaler built in
another module of the run (dinov2's `SSLMetaArch.fp16_scaler`), read through the project
index."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import List

from optimizer_codemod import runner
from optimizer_codemod.config import Settings

ARCH = textwrap.dedent("""\
    import torch.nn as nn
    from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler


    class MetaArch(nn.Module):
        def __init__(self):
            super().__init__()
            self.net = nn.Linear(4, 4)
            self.fp16_scaler = ShardedGradScaler()
    """)

TRAIN = textwrap.dedent("""\
    import torch
    from arch import MetaArch


    def main():
        model = MetaArch().cuda()
        scaler = model.fp16_scaler
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
        for x in loader:
            scaler.scale(model.net(x.cuda()).sum()).backward()
            scaler.unscale_(optimizer)
            scaler.step(optimizer)
            scaler.update()


    if __name__ == "__main__":
        main()
    """)


def opt501(folder: Path, files: List[str]) -> List[str]:
    settings = Settings(root=str(folder), why_not=True, select=["OPT501"])
    paths = [str(folder / name) for name in files]
    found = []
    for outcome in runner.run(paths, settings, runner.Mode(write=False, diff=True), jobs=1):
        assert outcome.error is None, outcome.error
        if outcome.path.endswith("train.py"):
            found += [f"{d.status.value}: {d.message}" for d in outcome.diagnostics]
    return found


def test_a_sharded_grad_scaler_of_an_imported_module_keeps_the_optimizer_unfused(
    tmp_path: Path,
) -> None:
    (tmp_path / "arch.py").write_text(ARCH)
    (tmp_path / "train.py").write_text(TRAIN)
    (finding,) = opt501(tmp_path, ["arch.py", "train.py"])
    assert "ShardedGradScaler in arch.py" in finding, finding
    assert not finding.startswith("fixed")


def test_without_the_scaler_module_the_optimizer_is_fused(tmp_path: Path) -> None:
    arch = ARCH.replace("ShardedGradScaler()", "None").replace("from torch.distributed", "# ")
    (tmp_path / "arch.py").write_text(arch)
    (tmp_path / "train.py").write_text(TRAIN)
    (finding,) = opt501(tmp_path, ["arch.py", "train.py"])
    assert finding.startswith("fixed"), finding


# Reading round 8 (transformer-xl): the embedding that may be sparse is built in the model's
# module; fused SGD raises "`_fused_sgd` does not support sparse gradients" at the first step.
SPARSE_MODEL = textwrap.dedent("""\
    import torch.nn as nn


    class MemTransformerLM(nn.Module):
        def __init__(self, n_token, sample_softmax=-1):
            super().__init__()
            self.word_emb = nn.Embedding(n_token, 8, sparse=sample_softmax > 0)
            self.out = nn.Linear(8, n_token)
    """)

SPARSE_TRAIN = textwrap.dedent("""\
    import torch
    from mem_transformer import MemTransformerLM


    def main(sample_softmax):
        model = MemTransformerLM(100, sample_softmax).cuda()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for x in loader:
            model.out(model.word_emb(x.cuda())).sum().backward()
            optimizer.step()
            optimizer.zero_grad()


    if __name__ == "__main__":
        main(2)
    """)


def test_an_embedding_of_an_imported_module_that_may_be_sparse_keeps_the_optimizer_unfused(
    tmp_path: Path,
) -> None:
    (tmp_path / "mem_transformer.py").write_text(SPARSE_MODEL)
    (tmp_path / "train.py").write_text(SPARSE_TRAIN)
    (finding,) = opt501(tmp_path, ["mem_transformer.py", "train.py"])
    assert finding.startswith("declined"), finding
    assert "mem_transformer.py may make sparse gradients" in finding, finding


def test_an_embedding_of_an_imported_module_that_is_never_sparse_lets_the_optimizer_fuse(
    tmp_path: Path,
) -> None:
    dense = SPARSE_MODEL.replace("sparse=sample_softmax > 0", "sparse=False")
    (tmp_path / "mem_transformer.py").write_text(dense)
    (tmp_path / "train.py").write_text(SPARSE_TRAIN)
    (finding,) = opt501(tmp_path, ["mem_transformer.py", "train.py"])
    assert finding.startswith("fixed"), finding


# continual-learning's OWM (reading round 10): the classifier projects its gradients and
# stores slices of one matrix as the layers' `.grad`.
PROJECTED_MODEL = textwrap.dedent("""\
    import torch
    import torch.nn as nn


    class Classifier(nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = nn.Linear(4, 3)

        def project_gradients(self, projection):
            linear = self.linear
            g = torch.cat((linear.weight.grad, linear.bias.grad[:, None]), -1) @ projection
            linear.weight.grad = g[..., :-1].detach()
            linear.bias.grad = g[..., -1].detach()
    """)

PROJECTED_TRAIN = textwrap.dedent("""\
    import torch
    from classifier import Classifier


    def main():
        model = Classifier().cuda()
        optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
        projection = torch.eye(5).cuda()
        for x in loader:
            model.linear(x.cuda()).sum().backward()
            model.project_gradients(projection)
            optimizer.step()
            optimizer.zero_grad()


    if __name__ == "__main__":
        main()
    """)


def test_gradients_an_imported_module_stores_keep_the_optimizer_unfused(tmp_path: Path) -> None:
    (tmp_path / "classifier.py").write_text(PROJECTED_MODEL)
    (tmp_path / "train.py").write_text(PROJECTED_TRAIN)
    (finding,) = opt501(tmp_path, ["classifier.py", "train.py"])
    assert finding.startswith("declined"), finding
    assert "classifier.py sets a `.grad` to a tensor of its own" in finding, finding


def test_gradients_reset_to_none_elsewhere_let_the_optimizer_fuse(tmp_path: Path) -> None:
    reset = PROJECTED_MODEL.replace("g[..., :-1].detach()", "None").replace(
        "g[..., -1].detach()", "None"
    )
    (tmp_path / "classifier.py").write_text(reset)
    (tmp_path / "train.py").write_text(PROJECTED_TRAIN)
    (finding,) = opt501(tmp_path, ["classifier.py", "train.py"])
    assert finding.startswith("fixed"), finding
