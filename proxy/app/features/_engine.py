"""The model server behind the token capture mode (docs/tokens.md): ``vllm``, ``sglang`` (its
``sglext`` token ids), or ``auto``: with ``--capture-tokens``, asked of the upstream at start (SGLang
answers ``GET /server_info``), vLLM otherwise; said in the log either way."""

from __future__ import annotations

import asyncio
import logging

from ...training import probe_engine
from ._declaration import Feature, FeatureHost, Option, SettingsBase
from ._token_mode import TOKENS, TokenModeFeature

log = logging.getLogger("mcc")


class EngineFeature(Feature):
    """Chooses the token capture mode's engine at start; `chosen` is its answer (prefix supply waits for it)."""

    name = "engine"
    options = (
        Option("engine", str, "auto", "The model server the token capture mode asks for token ids: vllm, sglang (its "
               "sglext ids, chat), or auto (default: with --capture-tokens, asked of the upstream at start, GET "
               "/server_info answers for SGLang; vLLM otherwise).", TOKENS, choices=("auto", "vllm", "sglang"),
               choices_said="auto, vllm or sglang", yaml_hint=True),
    )

    @classmethod
    def wanted(cls, settings: SettingsBase) -> bool:
        return settings.capture_on

    def __init__(self, host: FeatureHost) -> None:
        super().__init__(host)
        self.engine = "vllm"
        self._decided = asyncio.Event()

    async def chosen(self) -> str:
        await self._decided.wait()
        return self.engine

    async def start(self) -> None:
        try:
            await self._choose()
        finally:
            self._decided.set()

    async def _choose(self) -> None:
        settings, token_mode = self.settings, self.host.feature(TokenModeFeature)
        if token_mode is None or not self.host.upstream_url:
            return
        engine, why = settings.engine, "--engine"
        if engine == "auto":
            if settings.capture_tokens:
                engine, why = await asyncio.get_running_loop().run_in_executor(
                    None, probe_engine, self.host.upstream_url, settings.upstream_ca)
            else:
                engine, why = "vllm", ""
        token_mode.training.mode.engine = self.engine = engine
        if why:
            log.info("token capture mode: the upstream is %s (%s)", "SGLang" if engine == "sglang" else "vLLM", why,
                     extra={"engine": engine})
