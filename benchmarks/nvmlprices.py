"""What NVML charges, for the benchmarks that pay it (issue 32): the H200's prices per call from the fake's
cost table (``tests/fake_nvml.py``). What a GPU host cannot avoid per sample is measured instead, by the
minimal sampler (:mod:`benchmarks.minimal`)."""

from __future__ import annotations

import os
import sys

from benchmarks.common import ROOT


def tests_on_path() -> None:
    """``tests/`` importable: the NVML replay (``fake_nvml``, ``nvml_shim``) lives there."""
    tests = os.path.join(ROOT, "tests")
    if tests not in sys.path:
        sys.path.insert(0, tests)


def nvml_prices(load: str = "idle") -> dict:
    """Microseconds of CPU per NVML call on the H200 (``tests/fake_nvml.py``'s cost table)."""
    tests_on_path()
    from fake_nvml import prices

    return prices(load)
