"""Which URLs a webhook may be sent to, and the address it is sent to.

A webhook is a request this service makes to a URL someone typed in: it must
not become a way into our own network (server-side request forgery). So a URL
is ``https://`` and every address its host resolves to is public; and the
POST goes to the very address that was checked (:class:`Target` pins it),
never to a second resolution that could answer an internal address this time
(DNS rebinding). The check runs when an endpoint is registered or changed
and again before every attempt.

"Public" is decided by one table, :data:`SPECIAL_BLOCKS`: the IANA IPv4
and IPv6 Special-Purpose Address Registries (and the multicast and
site-local spaces), each block with its "Globally Reachable"; an address is
judged by the most specific block that holds it. The standard library's
``is_global`` is not enough on its own: Python 3.11's calls ``192.0.0.8``
(IETF protocol assignments) and ``3fff::/20`` (documentation) global, and
its ``is_private`` holds blocks that are neither (benchmarking,
documentation), so it only judges what the table does not hold.

With ``WEBHOOK_ALLOW_LOCAL_URLS`` (``make run``, the tests) ``http://`` and
loopback or private-use addresses (RFC 1918, unique-local) are allowed too;
link-local (the cloud's metadata service), multicast, documentation,
reserved and unspecified addresses, and the rest of the table, never are.

A URL holds only the characters RFC 3986 allows (a space, ``<``, ``>``,
``"``, ``{``... are refused, as is a ``%`` that starts no ``%XX``); the host
alone may hold others, an internationalised name, sent as its IDNA form.
"""

from __future__ import annotations

import ipaddress
import re
import socket
import string
from dataclasses import dataclass
from urllib.parse import urlsplit

from django.conf import settings

DEFAULT_PORTS = {"https": 443, "http": 80}
# NAT64's well-known prefix carries an IPv4 address in its last 32 bits.
_NAT64 = ipaddress.ip_network("64:ff9b::/96")

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


@dataclass(frozen=True)
class Block:
    """A block of the IANA special-purpose registries: the name the refusal
    gives, whether its addresses are globally reachable, and whether
    ``WEBHOOK_ALLOW_LOCAL_URLS`` allows them (a receiver on this machine or
    its network)."""

    network: IPNetwork
    name: str
    globally_reachable: bool = False
    local: bool = False


def _block(cidr: str, name: str, *, globally_reachable: bool = False, local: bool = False) -> Block:
    return Block(ipaddress.ip_network(cidr), name, globally_reachable, local)


# The IANA IPv4 and IPv6 Special-Purpose Address Registries (iana.org/assignments/
# iana-ipv4-special-registry, iana-ipv6-special-registry; as of 2025), every block,
# with "Globally Reachable"; blocks whose column says N/A are refused (never a
# destination), except 2002::/16 (6to4), judged, as 64:ff9b::/96, by the IPv4
# address it carries (_embedded_ipv4). Then the multicast spaces and IPv6's
# deprecated site-local, from other registries. The most specific block that holds
# an address judges it (192.0.0.9 is reachable, the rest of 192.0.0.0/24 not).
SPECIAL_BLOCKS: tuple[Block, ...] = (
    _block("0.0.0.0/8", '"this network"'),
    _block("0.0.0.0/32", "unspecified"),
    _block("10.0.0.0/8", "private", local=True),
    _block("100.64.0.0/10", "shared address space (carrier-grade NAT)"),
    _block("127.0.0.0/8", "loopback", local=True),
    _block("169.254.0.0/16", "link-local"),
    _block("172.16.0.0/12", "private", local=True),
    _block("192.0.0.0/24", "IETF protocol assignments"),
    _block("192.0.0.0/29", "IPv4 service continuity prefix"),
    _block("192.0.0.8/32", "IPv4 dummy address"),
    _block("192.0.0.9/32", "PCP anycast", globally_reachable=True),
    _block("192.0.0.10/32", "TURN anycast", globally_reachable=True),
    _block("192.0.0.170/31", "NAT64/DNS64 discovery"),
    _block("192.0.2.0/24", "documentation"),
    _block("192.31.196.0/24", "AS112-v4", globally_reachable=True),
    _block("192.52.193.0/24", "AMT", globally_reachable=True),
    _block("192.88.99.0/24", "deprecated 6to4 relay anycast"),
    _block("192.168.0.0/16", "private", local=True),
    _block("192.175.48.0/24", "AS112 direct delegation", globally_reachable=True),
    _block("198.18.0.0/15", "benchmarking"),
    _block("198.51.100.0/24", "documentation"),
    _block("203.0.113.0/24", "documentation"),
    _block("240.0.0.0/4", "reserved"),
    _block("255.255.255.255/32", "limited broadcast"),
    _block("::/128", "unspecified"),
    _block("::1/128", "loopback", local=True),
    # Judged as itself, not as the IPv4 address it maps: no resolver answers it
    # (we ask for no mapped addresses) and an IPv4 URL says what it means.
    _block("::ffff:0:0/96", "IPv4-mapped"),
    _block("64:ff9b::/96", "IPv4/IPv6 translation", globally_reachable=True),
    _block("64:ff9b:1::/48", "local IPv4/IPv6 translation"),
    _block("100::/64", "discard-only"),
    _block("100:0:0:1::/64", "dummy IPv6 prefix"),
    _block("2001::/23", "IETF protocol assignments"),
    _block("2001::/32", "Teredo"),
    _block("2001:1::1/128", "PCP anycast", globally_reachable=True),
    _block("2001:1::2/128", "TURN anycast", globally_reachable=True),
    _block("2001:1::3/128", "DNS-SD SRP anycast", globally_reachable=True),
    _block("2001:2::/48", "benchmarking"),
    _block("2001:3::/32", "AMT", globally_reachable=True),
    _block("2001:4:112::/48", "AS112-v6", globally_reachable=True),
    _block("2001:10::/28", "deprecated ORCHID"),
    _block("2001:20::/28", "ORCHIDv2", globally_reachable=True),
    _block("2001:30::/28", "drone remote ID entity tags", globally_reachable=True),
    _block("2001:db8::/32", "documentation"),
    _block("2002::/16", "6to4", globally_reachable=True),
    _block("2620:4f:8000::/48", "AS112 direct delegation", globally_reachable=True),
    _block("3fff::/20", "documentation"),
    _block("5f00::/16", "segment routing (SRv6) SIDs"),
    _block("fc00::/7", "unique-local", local=True),
    _block("fe80::/10", "link-local"),
    # Not in the special-purpose registries, and never a webhook's destination.
    _block("224.0.0.0/4", "multicast"),
    _block("ff00::/8", "multicast"),
    _block("fec0::/10", "site-local"),  # deprecated (RFC 3879); Python 3.11 calls it global
)
# Most specific first: the first block that holds an address judges it.
_BY_SPECIFICITY = sorted(SPECIAL_BLOCKS, key=lambda block: -block.network.prefixlen)

