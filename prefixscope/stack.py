"""`prefixscope up`: start the engine, then the gateway in front of it, then the dashboard, as child processes.

Each program runs in its own process (the gateway must never share a process with torch), started in dependency
order and stopped together: Ctrl-C or SIGTERM stops everything and exits with status 0; a child exiting on its own
stops the rest and exits with a non-zero status. Before anything starts, every port is checked to be free.
The engine gets a freshly generated API key and admin token through its environment; the gateway gets only the API
key (its upstream key) and the dashboard only the admin token (the cache views), so nothing reaches the engine around
the gateway. The API key is also written to `engine_api_key` in the state directory (0600), so that Prometheus can
scrape the engines' `/metrics` with it. The gateway requires API keys unless `--open`.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import secrets
import sys
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

from prefixscope.ports import PortRequest, port_problems
from prefixscope.supervisor import Program, supervise


def _replica_count(text: str) -> int:
    """How many engines `up` starts (argparse type): at least 1."""
    try:
        count = int(text)
    except ValueError:
        count = 0
    if count < 1:
        raise argparse.ArgumentTypeError(f"{text} is not a number of engines (1 or more)")
    return count


def _port(text: str) -> int:
    """A TCP port a program can listen on (argparse type): 1-65535."""
    try:
        port = int(text)
    except ValueError:
        port = 0
    if not 1 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{text} is not a port number (1-65535)")
    return port


def _program_available(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def _engine_options(args: argparse.Namespace) -> list[str]:
    """The engine's own options (model, device, cache flags) as given to `up`, to pass on unchanged: derived from
    EngineConfig's declarations (`local_engine.options`)."""
    from local_engine.config import EngineConfig
    from local_engine.options import passed_on_argv

    return passed_on_argv(EngineConfig, args)


def _replica_options(options: list[str], replica: int, num_replicas: int) -> list[str]:
    """`options` for one replica: with several, each gets its own subdirectory of `--disk-cache-dir`
    (`replica-1`, `replica-2`, ...), since an engine locks its disk directory for itself, and publishes its KV events
    on loopback ports of its own choosing (the gateway finds them in the engine's `GET /v1/cache`)."""
    if num_replicas == 1:
        return options
    if "--kv-events-endpoint" not in options:
        options = [*options, "--kv-events-endpoint", "tcp://127.0.0.1:*", "--kv-events-replay-endpoint",
                   "tcp://127.0.0.1:*"]
    if "--disk-cache-dir" not in options:
        return options
    at = options.index("--disk-cache-dir") + 1
    return options[:at] + [os.path.join(options[at], f"replica-{replica + 1}")] + options[at + 1 :]


def plan(args: argparse.Namespace) -> list[Program]:
    """The programs to start, in order."""
    command = [sys.executable, "-m", "prefixscope"]
    database = ["--database-url", args.database_url] if args.database_url else []
    host = args.host
    url_host = f"[{host}]" if ":" in host else host  # an IPv6 address goes in brackets in a URL
    programs, engine_urls = [], []
    num_replicas = max(1, args.replicas)
    for replica in range(num_replicas):  # replicas take consecutive ports, each with its own KV pool
        port = args.engine_port + replica
        engine_url = f"http://{url_host}:{port}"
        options = _replica_options(_engine_options(args), replica, num_replicas)
        if getattr(args, "otlp_endpoint", None):
            options = [*options, "--otlp-endpoint", args.otlp_endpoint]
        engine_argv = command + ["engine", *options, "--host", host, "--port", str(port)]
        name = "engine" if num_replicas == 1 else f"engine{replica + 1}"
        replica_of = "engine" if num_replicas > 1 else None
        programs.append(Program(name, engine_argv, engine_url + "/health", engine_url + "/v1", replica_of=replica_of))
        engine_urls.append(engine_url)
    engine_url = engine_urls[0]
    if _program_available("gateway.cli"):
        gateway_url = f"http://{url_host}:{args.gateway_port}"
        argv = command + ["gateway", "--host", host, "--port", str(args.gateway_port)]
        for url in engine_urls:
            argv += ["--upstream", url]
        argv += ["--config", str(args.config)] if args.config else []
        argv += ["--open"] if args.open else []
        programs.append(Program("gateway", argv + database, gateway_url + "/health", gateway_url + "/v1"))
    if _program_available("dashboard.cli"):
        dashboard_url = f"http://{url_host}:{args.dashboard_port}"
        argv = command + ["dashboard", "--host", host, "--port", str(args.dashboard_port), "--engine", engine_url]
        programs.append(Program("dashboard", argv + database, dashboard_url + "/_stcore/health", dashboard_url))
    return programs


