"""Gym's token-capture modules wherever the installed Gym keeps them (issue 72, point 5): NeMo Gym
0.7.0 ships them as ``nemo_gym.token_id_capture.<module>``; its main branch moved them under
``nemo_gym.models.token_capture``. The scripts the Gym tier runs in Gym's venv start with
`FINDER` and ask `gym_token_capture(name)` for a module, so the tier runs on either layout.
"""

from __future__ import annotations

#: Where each Gym release keeps the token-capture package, newest last.
GYM_TOKEN_CAPTURE_PACKAGES = ("nemo_gym.token_id_capture", "nemo_gym.models.token_capture")

#: Python source defining ``gym_token_capture(name)``: the module ``name`` of the first package of
#: `GYM_TOKEN_CAPTURE_PACKAGES` that has it. A module that exists and fails to import raises as
#: itself (a broken Gym is not a missing one).
FINDER = f'''
import importlib as _importlib


def gym_token_capture(name):
    tried = []
    for package in {GYM_TOKEN_CAPTURE_PACKAGES!r}:
        try:
            return _importlib.import_module(package + "." + name)
        except ModuleNotFoundError as missing:
            parents = {{package + "." + name}} | {{package.rsplit(".", depth)[0] for depth in range(package.count(".") + 1)}}
            if missing.name not in parents:
                raise
            tried.append(package + "." + name)
    raise ModuleNotFoundError("NeMo Gym's token capture module " + repr(name) + " is in none of " + ", ".join(tried))
'''
