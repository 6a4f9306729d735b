"""The Gym tier's shared fixture: NeMo Gym 0.7.0's interpreter (its cached venv), or a skip saying why."""

from __future__ import annotations

import pytest

from .gym_venv import GymUnavailable, gym_python


@pytest.fixture(scope="module")
def gym() -> str:
    try:
        return gym_python()
    except GymUnavailable as exc:
        pytest.skip(f"NeMo Gym 0.7.0 is not available here: {exc}")
