"""Per-request authorization against the configured bearer tokens (``--auth-token``, ``--auth-token-file``).

With no tokens configured the app never builds an ``Authorizer`` and nothing here runs. With tokens:

=========================================================  ===============================================
request                                                    needs
=========================================================  ===============================================
``GET``/``HEAD /healthz``                                  nothing (load balancers probe it)
``GET /metrics``                                           any valid token (read-only suffices)
``OPTIONS`` (CORS preflight) on any routable path          nothing (browsers never send credentials on it)
``GET``/``HEAD`` a stream                                  any token whose prefix covers the stream
``PUT``/``POST``/``DELETE`` a stream                       a read-write token whose prefix covers it; a
                                                           fork (``Stream-Forked-From``) also needs the
                                                           source covered
``GET __ds/x-durastream/extensions``                       any valid token
``GET __ds/x-durastream/streams`` (listing) and           any token; a prefixed token only with a
``.../changes`` (change feed)                              ``prefix=`` or ``pattern=`` inside its prefix
``POST __ds/x-durastream/selections``                      any valid token (it stores a path list, and
                                                           reveals nothing)
``POST __ds/x-durastream/lookups`` and ``.../reads``       any valid token; each listed range whose stream
(multi-range)                                              the token does not cover is answered 403 on its
                                                           own
``POST __ds/x-durastream/ensure``, ``.../stages``,         a read-write token; each listed stream it does
``.../commits`` (bulk-write)                               not cover is answered 403 on its own
``GET __ds/jwks.json``                                     nothing (public keys, for webhook receivers)
``POST __ds/subscriptions/{id}/callback|ack|release``      no server token: these carry the callback or
                                                           claim token the server minted (section 7)
other ``__ds/subscriptions/...`` (create, read, delete,    a token without prefix (a subscription pattern
membership, claim)                                         can match any stream); read-write except GET
anything else (unknown paths, malformed paths)             any valid token (then 404 / 400)
=========================================================  ===============================================

With ``--workers N`` a worker's own requests to another (no client's token to carry: following its
change feed, a wake stream's events) present the workers' credential instead, which counts only on a
request that arrived over a worker's Unix socket (``shards/internal.py``).

401 (with ``WWW-Authenticate: Bearer``) means no valid token; 403 means a valid token that does not allow
this request. Tokens are compared as SHA-256 digests with ``hmac.compare_digest`` against every configured
token, so the time taken does not depend on how much of a guess was right. Error bodies never contain the
presented token.
"""

from __future__ import annotations

import contextlib
import hmac
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from durastream_server.auth import AuthToken, digest
from durastream_server.errors import Forbidden, InvalidParameter, Unauthorized
from durastream_server.http import discovery, paths

if TYPE_CHECKING:
    from durastream_server.http.handlers import Request

REALM: Final = 'Bearer realm="durastream"'
_READS: Final = frozenset({"GET", "HEAD"})
_SELF_AUTHENTICATED: Final = frozenset({"callback", "ack", "release"})


@dataclass(frozen=True, slots=True)
class Need:
    """What a request needs from its token."""

    write: bool = False
    streams: tuple[str, ...] = ()  # canonical stream paths the token's prefix must cover
    unrestricted: bool = False  # a token without prefix
    listing: bool = False  # the stream listing: a prefixed token must list inside its prefix


def requirement(request: Request, target: paths.Route | None) -> Need | None:
    """What ``request`` needs, or ``None`` when it is open. ``target`` is ``None`` for an unroutable path."""
    method = request.method
    write = method not in _READS
    if target is None or target.kind is paths.RouteKind.NOT_FOUND:
        return Need()
    if target.kind is paths.RouteKind.HEALTH:
        return None
    if target.kind is paths.RouteKind.METRICS:
        return Need()  # operational figures, no stream paths: any valid token
    if target.kind is paths.RouteKind.STREAM:
        streams = [target.target]
        if method == "PUT" and "stream-forked-from" in request.headers:
            with contextlib.suppress(paths.InvalidPath):  # the handler answers 400 for it
                streams.append(paths.forked_from_path(request.headers["stream-forked-from"]))
        return Need(write=write, streams=tuple(streams))
    subpath = target.target
    if discovery.owns(subpath):
        resource = subpath[len(discovery.NAMESPACE) + 1 :]
        return Need(
            write=resource in discovery.WRITES, listing=resource in discovery.SCOPED_BY_QUERY
        )
    parts = subpath.split("/")
    if parts == ["jwks.json"]:
        return None
    if len(parts) == 3 and parts[0] == "subscriptions" and parts[2] in _SELF_AUTHENTICATED:
        return None
    return Need(write=write, unrestricted=True)


