"""Measuring through TVM's RPC tracker: ``ascendfuse rpc tracker|server`` bind 127.0.0.1 by default, a run
tunes through two servers, one server killed mid-run costs only the candidate it was running, and everything
started is shut down (no process left behind)."""

import os
import selectors
import signal
import socket
import subprocess
import sys
import threading
import time

import onnx
import pytest

from tvm_ascendfuse.cli import main
from tvm_ascendfuse.schedule.tuned import open_database
from tvm_ascendfuse.tune import RPCSpec, tune_model
from tvm_ascendfuse.tune.measure import count_servers
from tvm_ascendfuse.tune.search import kernel_records
from tvm_ascendfuse.workloads import mlp3

psutil = pytest.importorskip("psutil")
pytest.importorskip("tornado")

KEY = "ascendfuse-test"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Started:
    """A process of ``ascendfuse rpc ...`` in its own process group, and the port it announced."""

    def __init__(self, args, log):
        self.proc = subprocess.Popen([sys.executable, "-m", "tvm_ascendfuse.cli", "rpc", *args],
                                     stdout=subprocess.PIPE, stderr=open(log, "w"), text=True,
                                     start_new_session=True)
        self.port = None

    def wait_announce(self, timeout=120.0) -> "Started":
        sel = selectors.DefaultSelector()
        sel.register(self.proc.stdout, selectors.EVENT_READ)
        if not sel.select(timeout):
            raise AssertionError(f"no announcement from {self.proc.args} within {timeout} s")
        line = self.proc.stdout.readline()
        assert "listening on 127.0.0.1:" in line, line
        self.port = int(line.split("listening on 127.0.0.1:")[1].split(",")[0])
        return self

    def tree(self) -> list:
        try:
            me = psutil.Process(self.proc.pid)
            return [me, *me.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    def listening(self) -> set:
        out = set()
        for p in self.tree():
            try:
                out |= {c.laddr for c in p.net_connections(kind="tcp") if c.status == psutil.CONN_LISTEN}
            except psutil.NoSuchProcess:
                pass
        return out

    def stop(self) -> None:
        """SIGTERM to the group (the command stops its TVM worker), SIGKILL whatever is left."""
        for sig, wait in ((signal.SIGTERM, 15), (signal.SIGKILL, 5)):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                self.proc.wait(wait)
                break
            except subprocess.TimeoutExpired:
                continue
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)    # descendants that outlived the group leader
        except ProcessLookupError:
            pass
        self.proc.stdout.close()


def alive(procs) -> list:
    out = []
    for p in procs:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except psutil.NoSuchProcess:
            pass
    return out


def wait_for_servers(spec: RPCSpec, n: int, timeout=60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if count_servers(spec) == n:
                return
        except Exception:  # noqa: BLE001 - not registered yet
            pass
        time.sleep(0.2)
    raise AssertionError(f"{n} servers did not register under '{spec.key}' within {timeout} s")


def test_a_run_through_two_servers_survives_losing_one(tmp_path):
    path = tmp_path / "linear.onnx"
    onnx.save(mlp3(rows=20, width=48, depth=1), str(path))
    started, seen = [], []
    try:
        port = free_port()
        # all three at once (the servers retry until the tracker listens): each start imports TVM twice
        started.append(Started(["tracker", "--port", str(port)], tmp_path / "tracker.log"))
        for i in range(2):
            started.append(Started(["server", "--tracker", f"127.0.0.1:{port}", "--key", KEY,
                                    "--port", str(free_port())], tmp_path / f"server{i}.log"))
        tracker, victim, survivor = [s.wait_announce() for s in started]
        assert tracker.port == port
        for s in started:                              # bound to loopback only, as nobody said otherwise
            assert s.listening() and {a.ip for a in s.listening()} == {"127.0.0.1"}, s.listening()
        spec = RPCSpec("127.0.0.1", tracker.port, KEY, session_timeout=60)
        wait_for_servers(spec, 2)
        seen = [p for s in started for p in s.tree()]

        searching, done, killed = threading.Event(), threading.Event(), {}

        def kill_victim_mid_candidate():
            # kill the victim while it measures a searched candidate: its RPC session is a child of the
            # server's worker process (TVM's server forks one per session)
            if not searching.wait(300):
                return
            worker = psutil.Process(victim.proc.pid)
            while not done.is_set():
                sessions = [c for w in worker.children() for c in w.children()]
                if sessions:
                    killed["in_flight"] = len(sessions)
                    os.killpg(victim.proc.pid, signal.SIGKILL)
                    return
                time.sleep(0.005)

        watcher = threading.Thread(target=kill_victim_mid_candidate, daemon=True)
        watcher.start()
        t0 = time.monotonic()
        try:
            summary = tune_model(path, trials=6, output=tmp_path / "out", portable=True, rpc=spec, quiet=True,
                                 log=lambda m: m.startswith("tuning ") and searching.set(), finalists=1,
                                 rounds=1)
        finally:
            done.set()
            watcher.join(10)
        seconds = time.monotonic() - t0

        assert "in_flight" in killed, "the victim never ran a searched candidate: the test shows nothing"
        assert victim.proc.wait(10) is not None
        (result,) = summary.results
        assert result.status == "tuned" and result.trials == 6, result
        assert result.lost <= killed["in_flight"], (result.lost, killed)      # only what the victim was running
        kernel = next(k for k in summary.kernels if k.tunable)
        searched = kernel_records(open_database(summary.work_dir / "kernels" / kernel.key), kernel)
        assert len(searched) == 6 - result.lost
        assert kernel_records(open_database(summary.database), kernel)        # the default at least
        assert summary.rpc == f"{KEY}@127.0.0.1:{tracker.port}"
        assert count_servers(spec) == 1                                        # the tracker dropped the victim
        print(f"tuned through 2 RPC servers in {seconds:.1f} s; lost {result.lost} of 6 "
              f"({killed['in_flight']} in flight on the killed server)")
    finally:
        for s in reversed(started):
            s.stop()
    seen += [p for s in started for p in s.tree()]
    assert alive(seen) == [], f"left behind: {alive(seen)}"


@pytest.mark.parametrize("argv, message", [
    (["rpc", "server", "--tracker", "localhost", "--key", "k"], "--tracker must be HOST:PORT"),
    (["rpc", "server", "--tracker", "127.0.0.1:9190", "--key", "a:b"], "--key must be a non-empty name"),
    (["rpc", "tracker", "--port", "70000"], "--port must be a port in 1-65535"),
])
def test_rpc_command_errors_are_one_line(argv, message, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and message in err


def test_tune_through_a_tracker_that_is_not_there(tmp_path, capsys):
    path = tmp_path / "linear.onnx"
    onnx.save(mlp3(rows=20, width=48, depth=1), str(path))
    port = free_port()
    assert main(["tune", str(path), "--trials", "2", "-o", str(tmp_path / "o"), "--rpc-tracker",
                 f"127.0.0.1:{port}", "--rpc-key", "k"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and f"cannot reach the RPC tracker at 127.0.0.1:{port}" in err
    assert main(["tune", str(path), "--trials", "2", "--rpc-tracker", "127.0.0.1:9190"]) == 2
    assert "--rpc-tracker HOST:PORT and --rpc-key KEY go together" in capsys.readouterr().err
