"""The ``treefed`` command (DESIGN §7).

Theory of operation
-------------------
One argparse parser with a subcommand per job.  ``broker`` validates the config before
touching anything (an invalid file exits with status 2 and ``key: problem`` on stderr)
and hands over to ``node.run_broker``.  ``send`` / ``consume`` / ``stat`` are thin
wrappers over the client library that print JSON (one line per consumed message, so the
output pipes into ``jq``); they share the connection options ``--user`` / ``--password``
(or ``$TREEFED_PASSWORD``, which keeps it out of ``ps``) and ``--ca`` / ``--cert`` /
``--key`` for ``ssl://`` brokers.  ``passwd`` prints the ``password_hash`` for a
``[[security.user]]`` entry, reading the password without echo (or one line of stdin).
``scenario``, ``report`` and ``compare`` belong to other packages and are imported only
when asked for, so the broker never loads pyspark; when such a package is missing the
command says so and exits 2.

Exit status: 0 success, 1 runtime failure (broker unreachable, refused request),
2 usage or configuration error.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import json
import math
import os
import sys
from typing import Any, Sequence

__all__ = ["main", "build_parser"]

#: subcommand -> "module:function" owning it; the function takes argv (list of str).
_DELEGATED = {
    "scenario": "treefed.scenario.cli:main",
    "report": "treefed.analysis.job:main",
    "compare": "treefed.scenario.compare:main",
    "estate": "treefed.estate.cli:estate_main",
    "import": "treefed.estate.cli:import_main",
    "forecast": "treefed.estate.cli:forecast_main",
    "model": "treefed.model.cli:main",
}
_DELEGATED_HELP = {
    "scenario": "run store-scale scenarios (tree and TTL modes)",
    "report": "Spark job over run logs: tables, plots, HTML",
    "compare": "run scenarios and report them: the main job",
    "estate": "estate generate ESTATE.toml --out DIR: configs per site; estate start / run DIR",
    "import": "import activemq FILE.xml... --out DIR: ActiveMQ configs -> treefed",
    "forecast": "an estate as configured and as a tree: demand, spillage, stranding",
    "model": "compute an estate's spillage on Spark, without emulating it",
}


#: Seconds the client commands wait for a first connection (a failover: URI retries).
CONNECT_TIMEOUT = 10.0


def build_parser() -> argparse.ArgumentParser:
    import treefed

    parser = argparse.ArgumentParser(
        prog="treefed", description="Broker federation for organisations shaped like a tree.",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version",
                        version=f"treefed {treefed.__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("broker", help="run one site's broker")
    p.add_argument("--config", required=True, help="broker config file (TOML)")
    p.add_argument("--init", action="store_true",
                   help="accept an empty (0-byte) or missing message store as a new one")

    p = sub.add_parser("send", help="send messages")
    _connection_options(p)
    p.add_argument("uri", help="tcp://host:port, ssl://host:port or failover:(...)")
    p.add_argument("dest", help="destination, e.g. queue://Store.Incoming")
    p.add_argument("body", nargs="?", default=None,
                   help="message body (default: read stdin)")
    p.add_argument("--count", type=int, default=1, help="send the body N times")
    p.add_argument("--persistent", action="store_true",
                   help="persistent: wait until the broker has stored each message")
    p.add_argument("--header", action="append", default=[], metavar="K=V",
                   help="message header (repeatable); numbers and true/false are typed")
    p.add_argument("--priority", type=int, default=4)
    p.add_argument("--ttl", type=int, default=0, help="time to live in milliseconds")

    p = sub.add_parser("consume", help="receive messages, one JSON line each")
    _connection_options(p)
    p.add_argument("uri")
    p.add_argument("dest")
    p.add_argument("--count", type=int, default=0, help="stop after N messages (0: no limit)")
    p.add_argument("--selector", default=None, help="JMS selector over headers")
    p.add_argument("--timeout", type=float, default=None,
                   help="stop when no message arrived for this many seconds")

    p = sub.add_parser("stat", help="print a broker's statistics as JSON")
    _connection_options(p)
    p.add_argument("uri")
    p.add_argument("--section", default="all",
                   choices=("all", "summary", "destinations", "consumers", "conns", "links",
                            "connectors"),
                   help="what to show (default all; summary: figures and list totals)")
    p.add_argument("--match", default=None, metavar="PATTERN",
                   help="only destinations (and their consumers) matching PATTERN, "
                        "e.g. 'queue://Store.s1.>'")

    p = sub.add_parser("passwd", help="print a password hash for [[security.user]]")
    p.add_argument("--stdin", action="store_true",
                   help="read the password from one line of stdin (no prompt)")

    from treefed.ops import cli as ops_cli

    ops_cli.add_commands(sub, _connection_options)

    for name in _DELEGATED:
        p = sub.add_parser(name, help=_DELEGATED_HELP[name], add_help=False)
        p.add_argument("args", nargs=argparse.REMAINDER)
    # `treefed --help` lists every sub-command's options, not only their names
    usages = []
    for name, p in sub.choices.items():
        if name in _DELEGATED:
            usages.append(f"  treefed {name} ...   (options: treefed {name} --help)")
        elif name in ops_cli.NESTED:
            for q in ops_cli.NESTED[name](p).values():
                usages.append("  " + " ".join(q.format_usage().split())[len("usage: "):])
        else:
            usages.append("  " + " ".join(p.format_usage().split())[len("usage: "):])
    parser.epilog = "sub-commands and their options:\n" + "\n".join(usages)
    return parser


def _connection_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--user", default=None, help="user name, for brokers with authentication")
    p.add_argument("--password", default=None,
                   help="password (default: $TREEFED_PASSWORD when --user is given)")
    p.add_argument("--ca", default=None, help="CA bundle trusted for ssl:// (default: system)")
    p.add_argument("--cert", default=None, help="client certificate for mutual TLS")
    p.add_argument("--key", default=None, help="key of --cert (default: inside --cert)")
    p.add_argument("--no-check-hostname", action="store_true",
                   help="ssl://: do not match the certificate to the host name")
    p.add_argument("--connect-timeout", type=float, default=CONNECT_TIMEOUT, metavar="S",
                   help="give up when no broker answered within S seconds, retries of a "
                        f"failover: URI included (default {CONNECT_TIMEOUT:g})")


def _connect(args: argparse.Namespace, client_id: str) -> Any:
    """``client.connect`` with the command line's credentials and TLS settings."""
    from treefed.client import connect

    password = args.password
    if password is None and args.user is not None:
        password = os.environ.get("TREEFED_PASSWORD")
    ssl_context = None
    if args.ca or args.cert or args.no_check_hostname:
        from treefed.transport.tls import client_context

        ssl_context = client_context(ca=args.ca, cert=args.cert, key=args.key,
                                     check_hostname=not args.no_check_hostname,
                                     where="--tls")
    return connect(args.uri, client_id=client_id, username=args.user, password=password,
                   ssl_context=ssl_context, connect_timeout=args.connect_timeout)


