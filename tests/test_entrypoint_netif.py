"""The interface choice (entrypoint/host/netif.py): the contract's interface where it exists, else
the one routing to the master, else the only one besides loopback; and a 2-host cluster whose
resourceconfig.json names `ethwe`, as SDK v3's local mode writes it."""

from __future__ import annotations

import ipaddress
import json
import logging
from pathlib import Path

import pytest

from entrypoint.contract import ContractError
from entrypoint.host.netif import (
    InterfaceChoice,
    Route,
    choose_interface,
    parse_routes,
    usable_interface,
)

# A compose container's /proc/net/route: default via 172.18.0.1 and its /16 on eth0.
PROC_NET_ROUTE = """\
Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT
eth0\t00000000\t010012AC\t0003\t0\t0\t0\t00000000\t0\t0\t0
eth0\t000012AC\t00000000\t0001\t0\t0\t0\t0000FFFF\t0\t0\t0
eth1\t00000A0A\t00000000\t0001\t0\t0\t0\t0000FFFF\t0\t0\t0
garbage line
"""
ROUTES = (
    Route("eth0", ipaddress.IPv4Network("0.0.0.0/0")),
    Route("eth0", ipaddress.IPv4Network("172.18.0.0/16")),
    Route("eth1", ipaddress.IPv4Network("10.10.0.0/16")),
)


def ip(text: str) -> ipaddress.IPv4Address:
    return ipaddress.IPv4Address(text)


def test_parse_routes_reads_little_endian_addresses_and_skips_bad_lines():
    assert parse_routes(PROC_NET_ROUTE) == ROUTES


@pytest.mark.parametrize(
    ("named", "present", "master", "expected"),
    [
        # The contract's interface exists: used as is, whatever the routes say.
        ("eth0", ["eth0", "eth1", "lo"], ip("10.10.0.5"), InterfaceChoice("eth0")),
        # SDK v3's `ethwe` on a host with two interfaces: the longest prefix to the master wins
        # over the default route.
        (
            "ethwe",
            ["eth0", "eth1", "lo"],
            ip("10.10.0.5"),
            InterfaceChoice("eth1", "it routes to the master (10.10.0.5)"),
        ),
        (
            "ethwe",
            ["eth0", "eth1", "lo"],
            ip("172.18.0.2"),
            InterfaceChoice("eth0", "it routes to the master (172.18.0.2)"),
        ),
        # The master's name does not resolve (yet): the only interface besides loopback.
        (
            "ethwe",
            ["eth0", "lo"],
            None,
            InterfaceChoice("eth0", "it is the only interface besides loopback"),
        ),
        # A route through an interface this host does not list is no choice.
        (
            "ethwe",
            ["eth7", "lo"],
            ip("10.10.0.5"),
            InterfaceChoice("eth7", "it is the only interface besides loopback"),
        ),
    ],
)
def test_choose_interface(named, present, master, expected):
    assert choose_interface(named, present, ROUTES, master) == expected


def test_choose_interface_fails_in_one_line_when_nothing_fits():
    message = (
        "network_interface_name 'ethwe' does not exist on this host and no interface routes to "
        "the master (interfaces: eth0, eth1, lo)"
    )
    with pytest.raises(ContractError) as error:
        choose_interface("ethwe", ["lo", "eth1", "eth0"], (), None)
    assert str(error.value) == message


def _fake_host(tmp_path: Path, interfaces: list[str]) -> tuple[Path, Path]:
    sys_class_net = tmp_path / "net"
    for name in interfaces:
        (sys_class_net / name).mkdir(parents=True)
    route = tmp_path / "route"
    route.write_text(PROC_NET_ROUTE)
    return sys_class_net, route


def test_usable_interface_logs_a_fallback_once(tmp_path, caplog):
    sys_class_net, route = _fake_host(tmp_path, ["eth0", "eth1", "lo"])
    caplog.set_level(logging.INFO, logger="entrypoint")
    # An address literal: resolved without a resolver.
    chosen = usable_interface(
        "ethwe", "10.10.0.9", sys_class_net=sys_class_net, proc_net_route=route
    )
    assert chosen == "eth1"
    assert [record.getMessage() for record in caplog.records] == [
        "network_interface_name 'ethwe' does not exist on this host; using eth1: "
        "it routes to the master (10.10.0.9)"
    ]
    caplog.clear()
    assert (
        usable_interface("eth0", "10.10.0.9", sys_class_net=sys_class_net, proc_net_route=route)
        == "eth0"
    )
    assert caplog.records == []


@pytest.mark.docker
@pytest.mark.timeout(240)
def test_cluster_with_a_missing_interface_runs_on_the_one_that_routes_to_the_master(
    make_cluster,
):
    programs = Path(__file__).parent / "programs"
    cluster = make_cluster(
        2,
        hyperparameters={"sagemaker_program": "allreduce.py", "host_wait_timeout": "60"},
        code_dir=programs,
    )
    for host in cluster.hosts:
        config = cluster.ml_root(host) / "input" / "config" / "resourceconfig.json"
        resource = json.loads(config.read_text())
        config.write_text(json.dumps({**resource, "network_interface_name": "ethwe"}))
    cluster.start()
    assert cluster.wait(timeout=180) == {"algo-1": 0, "algo-2": 0}, cluster.describe()
    fallback = "network_interface_name 'ethwe' does not exist on this host; using eth0"
    for host in cluster.hosts:
        assert cluster.logs(host).count(fallback) == 1, cluster.describe()
    master_log = cluster.logs("algo-1")
    assert "size=2 sum=3" in master_log
    assert "btl_tcp_if_include eth0 -mca oob_tcp_if_include eth0" in master_log
    assert "ethwe" not in master_log.replace(fallback, "")
