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

from typing import TYPE_CHECKING, FrozenSet, Optional

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


def torch_sparse_use(facts: "ScriptFacts") -> Optional[cst.CSTNode]:
    """The first import or call of the file that names torch_sparse (`import torch_sparse`,
    `from torch_geometric.typing import SparseTensor`, `T.ToSparseTensor()`), or None."""
    return _first_use(facts, TORCH_SPARSE_NAMES)


def feature_knn_use(facts: "ScriptFacts") -> Optional[cst.CSTNode]:
    """The first import or call of the file that names `DynamicEdgeConv`, or None."""
    return _first_use(facts, FEATURE_KNN_NAMES)


def _first_use(facts: "ScriptFacts", names: FrozenSet[str]) -> Optional[cst.CSTNode]:
    memo = facts.memo("graph_library_use")
    if names not in memo:
        memo[names] = _first_use_of(facts, names)
    return memo[names]


def _first_use_of(facts: "ScriptFacts", names: FrozenSet[str]) -> Optional[cst.CSTNode]:
    for binding in facts.imports.bindings:
        if names & set(binding.target.split(".")):
            return binding.statement
    for call in facts.records.calls:
        if names & set(code_of(call.node.func).strip().split(".")):
            return call.node
    return None


def pyg_layer_use(facts: "ScriptFacts") -> Optional[cst.CSTNode]:
    """The first import or call of the file that names `torch_geometric.nn` (its layers,
    pooling and models), or `torch_scatter`; None when none."""
    memo = facts.memo("pyg_layer_use")
    if None not in memo:
        memo[None] = _pyg_layer_use(facts)
    return memo[None]


def _pyg_layer_use(facts: "ScriptFacts") -> Optional[cst.CSTNode]:
    for binding in facts.imports.bindings:
        if _pyg_layers(binding.target):
            return binding.statement
    for call in facts.records.calls:
        if _pyg_layers(call.qualname or ""):
            return call.node
    return None


def _pyg_layers(name: str) -> bool:
    return name.split(".")[0] == "torch_scatter" or (
        name == "torch_geometric.nn" or name.startswith("torch_geometric.nn.")
    )
