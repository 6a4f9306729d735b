"""Files made from captures are as private as the captures (docs/privacy.md, issue 73): `mcc report`,
`mcc export` and `mcc compact` write whole prompts and replies, so their files are 0600 and their
directories 0700 (``--permissions group``: 0640 / 0750), whatever the umask -- the sidecar's own
``--capture-permissions`` rule, and the same environment variable."""

from __future__ import annotations

import os
from typing import Any, Callable

import click

#: Per setting: the umask while writing, and the modes of what was written (files, directories).
PERMISSIONS = {"private": (0o077, 0o600, 0o700), "group": (0o027, 0o640, 0o750)}


def permissions_option(function: Callable[..., Any]) -> Callable[..., Any]:
    return click.option(
        "--permissions", type=click.Choice(sorted(PERMISSIONS)), default="private", show_default=True,
        envvar="MCC_CAPTURE_PERMISSIONS",
        help="What the written files are: private (0600, directories 0700) or group (0640 / 0750), as the "
             "captures they come from. [MCC_CAPTURE_PERMISSIONS]")(function)


def writing_privately(permissions: str) -> None:
    """From now on this process creates files no wider than ``permissions`` allows."""
    os.umask(PERMISSIONS[permissions][0])


def made_private(permissions: str, *paths: str) -> None:
    """``paths`` (files, or directories and all they hold) set to the modes of ``permissions``:
    a file that existed before was created under another umask."""
    _, file_mode, directory_mode = PERMISSIONS[permissions]
    for path in paths:
        if os.path.isdir(path):
            os.chmod(path, directory_mode)
            for root, directories, files in os.walk(path):
                for name in directories:
                    os.chmod(os.path.join(root, name), directory_mode)
                for name in files:
                    os.chmod(os.path.join(root, name), file_mode)
        elif os.path.exists(path):
            os.chmod(path, file_mode)


__all__ = ["PERMISSIONS", "made_private", "permissions_option", "writing_privately"]
