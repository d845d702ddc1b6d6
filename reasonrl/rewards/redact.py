"""Secrets out of every text a reward source makes from remote data or URLs (failure reasons, the judge's text, the
info a service returns), before the text is cut short, so that a failure reason, a sample log, a metric or a
checkpoint never holds an API key, a URL's credentials or an Authorization header.

``redact(text, secrets)`` replaces with ``***``: the user info of a URL (``https://user:pass@host`` ->
``https://***@host``), the value after ``Bearer``, the value of an ``Authorization``, ``api_key``, ``token``,
``password`` or ``secret`` field (``key: value``, ``key=value``, ``"key": "value"``), and each of ``secrets`` (the
literal values the caller knows: the API key it sends). ``excerpt`` is the one way a remote text enters a reason:
redacted first, then cut.
"""
from __future__ import annotations

import re
from typing import Any, Iterable, Mapping
from urllib.parse import urlsplit, urlunsplit

MASK = "***"

_URL_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^\s/?#@]+@")
_BEARER = re.compile(r"(?i)\b(bearer\s+)[A-Za-z0-9._~+/=-]+")
_FIELD = re.compile(r"(?i)\b((?:proxy-)?authorization|x-api-key|api[-_]?key|access[-_]?token|auth[-_]?token|token"
                    r"|password|passwd|secret)(\"?'?\s*[:=]\s*\"?'?)(?!\*\*\*)((?:(?:bearer|basic)\s+)?[^\s\"',;&}]+)")


def redact(text: Any, secrets: Iterable[str] = ()) -> str:
    """``str(text)`` with the secrets it shows replaced by ``***`` (module docstring)."""
    out = str(text)
    for secret in sorted({s for s in secrets if s and len(s) >= 4}, key=len, reverse=True):
        out = out.replace(secret, MASK)
    out = _URL_USERINFO.sub(rf"\1{MASK}@", out)
    out = _BEARER.sub(rf"\1{MASK}", out)
    return _FIELD.sub(rf"\1\2{MASK}", out)


def excerpt(value: Any, limit: int, secrets: Iterable[str] = ()) -> str:
    """``repr`` of ``value`` (a string's own ``repr`` too), redacted, then cut to ``limit`` characters (a secret cut
    in two is never half shown)."""
    text = redact(repr(redact_tree(value, secrets)), secrets)
    return text if len(text) <= limit else text[:limit] + "..."


def redact_tree(value: Any, secrets: Iterable[str] = ()) -> Any:
    """``value`` (JSON-like: dicts, lists, strings, numbers) with every string in it, keys included, redacted."""
    if isinstance(value, str):
        return redact(value, secrets)
    if isinstance(value, Mapping):
        return {redact(k, secrets): redact_tree(v, secrets) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [redact_tree(v, secrets) for v in value]
    return value


def url_secrets(url: str) -> list:
    """The credentials a URL carries, to be redacted as literals too: its password, or its user name when it has
    no password (a token written as ``https://<token>@host``)."""
    parts = urlsplit(str(url or ""))
    secret = parts.password if parts.password else parts.username
    return [secret] if secret else []


def safe_url(url: str) -> str:
    """``url`` without its user info (``https://user:pass@host/v1`` -> ``https://host/v1``), for messages."""
    parts = urlsplit(str(url or ""))
    if "@" not in parts.netloc:
        return str(url or "")
    return urlunsplit(parts._replace(netloc=parts.netloc.rsplit("@", 1)[1]))
