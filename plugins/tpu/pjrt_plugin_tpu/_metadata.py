"""Reads Cloud TPU attributes from the GCE metadata server, bounded in time.

Asked only on a GCE VM that has TPU chips; every request has a short timeout,
goes to the server's IP (no DNS lookup to hang on) and bypasses proxies. A
failure returns ``None``: callers fall back to environment variables.
"""

from __future__ import annotations

import functools
import logging

logger = logging.getLogger(__name__)

METADATA_ATTRIBUTES_URL = "http://169.254.169.254/computeMetadata/v1/instance/attributes/"
#: Seconds to wait for one answer; the server answers in milliseconds on a VM.
METADATA_TIMEOUT_S = 2.0


@functools.lru_cache(maxsize=None)
def metadata_attribute(key: str, timeout: float = METADATA_TIMEOUT_S) -> str | None:
    """The instance attribute ``key`` (e.g. ``tpu-env``), or ``None`` if it cannot be had quickly."""
    import urllib.error  # imported here: keeps `import pjrt_plugins` cheap
    import urllib.request

    request = urllib.request.Request(METADATA_ATTRIBUTES_URL + key, headers={"Metadata-Flavor": "Google"})
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(request, timeout=timeout) as response:
            return response.read().decode("utf-8", errors="replace")
    except (OSError, urllib.error.URLError, ValueError) as exc:
        logger.info("GCE metadata attribute %r is not available: %s", key, exc)
        return None


def parse_tpu_env(text: str) -> dict[str, str]:
    """Parse the ``tpu-env`` attribute: one ``KEY: 'value'`` per line (a flat YAML mapping)."""
    values: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        key = key.strip()
        if not sep or not key or key.startswith("#"):
            continue
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        values[key] = value
    return values


def parse_worker_endpoints(text: str) -> list[str]:
    """Worker IPs from ``worker-network-endpoints`` (``hostname:uid:ip,...``), in worker order."""
    addresses = []
    for worker in filter(None, (part.strip() for part in text.split(","))):
        fields = worker.split(":")
        addresses.append(fields[2] if len(fields) >= 3 else fields[-1])
    return addresses
