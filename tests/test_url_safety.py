"""Which addresses and URLs a webhook may be sent to (webhooks/url_safety.py;
docs/api.md, "Webhooks"): the decision only, never a connection, and no name
is resolved (every URL here names its address).

The addresses are checked against lists written out here from the IANA
IPv4 and IPv6 Special-Purpose Address Registries (the blocks whose "Globally
Reachable" is False, and those inside them whose is True), and the module's
table against the same lists, so that a block missing from the table, or one
it marks wrongly, fails here.
"""

from __future__ import annotations

import ipaddress

import pytest

from webhooks import url_safety
from webhooks.url_safety import UnsafeURL, check_url, why_not_allowed

# --- the registries, written out by hand ----------------------------------------------

# IANA IPv4 and IPv6 Special-Purpose Address Registries: every block whose
# "Globally Reachable" is False (or N/A and never a destination), and the
# blocks of the IPv4 and IPv6 multicast and site-local spaces.
NOT_GLOBALLY_REACHABLE = [
    "0.0.0.0/8",  # "this network"
    "0.0.0.0/32",  # "this host on this network"
    "10.0.0.0/8",  # private-use
    "100.64.0.0/10",  # shared address space
    "127.0.0.0/8",  # loopback
    "169.254.0.0/16",  # link local
    "172.16.0.0/12",  # private-use
    "192.0.0.0/24",  # IETF protocol assignments (but .9 and .10)
    "192.0.0.0/29",  # IPv4 service continuity prefix
    "192.0.0.8/32",  # IPv4 dummy address
    "192.0.0.170/32",  # NAT64/DNS64 discovery
    "192.0.0.171/32",  # NAT64/DNS64 discovery
    "192.0.2.0/24",  # documentation (TEST-NET-1)
    "192.88.99.0/24",  # deprecated (6to4 relay anycast)
    "192.88.99.2/32",  # 6a44-relay anycast address
    "192.168.0.0/16",  # private-use
    "198.18.0.0/15",  # benchmarking
    "198.51.100.0/24",  # documentation (TEST-NET-2)
    "203.0.113.0/24",  # documentation (TEST-NET-3)
    "240.0.0.0/4",  # reserved
    "255.255.255.255/32",  # limited broadcast
    "224.0.0.0/4",  # multicast (its own registry)
    "::1/128",  # loopback
    "::/128",  # unspecified
    "::ffff:0:0/96",  # IPv4-mapped
    "64:ff9b:1::/48",  # IPv4-IPv6 translation, local use
    "100::/64",  # discard-only
    "100:0:0:1::/64",  # dummy IPv6 prefix
    "2001::/23",  # IETF protocol assignments (but the blocks below)
    "2001::/32",  # TEREDO
    "2001:2::/48",  # benchmarking
    "2001:10::/28",  # deprecated (ORCHID)
    "2001:db8::/32",  # documentation
    "3fff::/20",  # documentation
    "5f00::/16",  # segment routing (SRv6) SIDs
    "fc00::/7",  # unique-local
    "fe80::/10",  # link-local unicast
    "fec0::/10",  # site-local (deprecated; not in the registry, never public)
    "ff00::/8",  # multicast (its own registry)
]
# Allowed with WEBHOOK_ALLOW_LOCAL_URLS (a receiver on your machine or network).
LOCAL = {"10.0.0.0/8", "127.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "::1/128", "fc00::/7"}
# The registries' globally reachable blocks, those inside a refused one first.
GLOBALLY_REACHABLE = [
    "192.0.0.9/32",  # Port Control Protocol anycast
    "192.0.0.10/32",  # TURN anycast
    "2001:1::1/128",  # Port Control Protocol anycast
    "2001:1::2/128",  # TURN anycast
    "2001:1::3/128",  # DNS-SD service registration protocol anycast
    "2001:3::/32",  # AMT
    "2001:4:112::/48",  # AS112-v6
    "2001:20::/28",  # ORCHIDv2
    "2001:30::/28",  # drone remote ID protocol entity tags
    "192.31.196.0/24",  # AS112-v4
    "192.52.193.0/24",  # AMT
    "192.175.48.0/24",  # direct delegation AS112 service
    "2620:4f:8000::/48",  # direct delegation AS112 service
]


def _ends(block: str) -> list[str]:
    """The first, a middle and the last address of a block."""
    network = ipaddress.ip_network(block)
    middle = network.network_address + network.num_addresses // 2
    return sorted({str(network[0]), str(middle), str(network[-1])})


def _case(blocks):
    return [pytest.param(b, address, id=address) for b in blocks for address in _ends(b)]


@pytest.mark.parametrize("block, address", _case(NOT_GLOBALLY_REACHABLE))
def test_an_address_not_globally_reachable_is_refused(block, address):
    assert why_not_allowed(address, allow_local=False)
    allowed_locally = why_not_allowed(address, allow_local=True) == ""
    assert allowed_locally == (block in LOCAL)


@pytest.mark.parametrize("block, address", _case(GLOBALLY_REACHABLE))
def test_an_address_globally_reachable_is_allowed(block, address):
    assert why_not_allowed(address, allow_local=False) == ""


@pytest.mark.parametrize("address", ["93.184.216.34", "2606:2800:220:1:248:1893:25c8:1946"])
def test_an_ordinary_public_address_is_allowed(address):
    assert why_not_allowed(address, allow_local=False) == ""


@pytest.mark.parametrize(
    "address, allowed",
    [
        # NAT64 (64:ff9b::/96) and 6to4 (2002::/16) reach the IPv4 address
        # they carry: judged as that address.
        ("64:ff9b::5db8:d822", True),  # 93.184.216.34
        ("64:ff9b::a00:1", False),  # 10.0.0.1
        ("64:ff9b::c000:8", False),  # 192.0.0.8
        ("2002:5db8:d822::1", True),
        ("2002:a9fe:a9fe::1", False),  # 169.254.169.254
        ("2002:c000:8::1", False),
    ],
)
def test_an_ipv6_address_carrying_an_ipv4_one_is_judged_as_it(address, allowed):
    assert (why_not_allowed(address, allow_local=False) == "") is allowed


# --- the module's table, each block as it says ------------------------------------------

CARRIERS = {"64:ff9b::/96", "2002::/16"}  # judged by the IPv4 address they carry (above)


def test_each_block_of_the_table_says_what_the_registries_written_here_say():
    # The table's own word against the lists above (judging each block by
    # why_not_allowed, which reads the table, would compare it with itself).
    # 192.0.0.170/31 is the registry's two /32s.
    written = {
        **dict.fromkeys(NOT_GLOBALLY_REACHABLE, False),
        "192.0.0.170/31": False,
        **dict.fromkeys(GLOBALLY_REACHABLE, True),
    }
    table = {
        str(block.network): block.globally_reachable
        for block in url_safety.SPECIAL_BLOCKS
        if str(block.network) not in CARRIERS
    }

    assert set(table) - set(written) == set()
    assert table == {network: written[network] for network in table}


def test_the_table_holds_every_block_written_out_here():
    table = {str(block.network) for block in url_safety.SPECIAL_BLOCKS}
    written = set(NOT_GLOBALLY_REACHABLE) | set(GLOBALLY_REACHABLE)
    # 192.0.0.170/31 is the registry's two /32s; 6a44's /32 is in 192.88.99.0/24.
    missing = written - table - {"192.0.0.170/32", "192.0.0.171/32", "192.88.99.2/32"}
    assert not missing


def test_the_local_blocks_are_exactly_loopback_and_private_use():
    assert {str(b.network) for b in url_safety.SPECIAL_BLOCKS if b.local} == LOCAL


def test_an_address_outside_the_table_is_judged_by_the_standard_library():
    assert url_safety.special_block(ipaddress.ip_address("4000::1")) is None
    assert why_not_allowed("4000::1", allow_local=True) == "reserved"


# --- URLs -----------------------------------------------------------------------------


def test_192_0_0_8_is_refused_as_a_url():
    with pytest.raises(UnsafeURL, match="not public"):
        check_url("https://192.0.0.8/hook", allow_local=False)
    with pytest.raises(UnsafeURL, match="not public"):
        check_url("http://192.0.0.8/hook", allow_local=True)


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:9/a b",
        "http://127.0.0.1:9/<script>",
        "http://127.0.0.1:9/a>b",
        'http://127.0.0.1:9/a"b',
        "http://127.0.0.1:9/{id}",
        "http://127.0.0.1:9/a|b",
        "http://127.0.0.1:9/a\\b",
        "http://127.0.0.1:9/a^b",
        "http://127.0.0.1:9/a`b",
        "http://127.0.0.1:9/a\tb",
        "http://127.0.0.1:9/a\nb",
        "http://127.0.0.1:9/a\x00b",
        "http://127.0.0.1:9/a%zzb",
        "http://127.0.0.1:9/a%2",
        "http://127.0.0.1:9/caf\u00e9",
        "http://127.0.0.1 :9/",
    ],
)
def test_a_url_with_a_character_a_url_may_not_hold_is_refused(url):
    with pytest.raises(UnsafeURL, match="not a URL"):
        check_url(url, allow_local=True)


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:9/hooks/boxoffice",
        "http://127.0.0.1:9/a%20b?x=1&y=%C3%A9;z=(2)*+,!$'~_-.",
        "http://[::1]:9/hook#part",
        "  http://127.0.0.1:9/padded  ",  # the whitespace around it is not part of it
    ],
)
def test_a_url_of_the_characters_a_url_may_hold_is_allowed(url):
    target = check_url(url, allow_local=True)

    assert target.port == 9 and target.path.startswith("/")


def test_an_internationalised_host_name_is_allowed_as_its_idna_form(monkeypatch):
    # The only test here that names a host: its resolution is answered here.
    asked = []

    def resolve(host, port):
        asked.append(host)
        return ["93.184.216.34"]

    monkeypatch.setattr(url_safety, "resolve", resolve)

    target = check_url("https://b\u00fccher.example/x", allow_local=False)

    assert asked == ["xn--bcher-kva.example"]
    assert (target.host, target.address) == ("xn--bcher-kva.example", "93.184.216.34")
