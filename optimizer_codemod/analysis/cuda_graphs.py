"""Where a script captures CUDA graphs, and where a value it computes is about them.

A CUDA graph replays the kernels it recorded at the addresses it recorded: the memory a
captured step reads and writes (gradients among it) must stay where it was. Rules that
change when memory is allocated or freed ask here first.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, List, Optional

import libcst as cst

from optimizer_codemod.analysis.calls import keyword, literal
from optimizer_codemod.analysis.nodes import find_all

if TYPE_CHECKING:
    from optimizer_codemod.analysis.script import ScriptFacts

# Modes that capture CUDA graphs (torch._inductor.list_mode_options: "triton.cudagraphs").
CUDA_GRAPH_MODES = ("reduce-overhead", "max-autotune")
CAPTURE_FUNCTIONS = (
    "torch.cuda.graph",
    "torch.cuda.CUDAGraph",
    "torch.cuda.make_graphed_callables",
    "torch.cuda.graphs.graph",
    "torch.cuda.graphs.CUDAGraph",
    "torch.cuda.graphs.make_graphed_callables",
)


def compile_calls(facts: "ScriptFacts") -> List[cst.Call]:
    """Every `torch.compile(...)` and `.compile(...)` call, once each, in source order."""
    found = {}
    for site in facts.calls_to("torch.compile") + facts.method_calls("compile"):
        found.setdefault(id(site.node), site)
    return [site.node for site in sorted(found.values(), key=lambda site: site.site.order)]


def graph_mode(call: cst.Call) -> Optional[str]:
    """The CUDA-graph mode a compile call asks for (`mode="reduce-overhead"`), if any."""
    mode = keyword(call, "mode")
    value = literal(mode.value, None) if mode is not None else None
    return value if value in CUDA_GRAPH_MODES else None


def cuda_graph_captures(facts: "ScriptFacts") -> List[cst.Call]:
    """The calls that capture CUDA graphs: `torch.cuda.graph`/`CUDAGraph`/
    `make_graphed_callables`, and compiling in a CUDA-graph mode."""
    captures = [site.node for site in facts.calls_to(*CAPTURE_FUNCTIONS)]
    return captures + [call for call in compile_calls(facts) if graph_mode(call) is not None]


def names_a_graph(node: cst.BaseExpression) -> bool:
    """`node` reads a name or attribute about graphs (`config.disable_cuda_graphs`,
    `use_cudagraphs`): a value the script chose with CUDA graphs in mind."""
    return any("graph" in name.value.lower() for name in find_all(node, cst.Name))
