"""Runtime verification: run a training script before and after the rewrite and compare.

- `probe`: runs any script, unchanged, in a subprocess with hooks that record the loss at each
  `backward`, the time between optimizer steps and the peak memory; stops after N steps.
- `runner`: starts probe subprocesses and reads their results.
- `equivalence`: tolerances per safety level, loss-curve comparison, `verify_pair` and
  `verify_script` (what `optcodemod verify` runs), the result table.
- `doctor`: what this machine offers a training script, and which rules pay off on it.

Importing this package does not import torch: only the probe subprocess and `doctor` need it.
"""

from __future__ import annotations

__all__ = ["verify_pair", "verify_script", "VerifyReport"]


def __getattr__(name: str):
    if name in __all__:
        from optimizer_codemod.verify import equivalence

        return getattr(equivalence, name)
    raise AttributeError(name)
