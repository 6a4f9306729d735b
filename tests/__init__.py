"""The suite (tests/README.md maps it). ``CHECKOUT``: the checkout's root, the directory holding tests/."""

import os

CHECKOUT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def soak_or(quick: int, soak: int) -> int:
    """A size for a test whose full run is a soak: ``soak`` under `make soak` (``MCC_SOAK=1``), else
    ``quick``, so `make test` keeps the same run, shorter (tests/README.md)."""
    return soak if os.environ.get("MCC_SOAK") == "1" else quick
