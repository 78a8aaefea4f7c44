"""Line diffs of a file against its rewrite, in time linear in the file's length.

`difflib.SequenceMatcher(autojunk=False)` looks for the longest matching block first, which
costs the product of the occurrences of each line in both texts: quadratic in a file whose
lines repeat (blank lines, `return x`, a block pasted into many functions). A rewrite changes
a few lines, so the texts are cut first into short regions that can only be aligned one way:
around their common prefix and suffix, and at lines that occur once in each text and in the
same order (patience diff's anchors). SequenceMatcher then aligns each region on its own.

Where several alignments are equally short (which of two blank lines is the inserted one),
regions can resolve them otherwise than SequenceMatcher over the whole text, and the lines a
diff calls changed decide what gets formatted. So SequenceMatcher's own answer is kept
whenever it comes cheaply: it runs first with a budget of steps linear in the texts' length
(enough for any ordinary file), and the region-by-region diff is used only past that budget.
"""

from __future__ import annotations

import difflib
from bisect import bisect_left
from typing import Dict, Hashable, List, Sequence, Tuple

Opcode = Tuple[str, int, int, int, int]
# Regions up to this many lines (both sides together) go to SequenceMatcher whole.
SMALL_REGION = 400
# SequenceMatcher's steps allowed before the region-by-region diff takes over: a floor that
# covers ordinary files (the most any of the 281 training scripts of the speed corpus took:
# 88,000, a 1,114-line file), plus a share per line. About 30 ms of work.
BUDGET_FLOOR = 100_000
BUDGET_PER_LINE = 20


class _OverBudget(Exception):
    pass


class _BudgetedMatcher(difflib.SequenceMatcher):
    """SequenceMatcher (no junk) whose search counts its steps and stops past a budget.

    The search is SequenceMatcher.find_longest_match's, except that it starts each line's
    occurrences at the region with a bisection instead of skipping them one by one: same
    answers, and the steps counted are the ones that depend on the region.
    """

    def __init__(self, a: Sequence[Hashable], b: Sequence[Hashable], budget: int) -> None:
        super().__init__(None, a, b, autojunk=False)
        self.budget = budget

    def find_longest_match(self, alo=0, ahi=None, blo=0, bhi=None):
        a, b, b2j = self.a, self.b, self.b2j
        ahi = len(a) if ahi is None else ahi
        bhi = len(b) if bhi is None else bhi
        besti, bestj, bestsize = alo, blo, 0
        j2len: Dict[int, int] = {}
        nothing: List[int] = []
        steps = 0
        for i in range(alo, ahi):
            j2lenget = j2len.get
            newj2len: Dict[int, int] = {}
            occurrences = b2j.get(a[i], nothing)
            first = bisect_left(occurrences, blo)
            for j in occurrences[first : bisect_left(occurrences, bhi, first)]:
                k = newj2len[j] = j2lenget(j - 1, 0) + 1
                if k > bestsize:
                    besti, bestj, bestsize = i - k + 1, j - k + 1, k
            steps += 1 + len(newj2len)
            j2len = newj2len
        self.budget -= steps
        if self.budget < 0:
            raise _OverBudget
        # Without junk, the longest block ending at each pair is already maximal: no
        # extension at either end (SequenceMatcher's junk loops find nothing to add).
        return difflib.Match(besti, bestj, bestsize)


def opcodes(a: Sequence[Hashable], b: Sequence[Hashable]) -> List[Opcode]:
    """`SequenceMatcher(None, a, b, autojunk=False).get_opcodes()` when that comes within a
    budget linear in the texts' length; else the diff computed region by region."""
    budget = BUDGET_FLOOR + BUDGET_PER_LINE * (len(a) + len(b))
    if _first_search_cost(a, b) <= budget:
        try:
            return _BudgetedMatcher(a, b, budget).get_opcodes()
        except _OverBudget:
            pass
    blocks: List[Tuple[int, int, int]] = []
    _match(a, b, 0, len(a), 0, len(b), blocks)
    return _to_opcodes(_collapsed(blocks), len(a), len(b))


