"""Shared test set-up: hypothesis profiles (CI's is derandomized, so a run is repeatable)."""
from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci",
    derandomize=True,  # same examples on every run: CI cannot flake
    deadline=None,  # shared, noisy machines: no per-example time limit
    max_examples=100,
    suppress_health_check=[HealthCheck.too_slow],
    print_blob=True,
)
settings.register_profile("dev", deadline=None, max_examples=100)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev"))
