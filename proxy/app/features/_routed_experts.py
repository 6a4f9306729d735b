"""MoE routed experts (docs/tokens.md): each call's ``routed_experts`` (vLLM with
``--enable-return-routed-experts``) stored apart, beside the token files, as an object named by its
sha256 (its parent's rows not again); the token entry and the line name it. A part of the token
capture mode: it applies to the calls that mode covers."""

from __future__ import annotations

from ._declaration import Feature, Option, SettingsBase
from ._token_mode import TOKENS, TokenModeFeature


class RoutedExpertsFeature(Feature):
    """Turns on the token capture's routed-experts objects (`proxy.training.TokenCapture`)."""

    name = "routed experts"
    options = (
        Option("capture_routed_experts", bool, False, "MoE routed experts: store each call's routed_experts (vLLM "
               "--enable-return-routed-experts) apart from the lines, as an object named by its sha256 beside the "
               "token files, its parent's rows not again (off by default; needs --capture-tokens).", TOKENS,
               yaml_hint=True),
    )

    @classmethod
    def check(cls, settings: SettingsBase) -> None:
        if settings.capture_routed_experts and not settings.capture_on:
            raise ValueError("--capture-routed-experts (MCC_CAPTURE_ROUTED_EXPERTS) needs the token capture mode, "
                             "which needs capture on: pass --capture-dir DIR (MCC_CAPTURE_DIR) and --capture-tokens")

    @classmethod
    def wanted(cls, settings: SettingsBase) -> bool:
        return settings.capture_on and bool(settings.capture_routed_experts)

    def prepare(self) -> None:
        token_mode = self.host.feature(TokenModeFeature)
        if token_mode is not None:
            token_mode.training.token_capture.routed_experts = True
