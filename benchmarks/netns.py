"""Stand-in hosts with bandwidth-limited links, on one machine (Linux network namespaces).

``Topology(hosts=N, rate="1gbit")`` builds N network namespaces, each with one veth pair
into a bridge in the root namespace (a star, like hosts on one switch), and limits every
host's link to ``rate`` in **both** directions with a token-bucket filter (``tc ... tbf``):
on the host's own end (what it sends) and on the bridge's end (what it receives). The
controller stays in the root namespace and reaches every host through the bridge.
``prefix(i)`` is the command prefix that runs a process on host ``i``: in its network
namespace and in a UTS namespace of its own with its own host name (so corral sees
different hosts: no shared memory between them, as between real machines).

Safety (this needs root and changes the machine's network configuration):

* only objects this run creates are touched: every name carries ``cr<pid>_<random>``
  (unique per run) and a subnet no route or address on the machine overlaps is used;
* each object is recorded *before* anything else happens and removed again by
  ``teardown()`` (idempotent, in reverse order), which runs on a failed ``setup()``, on
  ``close``, from ``atexit`` and (through the callers' signal handlers) on SIGTERM/SIGINT;
* what a SIGKILLed run left behind is removed by ``sweep_stale()``: objects whose name
  carries the pid of a process that no longer exists;
* traffic stays inside: the bridge has no uplink and the hosts have no default route.
"""

from __future__ import annotations

import atexit
import ipaddress
import json
import os
import random
import re
import secrets
import shutil
import subprocess
from collections.abc import Callable

from corral.procs import pid_alive

#: every name this module creates: ``cr<pid in base 36>_<3 hex>`` then what it is (``b``
#: the bridge, ``v<i>``/``p<i>`` the two ends of host i's link, ``n<i>`` its namespace)
PREFIX = "cr"
_NAME = re.compile(rf"^{PREFIX}([0-9a-z]{{1,6}})_[0-9a-f]{{3}}(b|[vpn]\d{{1,2}})$")
MAX_IFNAME = 15  # IFNAMSIZ - 1
MAX_HOSTS = 99

Runner = Callable[[list[str]], str]


