"""Runtime verification: run a training script and a candidate, and judge whether they agree.

- `probe`: runs any script, unchanged, in a subprocess with hooks that record the loss at each
  `backward`, the time between training iterations and the peak memory; stops after N of them.
- `checks` and `state` (inside the probe): the local-error check, which steps a candidate from
  the original's recorded training state, and the perturbation of reference runs.
- `runner`: starts probe subprocesses and reads their results.
- `judgment`: tolerances per safety level; the local and trajectory checks (no torch).
- `equivalence`: `verify_pair` and `verify_script` (what `optcodemod verify` runs), the report.
- `project`: the local modules a driver imports, rewritten together in a shadow folder.
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
