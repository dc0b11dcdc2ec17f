"""The links hangd puts in alerts: where a browser reaches this hangd (``external_url``), each
incident's page with a signature that opens that page alone, and the runbook.

A link is ``<external_url>/incidents/<id>?sig=<hmac>``: the HMAC-SHA256 of the incident id under a
key derived from the write token (the read token where there is none), so nodes sharing a token
(a fleet) accept each other's links, and changing the token revokes them. The signature reads one
incident; it never reads another route, and never acks."""

from __future__ import annotations

import hashlib
import hmac

RUNBOOK_PATH = "/docs/runbook"


def link_key(write: str | None, read: str | None) -> bytes | None:
    secret = write or read
    if secret is None:
        return None  # no token at all (loopback only): the page opens without a signature
    return hashlib.sha256(b"hangd incident link\0" + secret.encode()).digest()


def sign(key: bytes, incident_id: str) -> str:
    return hmac.new(key, f"incident:{incident_id}".encode(), hashlib.sha256).hexdigest()[:32]


def valid(key: bytes, incident_id: str, sig: str) -> bool:
    return hmac.compare_digest(sign(key, incident_id).encode(), sig.encode())


def external_base(external_url: str | None, node: str, host: str, port: int, tls: bool) -> str:
    """The configured external URL ("{node}" replaced by the node's name), else this node's name
    and the port hangd listens on: never a pod IP a browser cannot reach."""
    if external_url:
        return external_url.replace("{node}", node).rstrip("/")
    shown = node if host in ("0.0.0.0", "::", "") else host
    shown = f"[{shown}]" if ":" in shown else shown
    return f"{'https' if tls else 'http'}://{shown}:{port}"


def incident_url(base: str, incident_id: int, key: bytes | None) -> str:
    url = f"{base}/incidents/{incident_id}"
    return f"{url}?sig={sign(key, str(incident_id))}" if key is not None else url
