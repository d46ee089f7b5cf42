"""Entity tags for reads (section 10.1) and ``If-None-Match`` evaluation (RFC 9110 section 13.1.2).

An ETag names exactly what a read returned: the stream incarnation (so a deleted and re-created stream
never matches), the start and end offsets, and ``:c`` when the response carries the closure signal (so a
cached ``304`` can never hide EOF). ``If-None-Match`` uses *weak* comparison and may carry a list
(hazard 41): ``W/"x", "y"`` matches ``"y"``.
"""

from __future__ import annotations


def make_etag(
    storage_id: str, start_offset: str, end_offset: str, closed: bool, variant: str = ""
) -> str:
    """``variant`` names a representation chosen by query parameters (extensions: the requested
    ``end``, the frames format), so two differently shaped answers never share a tag."""
    suffix = ":c" if closed else ""
    extra = f":{variant}" if variant else ""
    return f'"{storage_id}:{start_offset}:{end_offset}{suffix}{extra}"'


def if_none_match(header: str | None, etag: str) -> bool:
    """True when the header matches ``etag`` under weak comparison (so the answer is 304)."""
    if header is None:
        return False
    target = _opaque(etag)
    for candidate in _entity_tags(header):
        if candidate == "*" or _opaque(candidate) == target:
            return True
    return False


def _opaque(tag: str) -> str:
    """The opaque-tag of an entity-tag: weakness indicator dropped, quotes kept (added if missing)."""
    tag = tag.strip()
    if tag[:2] in ("W/", "w/"):
        tag = tag[2:]
    if not (len(tag) >= 2 and tag.startswith('"') and tag.endswith('"')):
        tag = f'"{tag}"'
    return tag


def _entity_tags(header: str) -> list[str]:
    """Split a comma-separated list of entity-tags, honouring quotes (an etagc may not hold a comma,
    but a lenient split must not break a quoted tag that does)."""
    tags: list[str] = []
    current: list[str] = []
    quoted = False
    for char in header:
        if char == '"':
            quoted = not quoted
        if char == "," and not quoted:
            tags.append("".join(current).strip())
            current = []
        else:
            current.append(char)
    tags.append("".join(current).strip())
    return [tag for tag in tags if tag]
