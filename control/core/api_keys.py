"""The API keys a server accepts, and the tenant each one names.

``--api-key KEY`` (or ``SERVEDECK_API_KEY``) is one bare key. ``--api-key-file FILE`` holds
one key per line: ``name:key`` names the key's tenant, a bare ``key`` (a line without a
valid ``name:`` prefix, as today's one-key files) names none; blank lines and lines starting
with ``#`` are skipped. A request authenticated by a named key is that tenant's whatever its
body says; a bare key (or no key at all) leaves the tenant to the body's ``user``, else
``default`` (``tenant_of``).
"""

from __future__ import annotations

import hmac
import re
from dataclasses import dataclass

from pydantic import SecretStr

from engine.tenants import DEFAULT_TENANT, MAX_TENANT_NAME, MAX_TENANTS

NAME = re.compile(rf"[A-Za-z0-9._-]{{1,{MAX_TENANT_NAME}}}")
"""A key's tenant name: letters, digits, ``.``, ``_``, ``-``."""


@dataclass(frozen=True, slots=True)
class ApiKey:
    secret: SecretStr
    tenant: str | None = None
    """The tenant it names; None for a bare key."""


@dataclass(frozen=True, slots=True)
class ApiKeys:
    keys: tuple[ApiKey, ...]

    @classmethod
    def parse(cls, text: str, source: str) -> ApiKeys:
        """The keys of a key file; ``ValueError`` naming the line for an empty file, a
        duplicate name or key, or more than ``MAX_TENANTS`` keys."""
        keys: list[ApiKey] = []
        names: set[str] = set()
        secrets: set[str] = set()
        for number, raw in enumerate(text.splitlines(), 1):
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            name, colon, rest = line.partition(":")
            named = bool(colon) and NAME.fullmatch(name) is not None and bool(rest.strip())
            secret = rest.strip() if named else line
            if named and name in names:
                raise ValueError(f"{source} line {number}: the key name {name!r} is used twice")
            if secret in secrets:
                raise ValueError(f"{source} line {number}: the same key appears twice")
            if named:
                names.add(name)
            secrets.add(secret)
            keys.append(ApiKey(SecretStr(secret), name if named else None))
        if not keys:
            raise ValueError(f"the API key file {source} is empty")
        if len(keys) > MAX_TENANTS:
            raise ValueError(f"{source}: {len(keys)} keys, at most {MAX_TENANTS}")
        return cls(tuple(keys))

    @classmethod
    def single(cls, secret: SecretStr) -> ApiKeys:
        return cls((ApiKey(secret),))

    def match(self, given: str) -> ApiKey | None:
        """The key ``given`` is, compared in constant time against every key (no early exit,
        so the time says nothing of which key, or how much of one, matched)."""
        found = None
        for key in self.keys:
            if hmac.compare_digest(given.encode(), key.secret.get_secret_value().encode()):
                found = key
        return found

    @property
    def first(self) -> SecretStr:
        """The key the server's own clients use (the demo load)."""
        return self.keys[0].secret


def tenant_of(key: ApiKey | None, user: str | None) -> str:
    """A request's tenant: its named key's; else the body's ``user`` (advisory: a client may
    send any) within the tenant name's bounds; else ``default``."""
    if key is not None and key.tenant is not None:
        return key.tenant
    if user:
        return user[:MAX_TENANT_NAME]
    return DEFAULT_TENANT
