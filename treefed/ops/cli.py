"""The operator sub-commands of ``treefed`` (issue #16): ``wait``, ``map``, ``explain``,
``link add|del|list`` and ``reload``.  ``treefed.cli`` adds their parsers with
``add_commands`` and runs them with ``run(args, connect=...)``, handing over its own
``_connect`` (credentials and TLS from the command line); each one talks to brokers only
through the client library.  Kept apart from ``cli.py`` so that file stays small.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Callable, Sequence

__all__ = ["add_commands", "run", "check", "COMMANDS", "NESTED"]

COMMANDS = ("wait", "map", "link", "explain", "reload")
#: sub-commands with their own sub-commands: name -> parser -> {action: parser}
NESTED: dict[str, Callable[[argparse.ArgumentParser], dict]] = {
    "link": lambda p: next(a for a in p._actions   # noqa: SLF001 - argparse has no API
                           if isinstance(a, argparse._SubParsersAction)).choices,
}


def add_commands(sub: Any, connection_options: Callable[[argparse.ArgumentParser], None],
                 ) -> None:
    """Add the operator sub-commands to ``treefed``'s sub-parsers."""
    p = sub.add_parser("wait", help="wait until a broker answers (and its links are up)")
    connection_options(p)
    p.add_argument("uri")
    p.add_argument("--timeout", type=float, default=30.0,
                   help="give up after this many seconds (status 1)")
    p.add_argument("--link-up", action="store_true",
                   help="also wait for the parent link (or, without one, every connector)")

    p = sub.add_parser("map", help="walk the estate from a root broker and draw it")
    connection_options(p)
    p.add_argument("uri", help="the root broker (any broker: the walk goes down from it)")
    fmt = p.add_mutually_exclusive_group()
    fmt.add_argument("--json", action="store_true", help="the map as JSON")
    fmt.add_argument("--dot", action="store_true", help="Graphviz dot")
    fmt.add_argument("--html", action="store_true", help="a self-contained HTML page")
    p.add_argument("--timeout", type=float, default=5.0,
                   help="seconds each broker has to answer before it is shown unreachable")
    p.add_argument("--concurrency", type=int, default=64, help="brokers asked at once")

    p = sub.add_parser("link", help="add, delete or list a running broker's mesh links")
    link = p.add_subparsers(dest="link_command", required=True, metavar="ACTION")
    q = link.add_parser("add", help="start a network connector now")
    connection_options(q)
    q.add_argument("uri", help="the broker to change")
    q.add_argument("name", help="connector name (unique on that broker)")
    q.add_argument("target", help="where it dials: tcp://, ssl://, static:(...)")
    q.add_argument("--option", action="append", default=[], metavar="K=V",
                   help="[[network_connector]] option, e.g. network_ttl=2 or "
                        "statically_included=queue://A,queue://B (repeatable)")
    q = link.add_parser("del", help="stop a network connector (its link says bye)")
    connection_options(q)
    q.add_argument("uri")
    q.add_argument("name")
    q = link.add_parser("list", help="the broker's connectors and their state")
    connection_options(q)
    q.add_argument("uri")

    p = sub.add_parser("explain", help="why a message sent at a broker would or would not "
                                       "reach each consumer")
    connection_options(p)
    p.add_argument("dst", help="destination, e.g. queue://Store.0001.Incoming")
    p.add_argument("--from", dest="from_broker", required=True, metavar="BROKER",
                   help="the broker id the message is sent at (or its URI)")
    p.add_argument("--root", default=None, metavar="URI",
                   help="where to start walking the estate (default: --from, a URI)")
    p.add_argument("--run", default=None, metavar="DIR",
                   help="explain from a scenario run directory's event log instead")
    p.add_argument("--at", type=float, default=None, metavar="T",
                   help="with --run: the estate as it stood at run time T (default: end)")
    p.add_argument("--json", action="store_true", help="the explanation as JSON")
    p.add_argument("--timeout", type=float, default=5.0,
                   help="seconds each broker has to answer")

    p = sub.add_parser("reload", help="make a broker re-read its config file (as SIGHUP)")
    connection_options(p)
    p.add_argument("uri")


def check(args: argparse.Namespace) -> str | None:
    """A usage problem of the parsed arguments (exit 2), or None."""
    if args.command == "map" and (args.concurrency < 1 or args.timeout <= 0):
        return "--concurrency must be >= 1 and --timeout > 0"
    return None


async def run(args: argparse.Namespace, *, connect: Any) -> int:
    if args.command == "wait":
        return await _wait(args, connect)
    if args.command == "map":
        return await _map(args, connect)
    if args.command == "explain":
        return await _explain(args, connect)
    return await _admin(args, connect)


