"""Checking that the ports `prefixscope up` will listen on are free, before anything starts.

A health probe alone cannot tell our program from another one already answering on the same port (another
prefixscope, say), so `up` binds each port first, as the servers will (with SO_REUSEADDR, like uvicorn and
Tornado), and refuses to start when any is taken.
"""

from __future__ import annotations

import errno
import socket
from dataclasses import dataclass


@dataclass(frozen=True)
class PortRequest:
    """A port one program will listen on, and the option that chooses it."""

    program: str
    port: int
    option: str


def port_is_free(host: str, port: int) -> bool:
    """Whether a listening socket could be bound to (`host`, `port`) now. Raises OSError for other bind errors
    (an address that is not local, say)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return False
            raise
    return True


def port_problems(host: str, requests: list[PortRequest]) -> list[str]:
    """One message per port that cannot be used: taken by another process, or chosen for two programs."""
    problems = []
    seen: dict[int, PortRequest] = {}
    for request in requests:
        if request.port in seen:
            other = seen[request.port]
            problems.append(
                f"port {request.port} is chosen for both the {other.program} and the {request.program}: "
                f"give one of them another with {request.option} PORT"
            )
            continue
        seen[request.port] = request
        if not 1 <= request.port <= 65535:  # replicas take consecutive ports from --engine-port
            problems.append(
                f"port {request.port} (the {request.program}) is not a port number (1-65535): "
                f"choose a lower {request.option} PORT"
            )
            continue
        try:
            free = port_is_free(host, request.port)
        except OSError as exc:
            problems.append(
                f"cannot listen on {host}:{request.port} (the {request.program}): {exc.strerror}; "
                f"choose another port with {request.option} PORT or another address with --host"
            )
            continue
        if not free:
            problems.append(
                f"port {request.port} on {host} (the {request.program}) is already in use, perhaps by another "
                f"prefixscope: stop that program or choose another port with {request.option} PORT"
            )
    return problems
