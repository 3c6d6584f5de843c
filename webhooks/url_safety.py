"""Which URLs a webhook may be sent to, and the address it is sent to.

A webhook is a request this service makes to a URL someone typed in: it must
not become a way into our own network (server-side request forgery). So a URL
is ``https://`` and every address its host resolves to is public; and the
POST goes to the very address that was checked (:class:`Target` pins it),
never to a second resolution that could answer an internal address this time
(DNS rebinding). The check runs when an endpoint is registered or changed
and again before every attempt.

With ``WEBHOOK_ALLOW_LOCAL_URLS`` (``make run``, the tests) ``http://`` and
loopback or private addresses are allowed too; link-local (the cloud's
metadata service), multicast, reserved and unspecified addresses never are.
"""

from __future__ import annotations

import ipaddress
import socket
from dataclasses import dataclass
from urllib.parse import urlsplit

from django.conf import settings

DEFAULT_PORTS = {"https": 443, "http": 80}
# NAT64's well-known prefix carries an IPv4 address in its last 32 bits.
_NAT64 = ipaddress.ip_network("64:ff9b::/96")


class UnsafeURL(ValueError):
    """The URL may not be sent to; the message says why, for the person who
    registered it."""


@dataclass(frozen=True)
class Target:
    """A checked URL: connect to ``address``, speak to ``host`` (the Host
    header, and the name TLS checks the certificate against)."""

    scheme: str
    host: str
    port: int
    address: str
    path: str  # with the query, if any

    @property
    def host_header(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return host if self.port == DEFAULT_PORTS[self.scheme] else f"{host}:{self.port}"


def resolve(host: str, port: int) -> list[str]:
    """Every address ``host`` resolves to (TCP), in the resolver's order."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        raise UnsafeURL(f"{host} does not resolve ({exc})") from exc
    addresses: list[str] = []
    for *_, sockaddr in infos:
        address = str(sockaddr[0]).split("%", 1)[0]  # an IPv6 zone is not part of it
        if address not in addresses:
            addresses.append(address)
    if not addresses:
        raise UnsafeURL(f"{host} does not resolve")
    return addresses


def why_not_allowed(address: str, *, allow_local: bool) -> str:
    """ "" if a webhook may be sent to ``address``, else the reason."""
    ip = ipaddress.ip_address(address)
    if isinstance(ip, ipaddress.IPv6Address):
        # An IPv4 address inside an IPv6 one is judged as what it is.
        embedded = ip.ipv4_mapped or ip.sixtofour
        if embedded is None and ip in _NAT64:
            embedded = ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
        if embedded is not None:
            ip = embedded
    if ip.is_unspecified:
        return "unspecified"
    if ip.is_link_local:
        return "link-local"
    if isinstance(ip, ipaddress.IPv6Address) and ip.is_site_local:
        return "site-local"  # fec0::/10: deprecated, never public (3.11 calls it global)
    if ip.is_multicast:
        return "multicast"
    if ip.is_loopback:
        return "" if allow_local else "loopback"
    if ip.is_private:
        return "" if allow_local else "private"
    if ip.is_reserved:
        return "reserved"
    if not ip.is_global:
        return "not globally reachable"
    return ""


def check_url(url: str, *, allow_local: bool | None = None) -> Target:
    """Parse and check ``url``, resolve its host, check every address;
    the target pinned to the first one. Raises :class:`UnsafeURL`."""
    allow_local = settings.WEBHOOK_ALLOW_LOCAL_URLS if allow_local is None else allow_local
    schemes = ("https", "http") if allow_local else ("https",)
    try:
        parts = urlsplit(url.strip())
        port = parts.port
    except ValueError as exc:
        raise UnsafeURL(f"not a URL: {exc}") from exc
    scheme = parts.scheme.lower()
    if scheme not in schemes:
        raise UnsafeURL(
            "the URL must be https://"
            + ("" if allow_local else " (http:// only with WEBHOOK_ALLOW_LOCAL_URLS)")
        )
    if parts.username is not None or parts.password is not None:
        raise UnsafeURL(
            "credentials in the URL are not allowed: the signature authenticates the request"
        )
    if not parts.hostname:
        raise UnsafeURL("the URL has no host")
    port = port or DEFAULT_PORTS[scheme]
    try:
        host = str(ipaddress.ip_address(parts.hostname))
        addresses, named = [host], False
    except ValueError:
        try:
            host = parts.hostname.encode("idna").decode("ascii")
        except UnicodeError as exc:
            raise UnsafeURL(f"not a valid host name: {parts.hostname}") from exc
        addresses, named = resolve(host, port), True
    for address in addresses:
        why = why_not_allowed(address, allow_local=allow_local)
        if why:
            said = f"{host} resolves to {address}, which" if named else address
            raise UnsafeURL(f"{said} is not public ({why})")
    path = parts.path or "/"
    if parts.query:
        path += f"?{parts.query}"
    return Target(scheme=scheme, host=host, port=port, address=addresses[0], path=path)
