"""``treefed estate generate``: one small estate description -> a broker config per site.

Theory of operation
-------------------
``load_description`` validates ``ESTATE.toml`` up front (``ConfigError`` with the dotted
key at fault) and expands it into ``Site``s: HQ, then each ``[[layer]]`` in order (the
last layer is the stores), ``count`` per parent or an explicit ``sites`` list naming each
site's parent.  Ids, hosts and ports come from templates (``{i}`` index in the layer from
1, ``{n}`` index under the parent, ``{parent}``, ``{id}``); ids and (host, port) pairs
must be unique.

``generate`` writes, for every site, ``<id>.toml`` -- built as a dict, checked by
``config.parse_config`` exactly as ``treefed broker`` will check it, and written as
TOML text with relative paths, so the same description gives byte-identical configs --
plus ``users.toml`` (every user's scrypt hash) and, with ``[tls]``, a CA and one
certificate per site (ECDSA P-256 from the ``cryptography`` library; CN and DNS name the
site id, the host as DNS name or IP; server and client use, so links are mutual TLS) and
one client certificate per user (``certs/users/<name>.pem``, CN = the user: applications
reaching a listener that requires certificates authenticate with it).

Secrets never change behind the user's back: an existing CA, site key and certificate,
and generated password are kept on a re-run (so the run is idempotent) unless
``rotate=True``; private keys and generated passwords are written 0600 under
``certs/*.key`` and ``secrets/``, which the ``.gitignore`` written into the output folder
keeps out of any repository.  A user without ``password_hash`` gets a random password,
printed nowhere but ``secrets/passwords.toml``.

Description format (every key but the topology optional)::

    name = "retail"
    mode = "tree"                  # tree | mesh
    [hq]      id = "hq", host = "127.0.0.1", port = 61616
    [[layer]] name = "region", count = 4, id = "region-{i}", host = "...", port = 61617
              base_port = 62000    # instead of port: base_port + i - 1
    [[layer]] name = "store", count = 1000, id = "store-{parent}-{n:04}"
              sites = [{id = "...", parent = "...", port = 1}]   # instead of count
    [connector]                    # tree or mesh connector options (as in broker configs)
    [tls]     enabled = true, days = 825, verify_peer = true
    [security] authentication = true
    [[user]]  name, groups, sites = ["store"], password_hash
    [[permission]] principal, read, write, admin, sites      # {id} {parent} in patterns
    [[policy]] sites = ["store"], pattern = "queue://Store.{id}.>", max_messages = ...
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import re
import secrets
import string
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from treefed.config import (
    _POLICY, _REQUIRED, _bool, _check_table, _identifier, _int, _list_of, _string,
    _toml_value, parse_config, parse_mesh_options, parse_tree_options, read_toml,
)
from treefed.errors import ConfigError

__all__ = ["Site", "Description", "load_description", "parse_description", "generate"]

_ID_RE = re.compile(r"[A-Za-z0-9._-]+\Z")


@dataclass(frozen=True, slots=True)
class Site:
    id: str
    layer: str                 # "hq" or the layer name
    parent: str | None
    host: str
    port: int
    is_leaf: bool


@dataclass(slots=True)
class Description:
    name: str
    mode: str
    sites: list[Site]
    connector: dict[str, Any]
    tls: dict[str, Any]
    authentication: bool
    users: list[dict[str, Any]]
    permissions: list[dict[str, Any]]
    policies: list[dict[str, Any]]
    data_root: str = "data"
    source: str = "<string>"
    children: dict[str, list[str]] = field(default_factory=dict)


# --------------------------------------------------------------------------- parsing


def _template(*allowed: str):
    def check(value: Any, key: str) -> str:
        text = _string(value, key)
        try:
            names = {f for _, f, _, _ in string.Formatter().parse(text) if f is not None}
        except ValueError as exc:
            raise ConfigError(key, f"bad template {text!r}: {exc}") from None
        if bad := names - set(allowed):
            raise ConfigError(key, f"unknown placeholder {{{sorted(bad)[0]}}}; allowed: "
                                   + ", ".join("{" + a + "}" for a in allowed))
        return text

    return check


def _port(value: Any, key: str) -> int:
    return _int(1, 65535)(value, key)


def _explicit_sites(value: Any, key: str) -> tuple:
    if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
        raise ConfigError(key, "must be a list of {id, parent [, host, port]} tables")
    table = {"id": (_identifier, _REQUIRED), "parent": (_string, None),
             "host": (_string, None), "port": (_port, None)}
    return tuple(_check_table(v, table, f"{key}[{i}]") for i, v in enumerate(value))


_HQ = {"id": (_identifier, "hq"), "host": (_template("id"), "127.0.0.1"),
       "port": (_port, 61616)}
_LAYER = {"name": (_identifier, _REQUIRED), "count": (_int(1), None),
          "sites": (_explicit_sites, None), "id": (_template("i", "n", "parent", "name"), None),
          "host": (_template("id", "i", "n", "parent"), "127.0.0.1"),
          "port": (_port, None), "base_port": (_port, None)}
_TLS = {"enabled": (_bool, True), "days": (_int(1, 3650), 825), "verify_peer": (_bool, True)}
_USER = {"name": (_identifier, _REQUIRED), "groups": (_list_of(_identifier), ()),
         "sites": (_list_of(_string), ()), "password_hash": (_string, "")}
_PERMISSION = {"principal": (_string, _REQUIRED), "read": (_list_of(_string), ()),
               "write": (_list_of(_string), ()), "admin": (_list_of(_string), ()),
               "sites": (_list_of(_string), ())}
_TOP = ("name", "mode", "data_root", "hq", "layer", "connector", "tls", "security", "user",
        "permission", "policy")
#: the largest estate a description may expand to (a typo'd count is caught early)
MAX_SITES = 200_000


def load_description(path: str | Path) -> Description:
    return parse_description(read_toml(path), source=str(path))


def parse_description(data: dict, *, source: str = "<string>") -> Description:
    try:
        return _parse(data, source)
    except ConfigError as exc:
        exc.add_note(f"in {source}")
        raise


def _parse(data: dict, source: str) -> Description:
    from treefed.config import _suggest

    for key in data:
        if key not in _TOP:
            raise ConfigError(key, "unknown key" + _suggest(key, _TOP))
    name = _identifier(data.get("name", "estate"), "name")
    mode = data.get("mode", "tree")
    if mode not in ("tree", "mesh"):
        raise ConfigError("mode", f'must be "tree" or "mesh", got {mode!r}')
    data_root = _string(data.get("data_root", "data"), "data_root")
    hq = _check_table(data.get("hq", {}), _HQ, "hq")
    hq_site = Site(hq["id"], "hq", None, hq["host"].format(id=hq["id"]), hq["port"], False)
    sites = [hq_site]
    level = [hq_site]
    layers = data.get("layer", [])
    if not isinstance(layers, list) or not layers:
        raise ConfigError("layer", "at least one [[layer]] (the stores) is required")
    seen_layers = {"hq"}
    for li, raw in enumerate(layers):
        key = f"layer[{li}]"
        layer = _check_table(raw, _LAYER, key)
        if layer["name"] in seen_layers:
            raise ConfigError(f"{key}.name", f"duplicate layer name {layer['name']!r}")
        seen_layers.add(layer["name"])
        if (layer["count"] is None) == (layer["sites"] is None):
            raise ConfigError(f"{key}.count", "give exactly one of count or sites")
        if layer["port"] is not None and layer["base_port"] is not None:
            raise ConfigError(f"{key}.base_port", "give at most one of port or base_port")
        last = li == len(layers) - 1
        level = _expand(layer, level, key, last, len(sites))
        sites += level
    connector = data.get("connector", {})
    parse = parse_tree_options if mode == "tree" else parse_mesh_options
    connector = parse(connector, "connector")
    if mode == "mesh":
        connector.setdefault("duplex", True)
    tls = _check_table(data.get("tls", {"enabled": False}), _TLS, "tls")
    security = _check_table(data.get("security", {}), {"authentication": (_bool, None)},
                            "security")
    users = [_check_table(u, _USER, f"user[{i}]") for i, u in enumerate(data.get("user", []))]
    names = [u["name"] for u in users]
    if len(set(names)) != len(names):
        raise ConfigError("user", "duplicate user name")
    authentication = security["authentication"]
    if authentication is None:
        authentication = bool(users)
    if authentication and not tls["enabled"]:
        raise ConfigError("security.authentication", "needs [tls]: broker links "
                                                     "authenticate with their certificates")
    permissions = [_check_table(p, _PERMISSION, f"permission[{i}]")
                   for i, p in enumerate(data.get("permission", []))]
    policy_table = {**_POLICY, "sites": (_list_of(_string), ())}
    policy_table["pattern"] = (_string, _REQUIRED)
    policies = [_check_table(p, policy_table, f"policy[{i}]")
                for i, p in enumerate(data.get("policy", []))]
    for what, items in (("user", users), ("permission", permissions), ("policy", policies)):
        for i, item in enumerate(items):
            for s in item["sites"]:
                if s not in seen_layers and s not in {x.id for x in sites[:1]}:
                    raise ConfigError(f"{what}[{i}].sites", f"no layer {s!r}; layers: "
                                                            + ", ".join(sorted(seen_layers)))
    ids: dict[str, Site] = {}
    addrs: dict[tuple[str, int], str] = {}
    for s in sites:
        if s.id in ids:
            raise ConfigError("layer", f"site id {s.id!r} is generated twice")
        ids[s.id] = s
        if (s.host, s.port) in addrs:
            raise ConfigError("layer", f"{s.id} and {addrs[(s.host, s.port)]} both listen "
                                       f"on {s.host}:{s.port}")
        addrs[(s.host, s.port)] = s.id
    desc = Description(name, mode, sites, connector, tls, authentication, users,
                       permissions, policies, data_root, source)
    for s in sites:
        desc.children.setdefault(s.id, [])
        if s.parent is not None:
            desc.children[s.parent].append(s.id)
    return desc


def _expand(layer: dict, parents: list[Site], key: str, last: bool, before: int) -> list[Site]:
    out: list[Site] = []
    by_id = {p.id: p for p in parents}
    name = layer["name"]
    idt = layer["id"] or ("{parent}-{n:04}" if last else name + "-{i}")

    def port_for(i: int, given: int | None) -> int:
        if given is not None:
            return given
        if layer["base_port"] is not None:
            p = layer["base_port"] + i - 1
            if p > 65535:
                raise ConfigError(f"{key}.base_port", f"site {i} would get port {p} > 65535")
            return p
        if layer["port"] is not None:
            return layer["port"]
        raise ConfigError(f"{key}.port", "give port (with a host template per site) or "
                                         "base_port")

    if layer["sites"] is not None:
        for i, s in enumerate(layer["sites"], 1):
            parent = s["parent"] or (parents[0].id if len(parents) == 1 else None)
            if parent not in by_id:
                raise ConfigError(f"{key}.sites[{i - 1}].parent",
                                  f"no site {parent!r} in the layer above")
            host = s["host"] or layer["host"].format(id=s["id"], i=i, n=i, parent=parent)
            out.append(Site(s["id"], name, parent, host, port_for(i, s["port"]), last))
        return out
    total = len(parents) * layer["count"]
    if before + total > MAX_SITES:
        raise ConfigError(f"{key}.count", f"{before + total} sites is more than {MAX_SITES}")
    i = 0
    for p in parents:
        for n in range(1, layer["count"] + 1):
            i += 1
            try:
                sid = idt.format(i=i, n=n, parent=p.id, name=name)
                host = layer["host"].format(id=sid, i=i, n=n, parent=p.id)
            except (ValueError, IndexError) as exc:
                raise ConfigError(f"{key}.id", f"bad template: {exc}") from None
            if not _ID_RE.match(sid):
                raise ConfigError(f"{key}.id", f"{sid!r} is not a valid broker id")
            out.append(Site(sid, name, p.id, host, port_for(i, None), last))
    return out


# --------------------------------------------------------------------------- writing


def _toml(data: dict[str, Any]) -> str:
    """A dict of scalars, tables and arrays of tables as TOML, keys in insertion order."""
    out: list[str] = []

    def table(prefix: str, d: dict, array: bool) -> None:
        scalars = [(k, v) for k, v in d.items() if not isinstance(v, (dict, list))
                   or (isinstance(v, list) and not (v and isinstance(v[0], dict)))]
        out.append(f"[[{prefix}]]" if array else f"[{prefix}]")
        out.extend(f"{k} = {_toml_value(v)}" for k, v in scalars)
        out.append("")
        for k, v in d.items():
            if isinstance(v, dict):
                table(f"{prefix}.{k}", v, False)
            elif isinstance(v, list) and v and isinstance(v[0], dict):
                for item in v:
                    table(f"{prefix}.{k}", item, True)

    for k, v in data.items():
        if isinstance(v, dict):
            table(k, v, False)
        else:
            for item in v:
                table(k, item, True)
    return "\n".join(out)


def _private(path: Path, data: bytes) -> None:
    """Write a secret readable by its owner only (created 0600, never widened)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.chmod(path, 0o600)