def _port_requests(args: argparse.Namespace, programs: list[Program]) -> list[PortRequest]:
    ports = {"engine": args.engine_port, "gateway": args.gateway_port, "dashboard": args.dashboard_port}
    # Replicas engine1, engine2, ... take consecutive ports from --engine-port.
    ports |= {f"engine{n}": args.engine_port + n - 1 for n in range(1, max(1, args.replicas) + 1)}
    return [
        PortRequest(p.name, ports[p.name], "--" + p.name.rstrip("0123456789") + "-port")
        for p in programs
        if p.name in ports
    ]


def _print_state(args: argparse.Namespace) -> None:
    """Where this stack keeps its state, resolved (the same from any working directory)."""
    from db.config import database_url_from_env, shown_url
    from prefixscope.paths import engine_api_key_path, state_dir

    print(f"state     {state_dir()}", flush=True)
    print(f"database  {shown_url(database_url_from_env(args.database_url))}", flush=True)
    if args.config:
        print(f"config    {Path(args.config).resolve()}", flush=True)
    print(f"engine key {engine_api_key_path()} (bearer token for the engines' /metrics)", flush=True)


OPEN_BANNER = """
!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!
!!  OPEN MODE (--open): the gateway checks no API key. Anyone who can reach it is tenant "default" with admin  !!
!!  rights. Leave out --open and create keys with `prefixscope keys create --tenant NAME` instead.             !!
!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!
"""


def gateway_open(args: argparse.Namespace) -> bool:
    """Whether the gateway `up` starts will run open: `--open`, or `auth = "none"` in the config it reads (the one
    given with --config, else ./prefixscope.toml, as `prefixscope gateway` does)."""
    if args.open:
        return True
    if not _program_available("gateway.cli"):
        return False
    from gateway.cli import DEFAULT_CONFIG_FILE
    from gateway.config import load_config
    from gateway.errors import ConfigError

    path = args.config if args.config is not None else DEFAULT_CONFIG_FILE if DEFAULT_CONFIG_FILE.exists() else None
    if path is None:
        return False
    try:
        return load_config(Path(path)).open_mode
    except (ConfigError, ValueError):
        return False  # the gateway reports a broken config itself and does not start


_ENGINE_API_KEY = "PREFIXSCOPE_ENGINE_API_KEY"
_ENGINE_ADMIN_TOKEN = "PREFIXSCOPE_ENGINE_ADMIN_TOKEN"
_UPSTREAM_API_KEY = "PREFIXSCOPE_UPSTREAM_API_KEY"
_DASHBOARD_ENGINE_TOKEN = "PREFIXSCOPE_DASHBOARD_ENGINE_TOKEN"
_SECRETS = (_ENGINE_API_KEY, _ENGINE_ADMIN_TOKEN, _UPSTREAM_API_KEY, _DASHBOARD_ENGINE_TOKEN)


