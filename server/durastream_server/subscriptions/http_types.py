"""The boundary between the HTTP layer and the subscription service.

The HTTP layer routes every request under the reserved ``/v1/stream/__ds/`` prefix (section 6.1) to the
subscription service *before* stream handling, as a plain value: the service never sees ASGI, and the HTTP
layer never learns subscription semantics. Both sides import only these two types.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class SubscriptionHttpRequest:
    method: str  # upper-case
    # everything after "/v1/stream/__ds/", still percent-encoded,
    # e.g. "subscriptions/sub-1/streams/events%2Fx"
    subpath: str
    query: str  # raw query string, without the leading "?"
    headers: Mapping[str, str]  # lower-case names
    body: bytes
    # e.g. "http://127.0.0.1:4437/v1/stream" (scheme://host from the Host header), for callback_url/jwks_url
    stream_root_url: str


@dataclass(frozen=True)
class SubscriptionHttpResponse:
    status: int
    headers: Mapping[str, str] = field(default_factory=dict)
    body: bytes = b""
