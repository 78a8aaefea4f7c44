"""OPT410 names what varies batch shapes in a model class of another module by what its
layers do: Tacotron2's encoder packs sequences of varying length and resizes no image (round-3
reading found "`Encoder` from model.py resizes each image")."""

from __future__ import annotations

import textwrap
from pathlib import Path

from optimizer_codemod import runner
from optimizer_codemod.config import Settings

MODEL = textwrap.dedent("""\
    import torch.nn as nn
    from torch.nn.utils.rnn import pack_padded_sequence


    class Encoder(nn.Module):
        def __init__(self):
            super().__init__()
            self.lstm = nn.LSTM(8, 8, batch_first=True)

        def forward(self, x, lengths):
            return self.lstm(pack_padded_sequence(x, lengths, batch_first=True))[1][0][-1]
    """)

TRAIN = textwrap.dedent("""\
    import torch
    from model import Encoder

    if __name__ == "__main__":
        model = Encoder().cuda()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for x, lengths, y in loader:
            loss = torch.nn.functional.mse_loss(model(x.cuda(), lengths), y.cuda())
            loss.backward()
            opt.step()
            opt.zero_grad()
    """)


def test_a_sequence_model_of_another_module_is_said_to_take_varying_lengths(
    tmp_path: Path,
) -> None:
    (tmp_path / "model.py").write_text(MODEL)
    (tmp_path / "train.py").write_text(TRAIN)
    settings = Settings(root=str(tmp_path), select=["OPT410"])
    paths = [str(tmp_path / "model.py"), str(tmp_path / "train.py")]
    messages = [
        d.message
        for outcome in runner.run(paths, settings, runner.Mode(write=False, diff=True), jobs=1)
        for d in outcome.diagnostics
    ]
    (message,) = messages
    assert "`Encoder` from model.py takes sequences of varying length" in message
    assert "`pack_padded_sequence`" in message
    assert "image" not in message
