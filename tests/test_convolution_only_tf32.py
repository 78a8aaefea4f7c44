"""OPT301 on scripts whose models only convolve (analysis/matmuls.py).

`torch.set_float32_matmul_precision("high")` changes cuBLAS matmuls only; cuDNN convolutions
already run float32 on TF32 tensor cores by default. A DCGAN, Wav2Lip's SyncNet, a U-Net
without attention gain nothing from the line, and its message ("TF32 tensor cores stay
unused") would be false there. Anything that may multiply matrices keeps the fix.
"""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import List

import pytest

from optimizer_codemod import rewrite, runner
from optimizer_codemod.config import Settings
from optimizer_codemod.diagnostics import Status

FIXTURE = Path(__file__).parent.parent / "fixtures" / "OPT301" / "keep_convolution_only_gan.py"
GAN = FIXTURE.read_text()


def only_opt301(source: str):
    result = rewrite(source, select=["OPT301"], why_not=True)
    findings = [d for d in result.diagnostics if d.code == "OPT301"]
    assert len(findings) == 1, findings
    return result, findings[0]


def test_torch_keeps_cudnn_convolutions_on_tf32_whatever_the_matmul_precision() -> None:
    torch = pytest.importorskip("torch")
    backends = torch.backends
    before = (backends.cudnn.conv.fp32_precision, backends.cuda.matmul.fp32_precision)
    previous = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("high")
        after = (backends.cudnn.conv.fp32_precision, backends.cuda.matmul.fp32_precision)
    finally:
        torch.set_float32_matmul_precision(previous)
    assert before[0] == after[0] == "tf32"  # convolutions: TF32 already, and unchanged
    assert before[1] != after[1] == "tf32"  # the line changes cuBLAS matmuls only


def test_a_convolution_only_gan_is_declined_with_the_reason() -> None:
    result, finding = only_opt301(GAN)
    assert result.source == GAN and finding.status is Status.DECLINED
    assert "`torch.nn.Conv2d`" in finding.message and "cuBLAS" in finding.message


HANDED_IN_HEAD = (
    ("def __init__(self, ndf=64):", "def __init__(self, head, ndf=64):"),
    (
        "        self.main = nn.Sequential(\n            nn.Conv2d(3",
        "        self.head = head\n        self.main = nn.Sequential(\n            nn.Conv2d(3",
    ),
    ("return self.main(x).flatten()", "return self.head(self.main(x))"),
    ("netD = Discriminator()", "netD = Discriminator(head)"),
)


@pytest.mark.parametrize(
    "changes",
    [
        # a layer that multiplies
        (("nn.Tanh(),", "nn.Tanh(), nn.Flatten(), nn.Linear(12288, 10),"),),
        (("nn.Tanh(),", "nn.Tanh(), nn.LSTM(8, 8),"),),
        (("nn.Tanh(),", "nn.Tanh(), nn.MultiheadAttention(8, 2),"),),
        (
            (
                "nn.Conv2d(ndf, 1, 4, 1, 0, bias=False)",
                "nn.utils.spectral_norm(nn.Conv2d(ndf, 1, 4))",
            ),
        ),
        # a matmul written out, in a model or in the loss
        (("return self.main(z)", "return self.main(z) @ self.main(z)"),),
        (("return self.main(x).flatten()", "return torch.bmm(x, x).flatten()"),),
        (("return self.main(x).flatten()", "return x.mm(x).flatten()"),),
        (
            (
                "fake = netG(noise)",
                "fake = netG(noise)\n    gram = torch.einsum('bchw,bdhw->bcd', fake, fake)",
            ),
        ),
        (("return self.main(z)", "return F.affine_grid(z, z.shape)"),),
        # a function of another module (neural_style's `utils.gram_matrix` runs `bmm`)
        (("fake = netG(noise)", "fake = netG(noise)\n    style = utils.gram_matrix(fake)"),),
        # a model the analysis cannot see whole
        (("netD = Discriminator()", "netD = torchvision.models.vgg11()"),),
        (("netD = Discriminator()", "netD = torch.load('D.pt')"),),
        (("class Discriminator(nn.Module):", "class Discriminator(Base):"),),
        HANDED_IN_HEAD,
        # cuDNN off: convolutions go through im2col and cuBLAS
        (("device = torch", "torch.backends.cudnn.enabled = False\ndevice = torch"),),
    ],
)
def test_anything_that_may_multiply_matrices_keeps_the_fix(changes) -> None:
    source = GAN.replace("import torch.nn as nn", NN_IMPORTS)
    for old, new in changes:
        assert old in source, old
        source = source.replace(old, new, 1)
    result, finding = only_opt301(source)
    assert finding.status is Status.FIXED, finding.message
    assert 'torch.set_float32_matmul_precision("high")' in result.source