def _applies(item: dict, site: Site) -> bool:
    return not item["sites"] or site.layer in item["sites"] or site.id in item["sites"]


def _fill(text: str, site: Site) -> str:
    return text.replace("{id}", site.id).replace("{parent}", site.parent or "")


def _uri(scheme: str, site: Site) -> str:
    host = f"[{site.host}]" if ":" in site.host else site.host
    return f"{scheme}://{host}:{site.port}"


def site_config(desc: Description, site: Site, by_id: dict[str, Site],
                hashes: dict[str, str]) -> dict[str, Any]:
    tls = desc.tls["enabled"]
    scheme = "ssl" if tls else "tcp"
    children = desc.children.get(site.id, [])
    data: dict[str, Any] = {"broker": {
        "id": site.id, "data_dir": f"{desc.data_root}/{site.id}",
        "listen": [_uri(scheme, site)],
        "accept_tree_children": desc.mode == "tree" and bool(children),
        "accept_mesh": desc.mode == "mesh"}}
    policies = [{k: (_fill(v, site) if k == "pattern" else v) for k, v in p.items()
                 if k != "sites"} for p in desc.policies if _applies(p, site)]
    if policies:
        data["policy"] = policies
    if site.parent is not None:
        parent = by_id[site.parent]
        if desc.mode == "tree":
            data["tree_connector"] = {"node_type": "branch" if children else "leaf",
                                      "uri": _uri(scheme, parent), **desc.connector}
        else:
            data["network_connector"] = [{"name": "uplink",
                                          "uri": f"static:({_uri(scheme, parent)})",
                                          **desc.connector}]
    security: dict[str, Any] = {}
    if desc.authentication:
        security["authentication"] = True
        users = [{"name": c, "groups": ["brokers"]} for c in children]
        users += [{"name": u["name"], "password_hash": hashes[u["name"]],
                   "groups": list(u["groups"])} for u in desc.users if _applies(u, site)]
        if users:
            security["user"] = users
        perms = []
        if any("brokers" in u["groups"] for u in users):
            perms.append({"principal": "group:brokers", "read": [">"], "write": [">"]})
        have = {u["name"] for u in users} | {g for u in users for g in u["groups"]}
        for p in desc.permissions:
            who = p["principal"].removeprefix("group:")
            if _applies(p, site) and (who in have or p["principal"] == "*"):
                perms.append({"principal": p["principal"],
                              **{k: [_fill(x, site) for x in p[k]]
                                 for k in ("read", "write", "admin") if p[k]}})
        if perms:
            security["permission"] = perms
    if tls:
        security["tls"] = {"cert": f"certs/{site.id}.pem", "key": f"certs/{site.id}.key",
                           "ca": "certs/ca.pem",
                           # brokers that accept links require their certificates (mutual
                           # TLS); a store's listener serves only its applications
                           "verify_peer": desc.tls["verify_peer"] and bool(children)}
    if security:
        data["security"] = security
    return data


