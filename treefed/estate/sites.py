"""The procs engine's view of a generated estate: configs, workload clients, link checks.

Theory of operation
-------------------
``EstateSites(folder, plan)`` is what ``ProcsEngine(..., estate=DIR)`` asks instead of
writing its own configs.  Up front (before any process starts) it loads every site's
config as ``treefed broker`` would, and decides each workload client's credentials:

* **configs** -- ``config(site, port=, uplink_port=, data_dir=, log_file=)`` is the
  site's own config with only what one machine and one run need changed: the listener
  moves to ``127.0.0.1:<free port>`` (same scheme: ``ssl://`` stays TLS), the uplink to
  the engine's proxy for that link (same scheme and connector options; the proxy passes
  bytes, so TLS -- and the parent's check of the child's certificate -- is end to end),
  data and event log into the run's folder, events at info with message and advisory
  events (the run's log is built from them).  Certificates, CA, ``verify_peer``, users,
  permissions, policies and tree confinement are the estate's.  A TLS site must listen on
  ``127.0.0.1`` in the estate: its certificate names its host, and the run dials
  ``127.0.0.1`` (host-name checks stay on).
* **clients** -- a site the plan uses (consumers, sends) gets one workload client.  With
  authentication on, it logs in as the first application user of the site's config (not
  a broker: not in group ``brokers``) whose password is in ``secrets/passwords.toml``
  (generated passwords), and it offers that user's certificate
  (``certs/users/<user>.pem``) when there is one -- required where the listener requires
  client certificates (HQ and regions).  A used site with no such user is a
  ``ConfigError`` naming it, before anything starts.  A site the plan does not use is
  only probed (with its own certificate) to see that it listens.  ``connect`` dials (TLS
  handshake included) until the broker listens; a handshake failure is raised at once.
* **links** -- ``missing_links(logs)`` lists the child -> parent links whose ``link.up``
  the child has not logged; ``why(...)`` collects what the parent and child logged about
  refusals (``tls.handshake_failed``, ``auth.failed``, ``link.refused``...), so a run on an
  estate whose certificates do not match stops with the reason, not a time-out.
"""

from __future__ import annotations

import json
import ssl
import tomllib
from dataclasses import replace
from pathlib import Path
from typing import Any

import trio

from treefed.config import BrokerConfig, load_config
from treefed.errors import ConfigError, RemoteError
from treefed.transport.streams import open_tcp
from treefed.transport.uri import Endpoint, parse_uri

__all__ = ["EstateSites", "Client", "REFUSALS"]

#: log events that say why a link or a client was refused
REFUSALS = ("tls.handshake_failed", "auth.failed", "auth.locked_out", "link.refused",
            "link.failed", "connect.failed", "hello.refused")


class Client:
    __slots__ = ("scheme", "context", "username", "password")

    def __init__(self, scheme: str, context: ssl.SSLContext | None,
                 username: str | None, password: str | None) -> None:
        self.scheme, self.context = scheme, context
        self.username, self.password = username, password


