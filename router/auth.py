"""API keys -> tenants. Keys come from a file (`--auth-file`) or a Kubernetes Secret (`--auth-secret`).

Format (the file, or the Secret's key `api-keys`; every other Secret key is read the same way so one
key per tenant also works): one key per line, `<api-key> [tenant]`, `#` starts a comment, a missing
tenant means "default". Clients send `Authorization: Bearer <api-key>` (the OpenAI SDK's api_key).
The tenant travels to the engine (vllm_xargs `tenant`) for GMAX's fairness term.
With no keys configured, auth is off and every request is tenant "default".
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping

from jitserve.router.errors import RouterError

DEFAULT_TENANT = "default"
SECRET_KEY = "api-keys"


def parse_keys(text: str, where: str) -> dict[str, str]:
    keys: dict[str, str] = {}
    for n, line in enumerate(text.splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        parts = line.split()
        if len(parts) > 2:
            raise ValueError(f"{where}:{n}: expected '<api-key> [tenant]', got {len(parts)} fields")
        keys[parts[0]] = parts[1] if len(parts) == 2 else DEFAULT_TENANT
    return keys


def keys_from_secret_data(data: Mapping[str, str], where: str) -> dict[str, str]:
    """Secret data (already base64-decoded) -> keys; `api-keys` first, other entries after."""
    keys: dict[str, str] = {}
    ordered: Iterable[str] = sorted(data, key=lambda k: (k != SECRET_KEY, k))
    for name in ordered:
        keys.update(parse_keys(data[name], f"{where}/{name}"))
    return keys


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


class Keyring:
    """Looks keys up by their SHA-256, so lookups are O(1) and timing reveals nothing about a key."""

    def __init__(self, keys: dict[str, str] | None = None) -> None:
        self._by_digest = {_digest(k): t for k, t in (keys or {}).items()}
        self.required = bool(keys)

    def __len__(self) -> int:
        return len(self._by_digest)

    def replace(self, keys: dict[str, str]) -> None:
        self._by_digest = {_digest(k): t for k, t in keys.items()}
        self.required = True  # once configured, an empty key set locks the router rather than opening it

    def tenant(self, authorization: str | None) -> str:
        if not self.required:
            return DEFAULT_TENANT
        if not authorization or not authorization.lower().startswith("bearer "):
            raise RouterError(
                401,
                "missing API key: send 'Authorization: Bearer <key>'",
                "authentication_error",
                None,
                "missing_api_key",
            )
        tenant = self._by_digest.get(_digest(authorization[7:].strip()))
        if tenant is not None:
            return tenant
        raise RouterError(401, "invalid API key", "authentication_error", None, "invalid_api_key")
