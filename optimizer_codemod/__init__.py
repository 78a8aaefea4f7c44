"""optcodemod: a source-to-source optimizer for PyTorch training scripts.

`rewrite(source, ...)` is the Python API; the `optcodemod` command is built on it.
"""

__version__ = "0.1.0"

__all__ = ["rewrite", "Rewritten", "__version__"]


def __getattr__(name: str):
    # Imported lazily so that `import optimizer_codemod` stays cheap for the CLI's workers.
    if name in ("rewrite", "Rewritten"):
        from optimizer_codemod import api

        return getattr(api, name)
    raise AttributeError(name)
