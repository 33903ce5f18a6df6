"""Where the server may connect out to on a user's behalf (webhooks): public internet addresses only.

A webhook URL is user input, and the server sits inside the operator's network: without this check a
webhook reaches loopback services, the private network and the cloud's metadata endpoint, and its errors
make the dashboard a port scanner. The host is resolved and every address it resolves to is checked when
the channel is saved and again on every connection; the connection then goes to the checked address, so
a DNS answer that changes in between (DNS rebinding) cannot redirect it. An admin lets named internal
hosts through with WEBHOOK_ALLOWED_HOSTS; cloud metadata addresses stay refused even then.
"""

from __future__ import annotations

import socket
from ipaddress import IPv4Address, IPv6Address, IPv6Network, ip_address

from django.conf import settings

IPAddress = IPv4Address | IPv6Address
METADATA = {
    ip_address(a)
    for a in (
        "169.254.169.254",  # AWS, GCP, Azure, OpenStack, DigitalOcean
        "169.254.170.2",  # AWS ECS task metadata
        "100.100.100.200",  # Alibaba Cloud
        "192.0.0.192",  # Oracle Cloud (classic)
        "fd00:ec2::254",  # AWS over IPv6
    )
}
NAT64 = IPv6Network("64:ff9b::/96")
CATEGORIES = (
    ("unspecified", "is_unspecified"),
    ("loopback", "is_loopback"),
    ("link-local", "is_link_local"),
    ("multicast", "is_multicast"),
    ("reserved", "is_reserved"),
    ("private", "is_private"),
)


class AddressRefused(Exception):
    """The host may not be connected to. `public` is safe to show anyone; `detail` names the addresses."""

    def __init__(self, host: str, public: str, detail: str) -> None:
        super().__init__(detail)
        self.host, self.public, self.detail = host, public, detail


def embedded_ipv4(ip: IPAddress) -> IPv4Address | None:
    """The IPv4 address an IPv6 address carries (IPv4-mapped, 6to4, NAT64), which is where it really goes."""
    if isinstance(ip, IPv4Address):
        return None
    if ip.ipv4_mapped or ip.sixtofour:
        return ip.ipv4_mapped or ip.sixtofour
    return IPv4Address(int(ip) & 0xFFFFFFFF) if ip in NAT64 else None


def category(ip: IPAddress) -> str:
    """Why this address is not a public internet address ("cloud metadata", "loopback", ...), or ""."""
    ip = embedded_ipv4(ip) or ip
    if ip in METADATA:
        return "cloud metadata"
    for name, attribute in CATEGORIES:
        if getattr(ip, attribute):
            return name
    return "" if ip.is_global else "non-public"


def allowed_hosts() -> set[str]:
    return {
        host.strip().strip("[]").rstrip(".").lower()
        for host in settings.WEBHOOK_ALLOWED_HOSTS
        if host.strip()
    }


def resolve(host: str, port: int) -> list[IPAddress]:
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        raise AddressRefused(
            host, f"{host} could not be resolved", f"{host} could not be resolved: {exc}"
        ) from None
    addresses: list[IPAddress] = []
    for *_, sockaddr in infos:
        address = ip_address(
            sockaddr[0].split("%")[0]
        )  # an IPv6 scope (fe80::1%eth0) is not part of the address
        if address not in addresses:
            addresses.append(address)
    return addresses


def checked_addresses(host: str, port: int) -> list[IPAddress]:
    """Every address `host` resolves to, if all of them may be connected to; AddressRefused otherwise."""
    addresses = resolve(host, port)
    allowed = host.strip("[]").rstrip(".").lower() in allowed_hosts()
    for address in addresses:
        kind = category(address)
        if kind and (kind == "cloud metadata" or not allowed):
            hint = "" if kind == "cloud metadata" else " (an admin can allow it with WEBHOOK_ALLOWED_HOSTS)"
            raise AddressRefused(
                host,
                f"{host} is not a public internet address{hint}",
                f"{host} resolves to {address}, a {kind} address{hint}",
            )
    return addresses


def connect(
    addresses: list[IPAddress], port: int, connect_timeout: float, read_timeout: float
) -> socket.socket:
    """A TCP connection to the first checked address that accepts within `connect_timeout`."""
    error: OSError = OSError(f"no address to connect to on port {port}")
    for address in addresses:
        try:
            sock = socket.create_connection((str(address), port), timeout=connect_timeout)
        except OSError as exc:
            error = exc
            continue
        sock.settimeout(read_timeout)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock
    raise error