def _stat_function(args: argparse.Namespace, connect: Any) -> Any:
    """``stat(uri)`` with the command line's credentials: one short connection each."""
    import copy

    async def stat(uri: str) -> dict:
        one = copy.copy(args)
        one.uri = uri
        async with connect(one, f"treefed-{args.command}") as conn:
            return await conn.stat()

    return stat


async def _wait(args: argparse.Namespace, connect: Any) -> int:
    from treefed.ops.wait import wait_ready

    ok, reason = await wait_ready(args.uri, _stat_function(args, connect), timeout=args.timeout,
                                  link_up=args.link_up)
    if not ok:
        print(f"treefed wait: {args.uri} not ready after {args.timeout:g} s: {reason}",
              file=sys.stderr)
        return 1
    return 0


async def _map(args: argparse.Namespace, connect: Any) -> int:
    from treefed.ops import estate_map

    found = await estate_map.discover(args.uri, _stat_function(args, connect),
                                      concurrency=args.concurrency, timeout=args.timeout)
    if args.json:
        print(json.dumps(found.as_dict(), indent=1, default=str))
    elif args.dot:
        print(estate_map.render_dot(found), end="")
    elif args.html:
        print(estate_map.render_html(found), end="")
    else:
        print(estate_map.render_text(found), end="")
    root = found.brokers.get(found.root_key) if found.root_key else None
    return 0 if root is not None and root.reachable else 1


_LIST_OPTIONS = ("dynamically_included", "excluded", "statically_included")


def _link_options(pairs: Sequence[str]) -> dict:
    from treefed.cli import _header_value as _typed   # TOML-like typing, as --header

    options: dict = {}
    for pair in pairs:
        key, eq, text = pair.partition("=")
        if not eq or not key:
            raise SystemExit(f"treefed link: --option wants K=V, got {pair!r}")
        options[key] = ([v for v in text.split(",") if v] if key in _LIST_OPTIONS
                        else _typed(text))
    return options


async def _admin(args: argparse.Namespace, connect: Any) -> int:
    if args.command == "reload":
        command, params = "reload", {}
    elif args.link_command == "add":
        command = "link.add"
        params = {"name": args.name, "uri": args.target, **_link_options(args.option)}
    elif args.link_command == "del":
        command, params = "link.del", {"name": args.name}
    else:
        command, params = "link.list", {}
    async with connect(args, f"treefed-{args.command}") as conn:
        result = await conn.admin(command, **params)
    print(json.dumps(result, indent=2, sort_keys=True, default=str))
    return 0


async def _explain(args: argparse.Namespace, connect: Any) -> int:
    import copy

    import trio

    from treefed.core.destinations import parse_destination
    from treefed.errors import TreefedError
    from treefed.ops import estate_map, explain

    try:
        dst = parse_destination(args.dst)
    except TreefedError as exc:
        print(f"treefed explain: {exc.message}", file=sys.stderr)
        return 2
    if args.run is not None:
        views = explain.views_from_events(explain.read_run(args.run), dst, args.at)
        if args.from_broker not in views:
            print(f"treefed explain: no broker {args.from_broker!r} in {args.run}",
                  file=sys.stderr)
            return 2
        result = explain.trace(views, args.from_broker)
        print(json.dumps(result, indent=1, default=str) if args.json
              else explain.render(result, dst), end="\n" if args.json else "")
        return 0
    root = args.root or args.from_broker
    if "://" not in root and ":(" not in root:
        print("treefed explain: --root URI is needed when --from names a broker id",
              file=sys.stderr)
        return 2
    found = await estate_map.discover(root, _stat_function(args, connect), timeout=args.timeout)
    views: dict = {}

    async def ask(key: str, uri: str) -> None:
        one = copy.copy(args)
        one.uri = uri
        try:
            with trio.fail_after(args.timeout):
                async with connect(one, "treefed-explain") as conn:
                    views[key] = await conn.admin("explain", dst=dst)
        except (TreefedError, trio.TooSlowError, OSError):
            views[key] = None

    async with trio.open_nursery() as nursery:
        for key, view in found.brokers.items():
            if view.reachable:
                nursery.start_soon(ask, key, view.uri)
            else:
                views[key] = None
    start = args.from_broker
    if start not in views:   # a URI: the broker answering there
        start = next((k for k, v in found.brokers.items() if v.uri == start),
                     found.root_key)
    result = explain.trace(views, start)
    if args.json:
        print(json.dumps(result, indent=1, default=str))
    else:
        print(explain.render(result, dst), end="")
    return 0
