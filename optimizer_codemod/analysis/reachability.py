"""Whether a node of a graph reaches a seed: one walk per node, whatever the cycles.

Name-following questions ("may this value live on the device?") walk a graph of values,
names and definitions in which cycles are common (`vocab = self.vocab` in one method,
`self.vocab = vocab` in another). A depth limit cuts such a cycle by guessing; a visited set
alone cannot keep a "no" found inside a cycle, since the cycle's entry point was still open.
Tarjan's strongly connected components settle a whole cycle at once: every member reaches a
seed exactly when one of them, or a component after them, does. Answers are kept in `memo`,
so each node and edge is walked once per memo, over any number of questions.
"""

from __future__ import annotations

from typing import Callable, Dict, Hashable, Iterable, Iterator, List, Tuple


def reaches_seed(
    start: Hashable,
    successors: Callable[[Hashable], Iterable[Hashable]],
    is_seed: Callable[[Hashable], bool],
    memo: Dict[Hashable, bool],
) -> bool:
    """Whether `start`, or a node reachable from it through `successors`, is a seed.

    A seed's successors are never asked for. `memo` keeps the answer of every node whose
    component was settled; pass the same dict to every question about one graph.
    """
    if start in memo:
        return memo[start]
    order: Dict[Hashable, int] = {}
    low: Dict[Hashable, int] = {}
    hit: Dict[Hashable, bool] = {}
    open_nodes: List[Hashable] = []
    on_path = set()
    frames: List[Tuple[Hashable, Iterator[Hashable]]] = []

    def enter(node: Hashable) -> None:
        order[node] = low[node] = len(order)
        hit[node] = is_seed(node)
        open_nodes.append(node)
        on_path.add(node)
        frames.append((node, iter(() if hit[node] else successors(node))))

    enter(start)
    while frames:
        node, pending = frames[-1]
        descended = False
        for successor in pending:
            if successor in memo:
                hit[node] = hit[node] or memo[successor]
            elif successor not in order:
                enter(successor)
                descended = True
                break
            elif successor in on_path:
                low[node] = min(low[node], order[successor])
        if descended:
            continue
        frames.pop()
        if low[node] == order[node]:
            members = []
            while True:
                member = open_nodes.pop()
                on_path.discard(member)
                members.append(member)
                if member is node:
                    break
            answer = any(hit[m] for m in members)
            for member in members:
                memo[member] = answer
        if frames:
            parent = frames[-1][0]
            low[parent] = min(low[parent], low[node])
            hit[parent] = hit[parent] or memo.get(node, hit[node])
    return memo[start]