def _passwd(args: argparse.Namespace) -> int:
    from treefed.security.passwords import hash_password

    if args.stdin:
        password = sys.stdin.readline().rstrip("\r\n")
    else:
        import getpass

        password = getpass.getpass("password: ")
        if getpass.getpass("again: ") != password:
            print("treefed passwd: the passwords differ", file=sys.stderr)
            return 2
    if not password:
        print("treefed passwd: empty password", file=sys.stderr)
        return 2
    print(hash_password(password))
    return 0


def _header_value(text: str) -> Any:
    if text in ("true", "false"):
        return text == "true"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def _headers(pairs: Sequence[str]) -> dict:
    headers = {}
    for pair in pairs:
        key, eq, value = pair.partition("=")
        if not eq or not key:
            raise _UsageError(f"--header wants KEY=VALUE, got {pair!r}")
        headers[key] = _header_value(value)
    return headers


async def _send(args: argparse.Namespace) -> int:
    body = args.body if args.body is not None else sys.stdin.read()
    headers = _headers(args.header)
    async with _connect(args, "treefed-send") as conn:
        ids = []
        for _ in range(args.count):
            ids.append(await conn.send(args.dest, body.encode("utf-8"), headers=headers,
                                       persistent=args.persistent, priority=args.priority,
                                       ttl=args.ttl, confirm=False))
        if args.persistent:
            await conn.wait_confirmed()
        await conn.flush()
    print(json.dumps({"sent": len(ids), "dst": args.dest,
                      "first": ids[0] if ids else None, "last": ids[-1] if ids else None}))
    return 0


async def _consume(args: argparse.Namespace) -> int:
    import trio

    received = 0
    async with _connect(args, "treefed-consume") as conn:
        prefetch = max(1, min(args.count or 100, 1000))
        sub = await conn.subscribe(args.dest, selector=args.selector, prefetch=prefetch)
        idle = args.timeout if args.timeout is not None else math.inf
        while not args.count or received < args.count:
            msg = None
            with trio.move_on_after(idle):
                msg = await sub.receive()
            if msg is None:
                break
            print(json.dumps(msg.as_dict(), ensure_ascii=False), flush=True)
            await msg.ack()
            received += 1
        await sub.close()
    return 0