def shared_secrets_env(environ: Mapping[str, str]) -> dict[str, dict[str, str]]:
    """Each program's environment ("engine", "gateway", "dashboard"): `environ` without any of the shared secrets,
    plus only the ones that program needs. A generated engine API key (or `$PREFIXSCOPE_ENGINE_API_KEY`) goes to the
    engine and, as its upstream key, to the gateway; a generated admin token (or `$PREFIXSCOPE_ENGINE_ADMIN_TOKEN`)
    goes to the engine and, for the cache views, to the dashboard."""
    api_key = environ.get(_ENGINE_API_KEY) or secrets.token_urlsafe(32)
    admin_token = environ.get(_ENGINE_ADMIN_TOKEN) or secrets.token_urlsafe(32)
    base = {name: value for name, value in environ.items() if name not in _SECRETS}
    return {
        "engine": {**base, _ENGINE_API_KEY: api_key, _ENGINE_ADMIN_TOKEN: admin_token},
        "gateway": {**base, _UPSTREAM_API_KEY: api_key},
        "dashboard": {**base, _DASHBOARD_ENGINE_TOKEN: admin_token},
    }


def with_secrets(
    programs: list[Program], environ: Mapping[str, str], engine_env: Mapping[str, str] | None = None
) -> list[Program]:
    """`programs`, each with its environment from `shared_secrets_env` (engine replicas share the engine's, plus
    `engine_env`: the gateway config's trace export settings)."""
    envs = shared_secrets_env(environ)
    envs["engine"] |= engine_env or {}
    return [replace(p, env=envs["engine" if p.name.startswith("engine") else p.name]) for p in programs]


def save_engine_api_key(programs: list[Program], path: Path) -> Path:
    """Write the engines' API key (from their environment) to `path`, readable by its owner only (0600, also when
    the file was already there); returns `path`. Raises OSError when it cannot be written."""
    key = next(p.env[_ENGINE_API_KEY] for p in programs if p.name.startswith("engine"))
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as file:
        os.fchmod(file.fileno(), 0o600)
        file.write(key + "\n")
    return path


def engine_telemetry_env(telemetry, environ: Mapping[str, str]) -> dict[str, str]:
    """The OTEL_* variables that give the engines the gateway config's `[telemetry]` export settings (headers, as
    the gateway merges them with `$OTEL_EXPORTER_OTLP_HEADERS`, and the export timeout unless the environment sets
    one); the endpoint goes on the command line. Raises ValueError on malformed headers in `environ`."""
    from prefixscope.tracing import (ENV_HEADERS, ENV_TIMEOUT, ENV_TRACES_HEADERS, ENV_TRACES_TIMEOUT,
                                     format_headers, parse_headers)

    env_headers = parse_headers(environ.get(ENV_TRACES_HEADERS) or environ.get(ENV_HEADERS) or "")
    headers = {**telemetry.headers, **env_headers}
    env = {}
    if not (environ.get(ENV_TRACES_TIMEOUT) or environ.get(ENV_TIMEOUT)):  # the environment's own timeout wins
        env[ENV_TRACES_TIMEOUT] = f"{telemetry.export_timeout_s * 1000:g}"
    if headers:
        env[ENV_TRACES_HEADERS] = format_headers(headers)
    return env


def prepare(args: argparse.Namespace) -> int:
    """Settle the gateway's config as the gateway would read it, before anything starts; 0, or 2 after a message.

    The gateway reads `./prefixscope.toml` when no `--config` is given, so `up` does too (and says so). A config
    that cannot be read is refused now rather than after the engine has loaded its model. A `database_url` in the
    config is passed to every program, so the dashboard reads the database the gateway writes; as in the gateway,
    `--database-url` and `$PREFIXSCOPE_DATABASE_URL` take precedence over the file.
    """
    if not _program_available("gateway.cli"):
        if args.config is not None:
            print("prefixscope up: --config is the gateway's, and the gateway is not installed", file=sys.stderr)
            return 2
        return 0
    from gateway.cli import DEFAULT_CONFIG_FILE, ENV_DATABASE_URL
    from gateway.config import load_config
    from gateway.errors import ConfigError

    if args.config is None and DEFAULT_CONFIG_FILE.is_file():
        args.config = DEFAULT_CONFIG_FILE
    if args.config is None:
        return 0
    if not Path(args.config).is_file():
        print(f"prefixscope up: no config file at {Path(args.config).resolve()}", file=sys.stderr)
        return 2
    try:
        config = load_config(Path(args.config))
    except ConfigError as exc:
        print(f"prefixscope up: {exc}", file=sys.stderr)
        return 2
    if args.database_url is None and not os.environ.get(ENV_DATABASE_URL) and config.database_url:
        args.database_url = config.database_url
    # The engines export their spans where the gateway's `[telemetry]` says, unless the OTEL_* variables (which both
    # read, and which win over the file) name a collector.
    from prefixscope.tracing import ENV_ENDPOINT, ENV_TRACES_ENDPOINT

    if config.telemetry.otlp_endpoint and not (os.environ.get(ENV_ENDPOINT) or os.environ.get(ENV_TRACES_ENDPOINT)):
        args.otlp_endpoint = config.telemetry.otlp_endpoint
    try:
        args.engine_env = engine_telemetry_env(config.telemetry, os.environ)
    except ValueError as exc:
        print(f"prefixscope up: {exc}", file=sys.stderr)
        return 2
    return 0


