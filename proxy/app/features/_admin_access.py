"""Who may change state (docs/operations.md, "Who may change state"): the runner's and the trainer's
admin token. An admin request that changes what the trainer is told (an end, the run's end, a weight
version) needs ``Authorization: Bearer <token>``; an agent, which holds only the model port and its
API key, never has it. Without a token (and without ``--open-admin``) such requests are refused.
"""

from __future__ import annotations

import hmac
from typing import Any, Optional

import orjson

from ...http import ServerRequest
from ._declaration import Feature, Option, SettingsBase

_LISTEN = "Forward and listen"


class AdminAccessFeature(Feature):
    """The admin token: from ``MCC_ADMIN_TOKEN``, the YAML file or ``--admin-token-file``, never a flag."""

    name = "admin access"
    options = (
        #: A file holding the admin token (a Kubernetes Secret mounted as a file), read at start.
        Option("admin_token_file", str | None, None, "A file holding the runner's and trainer's token (or set "
               "MCC_ADMIN_TOKEN; never a flag: it would show in ps): admin requests that change state (POST "
               "/-/rollouts/<id>/end, POST /-/run/end, POST /-/weight-version) need Authorization: Bearer <token>; "
               "model calls never do. Without a token they are refused.", _LISTEN, metavar="FILE"),
        #: Let whatever reaches the port change state with no token (a trusted single-user setup only).
        Option("open_admin", bool, False, "Let whatever reaches the port end rollouts and declare weight versions "
               "with no token: an agent could post its own reward (a trusted single-user setup only; off by "
               "default).", _LISTEN),
        #: The runner's and the trainer's token. Never a flag (a flag shows in ``ps``): ``--admin-token``
        #: is refused with the way to give it.
        Option("admin_token", str | None, None, secret=True,
               refused_flag="a token on the command line shows in ps (for the supervisor and every worker): set "
                            "MCC_ADMIN_TOKEN, or put it in a file and pass --admin-token-file FILE",
               meaning="the runner's and the trainer's token: admin requests that change state (POST "
                       "`/-/rollouts/<id>/end`, POST /-/run/end, POST /-/weight-version) need `Authorization: "
                       "Bearer <token>`, and without one they are refused (docs/operations.md, \"Who may change "
                       "state\"); an environment variable (a Kubernetes Secret), the YAML file or "
                       "`--admin-token-file`, never a flag"),
    )

    @classmethod
    def given(cls, values: dict[str, Any]) -> dict[str, Any]:
        """``--admin-token-file``: the token read at start (a Secret mounted as a file)."""
        path = values.get("admin_token_file")
        if path is None:
            return values
        if values.get("admin_token") is not None:
            raise ValueError("the admin token is given twice (MCC_ADMIN_TOKEN and --admin-token-file): give one")
        try:
            with open(str(path), encoding="utf-8") as handle:
                token = handle.read().strip()
        except OSError as exc:
            raise ValueError(f"--admin-token-file {path}: {exc.strerror or exc}") from None
        if not token:
            raise ValueError(f"--admin-token-file {path} is empty")
        return {**values, "admin_token": token}

    @classmethod
    def check(cls, settings: SettingsBase) -> None:
        if settings.admin_token is not None and not settings.admin_token.strip():
            raise ValueError("the admin token (MCC_ADMIN_TOKEN) is empty")
        if settings.admin_token is not None and settings.open_admin:
            raise ValueError("--open-admin (MCC_OPEN_ADMIN) lets anyone change state, and an admin token is set: "
                             "give one or the other")


def admin_refusal(settings: SettingsBase, request: ServerRequest) -> Optional[tuple[int, bytes]]:
    """Why a state-changing admin request may not go ahead (403 with no token set, 401 without
    ``Bearer <token>``, compared in constant time), or None when it may."""
    token: Optional[str] = settings.admin_token
    if token is None:
        return None if settings.open_admin else (403, _NO_TOKEN)
    authorization = request.fields.get(b"authorization")
    if authorization is not None:
        scheme, _, given = authorization.decode("latin-1").strip().partition(" ")
        if scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), token.encode()):
            return None
    return 401, _WRONG_TOKEN


_NO_TOKEN = orjson.dumps({
    "code": "admin_token_required",
    "error": "this request changes what the trainer is told (an end, the run's end, a weight version), and this "
             "sidecar has no admin token: only the runner and the trainer may do it, never an agent, which holds the "
             "model port and its API key (docs/operations.md, \"Who may change state\"). Start the sidecar with "
             "MCC_ADMIN_TOKEN (or --admin-token-file FILE) and send Authorization: Bearer <token>, or end from the "
             "capture directory with records.end_rollout"})
_WRONG_TOKEN = orjson.dumps({
    "code": "admin_token_required",
    "error": "this admin request changes state: it needs Authorization: Bearer <the sidecar's admin token "
             "(MCC_ADMIN_TOKEN)>"})


