"""Content types: the one place that decides what a Content-Type header means.

Two rules, used by every path that looks at a content type (create, fork, append, read, SSE):

- *Equality* is equality of the media-type essence (``type/subtype``, case-insensitive); parameters are
  ignored. So ``application/json; charset=utf-8`` and ``APPLICATION/JSON`` name the same stream type, for
  idempotent PUT and for append alike (hazard 37: two stores that disagreed on parameters gave 200 in one
  and 409 in the other).
- *JSON mode* is on exactly when the essence is ``application/json`` (hazard 40: substring tests made
  ``application/json-patch+json`` JSON in some paths and not in others).

The stored form keeps the parameters as sent, behind the lower-cased essence, so a stream created with
``text/plain; charset=utf-8`` reports exactly that.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import Final

DEFAULT: Final = "application/octet-stream"
JSON_ESSENCE: Final = "application/json"

# RFC 9110 token characters.
_TOKEN: Final = re.compile(r"\A[!#$%&'*+\-.^_`|~0-9A-Za-z]+\Z")


@dataclass(frozen=True, slots=True)
class ContentType:
    essence: str  # lower-case "type/subtype"
    params: tuple[str, ...]  # "name=value" items as sent, whitespace-trimmed

    @property
    def text(self) -> str:
        """The normalized header value the server stores and reports."""
        if not self.params:
            return self.essence
        return "; ".join((self.essence, *self.params))

    @property
    def is_json(self) -> bool:
        return self.essence == JSON_ESSENCE


def parse(raw: str | None) -> ContentType | None:
    """Parse a Content-Type header value; None when absent, empty or not ``type/subtype``."""
    if raw is None:
        return None
    return _parse(raw)


@functools.lru_cache(
    maxsize=256
)  # every append parses one; clients send a handful of distinct values
def _parse(raw: str) -> ContentType | None:
    head, _, rest = raw.partition(";")
    media_type, slash, subtype = head.strip().partition("/")
    if not slash or not _TOKEN.match(media_type) or not _TOKEN.match(subtype):
        return None
    params = tuple(p.strip() for p in rest.split(";") if p.strip()) if rest else ()
    return ContentType(f"{media_type.lower()}/{subtype.lower()}", params)


def essence(value: str) -> str:
    """Essence of a stored (already normalized) or raw content type; the raw text if unparseable."""
    parsed = parse(value)
    return parsed.essence if parsed is not None else value.strip().lower()


def same_type(a: str, b: str) -> bool:
    """True if two content types name the same stream type (parameters ignored)."""
    return essence(a) == essence(b)


def is_json(value: str) -> bool:
    """JSON mode test, the single definition used everywhere."""
    return essence(value) == JSON_ESSENCE


def for_create(raw: str | None) -> str:
    """The content type a new (non-fork) stream gets: missing means octet-stream (section 5.1).

    An invalid one never gets here from a request (``invalid_for_create`` refuses it first); the
    default for it only keeps this total."""
    parsed = parse(raw)
    return parsed.text if parsed is not None else DEFAULT


def invalid_for_create(
    raw: str | None, name: str = "Content-Type", *, header: bool = True
) -> str | None:
    """Why a create's content type is refused, or None when it is acceptable.

    Missing or blank is acceptable (the stream gets ``application/octet-stream``, as the protocol
    allows); anything else must be ``type/subtype`` with optional parameters. Giving a malformed one
    the default instead would be a silent guess: ``json`` or ``application/json/x`` would make a
    binary stream whose reads and appends then surprise the writer."""
    if raw is None or not raw.strip() or parse(raw) is not None:
        return None
    omit = f" (omit the header for {DEFAULT})" if header else ""
    return (
        f"{name} {raw!r} is not a media type: expected type/subtype with optional parameters, "
        f"e.g. application/json or text/plain; charset=utf-8{omit}"
    )
