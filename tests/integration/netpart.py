"""Real network partitions for integration tests: a worker in its own network namespace, joined to the host by a veth
pair that the test cuts and heals.

    with Netns(expose=[9092, llm_port, services_port], publish=[web_port]) as net:
        worker.prefix = net.exec_prefix()   # the worker process runs inside the namespace
        ...
        net.cut()                           # the namespace's link is down: no packet in or out
        net.heal()

    with Netns(expose=[llm_port, services_port], side=[9092], publish=[web_port]) as net:
        net.cut_side()                      # only the broker is lost: the model and the services still answer

Inside the namespace everything keeps its usual address: a forwarder there listens on 127.0.0.1:<port> for each
``expose`` port and pipes it over the veth to a forwarder on the host side (10.231.N.1:<port>), which pipes it to
the host's 127.0.0.1:<port> (the broker advertises 127.0.0.1, so a worker must find it there). ``publish`` goes the
other way (the worker's web port, so the test can ask /readyz from the host). Both forwarders' connections cross the
veth, so a cut stops them: the link's host end is set down, its carrier drops, and the namespace's packets go
nowhere — its open connections hang, new ones time out, as in a partition (this kernel has no netem; a down link is
the fault). The host side's packets to the namespace go to a sink meanwhile (``Netns._sink``), never to the default
route. ``side`` ports cross a second veth pair of their own (the side link, 10.231.M.0/30), which
``cut_side`` takes down alone: a worker that still reaches the model but no longer the broker. Only loopback and
this namespace's own veth addresses are ever connected to.

Needs root and iproute2 (``ip netns``). Names carry the test process's PID and a random suffix, so tests running at
once (pytest-xdist) never share one; ``close`` removes the namespace (and with it both veth ends) and stops the
forwarders by PID, and a later run removes namespaces left by a test process that no longer exists.
"""

from __future__ import annotations

import fcntl
import os
import re
import select
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType

from tests.integration.harness import dies_with_this_process

ROOT = Path(__file__).resolve().parents[2]
#: the namespaces' subnets: 10.231.N.0/30, host end .1, namespace end .2
_PREFIX = "10.231"
_NAME = re.compile(r"^asnp-(\d+)-[0-9a-f]+$")
#: chosen-subnet lock: two tests starting at once must not pick the same N
_LOCK = Path("/tmp/agents-stream-netpart.lock")
_READY_TIMEOUT_S = 15.0
_STOP_TIMEOUT_S = 5.0


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=15, check=check)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sweep_stale() -> list[str]:
    """Remove the namespaces of test processes that are gone (a run killed before its ``close``); their names."""
    gone = []
    for line in _ip("netns", "list").stdout.splitlines():
        name = line.split()[0] if line.strip() else ""
        found = _NAME.match(name)
        if found and not _alive(int(found.group(1))):
            _ip("netns", "del", name, check=False)
            gone.append(name)
    return gone


