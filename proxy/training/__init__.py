"""Training features, each plugged into a call's named phases (docs/layout.md, docs/tokens.md).

The token capture mode and its training-token files (`TokenTraining`, `TokenHooks`), prefix supply
(`PrefixSupply`), the trainer's declared weight versions (`DeclaredWeightVersions`,
`WeightVersionHooks`). Each implements `proxy.call.CallHooks`; the call never names them, and a
call none of them covers runs none of this code.
"""

from ._declared_versions import DECLARATION_FILE, DeclaredWeightVersions, WeightWatch, declared_version
from ._engine import probe_engine
from ._entry_writer import TOKEN_DIALECTS, TokenCapture, TokenPlan
from ._metrics import TokenModeMetrics
from ._renderer import PrefixSupply, SuppliedPrefix, probe_renderer
from ._side_calls import SideCallHooks, SideCalls
from ._token_hooks import TokenHooks, TokenTraining
from ._token_mode import REFUSAL_STATUSES, TokenMode, refused_fields
from ._weight_hooks import WeightVersionHooks

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
