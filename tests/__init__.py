"""The suite (tests/README.md maps it). ``CHECKOUT``: the checkout's root, the directory holding tests/."""

import os

CHECKOUT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