def check_up_engine_options(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """The engine's cross-option checks, before anything starts: otherwise the engine refuses them and `up` can only
    say that it did not become healthy. Reports through `parser.error` (exit status 2)."""
    from local_engine.cli import check_engine_options

    check_engine_options(parser, args)


def _up(args: argparse.Namespace) -> int:
    if getattr(args, "up_parser", None) is not None:
        check_up_engine_options(args.up_parser, args)
    status = prepare(args)
    if status:
        return status
    programs = plan(args)
    problems = port_problems(args.host, _port_requests(args, programs))
    if problems:
        for problem in problems:
            print(f"prefixscope up: {problem}", file=sys.stderr)
        print("prefixscope up: nothing was started", file=sys.stderr)
        return 2
    programs = with_secrets(programs, os.environ, getattr(args, "engine_env", None))
    from prefixscope.paths import engine_api_key_path

    try:
        save_engine_api_key(programs, engine_api_key_path())
    except OSError as exc:
        print(f"prefixscope up: cannot write the engine API key: {exc}", file=sys.stderr)
        return 2
    _print_state(args)
    if gateway_open(args):
        print(OPEN_BANNER, file=sys.stderr, flush=True)
        ready = OPEN_BANNER
    else:
        from prefixscope.invocation import typed_command

        ready = (
            f"the gateway requires API keys: {typed_command()} keys create --tenant NAME "
            "(a new key works on its first request)"
        )
    return supervise(programs, args.start_timeout, ready_message=ready)


def register(commands, bench_commands) -> None:
    from local_engine.cli import add_engine_options

    up = commands.add_parser(
        "up",
        help="start the engine, gateway and dashboard together",
        description="Start the engine, the gateway in front of it and the dashboard, after checking that their "
        "ports are free; Ctrl-C stops all three. Engine options (--model, --device, cache flags) are passed on.",
    )
    add_engine_options(up)
    up.add_argument("--host", default="127.0.0.1", help="address every program listens on (default 127.0.0.1)")
    up.add_argument("--engine-port", type=_port, default=8001, help="engine port (default 8001)")
    up.add_argument("--gateway-port", type=_port, default=8080, help="gateway port (default 8080)")
    up.add_argument("--dashboard-port", type=_port, default=8501, help="dashboard port (default 8501)")
    up.add_argument("--config", type=Path, default=None, help="the gateway's TOML config (upstreams, tenants, rules)")
    up.add_argument(
        "--database-url",
        default=None,
        help="default: $PREFIXSCOPE_DATABASE_URL, else prefixscope.db in the state directory ($PREFIXSCOPE_HOME)",
    )
    up.add_argument(
        "--replicas", type=_replica_count, default=1,
        help="engines to start (ports from --engine-port up), routed cache-aware",
    )
    up.add_argument("--start-timeout", type=float, default=180.0, help="seconds to wait for each program")
    up.add_argument(
        "--open", action="store_true", help='run the gateway without API keys (everyone is tenant "default"; loud)'
    )
    up.set_defaults(handler=_up, up_parser=up)
