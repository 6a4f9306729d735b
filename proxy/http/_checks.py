"""What readiness and the forwarder say about an upstream that cannot be reached (docs/wire.md)."""

from __future__ import annotations

import asyncio
import ssl
from typing import Optional
from urllib.parse import urlsplit

#: Seconds the readiness probe waits for the upstream's connection (and TLS handshake).
READY_PROBE_TIMEOUT_S = 2.0


async def upstream_problem(upstream_url: str, ssl_context: Optional[ssl.SSLContext] = None) -> Optional[str]:
    """Why the upstream cannot be forwarded to, in one sentence, or None when it can.

    An HTTPS upstream is probed with the TLS handshake every call makes: a certificate that does
    not verify fails every call, so it makes readiness fail too (issue 21), naming the flag.
    """
    parts = urlsplit(upstream_url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(parts.hostname, port, ssl=ssl_context),
                                           READY_PROBE_TIMEOUT_S)
    except ssl.SSLCertVerificationError as exc:
        return certificate_problem(exc)
    except (OSError, asyncio.TimeoutError) as exc:
        return f"cannot connect: {type(exc).__name__}: {exc}"
    writer.close()
    return None


def certificate_problem(exc: BaseException) -> str:
    detail = getattr(exc, "verify_message", None) or str(exc)
    return (f"the upstream's TLS certificate does not verify ({detail}): pass --upstream-ca FILE (MCC_UPSTREAM_CA) "
            "with the CA that signed it")
