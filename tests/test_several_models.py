"""Rules that change how a model is trained, in files that train several models (a GAN's
generator and discriminator, issue 15): OPT302 wraps every step or none, OPT407 converts
each convnet."""

from __future__ import annotations

from pathlib import Path

from optimizer_codemod import rewrite
from optimizer_codemod.diagnostics import Status

GAN = (Path(__file__).resolve().parent.parent / "fixtures/OPT302/fix_gan_two_models.py").read_text()


def _opt302(source: str, **options):
    result = rewrite(source, select=["OPT302"], why_not=True, **options)
    return result, [d for d in result.diagnostics if d.code == "OPT302"]


def test_each_step_of_a_gan_is_wrapped_once() -> None:
    result, findings = _opt302(GAN)
    assert [d.status for d in findings] == [Status.FIXED]
    assert "`generator`, `discriminator` are trained" in findings[0].message
    assert result.source.count('with torch.autocast("cuda", dtype=torch.bfloat16):') == 2
    # The discriminator's step starts after the generator's backward, not at `generator(...)`.
    generator_step, discriminator_step = result.source.split("loss_G.backward()")
    assert "        fake_B = generator(real_A)" in generator_step
    assert "        pred_real = discriminator(real_B, real_A)" in discriminator_step
    assert "    loss_D.backward()" in discriminator_step


def test_float16_shares_one_scaler_updated_after_the_last_step() -> None:
    result, findings = _opt302(GAN, precision="fp16")
    assert [d.status for d in findings] == [Status.FIXED]
    loop = result.source.split("for i in range(3):")[1]
    assert [line.strip() for line in loop.splitlines() if "scaler" in line] == [
        "scaler.scale(loss_G).backward()",
        "scaler.step(optimizer_G)",
        "scaler.scale(loss_D).backward()",
        "scaler.step(optimizer_D)",
        "scaler.update()",
    ]
    assert result.source.count("GradScaler(") == 1


def test_float16_with_a_generator_trained_every_other_step_is_declined() -> None:
    """`update()` after the discriminator's step would skip iterations where only it steps,
    and a second `scaler.step(optimizer_D)` before an update raises: no scaler is placed."""
    generator_step = GAN[
        GAN.index("    optimizer_G.zero_grad()") : GAN.index("    optimizer_D.zero_grad()")
    ]
    conditional = "    if i % 2 == 0:\n" + "".join(
        f"    {line}\n" if line else "\n" for line in generator_step.splitlines()
    )
    source = GAN.replace(generator_step, conditional)
    result, findings = _opt302(source, precision="fp16")
    assert result.source == source
    assert [d.status for d in findings] == [Status.DECLINED]
    assert "several models with their own optimizers" in findings[0].message
    assert "once per iteration after the last step" in findings[0].message
    # bfloat16 needs no scaler: both steps are wrapped.
    result, findings = _opt302(source)
    assert [d.status for d in findings] == [Status.FIXED]
    assert result.source.count("torch.autocast(") == 2


def test_a_recurrent_discriminator_keeps_both_models_in_float32() -> None:
    source = GAN.replace(
        "        self.model = nn.Sequential(",
        "        self.rnn = nn.LSTM(8, 8)\n        self.model = nn.Sequential(",
    )
    result, findings = _opt302(source)
    assert result.source == source
    assert [d.status for d in findings] == [Status.DECLINED]
    assert "`discriminator` has a cuDNN recurrent layer" in findings[0].message


def test_a_read_of_a_model_attribute_does_not_start_the_forward() -> None:
    source = GAN.replace(
        "    valid = Tensor(np.ones((real_A.size(0), *patch)))",
        "    valid = Tensor(np.ones((real_A.size(0), *discriminator.patch)))",
    ).replace(
        "        super().__init__()\n        self.model",
        "        super().__init__()\n        self.patch = (1, 8, 8)\n        self.model",
    )
    result, findings = _opt302(source)
    assert [d.status for d in findings] == [Status.FIXED]
    assert "    valid = Tensor(np.ones((real_A.size(0), *discriminator.patch)))" in result.source


def test_each_convnet_of_a_gan_gets_channels_last_once() -> None:
    result = rewrite(GAN, select=["OPT407"], why_not=True)
    assert result.source.count("= generator.to(memory_format=torch.channels_last)") == 1
    assert result.source.count("= discriminator.to(memory_format=torch.channels_last)") == 1
    assert [d.status for d in result.diagnostics] == [Status.FIXED, Status.FIXED]


def test_float16_steps_an_optimizer_shared_by_two_models_through_the_scaler() -> None:
    """InfoGAN's third optimizer, over the parameters of both models, is no model's first:
    its step must go through the scaler too, before the one update."""
    source = GAN.replace(
        "optimizer_D = torch.optim.Adam(discriminator.parameters(), lr=2e-4, betas=(0.5, 0.999))\n",
        "optimizer_D = torch.optim.Adam(discriminator.parameters(), lr=2e-4, betas=(0.5, 0.999))\n"
        "optimizer_info = torch.optim.Adam(\n"
        "    itertools.chain(generator.parameters(), discriminator.parameters()), lr=2e-4\n"
        ")\n",
    ).replace(
        "    optimizer_D.step()\n",
        "    optimizer_D.step()\n\n"
        "    optimizer_info.zero_grad()\n"
        "    info_loss = criterion_pixelwise(generator(real_A), real_B)\n"
        "    info_loss.backward()\n"
        "    optimizer_info.step()\n",
    )
    source = "import itertools\n" + source
    result, findings = _opt302(source, precision="fp16")
    assert [d.status for d in findings] == [Status.FIXED]
    loop = result.source.split("for i in range(3):")[1]
    assert [line.strip() for line in loop.splitlines() if "scaler" in line][-3:] == [
        "scaler.scale(info_loss).backward()",
        "scaler.step(optimizer_info)",
        "scaler.update()",
    ]
