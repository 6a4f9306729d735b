"""Prefix supply (docs/tokens.md, "Prefix supply"): a chat turn whose parent call is known is sent on
the parent's exact token ids (vLLM's ``kv_transfer_params.prompt_token_ids``), so no turn drifts. On
by default in the token capture mode where the upstream renders (``/tokenize``)."""

from __future__ import annotations

import asyncio
import logging
from typing import Optional

from ...training import PrefixSupply, probe_renderer
from ._declaration import Feature, Option, SettingsBase
from ._engine import EngineFeature
from ._token_mode import TOKENS, TokenModeFeature

log = logging.getLogger("mcc")


class PrefixSupplyFeature(Feature):
    """A part of the token capture mode (`TokenModeFeature`): its `PrefixSupply`, asked at start
    whether the upstream renders, and what that means said in the log."""

    name = "prefix supply"
    options = (
        #: Unset: on with ``--capture-tokens`` (issue 72: without it a multi-turn rollout on a real
        #: vLLM drifts and is masked); ``False`` turns it off.
        Option("supply_prefix", bool | None, None, "Prefix supply: send each chat turn whose parent call is known "
               "on the parent's exact token ids (vLLM kv_transfer_params.prompt_token_ids), so no turn drifts; "
               "changes what the model samples (on by default with --capture-tokens where the upstream renders: "
               "/tokenize; --no-supply-prefix turns it off).", TOKENS, yaml_hint=True),
    )

    @classmethod
    def check(cls, settings: SettingsBase) -> None:
        if settings.supply_prefix is True and not settings.capture_on:
            raise ValueError("--supply-prefix (MCC_SUPPLY_PREFIX) needs the token capture mode, which needs capture "
                             "on: pass --capture-dir DIR (MCC_CAPTURE_DIR) and --capture-tokens")

    @staticmethod
    def supplies(settings: SettingsBase) -> bool:
        """Whether prefix supply is on: as set, else with the token capture mode (``--capture-tokens``)."""
        return settings.capture_on and bool(settings.supply_prefix if settings.supply_prefix is not None
                                            else settings.capture_tokens)

    @classmethod
    def wanted(cls, settings: SettingsBase) -> bool:
        return settings.capture_on

    def prepare(self) -> None:
        self.supply: Optional[PrefixSupply] = PrefixSupply() if self.supplies(self.settings) else None
        token_mode = self.host.feature(TokenModeFeature)
        if token_mode is not None:
            token_mode.training.prefix_supply = self.supply

    async def start(self) -> None:
        """Whether the upstream renders, asked beside the engine's probe (one wait at start, not two)."""
        host, supply = self.host, self.supply
        if not host.upstream_url:
            return
        if supply is None:
            if self.settings.capture_tokens:
                log.info("prefix supply: off (--no-supply-prefix): turns go as the agent wrote them; a turn whose "
                         "text re-tokenizes differently drifts and its rollout is masked (docs/tokens.md, \"Prefix "
                         "supply\")")
            return
        renders, answered = await asyncio.get_running_loop().run_in_executor(
            None, probe_renderer, host.upstream_url, self.settings.upstream_ca)
        engine = host.feature(EngineFeature)
        _say_prefix_supply(supply, await engine.chosen() if engine is not None else "vllm", renders, answered)


def _say_prefix_supply(supply: PrefixSupply, engine: str, renders: Optional[bool], answered: str) -> None:
    """What the start learnt of prefix supply, kept and said."""
    if engine == "sglang":
        supply.unavailable = "engine_sglang"
        log.info("prefix supply: off: SGLang takes no prompt ids for a chat call; turns go as the agent wrote them "
                 "and each line says why (prefix_not_supplied: engine_sglang)")
    elif renders is False:
        supply.unavailable = "no_renderer"
        log.warning("prefix supply: off: the upstream has no renderer (%s); turns go as the agent wrote them, a turn "
                    "whose text re-tokenizes differently drifts and its rollout is masked (docs/tokens.md, \"Prefix "
                    "supply\")", answered)
    elif renders:
        log.info("prefix supply: on (%s): each chat turn goes on its parent's exact token ids; --no-supply-prefix "
                 "turns it off", answered)
    else:
        log.info("prefix supply: on; whether the upstream renders is learnt at the first turn (%s)", answered)