# RFC 3986's characters: unreserved, reserved, and % (of a %XX).
_URL_CHARACTERS = frozenset(string.ascii_letters + string.digits + "-._~:/?#[]@!$&'()*+,;=%")
_BAD_PERCENT = re.compile(r"%(?![0-9A-Fa-f]{2})")


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


def special_block(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> Block | None:
    """The most specific block of :data:`SPECIAL_BLOCKS` that holds ``ip``."""
    for block in _BY_SPECIFICITY:
        if ip.version == block.network.version and ip in block.network:
            return block
    return None


def _embedded_ipv4(ip: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address a NAT64 (64:ff9b::/96) or 6to4 (2002::/16) address
    reaches: the gateway translates to it, so it is what is judged."""
    if ip in _NAT64:
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    return ip.sixtofour


def why_not_allowed(address: str, *, allow_local: bool) -> str:
    """ "" if a webhook may be sent to ``address``, else the reason."""
    ip = ipaddress.ip_address(address)
    if isinstance(ip, ipaddress.IPv6Address):
        ip = _embedded_ipv4(ip) or ip
    block = special_block(ip)
    if block is not None:
        allowed = block.globally_reachable or (allow_local and block.local)
        return "" if allowed else block.name
    # Beyond the registries: the IPv6 space IANA has not allocated (reserved),
    # and whatever a later Python knows that the table does not.
    if ip.is_reserved:
        return "reserved"
    if not ip.is_global:
        return "not globally reachable"
    return ""


def _check_characters(url: str) -> None:
    bad = sorted({c for c in url if c.isascii() and c not in _URL_CHARACTERS})
    if bad:
        shown = ", ".join("a space" if c == " " else repr(c) for c in bad)
        raise UnsafeURL(f"not a URL: it holds {shown}, which a URL may not (percent-encode it)")
    if _BAD_PERCENT.search(url):
        raise UnsafeURL("not a URL: a % that does not start a percent-encoded byte (%XX)")


def check_url(url: str, *, allow_local: bool | None = None) -> Target:
    """Parse and check ``url``, resolve its host, check every address;
    the target pinned to the first one. Raises :class:`UnsafeURL`."""
    allow_local = settings.WEBHOOK_ALLOW_LOCAL_URLS if allow_local is None else allow_local
    schemes = ("https", "http") if allow_local else ("https",)
    url = url.strip()
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise UnsafeURL(f"not a URL: {exc}") from exc
    scheme = parts.scheme.lower()
    if scheme not in schemes:
        raise UnsafeURL(
            "the URL must be https://"
            + ("" if allow_local else " (http:// only with WEBHOOK_ALLOW_LOCAL_URLS)")
        )
    # The whole text, not the parts: urlsplit drops tabs and newlines unsaid.
    _check_characters(url)
    if not (parts.path + parts.query + parts.fragment).isascii():
        raise UnsafeURL("not a URL: only its host may hold characters that are not ASCII")
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