# With --workers N: what a request presenting the workers' own credential over a worker's Unix socket
# is authorized as, else None (``shards/router.ShardRouter.internal_token``).
InternalAccess = Callable[[Mapping[str, str], Any], "AuthToken | None"]


class Authorizer:
    def __init__(
        self, tokens: tuple[AuthToken, ...], internal: InternalAccess | None = None
    ) -> None:
        if not tokens:
            raise ValueError("an Authorizer needs at least one token")
        self._tokens = tokens
        self._internal = internal

    def authorize(self, request: Request, target: paths.Route | None) -> AuthToken | None:
        """Return the request's token (None for an open endpoint) if ``request`` may proceed; raise
        ``Unauthorized`` (401) or ``Forbidden`` (403). Handlers that learn stream paths from a body
        (multi-range requests) check each against the returned token."""
        need = requirement(request, target)
        if need is None:
            return None
        token = (
            self._internal(request.headers, request.server) if self._internal is not None else None
        )
        if token is None:
            token = self.identify(request.headers.get("authorization"))
        if need.write and not token.writable:
            raise _forbidden(f"this token is read-only; {request.method} needs a read-write token")
        if need.unrestricted and token.prefix:
            raise _forbidden(
                f"this token is limited to streams under '{token.prefix}/'; subscription control needs "
                "a token without a prefix, because a subscription can match any stream"
            )
        for stream in need.streams:
            if not token.covers(stream):
                raise _forbidden(
                    f"this token is limited to streams under '{token.prefix}/'; "
                    f"'{stream}' is outside it"
                )
        if need.listing and token.prefix and not _listing_within(request.query_string, token):
            raise _forbidden(
                f"this token is limited to streams under '{token.prefix}/'; list them with "
                f"prefix={token.prefix}/ or a pattern starting with {token.prefix}/"
            )
        return token

    def identify(self, header: str | None) -> AuthToken:
        """The configured token an ``Authorization`` header value carries, or ``Unauthorized``."""
        if header is None:
            raise Unauthorized(
                "this server requires a bearer token: send 'Authorization: Bearer <token>'",
                headers={"WWW-Authenticate": REALM},
            )
        scheme, _, credentials = header.strip().partition(" ")
        credentials = credentials.strip()
        if scheme.lower() != "bearer" or not credentials:
            raise Unauthorized(
                "the Authorization header must have the form 'Bearer <token>'",
                headers={"WWW-Authenticate": f'{REALM}, error="invalid_request"'},
            )
        presented = digest(credentials)
        found: AuthToken | None = None
        for token in self._tokens:  # every token, no early exit: timing says nothing about which
            if hmac.compare_digest(presented, token.digest):
                found = token
        if found is None:
            raise Unauthorized(
                "the bearer token is not valid",
                headers={"WWW-Authenticate": f'{REALM}, error="invalid_token"'},
            )
        return found


def _forbidden(message: str) -> Forbidden:
    return Forbidden(message, headers={"WWW-Authenticate": f'{REALM}, error="insufficient_scope"'})


def _listing_within(query_string: bytes, token: AuthToken) -> bool:
    """Can every stream this listing may return be inside the token's prefix?"""
    try:
        values = discovery.listing_query(query_string)
    except InvalidParameter:  # the listing would answer 400 anyway
        return False
    if values.get("prefix", "").startswith(token.prefix + "/"):
        return True
    pattern = values.get("pattern")
    if pattern is None:
        return False
    wanted = token.prefix.split("/")
    head = pattern.split("/")[: len(wanted)]
    return head == wanted and not any("*" in segment for segment in head)
