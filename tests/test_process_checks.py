"""Tests that only ask which process this is hold on every step of that process (syncs.py)."""

from __future__ import annotations

import libcst as cst
import pytest

from optimizer_codemod.analysis.syncs import is_process_check


@pytest.mark.parametrize(
    "test",
    [
        "RANK in {-1, 0}",
        "rank == 0",
        "args.rank % ngpus_per_node == 0",
        "local_rank in [-1, 0]",
        "dist.get_rank() == 0",
        "torch.distributed.get_rank() != 0",
        "master_process",
        "accelerator.is_main_process",
        "utils.is_main_process()",
        "not is_master",
        "RANK in (-1, 0) and master_process",
    ],
)
def test_a_rank_or_main_process_test_is_a_process_check(test: str) -> None:
    assert is_process_check(cst.parse_expression(test))


@pytest.mark.parametrize(
    "test",
    [
        "i % 10 == 0",
        "rank == 0 and i % 10 == 0",  # every tenth step of that process
        "step == rank",  # compares with the step
        "rank == world_size - 1",  # a name, not a number: may change
        "is_main_process(step)",  # a call with arguments
        "loss.item() > 0",
        "ranking == 0",
    ],
)
def test_other_tests_are_not(test: str) -> None:
    assert not is_process_check(cst.parse_expression(test))