def _first_search_cost(a: Sequence[Hashable], b: Sequence[Hashable]) -> int:
    """The steps of SequenceMatcher's first search (the whole texts): the pairs of equal lines."""
    counts: Dict[Hashable, int] = {}
    for line in b:
        counts[line] = counts.get(line, 0) + 1
    return sum(counts.get(line, 0) for line in a)


def _match(a, b, alo: int, ahi: int, blo: int, bhi: int, blocks: List[Tuple[int, int, int]]):
    """Append the matching blocks (i, j, n) of a[alo:ahi] and b[blo:bhi], in order."""
    start = 0
    while alo + start < ahi and blo + start < bhi and a[alo + start] == b[blo + start]:
        start += 1
    if start:
        blocks.append((alo, blo, start))
    alo, blo = alo + start, blo + start
    end = 0
    while alo < ahi - end and blo < bhi - end and a[ahi - end - 1] == b[bhi - end - 1]:
        end += 1
    ahi, bhi = ahi - end, bhi - end
    if alo < ahi and blo < bhi:
        anchors = _anchors(a, b, alo, ahi, blo, bhi) if ahi - alo + bhi - blo > SMALL_REGION else []
        if anchors:
            i0, j0 = alo, blo
            for i, j in anchors:
                _match(a, b, i0, i, j0, j, blocks)
                blocks.append((i, j, 1))
                i0, j0 = i + 1, j + 1
            _match(a, b, i0, ahi, j0, bhi, blocks)
        else:
            matcher = difflib.SequenceMatcher(None, a[alo:ahi], b[blo:bhi], autojunk=False)
            for i, j, n in matcher.get_matching_blocks():
                if n:
                    blocks.append((alo + i, blo + j, n))
    if end:
        blocks.append((ahi, bhi, end))


def _anchors(a, b, alo: int, ahi: int, blo: int, bhi: int) -> List[Tuple[int, int]]:
    """Pairs (i, j) of lines unique on each side, equal, forming the longest run increasing
    on both sides (patience sorting)."""
    seen_a: Dict[Hashable, int] = {}
    for i in range(alo, ahi):
        seen_a[a[i]] = -1 if a[i] in seen_a else i
    seen_b: Dict[Hashable, int] = {}
    for j in range(blo, bhi):
        if seen_a.get(b[j], -1) >= 0:
            seen_b[b[j]] = -1 if b[j] in seen_b else j
    pairs = sorted((seen_a[line], j) for line, j in seen_b.items() if j >= 0)
    # Longest increasing subsequence of j, keeping back-links to rebuild it.
    tails: List[int] = []  # tails[k]: index in `pairs` ending the best run of length k + 1
    tail_js: List[int] = []
    back: List[int] = []
    for index, (_, j) in enumerate(pairs):
        k = bisect_left(tail_js, j)
        back.append(tails[k - 1] if k else -1)
        if k == len(tails):
            tails.append(index)
            tail_js.append(j)
        else:
            tails[k] = index
            tail_js[k] = j
    run: List[Tuple[int, int]] = []
    index = tails[-1] if tails else -1
    while index >= 0:
        run.append(pairs[index])
        index = back[index]
    return run[::-1]


def _collapsed(blocks: List[Tuple[int, int, int]]) -> List[Tuple[int, int, int]]:
    merged: List[Tuple[int, int, int]] = []
    for i, j, n in blocks:
        if merged and merged[-1][0] + merged[-1][2] == i and merged[-1][1] + merged[-1][2] == j:
            i0, j0, n0 = merged[-1]
            merged[-1] = (i0, j0, n0 + n)
        else:
            merged.append((i, j, n))
    return merged


def _to_opcodes(blocks: List[Tuple[int, int, int]], la: int, lb: int) -> List[Opcode]:
    # As SequenceMatcher.get_opcodes does from its matching blocks.
    i = j = 0
    answer: List[Opcode] = []
    for ai, bj, size in [*blocks, (la, lb, 0)]:
        tag = ""
        if i < ai and j < bj:
            tag = "replace"
        elif i < ai:
            tag = "delete"
        elif j < bj:
            tag = "insert"
        if tag:
            answer.append((tag, i, ai, j, bj))
        i, j = ai + size, bj + size
        if size:
            answer.append(("equal", ai, i, bj, j))
    return answer