class Netns:
    """One network namespace, its veth pair and its two forwarders; a context manager (``close`` on exit)."""

    def __init__(self, expose: Sequence[int], publish: Sequence[int] = (), side: Sequence[int] = ()) -> None:
        suffix = uuid.uuid4().hex[:6]
        self.name = f"asnp-{os.getpid()}-{suffix}"
        # interface names have at most 15 characters
        self.host_if, self.ns_if = f"asnp{suffix}h", f"asnp{suffix}n"
        self.side_host_if, self.side_ns_if = f"asnp{suffix}sh", f"asnp{suffix}sn"
        #: the sink: a veth pair whose namespace end stays down, the host's fallback route to the namespace's
        #: addresses while a link is cut (``_sink``)
        self.sink_if, self.sink_peer = f"asnp{suffix}k", f"asnp{suffix}kn"
        self.expose, self.publish, self.side = list(expose), list(publish), list(side)
        if set(self.side) & set(self.expose):
            raise ValueError(f"ports {sorted(set(self.side) & set(self.expose))} are both exposed and on the side link")
        self.host_addr = self.ns_addr = self.side_host_addr = self.side_ns_addr = ""
        self._forwarders: list[subprocess.Popen[bytes]] = []
        self._made = False

    # lifecycle

    def open(self) -> Netns:
        sweep_stale()
        try:
            self._make()
            host_maps = [f"{self.host_addr}:{p}=127.0.0.1:{p}" for p in self.expose]
            host_maps += [f"{self.side_host_addr}:{p}=127.0.0.1:{p}" for p in self.side]
            host_maps += [f"127.0.0.1:{p}={self.ns_addr}:{p}" for p in self.publish]
            ns_maps = [f"127.0.0.1:{p}={self.host_addr}:{p}" for p in self.expose]
            ns_maps += [f"127.0.0.1:{p}={self.side_host_addr}:{p}" for p in self.side]
            ns_maps += [f"{self.ns_addr}:{p}=127.0.0.1:{p}" for p in self.publish]
            self._forward([], host_maps)
            self._forward(self.exec_prefix(), ns_maps)
        except BaseException:
            self.close()
            raise
        return self

    def _make(self) -> None:
        _LOCK.touch(exist_ok=True)
        with open(_LOCK) as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # held only while choosing and assigning the subnet
            used = set(re.findall(rf"inet {re.escape(_PREFIX)}\.(\d+)\.", _ip("-o", "-4", "addr", "show").stdout))
            free = [n for n in range(256) if str(n) not in used]
            links = self._links()
            if len(free) < len(links):
                raise RuntimeError(f"no free {_PREFIX}.N.0/30 subnet for a test namespace; `ip netns list` shows "
                                   "leftovers to remove")
            self.host_addr, self.ns_addr = f"{_PREFIX}.{free[0]}.1", f"{_PREFIX}.{free[0]}.2"
            if self.side:
                self.side_host_addr, self.side_ns_addr = f"{_PREFIX}.{free[1]}.1", f"{_PREFIX}.{free[1]}.2"
            _ip("netns", "add", self.name)
            self._made = True
            for host_if, ns_if, host_addr, _ in self._links():
                _ip("link", "add", host_if, "type", "veth", "peer", "name", ns_if, "netns", self.name)
                _ip("addr", "add", f"{host_addr}/30", "dev", host_if)
        for host_if, ns_if, _, ns_addr in self._links():
            _ip("link", "set", host_if, "up")
            _ip("-n", self.name, "addr", "add", f"{ns_addr}/30", "dev", ns_if)
            _ip("-n", self.name, "link", "set", ns_if, "up")
            self._wait_link(ns_if, up=True)
        _ip("-n", self.name, "link", "set", "lo", "up")
        self._sink()

    def _sink(self) -> None:
        """Where the host's packets to the namespace go while a link is cut: nowhere. A link's host end set down
        takes its connected route with it, and the namespace's address would then be routed to the default
        gateway, where this machine's egress answers any connection with ``HTTP/1.1 400 Bad Request``: a broker
        reconnecting to the cut-off node read "HTTP" as a 1.2 GB response size and died of OutOfMemoryError
        (both of the nodes that were not cut off, in 3 of 5 partition test runs: docs/cluster.md). The sink is a
        veth whose peer stays down (no carrier), with a route to each link's subnet that only a cut uncovers
        (metric 1000, the connected route's is 0) and a fixed neighbour entry, so no ARP fails: a connection
        opened during the cut loses its SYN and hangs, as one to a partitioned host would."""
        _ip("link", "add", self.sink_if, "type", "veth", "peer", "name", self.sink_peer, "netns", self.name)
        _ip("link", "set", self.sink_if, "up")
        for _, _, host_addr, ns_addr in self._links():
            subnet = host_addr.rsplit(".", 1)[0] + ".0/30"
            _ip("route", "add", subnet, "dev", self.sink_if, "metric", "1000")
            _ip("neigh", "replace", ns_addr, "lladdr", "02:00:00:00:00:01", "dev", self.sink_if, "nud", "permanent")

    def _links(self) -> list[tuple[str, str, str, str]]:
        """(host interface, namespace interface, host address, namespace address) of each veth pair: the main
        link, and the side link when there are ``side`` ports."""
        links = [(self.host_if, self.ns_if, self.host_addr, self.ns_addr)]
        if self.side:
            links.append((self.side_host_if, self.side_ns_if, self.side_host_addr, self.side_ns_addr))
        return links

    def _forward(self, prefix: list[str], maps: list[str]) -> None:
        if not maps:
            return
        args = [a for m in maps for a in ("--map", m)]
        proc = subprocess.Popen(
            [*prefix, sys.executable, "-m", "tests.integration.tcpfwd", *args], cwd=ROOT,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, preexec_fn=dies_with_this_process(),
        )
        self._forwarders.append(proc)
        deadline = time.monotonic() + _READY_TIMEOUT_S
        assert proc.stdout is not None
        fd, seen = proc.stdout.fileno(), b""
        while (left := deadline - time.monotonic()) > 0:
            if select.select([fd], [], [], min(left, 0.2))[0]:
                chunk = os.read(fd, 4096)
                seen += chunk
                if b"tcpfwd ready" in seen:
                    return
                if not chunk:
                    break
        raise RuntimeError(f"forwarder {maps} not ready after {_READY_TIMEOUT_S}s (exit {proc.poll()}): {seen}")

    def close(self) -> None:
        for proc in self._forwarders:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=_STOP_TIMEOUT_S)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(timeout=_STOP_TIMEOUT_S)
            if proc.stdout:
                proc.stdout.close()
        self._forwarders.clear()
        if self._made:
            # deleting the namespace deletes the veth end in it, and with it the host end
            _ip("netns", "del", self.name, check=False)
            for host_if, *_ in self._links():
                _ip("link", "del", host_if, check=False)
            _ip("link", "del", self.sink_if, check=False)
            self._made = False

    def __enter__(self) -> Netns:
        return self.open()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    # use

    def exec_prefix(self) -> list[str]:
        """What runs a command inside the namespace: ``[*net.exec_prefix(), "python", ...]`` (its PID is the
        command's: ``ip netns exec`` execs it)."""
        return ["ip", "netns", "exec", self.name]

    def cut(self) -> None:
        """The namespace loses the host: its links' host ends go down (the namespace ends lose their carrier)."""
        for host_if, ns_if, *_ in self._links():
            _ip("link", "set", host_if, "down")
            self._wait_link(ns_if, up=False)

    def cut_side(self) -> None:
        """Only the side link goes down: the ``side`` ports are lost, the ``expose`` ports still answer."""
        if not self.side:
            raise RuntimeError(f"{self.name} has no side link: give Netns side=[ports]")
        _ip("link", "set", self.side_host_if, "down")
        self._wait_link(self.side_ns_if, up=False)

    def heal(self) -> None:
        """Every link up again (those that were not cut stay as they were)."""
        for host_if, ns_if, *_ in self._links():
            _ip("link", "set", host_if, "up")
            self._wait_link(ns_if, up=True)

    def _wait_link(self, ns_if: str, *, up: bool, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            out = _ip("-n", self.name, "-o", "link", "show", ns_if).stdout
            if ("LOWER_UP" in out) == up:
                return
            time.sleep(0.05)
        raise RuntimeError(f"{ns_if} in {self.name} not {'up' if up else 'down'} after {timeout}s")
