"""Which ``Host`` header values the server answers (``--allowed-host``): the defence against DNS rebinding.

A page on ``https://evil.example`` can make a visitor's browser send requests to a server on the visitor's
own machine by having its DNS name answer ``127.0.0.1``. The browser then believes it talks to
``evil.example``, so the page may read the answers too (same origin), whatever CORS says. What gives it
away is the ``Host`` header, which still names ``evil.example``. So a server that listens on loopback
answers by default only to the loopback names (``localhost``, ``127.x.y.z``, ``[::1]``), on any port: a
port carries no protection against rebinding (the page chooses it), and ports change legitimately under
SSH tunnels and container port mappings. Anything else gets 421 Misdirected Request.

On any other address the operator decides who may connect (tokens, a firewall, a proxy), and the name
clients use is theirs to choose, so by default every ``Host`` is answered. ``--allowed-host`` (repeatable)
replaces either default with a list: names (``stream.example``), addresses (``10.0.0.5``, ``[fd00::1]``),
either with a ``:port`` to allow only that port, ``loopback`` for the loopback names, ``*`` for any.

Whatever the list, a request with two ``Host`` headers, or one that is not a host name or address with an
optional port, gets 400 (RFC 9112 section 3.2). A request without ``Host`` (HTTP/1.0) is answered: browsers
always send one, so it cannot come from a rebinding page.
"""

from __future__ import annotations

import contextlib
import ipaddress
import re
from collections.abc import Iterable
from typing import Final

ANY: Final = "*"
LOOPBACK: Final = "loopback"
SYNTAX: Final = (
    "a host name or IP address with an optional :port (stream.example, 10.0.0.5:4437, [fd00::1]), "
    "'loopback' for localhost, 127.x.y.z and [::1], or '*' for any"
)

# The loopback host names, as a regular expression (also the host part of CORS's loopback origins).
LOOPBACK_HOST: Final = r"(?:localhost|127(?:\.\d{1,3}){3}|\[::1\])"
_LOOPBACK: Final = re.compile(LOOPBACK_HOST)
# RFC 3986 host (reg-name, IPv4 or bracketed IP literal) and optional port, as RFC 9110 allows in Host.
_ANSWERED_CACHE: Final = 64  # Host values remembered as answered
_HOST: Final = re.compile(r"(\[[0-9a-z:.]+\]|[a-z0-9\-._~!$&'()*+,;=%]*)(?::(\d{0,5}))?")


def is_loopback(host: str) -> bool:
    """Is ``host`` (an address to listen on) a loopback address or ``localhost``?"""
    try:
        return ipaddress.ip_address(host.split("%")[0]).is_loopback
    except ValueError:
        return host == "localhost"


def _split(text: str) -> tuple[str, str | None] | None:
    """``(host, port)`` of a ``Host`` value in lower case (port ``None`` if absent), or None if malformed."""
    match = _HOST.fullmatch(text.strip().lower())
    if match is None:
        return None
    host, port = match.group(1), match.group(2)
    if host.endswith(".") and not host.startswith("["):
        host = host[:-1]  # "localhost." is "localhost"
    return host, port or None


def normalize_allowed_host(text: str) -> str:
    """An ``--allowed-host`` value as it is matched (lower case, IPv6 in brackets); ``ValueError`` if
    malformed."""
    value = text.strip()
    if value in (ANY, LOOPBACK):
        return value
    with contextlib.suppress(ValueError):
        value = f"[{ipaddress.IPv6Address(value)}]"  # a bare IPv6 address
    parts = _split(value)
    if parts is None or not parts[0]:
        raise ValueError(f"{text!r} is not {SYNTAX}")
    host, port = parts
    if host.startswith("["):
        try:
            host = f"[{ipaddress.IPv6Address(host[1:-1])}]"
        except ValueError:
            raise ValueError(f"{text!r} is not {SYNTAX}") from None
    if port is not None:
        if not 0 < int(port) <= 65535:
            raise ValueError(f"{text!r}: the port must be in 1..65535")
        return f"{host}:{int(port)}"
    return host


class HostPolicy:
    """Decides, from a request's ``Host`` headers, whether the server answers it (see the module docstring)."""

    def __init__(self, allowed: Iterable[str]) -> None:
        entries = {normalize_allowed_host(entry) for entry in allowed}
        if not entries:
            raise ValueError("a HostPolicy needs at least one entry (use '*' for any host)")
        self.any = ANY in entries
        self.loopback = LOOPBACK in entries
        self._names = frozenset(entries - {ANY, LOOPBACK})
        # Host values answered before: a server's clients use a handful of names, so nearly every
        # request is one set lookup. Bounded, since clients choose what they send.
        self._answered: set[bytes] = set()

    @classmethod
    def for_server(cls, allowed: Iterable[str], listen_host: str) -> HostPolicy:
        """``allowed`` (``--allowed-host``), or the default for a server listening on ``listen_host``."""
        entries = tuple(allowed)
        if not entries:
            entries = (LOOPBACK,) if is_loopback(listen_host) else (ANY,)
        return cls(entries)

    def refusal(self, values: list[bytes]) -> tuple[int, str, str] | None:
        """Status, error code and message for a request carrying these ``Host`` header values, or None
        if the server answers it."""
        if not values:
            return None
        if len(values) > 1:
            return 400, "BAD_REQUEST", f"{len(values)} Host headers; a request carries exactly one"
        value = values[0]
        if value in self._answered:
            return None
        parts = _split(value.decode("latin-1"))
        if parts is None:
            return 400, "BAD_REQUEST", "the Host header is not a host name or address with a port"
        host, port = parts
        if (
            self.any
            or (self.loopback and _LOOPBACK.fullmatch(host))
            or host in self._names
            or (port is not None and f"{host}:{port.lstrip('0') or '0'}" in self._names)
        ):
            if len(self._answered) < _ANSWERED_CACHE:
                self._answered.add(value)
            return None
        if self._names:
            why = "it is not one of the names this server is configured to answer to"
        else:
            why = (
                "this server listens on loopback and answers only to localhost, 127.x.y.z and [::1]"
            )
        return (
            421,
            "MISDIRECTED_REQUEST",
            f"Host {values[0].decode('latin-1')[:100]!r} is not served here: {why} "
            "(the operator can add names with --allowed-host)",
        )
