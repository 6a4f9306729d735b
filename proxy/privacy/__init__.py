"""Privacy of what is captured (docs/privacy.md): redaction rules and a hook applied to every line
before anything is written, the metrics-only form, failing closed. One feature, plugged into the
call's line phase (`RedactionHooks`); `Redaction` is the process's side (rules, hook, budget,
each rollout's placeholders, the metrics)."""

from ._redaction_hooks import Redaction, RedactionHooks, RedactionMetrics, load_redaction

__all__ = ["Redaction", "RedactionHooks", "RedactionMetrics", "load_redaction"]
