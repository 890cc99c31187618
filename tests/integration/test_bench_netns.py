"""The stand-in hosts of the netns benchmark (benchmarks/netns.py): names, what a sweep may
remove, subnet choice, and (as root, with iproute2) real namespaces built, used and removed,
also when setup fails midway or a run was SIGKILLed."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), "benchmarks"))

import netns  # noqa: E402

from tests.conformance.harness import require_service  # noqa: E402


@pytest.fixture
def namespaces_available() -> None:
    """Real namespaces need root and iproute2: skipped on a developer machine without
    them, a failure in CI (scripts/test.sh installs iproute2)."""
    why = netns.unavailable()
    if why is not None:
        require_service("network namespaces", why)


needs_root = pytest.mark.usefixtures("namespaces_available")


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_names_say_which_process_made_them_and_fit_interface_names():
    topo = netns.Topology(netns.MAX_HOSTS, tag=netns.new_tag(pid=4194304))  # largest pid
    names = [topo.bridge]
    for i in range(topo.hosts):
        names += [topo.link(i), topo.peer(i), topo.namespace(i)]
    assert all(len(n) <= netns.MAX_IFNAME for n in names)
    assert {netns.tag_pid(n) for n in names} == {4194304}
    assert netns.tag_pid(netns.new_tag() + "b") == os.getpid()
    with pytest.raises(ValueError, match="hosts=100"):
        netns.Topology(netns.MAX_HOSTS + 1)


def test_a_sweep_picks_only_our_names_whose_process_is_gone():
    dead, live = netns.new_tag(pid=111), netns.new_tag(pid=222)
    names = [f"{dead}b", f"{dead}v3", f"{dead}n0", f"{live}b", f"{live}v1",
             "eth0", "docker0", "cr111", f"{dead}x", f"x{dead}b", "cr3f_abcd", "cr3f_abcv100"]  # fmt: skip
    assert netns.stale(names, alive=lambda pid: pid == 222) == [
        f"{dead}b",
        f"{dead}v3",
        f"{dead}n0",
    ]


def test_the_subnet_overlaps_nothing_on_the_machine():
    used = ["10.64.0.0/10", "10.200.0.0/16", "192.168.1.0/24", "0.0.0.0/32"]
    for seed in range(50):
        net = netns.pick_subnet(used, random.Random(seed))
        assert net.prefixlen == 24 and net.subnet_of(netns.ipaddress.ip_network("10.0.0.0/8"))
        assert not any(net.overlaps(netns.ipaddress.ip_network(u)) for u in used[:3])
    with pytest.raises(RuntimeError, match="no free"):
        netns.pick_subnet(["10.0.0.0/8"])


def _ours(tag: str) -> list[str]:
    links = [x["ifname"] for x in json.loads(netns.run_cmd(["ip", "-j", "link"]) or "[]")]
    spaces = [line.split()[0] for line in netns.run_cmd(["ip", "netns", "list"]).splitlines()]
    return [n for n in links + spaces if n.startswith(tag)]


@needs_root
def test_hosts_are_separate_reachable_rate_limited_and_removed_again():
    topo = netns.Topology(2, rate="100mbit")
    with topo:
        server = (
            f"import socket; s = socket.socket(); s.bind(({topo.address(0)!r}, 0)); s.listen();"
            "print(socket.gethostname(), s.getsockname()[1], flush=True);"
            "c, _ = s.accept(); c.sendall(socket.gethostname().encode()); c.close()"
        )
        proc = subprocess.Popen(
            [*topo.prefix(0), sys.executable, "-c", server], stdout=subprocess.PIPE, text=True
        )
        name, port = proc.stdout.readline().split()
        client = (
            f"import socket, sys; c = socket.create_connection(({topo.address(0)!r}, {port}), timeout=10);"
            "print(socket.gethostname(), c.recv(100).decode())"
        )
        got = subprocess.run(
            [*topo.prefix(1), sys.executable, "-c", client],
            capture_output=True,
            text=True,
            timeout=30,
        )
        proc.wait(timeout=10)
        assert got.stdout.split() == [topo.hostname(1), topo.hostname(0)]
        assert name == topo.hostname(0)
        for i in range(2):
            inside = netns.run_cmd(
                ["ip", "netns", "exec", topo.namespace(i), "tc", "qdisc", "show"]
            )
            outside = netns.run_cmd(["tc", "qdisc", "show", "dev", topo.link(i)])
            assert "tbf" in inside and "100Mbit" in inside
            assert "tbf" in outside and "100Mbit" in outside
        assert len(_ours(topo.tag)) == 1 + 2 + 2  # bridge, 2 links, 2 namespaces
    assert _ours(topo.tag) == []


@needs_root
def test_a_setup_failing_midway_leaves_nothing():
    topo = netns.Topology(2, rate="not-a-rate")  # tc refuses it after links and namespaces
    with pytest.raises(RuntimeError, match="tc qdisc add"):
        topo.setup()
    assert topo.undo == []
    assert _ours(topo.tag) == []


@needs_root
def test_a_sweep_removes_what_a_killed_run_left_and_nothing_of_a_live_one():
    left = netns.Topology(1, rate="10mbit", tag=netns.new_tag(pid=_dead_pid())).setup()
    live = netns.Topology(1, rate="10mbit").setup()
    try:
        removed = netns.sweep_stale()
        assert {left.bridge, left.link(0), left.namespace(0)} <= set(removed)
        assert _ours(left.tag) == []
        assert len(_ours(live.tag)) == 3
    finally:
        left.teardown()
        live.teardown()


@needs_root
def test_the_prefix_never_renames_the_namespace_it_was_made_in():
    """Run where the prefix was made (a throwaway UTS namespace, so that a broken guard
    could only rename that one): the host-name step refuses, and the name stays."""
    script = (
        f"import os, socket, subprocess, sys; sys.path.insert(0, {os.path.dirname(netns.__file__)!r}); import netns;"
        "shell = netns.Topology(1, tag=netns.new_tag()).prefix(0)[-2];"
        "before = socket.gethostname();"
        "rc = subprocess.run(['sh', '-c', shell, 'renamed', 'true']).returncode;"
        "print(rc, socket.gethostname() == before)"
    )
    got = subprocess.run(
        ["unshare", "--uts", sys.executable, "-c", script], capture_output=True, text=True
    )
    assert got.stdout.split() == ["97", "True"], got.stderr