def run_cmd(argv: list[str]) -> str:
    """Run ``argv``; its stdout, or RuntimeError with the command and its stderr."""
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    if proc.returncode:
        raise RuntimeError(f"{' '.join(argv)} failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc.stdout


def unavailable() -> str | None:
    """Why namespaces cannot be built here, or None."""
    if os.geteuid() != 0:
        return "needs root (network namespaces, veth links, tc)"
    missing = [t for t in ("ip", "tc", "unshare") if shutil.which(t) is None]
    if missing:
        return f"{', '.join(missing)} not found (apt-get install -y iproute2 util-linux)"
    return None


def _base36(n: int) -> str:
    digits = "0123456789abcdefghijklmnopqrstuvwxyz"
    out = ""
    while True:
        n, r = divmod(n, 36)
        out = digits[r] + out
        if not n:
            return out


def new_tag(pid: int | None = None) -> str:
    """``cr<pid, base 36>_<3 hex>``: unique per run, says which process made it, and short
    enough for interface names (15 characters with ``v99``). The hex comes from the OS, not
    from ``random``: pytest-randomly reseeds that alike before every test."""
    return f"{PREFIX}{_base36(os.getpid() if pid is None else pid)}_{secrets.randbits(12):03x}"


def tag_pid(name: str) -> int | None:
    """The pid in the name of an object ``Topology`` made (None for any other name)."""
    match = _NAME.match(name)
    return int(match.group(1), 36) if match else None


def pick_subnet(used: list[str], rng: random.Random | None = None) -> ipaddress.IPv4Network:
    """A /24 in 10.0.0.0/8 that overlaps none of ``used`` (the machine's routes/addresses)."""
    rng = rng or random.Random()
    taken = [ipaddress.ip_network(u, strict=False) for u in used]
    for _ in range(1000):
        net = ipaddress.ip_network(f"10.{rng.randrange(64, 250)}.{rng.randrange(0, 256)}.0/24")
        if not any(net.overlaps(t) for t in taken if t.version == 4):
            return net
    raise RuntimeError("no free 10.x.y.0/24 subnet for the stand-in hosts")


def used_networks(run: Runner = run_cmd) -> list[str]:
    """Every IPv4 route destination and interface address of the root namespace."""
    nets = []
    for route in json.loads(run(["ip", "-j", "-4", "route", "show", "table", "all"]) or "[]"):
        dst = route.get("dst", "")
        if dst and dst != "default" and re.match(r"^\d", dst):
            nets.append(dst)
    for link in json.loads(run(["ip", "-j", "-4", "addr"]) or "[]"):
        for addr in link.get("addr_info", []):
            nets.append(f"{addr['local']}/{addr.get('prefixlen', 32)}")
    return nets


class Topology:
    """``hosts`` namespaces in a star around one bridge, each link limited to ``rate``."""

    def __init__(self, hosts: int, rate: str = "1gbit", run: Runner = run_cmd, tag: str = ""):
        if not 1 <= hosts <= MAX_HOSTS:
            raise ValueError(f"hosts={hosts}: use 1..{MAX_HOSTS}")
        self.hosts = hosts
        self.rate = rate
        self.run = run
        self.tag = tag or new_tag()
        self.bridge = f"{self.tag}b"
        self.undo: list[list[str]] = []  # commands that remove what exists, in creation order
        self.subnet: ipaddress.IPv4Network | None = None
        for name in [self.bridge, *(self.peer(i) for i in range(hosts))]:
            if len(name) > MAX_IFNAME:
                raise ValueError(f"interface name {name!r} is longer than {MAX_IFNAME} characters")

    def namespace(self, i: int) -> str:
        return f"{self.tag}n{i}"

    def link(self, i: int) -> str:
        """The bridge's end of host ``i``'s veth (``peer(i)`` is the end inside the host)."""
        return f"{self.tag}v{i}"

    def peer(self, i: int) -> str:
        return f"{self.tag}p{i}"

    def hostname(self, i: int) -> str:
        return f"{self.tag.replace('_', '-')}-host{i}"

    def address(self, i: int) -> str:
        """Host ``i``'s address (the bridge, in the root namespace, has ``.1``)."""
        if self.subnet is None:
            raise RuntimeError("setup() first")
        return str(self.subnet.network_address + 2 + i)

    def gateway(self) -> str:
        if self.subnet is None:
            raise RuntimeError("setup() first")
        return str(self.subnet.network_address + 1)

    def _tbf(self, dev: str, ns: str | None = None) -> list[str]:
        where = ["ip", "netns", "exec", ns] if ns else []
        # burst: a 64 KiB GSO packet must fit; latency bounds the queue
        return [*where, "tc", "qdisc", "add", "dev", dev, "root", "tbf", "rate", self.rate,
                "burst", "256kb", "latency", "100ms"]  # fmt: skip

    def setup(self) -> Topology:
        """Build it all, or (on any failure) remove what was built and raise."""
        atexit.register(self.teardown)
        try:
            self.subnet = pick_subnet(used_networks(self.run))
            prefixlen = self.subnet.prefixlen
            self.undo.append(["ip", "link", "del", self.bridge])
            self.run(["ip", "link", "add", self.bridge, "type", "bridge"])
            self.run(["ip", "addr", "add", f"{self.gateway()}/{prefixlen}", "dev", self.bridge])
            self.run(["ip", "link", "set", self.bridge, "up"])
            for i in range(self.hosts):
                ns, link, peer = self.namespace(i), self.link(i), self.peer(i)
                self.undo.append(["ip", "netns", "del", ns])
                self.run(["ip", "netns", "add", ns])
                self.undo.append(["ip", "link", "del", link])
                self.run(["ip", "link", "add", link, "type", "veth", "peer", "name", peer,
                          "netns", ns])  # fmt: skip
                self.run(["ip", "link", "set", link, "master", self.bridge, "up"])
                inside = ["ip", "-n", ns]
                self.run([*inside, "link", "set", "lo", "up"])
                self.run([*inside, "addr", "add", f"{self.address(i)}/{prefixlen}", "dev", peer])
                self.run([*inside, "link", "set", peer, "up"])
                self.run(self._tbf(link))  # into host i
                self.run(self._tbf(peer, ns))  # out of host i
        except BaseException:
            self.teardown()
            raise
        return self

    def prefix(self, i: int) -> list[str]:
        """argv prefix running a command on host ``i`` (own network and UTS namespace).

        The host name is only set in a UTS namespace other than this process's: should the
        ``unshare`` ever be missing, the command fails instead of renaming the machine."""
        here = os.readlink("/proc/self/ns/uts")
        guard = f'[ "$(readlink /proc/self/ns/uts)" != "{here}" ] || exit 97; '
        return ["ip", "netns", "exec", self.namespace(i), "unshare", "--uts", "sh", "-c",
                guard + 'hostname "$0" && exec "$@"', self.hostname(i)]  # fmt: skip

    def teardown(self) -> None:
        """Remove everything ``setup`` created (reverse order); safe to call again."""
        while self.undo:
            argv = self.undo.pop()
            try:
                self.run(argv)
            except Exception:
                pass  # already gone (a veth goes with its namespace), or never made
        atexit.unregister(self.teardown)

    def __enter__(self) -> Topology:
        return self.setup()

    def __exit__(self, *exc) -> None:
        self.teardown()


def stale(names: list[str], alive: Callable[[int], bool] = pid_alive) -> list[str]:
    """Names made by ``new_tag`` whose creating process no longer exists."""
    return [n for n in names if (pid := tag_pid(n)) is not None and not alive(pid)]


def sweep_stale(run: Runner = run_cmd) -> list[str]:
    """Remove namespaces and links left by runs of this module that were SIGKILLed."""
    namespaces = [line.split()[0] for line in run(["ip", "netns", "list"]).splitlines() if line]
    links = [link["ifname"] for link in json.loads(run(["ip", "-j", "link"]) or "[]")]
    removed = []
    for name in stale(links):
        try:
            run(["ip", "link", "del", name])
            removed.append(name)
        except RuntimeError:
            pass  # went with its namespace or bridge
    for name in stale(namespaces):
        try:
            run(["ip", "netns", "del", name])
            removed.append(name)
        except RuntimeError:
            pass
    return removed
