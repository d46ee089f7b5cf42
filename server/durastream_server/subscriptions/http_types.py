"""The boundary between the HTTP layer and the subscription service.

The HTTP layer routes every request under the reserved ``/v1/stream/__ds/`` prefix (section 6.1) to the
subscription service *before* stream handling, as a plain value: the service never sees ASGI, and the HTTP
layer never learns subscription semantics. Both sides import only these types.

The body is not part of the value: the service reads it with ``read_body`` once it knows the caller may
send one (after authenticating a callback token, after finding the subscription), so an anonymous or
misdirected request is answered without its body ever being read. ``read_body`` enforces the HTTP layer's
size limit (413) and raises ``ClientGone`` if the client disconnects mid-body.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field

BodyReader = Callable[[], Awaitable[bytes]]


class ClientGone(Exception):
    """The client disconnected while sending its body: there is nobody left to answer."""


@dataclass(frozen=True)
class SubscriptionHttpRequest:
    method: str  # upper-case
    # everything after "/v1/stream/__ds/", still percent-encoded,
    # e.g. "subscriptions/sub-1/streams/events%2Fx"
    subpath: str
    query: str  # raw query string, without the leading "?"
    headers: Mapping[str, str]  # lower-case names
    read_body: (
        BodyReader  # call at most once, only when the request is allowed to have its body read
    )


@dataclass(frozen=True)
class SubscriptionHttpResponse:
    status: int
    headers: Mapping[str, str] = field(default_factory=dict)
    body: bytes = b""