NN_IMPORTS = (
    "import torch.nn as nn\nimport torch.nn.functional as F\nimport torchvision\n"
    "import utils\nfrom base import Base"
)


CONV_MODEL = textwrap.dedent("""\
    import torch
    import torch.nn as nn


    class SyncNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.encoder = nn.Sequential(nn.Conv2d(15, 32, 3, padding=1), nn.ReLU())

        def forward(self, x):
            return self.encoder(x){extra}
    """)

TRAIN = textwrap.dedent("""\
    import torch
    from models import SyncNet

    device = torch.device("cuda")
    model = SyncNet().to(device)
    optimizer = torch.optim.Adam(model.parameters())

    if __name__ == "__main__":
        for x in loader:
            loss = model(x.to(device)).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    """)


def statuses(folder: Path, models: str) -> List[str]:
    (folder / "models.py").write_text(models)
    (folder / "train.py").write_text(TRAIN)
    settings = Settings(root=str(folder), why_not=True, select=["OPT301"])
    paths = [str(folder / "models.py"), str(folder / "train.py")]
    found = []
    for outcome in runner.run(paths, settings, runner.Mode(write=False, diff=True), jobs=1):
        assert outcome.error is None, outcome.error
        if outcome.path.endswith("train.py"):
            found.extend(d.status.value for d in outcome.diagnostics)
    return found


@pytest.mark.parametrize(
    "extra, expected",
    [
        ("", Status.DECLINED),
        (" @ x.transpose(-1, -2)", Status.FIXED),
        (".bmm(x)", Status.FIXED),
        (" + nn.functional.linear(x, x)", Status.FIXED),
    ],
)
def test_a_model_class_of_another_module_is_read_for_matmuls(
    tmp_path: Path, extra: str, expected: Status
) -> None:
    assert statuses(tmp_path, CONV_MODEL.replace("{extra}", extra)) == [expected.value]


DATASET = textwrap.dedent("""\
    import audio


    class Spectrograms(torch.utils.data.Dataset):
        def __getitem__(self, index):
            return torch.from_numpy(audio.melspectrogram(index)){placement}

        def __len__(self):
            return 64


    loader = torch.utils.data.DataLoader(Spectrograms(), batch_size=8)
    """)


@pytest.mark.parametrize(
    "placement, expected", [("", Status.DECLINED), (".to(device)", Status.FIXED)]
)
def test_a_dataset_computing_on_the_host_is_not_read_for_matmuls(
    placement: str, expected: Status
) -> None:
    source = GAN.replace(
        "\n\nclass Generator",
        "\n\n" + DATASET.format(placement=placement) + "\n\nclass Generator",
        1,
    )
    assert "audio.melspectrogram" in source
    assert only_opt301(source)[1].status is expected


def test_pytorch_examples_dcgan_shape_is_declined() -> None:
    """pytorch/examples' dcgan: the model's size comes from argparse (`ngpu =
    int(opt.ngpu)`), its forward runs `nn.parallel.data_parallel` over several GPUs."""
    source = GAN.replace(
        "import torch\n",
        "import argparse\n\nimport torch\n\nparser = argparse.ArgumentParser()\n"
        "parser.add_argument('--ngpu', type=int, default=1)\nopt = parser.parse_args()\n"
        "ngpu = int(opt.ngpu)\n",
        1,
    )
    source = source.replace(
        "def __init__(self, nz=100, ngf=64):", "def __init__(self, ngpu, nz=100, ngf=64):"
    )
    source = source.replace(
        "return self.main(z)", "return nn.parallel.data_parallel(self.main, z, range(ngpu))"
    )
    source = source.replace("netG = Generator()", "netG = Generator(ngpu)")
    assert source.count("ngpu") == 6
    result, finding = only_opt301(source)
    assert finding.status is Status.DECLINED, finding.message
