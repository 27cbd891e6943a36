"""``leader_url`` -> the etcd members, credentials and TLS files to use.

``etcd://`` speaks HTTP, ``etcds://`` HTTPS; options ``cacert``, ``cert``, ``key``
are named like ``etcdctl``'s flags.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import parse_qsl, unquote, urlsplit

from ...exceptions import ConfigError
from ..urls import mask_url

DEFAULT_PORT = 2379

_OPTIONS = ("cacert", "cert", "key")


@dataclass(frozen=True)
class EtcdParams:
    """Where and how to reach one etcd cluster."""

    endpoints: tuple[tuple[str, int], ...]
    tls: bool
    user: str | None = None
    password: str | None = None
    cacert: str | None = None
    cert: str | None = None
    key: str | None = None


def etcd_params(url: str) -> EtcdParams:
    """Parse an ``etcd://`` or ``etcds://`` URL; a bad one fails naming ``leader_url``."""
    shown = mask_url(url)
    parts = urlsplit(url)
    userinfo, _, hosts = parts.netloc.rpartition("@")
    user = password = None
    if userinfo:
        name, colon, secret = userinfo.partition(":")
        if not name or not colon:
            raise ConfigError(
                f"leader_url {shown!r}: etcd credentials go as user:password@ before the hosts"
            )
        user, password = unquote(name), unquote(secret)
    endpoints = tuple(_endpoint(hostport, shown) for hostport in hosts.split(","))
    if parts.path not in ("", "/"):
        raise ConfigError(
            f"leader_url {shown!r}: an etcd URL has no path (keys use leader_key_prefix)"
        )
    options = dict(parse_qsl(parts.query, keep_blank_values=True))
    unknown = sorted(set(options) - set(_OPTIONS))
    if unknown:
        raise ConfigError(
            f"leader_url {shown!r}: unknown option(s) {', '.join(unknown)}; "
            f"an etcd URL takes {', '.join(_OPTIONS)}"
        )
    tls = parts.scheme.lower() == "etcds"
    if options and not tls:
        raise ConfigError(f"leader_url {shown!r}: TLS options need the etcds:// scheme")
    if ("cert" in options) != ("key" in options):
        raise ConfigError(f"leader_url {shown!r}: give the client certificate's cert and key both")
    return EtcdParams(
        endpoints,
        tls,
        user,
        password,
        options.get("cacert") or None,
        options.get("cert") or None,
        options.get("key") or None,
    )


def _endpoint(hostport: str, shown: str) -> tuple[str, int]:
    host, port = hostport, ""
    if hostport.startswith("["):  # [IPv6]:port
        host, _, rest = hostport[1:].partition("]")
        port = rest.removeprefix(":")
    elif ":" in hostport:
        host, _, port = hostport.rpartition(":")
    if not host:
        raise ConfigError(f"leader_url {shown!r}: every etcd member needs a host name")
    try:
        number = int(port) if port else DEFAULT_PORT
    except ValueError:
        number = 0
    if not 0 < number < 65536:
        raise ConfigError(f"leader_url {shown!r}: bad port {port!r} for etcd member {host!r}")
    return host, number