async def _stat(args: argparse.Namespace) -> int:
    async with _connect(args, "treefed-stat") as conn:
        # paged: a big broker's statistics do not fit one frame (issue #12)
        stats = await conn.stat_all(args.section, match=args.match)
    print(json.dumps(stats, indent=2, sort_keys=True, default=str))
    return 0


def _delegate(command: str, argv: list[str]) -> int:
    module_name, _, func_name = _DELEGATED[command].partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and (module_name == exc.name or module_name.startswith(exc.name + ".")):
            print(f"treefed {command}: not available: module {module_name} is not installed "
                  "in this build", file=sys.stderr)
            return 2
        raise
    func = getattr(module, func_name, None)
    if func is None:
        print(f"treefed {command}: not available: {module_name} has no {func_name}()",
              file=sys.stderr)
        return 2
    result = func(argv)
    return int(result or 0)


class _UsageError(SystemExit):
    """A command line that cannot work (exit status 2, like argparse's own errors)."""


def _check_usage(args: argparse.Namespace) -> str | None:
    """What is wrong with a client command's arguments, or None."""
    if getattr(args, "connect_timeout", 1.0) <= 0:
        return "--connect-timeout must be > 0"
    if args.command == "send":
        if args.count < 0:
            return "--count must be >= 0"
        if not 0 <= args.priority <= 9:
            return f"--priority must be 0..9, not {args.priority}"
        if args.ttl < 0:
            return f"--ttl must be >= 0, not {args.ttl}"
    if args.command == "consume":
        if args.count < 0:
            return "--count must be >= 0"
        if args.timeout is not None and args.timeout < 0:
            return "--timeout must be >= 0"
    return None


def _run_client(coro_fn: Any, args: argparse.Namespace) -> int:
    import trio

    from treefed.errors import LocalError, TreefedError

    problem = _check_usage(args)
    if problem is not None:
        print(f"treefed {args.command}: {problem}", file=sys.stderr)
        return 2
    try:
        return trio.run(coro_fn, args)
    except (_UsageError, LocalError) as exc:   # a bad URI, header, certificate path...
        text = exc.message if isinstance(exc, LocalError) else str(exc)
        print(f"treefed {args.command}: {text}", file=sys.stderr)
        return 2
    except TreefedError as exc:
        print(f"treefed {args.command}: {exc.message} [{exc.code}]", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


def _import_structlog_plain() -> None:
    """Import structlog with ``rich`` hidden, in the broker process only: structlog's
    console renderer imports rich (and pygments) when it is installed, ~4 MiB of RSS a
    broker never uses (it writes JSON lines; on a terminal, tracebacks print plain).
    Issue #14: idle broker RSS."""
    if "structlog" in sys.modules or "rich" in sys.modules:
        return
    sys.modules["rich"] = None  # type: ignore[assignment]  # import rich -> ImportError
    try:
        import structlog  # noqa: F401
    finally:
        del sys.modules["rich"]


def main(argv: Sequence[str] | None = None) -> int:
    try:
        return _main(argv)
    except BrokenPipeError:
        # `treefed stat URI | head`: the reader left; that is not an error of ours.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


def _main(argv: Sequence[str] | None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in _DELEGATED:
        return _delegate(argv[0], argv[1:])
    args = build_parser().parse_args(argv)
    if args.command == "broker":
        _import_structlog_plain()
        from treefed.config import load_config
        from treefed.errors import ConfigError

        try:
            config = load_config(args.config)
        except ConfigError as exc:
            notes = "".join(f" ({note})" for note in getattr(exc, "__notes__", ()))
            print(f"treefed broker: invalid config: {exc.message}{notes}", file=sys.stderr)
            return 2
        from treefed.node import run_broker

        return run_broker(config, init=args.init)
    if args.command == "send":
        return _run_client(_send, args)
    if args.command == "consume":
        return _run_client(_consume, args)
    if args.command == "stat":
        return _run_client(_stat, args)
    if args.command == "passwd":
        return _passwd(args)
    from treefed.ops import cli as ops_cli

    if args.command in ops_cli.COMMANDS:   # wait, map, explain, link, reload
        problem = ops_cli.check(args)
        if problem:
            print(f"treefed {args.command}: {problem}", file=sys.stderr)
            return 2
        return _run_client(functools.partial(ops_cli.run, connect=_connect), args)
    return _delegate(args.command, args.args)  # pragma: no cover - handled above


if __name__ == "__main__":
    sys.exit(main())
