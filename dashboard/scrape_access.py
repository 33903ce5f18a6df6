"""Who may scrape `/metrics`: a client from an allow-listed network, or one with the configured bearer token.

Settings: METRICS_ALLOW (networks, from LAYERCAKE_METRICS_ALLOW) and METRICS_TOKEN_SHA256 (the SHA-256 of
LAYERCAKE_METRICS_TOKEN; the token itself is not kept). Digests are compared in constant time.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
from typing import NamedTuple

from django.conf import settings

REALM = 'Bearer realm="layercake metrics"'


class Verdict(NamedTuple):
    status: int  # 200: let in; 401: no or a wrong token; 403: nothing could let this client in
    reason: str
    challenge: str = ""  # the WWW-Authenticate header of a 401


def check_scrape(remote_addr: str, authorization: str) -> Verdict:
    if address_allowed(remote_addr):
        return Verdict(200, f"{remote_addr} is in LAYERCAKE_METRICS_ALLOW")
    scheme, _, token = authorization.strip().partition(" ")
    if scheme.lower() == "bearer" and token_matches(token.strip()):
        return Verdict(200, "bearer token")
    if authorization:
        return Verdict(401, "wrong token", f'{REALM}, error="invalid_token"')
    if settings.METRICS_TOKEN_SHA256:
        return Verdict(401, "a bearer token is required", REALM)
    return Verdict(403, f"{remote_addr or 'this address'} is not allowed to scrape (LAYERCAKE_METRICS_ALLOW)")


def token_matches(token: str) -> bool:
    expected = settings.METRICS_TOKEN_SHA256
    if not expected or not token or len(token) > 512:
        return False
    return hmac.compare_digest(hashlib.sha256(token.encode()).hexdigest(), expected)


def address_allowed(remote_addr: str) -> bool:
    try:
        address = ipaddress.ip_address(remote_addr)
    except ValueError:  # no address (a unix socket) or a malformed one
        return False
    if address.version == 6 and address.ipv4_mapped is not None:  # ::ffff:10.0.0.5 on a dual-stack socket
        address = address.ipv4_mapped
    return any(address in network for network in settings.METRICS_ALLOW)
