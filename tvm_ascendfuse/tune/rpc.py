"""TVM's RPC tracker and servers for distributed measurement (``ascendfuse rpc tracker|server``).

Thin wrappers over ``tvm.rpc.tracker.Tracker`` and ``tvm.rpc.server.Server`` (TVM's own
``python -m tvm.exec.rpc_tracker``/``rpc_server`` work the same and are what a board without this package
runs). The difference is the default address: ours bind 127.0.0.1 unless ``--host`` names another one (TVM's
default is every interface), since an RPC server runs whatever code a client sends it. Each searches a
free port from the one given upwards and prints the one it bound.
"""

from __future__ import annotations

import signal
import sys

from ..errors import AscendFuseError

DEFAULT_HOST = "127.0.0.1"
TRACKER_PORT = 9190
SERVER_PORT = 9090
PORT_SEARCH = 100      # ports tried from the given one upwards when it is taken


def check_port(port: int, what: str = "--port") -> int:
    if not isinstance(port, int) or not 0 < port < 65536:
        raise AscendFuseError(f"{what} must be a port in 1-65535, got {port!r}")
    return port


def check_key(key: str) -> str:
    # the tracker reports servers as "server:<key>" and MetaSchedule splits that on ':'
    if not key or any(c.isspace() for c in key) or ":" in key:
        raise AscendFuseError(f"--key must be a non-empty name without spaces or ':', got {key!r}")
    return key


def start_tracker(host: str = DEFAULT_HOST, port: int = TRACKER_PORT, silent: bool = True):
    """A tracker on ``host`` at the first free port from ``port`` (``.port`` says which)."""
    from tvm.rpc.tracker import Tracker

    check_port(port)
    try:
        return Tracker(host, port=port, port_end=min(65536, port + PORT_SEARCH), silent=silent)
    except (OSError, ValueError) as err:
        raise AscendFuseError(f"cannot start an RPC tracker on {host}:{port}: {err}") from None


def start_server(tracker: tuple[str, int], key: str, host: str = DEFAULT_HOST, port: int = SERVER_PORT,
                 silent: bool = True):
    """A server on ``host`` (first free port from ``port``) registered with ``tracker`` under ``key``."""
    from tvm.rpc.server import Server

    check_port(port)
    check_key(key)
    try:
        return Server(host, port=port, port_end=min(65536, port + PORT_SEARCH), key=key, tracker_addr=tracker,
                      silent=silent)
    except (OSError, ValueError, RuntimeError) as err:
        raise AscendFuseError(f"cannot start an RPC server on {host}:{port}: {err}") from None


def serve(handle, announce: str, stream=None) -> int:
    """Print ``announce``, then block until the tracker/server process ends or this one is interrupted or
    terminated; the tracker/server is stopped either way."""
    stream = stream if stream is not None else sys.stdout

    def stop(signum, _frame):
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        print(announce, file=stream, flush=True)
        handle.proc.join()
        print("the RPC process stopped", file=sys.stderr, flush=True)
        return 1
    except KeyboardInterrupt:
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous)
        _terminate(handle)


def _terminate(handle) -> None:
    try:
        handle.terminate()
    except Exception:  # noqa: BLE001 - e.g. the tracker's stop message cannot reach a non-loopback address
        proc = getattr(handle, "proc", None)
        if proc is not None:
            proc.kill()
