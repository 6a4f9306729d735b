"""Which engine the token capture mode talks to (docs/tokens.md): vLLM or SGLang, whose token ids
are asked for and come back differently (`capture.token_fields_to_add`).

``--engine auto`` (the default) asks the upstream once, at start: SGLang answers ``GET /server_info``
with its server arguments (``model_path``, ``version``); vLLM has no such route (or, in its dev
mode, answers with a ``vllm_config``). An upstream that does not answer in time is taken for vLLM,
and the log says so: ``--engine sglang`` says it instead.
"""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.request
from typing import Optional

#: How long the probe may hold the sidecar's start.
PROBE_SECONDS = 2.0


def probe_engine(upstream_url: str, ca_file: Optional[str] = None, timeout: float = PROBE_SECONDS) -> tuple[str, str]:
    """(``vllm`` or ``sglang``, why), from the upstream's ``/server_info`` (blocking: run it on a thread)."""
    url = upstream_url.rstrip("/") + "/server_info"
    context = ssl.create_default_context(cafile=ca_file) if url.startswith("https:") else None
    try:
        with urllib.request.urlopen(url, timeout=timeout, context=context) as reply:  # noqa: S310 (the operator's upstream)
            info = json.loads(reply.read(1 << 20))
    except urllib.error.HTTPError as exc:
        return "vllm", f"GET /server_info answered {exc.code}: not SGLang"
    except (OSError, ValueError) as exc:
        return "vllm", f"the upstream did not answer GET /server_info ({exc}); assumed"
    if isinstance(info, dict) and "model_path" in info and "vllm_config" not in info:
        return "sglang", f"GET /server_info answered as SGLang {info.get('version') or ''}".rstrip()
    return "vllm", "GET /server_info answered, not as SGLang"
