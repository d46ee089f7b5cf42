"""Webhook URL validation: SSRF prevention (sections 6.2 and 12.8).

A webhook URL makes *this server* send requests, so an attacker who can create subscriptions must not be
able to aim them at the server's own network. The rules:

* ``https://`` to a public host or a public IP address;
* the development exception: ``http://`` (or ``https://``) to ``localhost`` or ``127.0.0.x``, which a
  deployment can switch off (``allow_local_dev=False``);
* everything else that reaches a local network is rejected: RFC 1918, loopback outside the exception,
  link-local (which includes the ``169.254.169.254`` metadata service), CGNAT, unique-local IPv6,
  multicast, reserved ranges, IPv4-mapped forms of all of these, and the legacy numeric spellings
  (``2130706433``, ``0x7f.1``) that resolvers turn into such addresses;
* names that only resolve inside a network (``*.localhost``, ``*.local``, ``*.internal``, ...);
* user-info in the URL (credentials would end up in logs).

A host name is checked again at delivery time against the addresses it resolves to (``check_resolved``),
so a public name pointing at a private address is not delivered to either.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Iterable
from urllib.parse import SplitResult, urlsplit

from durastream_server.subscriptions.errors import WebhookUrlRejected

MAX_URL_LENGTH = 2048

IpAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

_DEV_LOOPBACK = ipaddress.ip_network("127.0.0.0/24")
_DEV_HOSTNAMES = frozenset({"localhost"})
_INTERNAL_SUFFIXES = (
    ".localhost",
    ".local",
    ".internal",
    ".intranet",
    ".lan",
    ".home.arpa",
    ".corp",
)
_INTERNAL_NAMES = frozenset({"metadata", "metadata.google.internal", "instance-data"})


class WebhookUrlPolicy:
    """Decides whether the server may deliver to a URL. One instance per server, immutable."""

    def __init__(self, *, allow_local_dev: bool = True) -> None:
        self.allow_local_dev = allow_local_dev

    def validate(self, url: object) -> str:
        """Return ``url`` unchanged if deliverable, else raise ``WebhookUrlRejected`` saying why."""
        if not isinstance(url, str) or not url:
            raise WebhookUrlRejected("must be a non-empty string (an https:// URL)")
        if len(url) > MAX_URL_LENGTH:
            raise WebhookUrlRejected(f"must be at most {MAX_URL_LENGTH} characters")
        if any(ch.isspace() or ord(ch) < 0x20 or ord(ch) == 0x7F for ch in url):
            raise WebhookUrlRejected("must not contain whitespace or control characters")
        parts = _split(url)
        host = _hostname(parts)
        address = literal_address(host)
        if address is not None:
            # The development exception is for the plain spelling only, not "2130706433" or "0x7f.1".
            self._check_address(address, parts.scheme, canonical=host == str(address))
        else:
            self._check_name(host, parts.scheme)
        return url

    def check_resolved(self, host: str, addresses: Iterable[str]) -> None:
        """Delivery-time check of what a host name resolved to (DNS may point a public name inward)."""
        name = host.lower().rstrip(".")
        dev_name = self.allow_local_dev and name in _DEV_HOSTNAMES
        for text in addresses:
            address = _unmap(ipaddress.ip_address(text.split("%", 1)[0]))
            if dev_name and address.is_loopback:
                continue
            if self._is_dev_address(address):
                continue
            if not _is_public(address):
                raise WebhookUrlRejected(f"host {host!r} resolves to non-public address {address}")

    def _is_dev_address(self, address: IpAddress) -> bool:
        return self.allow_local_dev and address.version == 4 and address in _DEV_LOOPBACK

    def _check_address(self, address: IpAddress, scheme: str, *, canonical: bool) -> None:
        if canonical and self._is_dev_address(address):
            return
        if not _is_public(address):
            raise WebhookUrlRejected(
                f"address {address} is on a private, loopback, link-local or reserved network; "
                "use a public https:// URL (http://localhost and http://127.0.0.x are allowed "
                "for development)"
                if self.allow_local_dev
                else f"address {address} is not a public address"
            )
        _require_https(scheme)

    def _check_name(self, host: str, scheme: str) -> None:
        if host in _DEV_HOSTNAMES:
            if self.allow_local_dev:
                return
            raise WebhookUrlRejected("localhost is not allowed on this server")
        if host in _INTERNAL_NAMES or host.endswith(_INTERNAL_SUFFIXES) or "." not in host:
            raise WebhookUrlRejected(f"host {host!r} names an internal network target")
        _require_https(scheme)


def literal_address(host: str) -> IpAddress | None:
    """The IP address a host string denotes by itself, including legacy IPv4 spellings, else None."""
    try:
        return _unmap(ipaddress.ip_address(host))
    except ValueError:
        pass
    # inet_aton accepts what C resolvers accept: "127.1", "2130706433", "0x7f.0.0.1", "0177.0.0.1".
    if host and all(ch in "0123456789abcdefx." for ch in host):
        try:
            return ipaddress.IPv4Address(socket.inet_aton(host))
        except OSError:
            return None
    return None


def _split(url: str) -> SplitResult:
    try:
        parts = urlsplit(url)
        _ = parts.port  # raises ValueError for a malformed port
    except ValueError as exc:
        raise WebhookUrlRejected(f"is not a valid URL ({exc})") from None
    if parts.scheme not in ("http", "https"):
        raise WebhookUrlRejected("must use https:// (http:// only for localhost development)")
    if parts.username is not None or parts.password is not None:
        raise WebhookUrlRejected("must not contain user-info (credentials)")
    return parts


def _hostname(parts: SplitResult) -> str:
    host = (parts.hostname or "").rstrip(".")
    if not host:
        raise WebhookUrlRejected("must have a host")
    return host.lower()


def _require_https(scheme: str) -> None:
    if scheme != "https":
        raise WebhookUrlRejected(
            "must use https:// (http:// is allowed only for localhost and 127.0.0.x)"
        )


def _unmap(address: IpAddress) -> IpAddress:
    """Judge ``::ffff:10.0.0.1`` (and the NAT64/6to4 embeddings Python knows) by the IPv4 inside."""
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return address.ipv4_mapped
        if address.sixtofour is not None:
            return address.sixtofour
    return address


def _is_public(address: IpAddress) -> bool:
    return (
        address.is_global
        and not address.is_multicast
        and not address.is_reserved
        and not address.is_loopback
        and not address.is_link_local
        and not address.is_private
        and not address.is_unspecified
    )
