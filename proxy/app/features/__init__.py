"""The sidecar's features, each declaring itself (docs/layout.md, "Adding a feature"): its options,
metrics, call hooks, admin endpoints, what it starts and how it drains (`Feature`, `Option`).

`FEATURES` is the feature list: `proxy.app.Settings`, ``mcc serve``'s flags, docs/configuration.md
and `proxy.app.Sidecar` are loops over it, and nothing else of the app names a feature. Its order
is the order the features take part in a call (privacy first: every later hook, and the line, see
the redacted fields), make their parts and stop; a section of the help lists their options in it.

Adding a feature: a module of its own here with a `Feature` subclass, and one line below.
"""

from ._admin_access import AdminAccessFeature
from ._declaration import AdminAnswer, Feature, FeatureHost, Option, SettingsBase, absolute_directory
from ._engine import EngineFeature
from ._overhead_header import OverheadHeaderFeature
from ._prefix_supply import PrefixSupplyFeature
from ._privacy import PrivacyFeature
from ._rollout_ends import RolloutEndsFeature
from ._routed_experts import RoutedExpertsFeature
from ._side_calls import SideCallsFeature
from ._store_upload import StoreUploadFeature
from ._token_mode import TokenModeFeature
from ._websocket_bridge import WebSocketFeature
from ._weight_versions import WeightVersionsFeature

#: The feature list, in the order they take part in a call.
FEATURES: tuple[type[Feature], ...] = (
    PrivacyFeature,
    TokenModeFeature,
    PrefixSupplyFeature,
    RoutedExpertsFeature,
    EngineFeature,
    SideCallsFeature,
    WeightVersionsFeature,
    AdminAccessFeature,
    RolloutEndsFeature,
    StoreUploadFeature,
    WebSocketFeature,
    OverheadHeaderFeature,  # Last: its header says the time the others' upstream_head took.
)

__all__ = [
    "FEATURES",
    "AdminAccessFeature",
    "AdminAnswer",
    "EngineFeature",
    "Feature",
    "FeatureHost",
    "Option",
    "OverheadHeaderFeature",
    "PrefixSupplyFeature",
    "PrivacyFeature",
    "RolloutEndsFeature",
    "RoutedExpertsFeature",
    "SettingsBase",
    "SideCallsFeature",
    "StoreUploadFeature",
    "TokenModeFeature",
    "WebSocketFeature",
    "WeightVersionsFeature",
    "absolute_directory",
]
