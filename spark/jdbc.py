"""libpq DSNs (URL or ``key=value``) to a JDBC URL plus connection properties, password kept out of the URL."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from urllib.parse import quote

import psycopg.conninfo

from pgjournal.errors import ConfigurationError
from pgjournal.server.connections import connection_kwargs
from pgjournal.server.dsn import check_dsn, dsn_password, mask_dsn, resolve_dsn
from pgjournal.settings import Settings

from .scram import PASSFILE_PROPERTY, PLUGIN_CLASS

# libpq keyword -> PgJDBC property (https://jdbc.postgresql.org/documentation/use/).
_PROPERTY_NAMES = {
    "user": "user",
    "password": "password",
    "sslmode": "sslmode",
    "sslrootcert": "sslrootcert",
    "sslcert": "sslcert",
    "sslkey": "sslkey",
    "application_name": "ApplicationName",
    "connect_timeout": "connectTimeout",
    "options": "options",
    "target_session_attrs": "targetServerType",
    # libpq's list of accepted methods (the embedded server's DSN: SCRAM only); PgJDBC 42.7.13 refuses the
    # others as libpq does; older drivers (42.5.5) ignore the property, hence spark/scram.py's plugin.
    "require_auth": "requireAuth",
}
# libpq keywords that have no JDBC meaning for a read; ignored rather than refused.
_IGNORED = {"client_encoding", "fallback_application_name", "keepalives", "keepalives_idle",
            "keepalives_interval", "keepalives_count", "gssencmode", "channel_binding"}
_TARGET_TYPES = {"any": "any", "read-write": "primary", "primary": "primary", "read-only": "secondary",
                 "standby": "secondary", "prefer-standby": "preferSecondary"}


@dataclass(frozen=True)
class JdbcTarget:
    """A JDBC URL and the properties Spark passes to the driver (``user``, ``password``, ``sslmode``...)."""

    url: str
    properties: dict[str, str] = field(repr=False)

    def __repr__(self) -> str:
        shown = {k: ("***" if k == "password" else v) for k, v in self.properties.items()}
        return f"JdbcTarget(url={self.url!r}, properties={shown!r})"

    def options(self) -> dict[str, str]:
        """``url`` and the properties as Spark ``DataFrameReader.option`` pairs (``driver`` included)."""
        return {"url": self.url, **self.properties}


def jdbc_target(dsn: str | None = None, *, scram_plugin: bool = False) -> JdbcTarget:
    """Convert a libpq DSN (``postgresql://u:p@h:5432/db?sslmode=require`` or ``host=h dbname=db``) to JDBC.

    ``None`` means the configured DSN or the embedded server. Unix-socket hosts are refused: the JDBC driver
    needs TCP. Errors mask the password. ``scram_plugin``: the session's driver can load
    :data:`spark.scram.PLUGIN_CLASS` (:func:`spark.scram.in_session`); a DSN that requires SCRAM
    (``require_auth=scram-sha-256``, as the embedded server's) then has the plugin read its password file when
    the server asks for a SCRAM exchange, and never for anything else. Otherwise the password goes as a property.
    The authentication rules (``requireAuth``, the plugin) are parameters of the URL, which names no secret.
    """
    resolved = check_dsn(resolve_dsn(dsn))
    params = psycopg.conninfo.conninfo_to_dict(resolved)
    passfile = params.pop("passfile", None)
    plugin = scram_plugin and params.get("require_auth") == "scram-sha-256"
    if plugin:
        passfile = passfile or os.environ.get("PGPASSFILE")  # as libpq (and dsn_password) would read
    elif passfile:  # the driver reads no libpq password file: the password goes as a property
        params["password"] = dsn_password(resolved)
    hosts = str(params.pop("host", "") or params.pop("hostaddr", "") or "localhost").split(",")
    params.pop("hostaddr", None)
    ports = str(params.pop("port", "") or "5432").split(",")
    if len(ports) == 1:
        ports = ports * len(hosts)
    if len(ports) != len(hosts):
        raise ConfigurationError(f"DSN {mask_dsn(resolved)!r} lists {len(hosts)} hosts but {len(ports)} ports")
    for host in hosts:
        if not host or host.startswith("/") or host.startswith("@"):
            raise ConfigurationError(
                f"DSN {mask_dsn(resolved)!r} uses a Unix socket ({host!r}); Spark's JDBC driver needs TCP: "
                "give host=127.0.0.1 (or a host name) and a port"
            )
    for port in ports:
        if not port.isdigit() or not 0 < int(port) < 65536:
            raise ConfigurationError(f"DSN {mask_dsn(resolved)!r} has port {port!r}; expected 1..65535")
    user = str(params.get("user") or "")
    dbname = str(params.pop("dbname", "") or user or "postgres")
    authority = ",".join(f"[{h}]:{p}" if ":" in h else f"{h}:{p}" for h, p in zip(hosts, ports, strict=True))
    url = f"jdbc:postgresql://{authority}/{quote(dbname, safe='')}"
    properties: dict[str, str] = {"driver": "org.postgresql.Driver"}
    for key, value in params.items():
        if value is None or value == "" or key in _IGNORED:
            continue
        name = _PROPERTY_NAMES.get(key)
        if name is None:
            raise ConfigurationError(
                f"DSN {mask_dsn(resolved)!r} has parameter {key!r}, which has no JDBC equivalent here; "
                f"supported: host, port, dbname, {', '.join(sorted(_PROPERTY_NAMES))}"
            )
        if key == "target_session_attrs":
            value = _TARGET_TYPES.get(str(value), str(value))
        properties[name] = str(value)
    # Who may have the password travels in the URL: Spark lower-cases the property names of a read by predicates
    # (spark.read.jdbc(..., predicates=...)), and PgJDBC's are case-sensitive, so as properties they would be
    # dropped without a word on the reads by slice range.
    rules = {"requireAuth": properties.pop("requireAuth")} if "requireAuth" in properties else {}
    if plugin:
        rules["authenticationPluginClassName"] = PLUGIN_CLASS
        if passfile and "password" not in properties:
            rules[PASSFILE_PROPERTY] = str(passfile)
    if rules:
        url += "?" + "&".join(f"{name}={quote(value, safe='')}" for name, value in rules.items())
    # As every pgjournal connection (pgjournal/server/connections.py): a bounded connect and TCP keepalives. No
    # socket timeout: one partition's read may legitimately stream for long.
    properties.setdefault("connectTimeout", str(connection_kwargs(Settings.load())["connect_timeout"]))
    properties["tcpKeepAlive"] = "true"
    return JdbcTarget(url, properties)
