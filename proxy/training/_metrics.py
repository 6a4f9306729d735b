"""The token capture mode's metrics (docs/tokens.md, docs/operations.md), on the sidecar's registry
(`SidecarMetrics.feature`)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter


class TokenModeMetrics:
    """What the token capture mode resent, could not cut, wrote as entries, and supplied as prefixes."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.token_fields_refused = Counter("mcc_token_fields_refused_total", "Calls the token capture mode resent as "
                                            "the agent's own request because the upstream refused an added field.",
                                            registry=registry)
        self.token_mode_compressed = Counter("mcc_token_mode_compressed_replies_total", "Calls the token capture mode "
                                             "resent as the agent's own request because the reply came compressed "
                                             "(Content-Encoding), which it cannot cut: those calls have no token "
                                             "arrays; the mode stays on.", registry=registry)
        self.token_mode_uncut_events = Counter("mcc_token_mode_uncut_events_total", "Events (or JSON bodies) of "
                                               "token capture mode replies whose added fields could not be found to "
                                               "cut: the agent received them as the upstream sent them.",
                                               registry=registry)
        self.token_entries = Counter("mcc_token_entries_total", "Training-token entries written (written; same: "
                                     "already there; late: the rollout was frozen, kept as evidence).", ["outcome"],
                                     registry=registry)
        self.token_entry_failures = Counter("mcc_token_entry_failures_total", "Calls in the token capture mode whose "
                                            "training-token entry could not be prepared or written, by kind.", ["kind"],
                                            registry=registry)
        self.routed_experts_bytes = Counter("mcc_routed_experts_bytes_total", "Bytes of MoE routed experts stored "
                                            "apart (--capture-routed-experts), each call's new rows once.",
                                            registry=registry)
        self.prefix_supply = Counter("mcc_prefix_supply_total", "Chat and Responses calls with a resolved parent under prefix supply (on by default in the token mode), "
                                     "by outcome: proved (the upstream's prompt ids begin with the supplied ones), "
                                     "unproved (sent, not proved: recorded as drift), or why nothing was supplied.",
                                     ["outcome"], registry=registry)