class EstateSites:
    """See the module docstring."""

    def __init__(self, folder: str | Path, plan: Any) -> None:
        self.folder = Path(folder).resolve()
        self.configs: dict[str, BrokerConfig] = {}
        self.probe_only: set[str] = set()
        for spec in plan.final_topology.brokers:
            path = self.folder / f"{spec.id}.toml"
            if not path.exists():
                raise ConfigError("", f"the plan has site {spec.id!r} but {self.folder} has "
                                      f"no {spec.id}.toml")
            self.configs[spec.id] = c = load_config(path)
            for uri in c.broker.listen[:1]:
                if uri.lower().startswith("ssl://") and \
                        parse_uri(uri, listen=True).endpoints[0].host != "127.0.0.1":
                    raise ConfigError("broker.listen", f"{spec.id} listens on {uri}: a run "
                                      "on this machine dials 127.0.0.1, which its "
                                      "certificate does not name; generate the estate with "
                                      'host = "127.0.0.1"')
        passwords = self._passwords()
        used = {c.broker for c in plan.consumers}
        for step in plan.steps:
            used.update(m.broker for m in step.messages)
            used.update(c.broker for c in step.consumers)
        self.clients: dict[str, Client] = {}
        for site, c in self.configs.items():
            client = self._client(site, c, passwords)
            if client is not None:
                self.clients[site] = client
                continue
            if site not in used:   # only probed: does it listen? (with its own certificate)
                scheme = c.broker.listen[0].partition("://")[0].lower()
                self.clients[site] = Client(scheme, c.security.tls.client_context()
                                            if scheme == "ssl" else None, None, None)
                self.probe_only.add(site)
            else:
                raise ConfigError("security.user", f"the workload uses {site}, but its "
                                  "config has no application user whose password is in "
                                  "secrets/passwords.toml: the run cannot log in there")

    def _passwords(self) -> dict[str, str]:
        path = self.folder / "secrets" / "passwords.toml"
        if not path.exists():
            return {}
        try:
            return dict(tomllib.loads(path.read_text(encoding="utf-8")).get("users", {}))
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise ConfigError("", f"{path}: {exc}") from None

    def _client(self, site: str, c: BrokerConfig,
                passwords: dict[str, str]) -> Client | None:
        scheme = c.broker.listen[0].partition("://")[0].lower() if c.broker.listen else "tcp"
        sec, tls = c.security, c.security.tls
        user = None
        if sec.authentication:
            apps = [u for u in sec.users if "brokers" not in u.groups
                    and u.name in passwords]
            if not apps:
                return None
            user = apps[0].name
        context = None
        if scheme == "ssl":
            from treefed.transport.tls import client_context

            cert = self.folder / "certs" / "users" / f"{user}.pem" if user else None
            have = cert is not None and cert.exists()
            context = client_context(ca=tls.ca or None, cert=str(cert) if have else None,
                                     key=str(cert.with_suffix(".key")) if have else None)
        return Client(scheme, context, user, passwords.get(user) if user else None)

    # ------------------------------------------------------------------ configs
    def config(self, site: str, *, port: int, uplink_port: int | None, data_dir: str,
               log_file: str) -> BrokerConfig:
        c = self.configs[site]
        scheme = c.broker.listen[0].partition("://")[0] if c.broker.listen else "tcp"
        broker = replace(c.broker, listen=(f"{scheme}://127.0.0.1:{port}",),
                         data_dir=data_dir)
        logging = replace(c.logging, level="info", file=log_file, message_events=True,
                          advisory_events=True)
        tree, mesh = c.tree_connector, c.network_connectors
        if uplink_port is not None:
            if tree is not None:
                tree = replace(tree, uri=_moved(tree.uri, uplink_port))
            elif len(mesh) == 1:
                mesh = (replace(mesh[0], uri=_moved(mesh[0].uri, uplink_port)),)
            else:
                raise ConfigError("network_connector", f"{site} has {len(mesh)} network "
                                                       "connectors; a run site dials one "
                                                       "parent")
        return replace(c, broker=broker, logging=logging, tree_connector=tree,
                       network_connectors=mesh, monitor=replace(c.monitor, listen=""))

    # ------------------------------------------------------------------ clients
    async def connect(self, site: str, port: int, alive: Any,
                      timeout: float) -> trio.abc.Stream | None:
        """A workload client stream to ``site`` (None: it has no client); dials until the
        broker listens, ``alive()`` says the process still runs, or ``timeout``."""
        client = self.clients[site]
        with trio.fail_after(timeout):
            while True:
                if not alive():
                    raise RuntimeError(f"broker {site} exited")
                try:
                    stream = await open_tcp(Endpoint(client.scheme, "127.0.0.1", port),
                                            ssl_context=client.context)
                except RemoteError as exc:
                    if exc.code != "unreachable":
                        raise RemoteError(f"{site}: the workload client was refused: "
                                          f"{exc.message}", code=exc.code) from None
                    await trio.sleep(0.05)
                    continue
                if site in self.probe_only:   # nothing to do there: it answered, that is all
                    await trio.aclose_forcefully(stream)
                    return None
                return stream

    # ------------------------------------------------------------------ links
    @staticmethod
    def missing_links(parents: dict[str, str | None], logs: dict[str, Path]) -> list:
        """(child, parent) pairs whose link.up the child has not logged."""
        up = set()
        for site, log in logs.items():
            for line in _lines(log):
                if line.get("event") == "link.up":
                    up.add((site, line.get("peer")))
        return [(s, p) for s, p in parents.items() if p is not None and (s, p) not in up]

    @staticmethod
    def why(missing: list, logs: dict[str, Path]) -> str:
        """One line per missing link: what its parent and child logged about refusals
        (each distinct event and reason once, with how often)."""
        out = []
        for child, parent in missing:
            said: dict[str, int] = {}
            for who in (parent, child):
                for line in _lines(logs[who]):
                    if line.get("event") in REFUSALS:
                        reason = line.get("reason") or line.get("error") or ""
                        key = f"{who} logged {line['event']}: {reason}".rstrip(": ")
                        said[key] = said.get(key, 0) + 1
            out.append(f"{child} -> {parent} never came up; "
                       + ("; ".join(f"{k} (x{n})" for k, n in said.items())
                          or "nothing logged about it"))
        return "\n".join(out)


def _lines(path: Path) -> list[dict]:
    out = []
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return out
    for raw in text.splitlines():
        try:
            out.append(json.loads(raw))
        except ValueError:
            pass
    return out


def _moved(uri: str, port: int) -> str:
    """``uri`` (one address, possibly in ``static:(...)``) dialing 127.0.0.1:``port``."""
    target = parse_uri(uri)
    if len(target.endpoints) != 1:
        raise ConfigError("uri", f"{uri}: a run site dials one address")
    e = target.endpoints[0]
    inner = f"{e.scheme}://127.0.0.1:{port}"
    return f"static:({inner})" if uri.lower().startswith("static:") else inner
