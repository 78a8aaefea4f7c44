"""Where a file uses the CUDA kernels of PyG's companion libraries, which have no bfloat16
version: torch_sparse's matrix product (`spmm_sum`) and the k-nearest-neighbour search of
pyg-lib and torch_cluster that `DynamicEdgeConv` runs on learned features.

Both dispatch `AT_DISPATCH_FLOATING_TYPES_AND(at::ScalarType::Half, ...)` and register no
autocast rule, so a bfloat16 input raises "not implemented for 'BFloat16'" on CUDA
(rusty1s/pytorch_sparse `csrc/cuda/spmm_cuda.cu` at 91feaa5e, pyg-team/pyg-lib
`pyg_lib/csrc/ops/cuda/knn_kernel.cu` at cc670773, rusty1s/pytorch_cluster
`csrc/cuda/knn_cuda.cu` at 004a0d53).

And where PyG's layers aggregate at all: `torch_geometric.utils.scatter` sums messages with
`scatter_add_` into a tensor of the messages' dtype, and counts neighbours for a mean the
same way (`count = src.new_zeros(...).scatter_add_(0, index, src.new_ones(...))`,
torch_geometric/utils/_scatter.py at 5c6461b2). On CUDA each atomic add rounds to that dtype,
and bfloat16's integers stop at 256: a node with more neighbours, or a graph with more
nodes under `global_mean_pool`, gets a wrong count and sum (`index_add_`, which adds one
at a time on the CPU too, counts 1,000 ones as 256: tests/test_autocast_declines.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, FrozenSet, Optional

import libcst as cst

from optimizer_codemod.analysis.calls import code_of

if TYPE_CHECKING:  # pragma: no cover
    from optimizer_codemod.analysis.script import ScriptFacts

# What names torch_sparse in a file: the package, its `SparseTensor` (also re-exported by
# `torch_geometric.typing`) and PyG's transform that builds one.
TORCH_SPARSE_NAMES = frozenset({"torch_sparse", "SparseTensor", "ToSparseTensor"})
# PyG's layer that searches the k nearest neighbours of each node's features, not of its
# input positions (PointNet++'s `radius(pos, ...)` reads float32 data): under autocast those
# features are a Linear's bfloat16 output.
FEATURE_KNN_NAMES = frozenset({"DynamicEdgeConv"})
# PyG's temporal graph network, whose memory module encodes time differences in seconds
# (analysis/phases.py).
TGN_NAMES = frozenset({"TGNMemory", "TimeEncoder"})


def torch_sparse_use(facts: "ScriptFacts") -> Optional[cst.CSTNode]:
    """The first import or call of the file that names torch_sparse (`import torch_sparse`,
    `from torch_geometric.typing import SparseTensor`, `T.ToSparseTensor()`), or None."""
    return _first_use(facts, "torch_sparse", _naming(TORCH_SPARSE_NAMES))


def feature_knn_use(facts: "ScriptFacts") -> Optional[cst.CSTNode]:
    """The first import or call of the file that names `DynamicEdgeConv`, or None."""
    return _first_use(facts, "feature_knn", _naming(FEATURE_KNN_NAMES))


def tgn_use(facts: "ScriptFacts") -> Optional[cst.CSTNode]:
    """The first import or call of the file that names PyG's TGN, or None."""
    return _first_use(facts, "tgn", _naming(TGN_NAMES))


def pyg_layer_use(facts: "ScriptFacts") -> Optional[cst.CSTNode]:
    """The first import or call of the file that names `torch_geometric.nn` (its layers,
    pooling and models), or `torch_scatter`; None when none."""
    return _first_use(facts, "pyg_layers", _pyg_layers)


def _naming(names: FrozenSet[str]) -> Callable[[str], bool]:
    return lambda dotted: bool(names & set(dotted.split(".")))


def _pyg_layers(dotted: str) -> bool:
    return dotted.split(".")[0] == "torch_scatter" or (
        dotted == "torch_geometric.nn" or dotted.startswith("torch_geometric.nn.")
    )


def _first_use(
    facts: "ScriptFacts", key: str, names: Callable[[str], bool]
) -> Optional[cst.CSTNode]:
    """The first import whose target, or else call whose qualified name or code as written,
    `names` accepts; memoised under `key`."""
    memo = facts.memo("graph_library_use")
    if key not in memo:
        memo[key] = next(
            (b.statement for b in facts.imports.bindings if names(b.target)), None
        ) or next(
            (
                c.node
                for c in facts.records.calls
                if names(c.qualname or "") or names(code_of(c.node.func).strip())
            ),
            None,
        )
    return memo[key]