def generate(desc: Description, out: str | Path, *, rotate: bool = False) -> dict[str, Any]:
    """Write the estate into ``out`` (see the module docstring); returns counts."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "secrets").mkdir(exist_ok=True)
    os.chmod(out / "secrets", 0o700)
    gitignore = out / ".gitignore"
    gitignore.write_text("# private keys and generated passwords never go into a "
                         "repository\ncerts/*.key\ncerts/users/*.key\nsecrets/\n")
    hashes = _users(desc, out, rotate)
    new_keys = _certificates(desc, out, rotate) if desc.tls["enabled"] else 0
    by_id = {s.id: s for s in desc.sites}
    files = 0
    for site in desc.sites:
        data = site_config(desc, site, by_id, hashes)
        path = out / f"{site.id}.toml"
        try:
            parse_config(data, source=str(path))
        except ConfigError as exc:
            raise ConfigError(exc.key, f"generated config of {site.id} is invalid: "
                                       f"{exc.problem}") from None
        text = (f"# {site.id}: {site.layer} of estate {desc.name!r}, generated by treefed "
                f"estate generate from {Path(desc.source).name}\n" + _toml(data))
        if not path.exists() or path.read_text(encoding="utf-8") != text:
            path.write_text(text, encoding="utf-8")
        files += 1
    written = sum(1 for p in out.rglob("*") if p.is_file())
    return {"sites": len(desc.sites), "configs": files, "files": written,
            "new_keys": new_keys}


def _users(desc: Description, out: Path, rotate: bool) -> dict[str, str]:
    """users.toml (name -> scrypt hash) and secrets/passwords.toml for generated ones."""
    from treefed.security.passwords import hash_password

    users_file, pw_file = out / "users.toml", out / "secrets" / "passwords.toml"
    old_hashes: dict[str, str] = {}
    old_pw: dict[str, str] = {}
    if not rotate:
        for path, target in ((users_file, old_hashes), (pw_file, old_pw)):
            if path.exists():
                try:
                    target.update(tomllib.loads(path.read_text(encoding="utf-8")).get(
                        "users", {}))
                except tomllib.TOMLDecodeError as exc:
                    raise ConfigError("", f"{path}: invalid TOML: {exc}") from None
    hashes: dict[str, str] = {}
    passwords: dict[str, str] = {}
    for u in desc.users:
        name = u["name"]
        if u["password_hash"]:
            hashes[name] = u["password_hash"]
        elif name in old_pw and name in old_hashes:
            hashes[name], passwords[name] = old_hashes[name], old_pw[name]
        else:
            passwords[name] = secrets.token_urlsafe(18)
            hashes[name] = hash_password(passwords[name])
    body = "".join(f"{_toml_value(n)} = {_toml_value(h)}\n" for n, h in hashes.items())
    users_file.write_text("# user -> scrypt password hash ([[security.user]] "
                          "password_hash), by treefed estate generate\n[users]\n" + body)
    if passwords:
        _private(pw_file, ("# generated passwords: hand them over, then delete this file\n"
                           "[users]\n" + "".join(f"{_toml_value(n)} = {_toml_value(p)}\n"
                                                 for n, p in passwords.items())).encode())
    return hashes


def _certificates(desc: Description, out: Path, rotate: bool) -> int:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    certs = out / "certs"
    certs.mkdir(exist_ok=True)
    ca_cert_path, ca_key_path = certs / "ca.pem", out / "secrets" / "ca.key"
    now = datetime.datetime.now(datetime.timezone.utc)
    days = datetime.timedelta(days=desc.tls["days"])
    new = 0
    if not rotate and ca_cert_path.exists() and ca_key_path.exists():
        ca_key = serialization.load_pem_private_key(ca_key_path.read_bytes(), None)
        ca_cert = x509.load_pem_x509_certificate(ca_cert_path.read_bytes())
        fresh_ca = False
    else:
        ca_key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME,
                                             f"treefed estate {desc.name} CA")])
        ca_cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
                   .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
                   .not_valid_before(now - datetime.timedelta(minutes=5))
                   .not_valid_after(now + days)
                   .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
                   .add_extension(x509.KeyUsage(False, False, False, False, False, True, True,
                                                False, False), critical=True)
                   .sign(ca_key, hashes.SHA256()))
        _private(ca_key_path, ca_key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption()))
        ca_cert_path.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
        fresh_ca = True
        new += 1
    issuer = ca_cert.subject
    usage = x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH,
                                   ExtendedKeyUsageOID.CLIENT_AUTH])
    # one certificate per site (server and client: links are mutual TLS), and one per
    # user, for applications connecting to a listener that requires a certificate
    subjects = [(site.id, site.host, certs) for site in desc.sites]
    if desc.users:
        (certs / "users").mkdir(exist_ok=True)
        subjects += [(u["name"], None, certs / "users") for u in desc.users]
    for cn, host, folder in subjects:
        cert_path, key_path = folder / f"{cn}.pem", folder / f"{cn}.key"
        if not rotate and not fresh_ca and cert_path.exists() and key_path.exists():
            continue
        key = ec.generate_private_key(ec.SECP256R1())
        alt: list[x509.GeneralName] = [x509.DNSName(cn)]
        if host is not None:
            try:
                alt.append(x509.IPAddress(ipaddress.ip_address(host)))
            except ValueError:
                if host != cn:
                    alt.append(x509.DNSName(host))
        cert = (x509.CertificateBuilder()
                .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)]))
                .issuer_name(issuer).public_key(key.public_key())
                .serial_number(x509.random_serial_number())
                .not_valid_before(now - datetime.timedelta(minutes=5))
                .not_valid_after(now + days)
                .add_extension(x509.SubjectAlternativeName(alt), critical=False)
                .add_extension(x509.BasicConstraints(ca=False, path_length=None),
                               critical=True)
                .add_extension(usage, critical=False)
                .sign(ca_key, hashes.SHA256()))
        _private(key_path, key.private_bytes(serialization.Encoding.PEM,
                                             serialization.PrivateFormat.PKCS8,
                                             serialization.NoEncryption()))
        cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        new += 1
    return new
