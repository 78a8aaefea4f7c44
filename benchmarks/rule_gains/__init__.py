"""Micro-benchmarks, one module per rule: the pattern before and after the rewrite.

Each module defines CODE, WHAT (one line: what is timed) and measure(repeats) returning
{"before_s": seconds, "after_s": seconds}: medians of the same work written both ways,
timed in the same process. `python benchmarks/rule_gains.py` runs them and writes
benchmarks/results/rule-gains-<device>.json with the machine, torch version and date.
"""
