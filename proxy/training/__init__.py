"""Training features, each plugged into a call's named phases (docs/layout.md, docs/tokens.md).

The token capture mode and its training-token files (`TokenTraining`, `TokenHooks`), prefix supply
(`PrefixSupply`), the trainer's declared weight versions (`DeclaredWeightVersions`,
`WeightVersionHooks`). Each implements `proxy.call.CallHooks`; the call never names them, and a
call none of them covers runs none of this code.

The door is lazy (PEP 562): each name is imported from its module on first use, so the capture
process, which imports `proxy.training._token_line` to build the token mode's lines
(`capture.journal.Job`), loads that room alone, not the call, the wire and the metrics beside it.
The imports below are what a type checker and a reader of this file see.
"""

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._declared_versions import DECLARATION_FILE, DeclaredWeightVersions, WeightWatch, declared_version
    from ._engine import probe_engine
    from ._entry_writer import TOKEN_DIALECTS, TokenCapture, TokenPlan
    from ._metrics import TokenModeMetrics
    from ._renderer import PrefixSupply, SuppliedPrefix, probe_renderer
    from ._side_calls import SideCallHooks, SideCalls
    from ._token_hooks import TokenHooks, TokenTraining
    from ._token_mode import REFUSAL_STATUSES, TokenMode, refused_fields
    from ._weight_hooks import WeightVersionHooks

#: Each name of the door, and the module it is imported from on first use.
_MODULES = {
    "DECLARATION_FILE": "._declared_versions",
    "DeclaredWeightVersions": "._declared_versions",
    "WeightWatch": "._declared_versions",
    "declared_version": "._declared_versions",
    "probe_engine": "._engine",
    "TOKEN_DIALECTS": "._entry_writer",
    "TokenCapture": "._entry_writer",
    "TokenPlan": "._entry_writer",
    "TokenModeMetrics": "._metrics",
    "PrefixSupply": "._renderer",
    "SuppliedPrefix": "._renderer",
    "probe_renderer": "._renderer",
    "SideCallHooks": "._side_calls",
    "SideCalls": "._side_calls",
    "TokenHooks": "._token_hooks",
    "TokenTraining": "._token_hooks",
    "REFUSAL_STATUSES": "._token_mode",
    "TokenMode": "._token_mode",
    "refused_fields": "._token_mode",
    "WeightVersionHooks": "._weight_hooks",
}

__all__ = [
    "SideCallHooks",
    "SideCalls",
    "DECLARATION_FILE",
    "DeclaredWeightVersions",
    "PrefixSupply",
    "REFUSAL_STATUSES",
    "SuppliedPrefix",
    "TOKEN_DIALECTS",
    "TokenCapture",
    "TokenHooks",
    "TokenMode",
    "TokenModeMetrics",
    "TokenPlan",
    "TokenTraining",
    "WeightVersionHooks",
    "WeightWatch",
    "declared_version",
    "probe_engine",
    "probe_renderer",
    "refused_fields",
]


def __getattr__(name: str) -> Any:
    import importlib

    module = _MODULES.get(name)
    if module is None:
        raise AttributeError(f"module 'proxy.training' has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value  # Found once: the next use is a plain attribute.
    return value
