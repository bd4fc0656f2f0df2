"""The network interface the job's traffic uses: OpenMPI's TCP transports, NCCL, Gloo and
tf.distribute's collectives (plan.py pins them all to one name).

SageMaker names it in resourceconfig.json (`network_interface_name`, `eth0` on SageMaker and in
SDK v2's local mode). SDK v3's local mode (ModelTrainer, Mode.LOCAL_CONTAINER) writes `ethwe`,
which its compose containers do not have (sagemaker/train/local/local_container.py, the
resourceconfig it writes); OpenMPI, NCCL and Gloo given an interface that does not exist fail or
hang. So a named interface that exists is used as is, and one that does not falls back to the
interface of the route to the master (the kernel's routing table, longest prefix first), else
to the host's only interface besides loopback.

`choose_interface` is pure; `usable_interface` reads /sys/class/net and /proc/net/route (the
image has no iproute2) and resolves the master's name.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import logging
import socket
from collections.abc import Sequence
from pathlib import Path

from entrypoint.contract import ContractError

log = logging.getLogger("entrypoint")

LOOPBACK = "lo"
SYS_CLASS_NET = Path("/sys/class/net")
PROC_NET_ROUTE = Path("/proc/net/route")


@dataclasses.dataclass(frozen=True)
class Route:
    """One IPv4 route of the main table, as /proc/net/route lists it."""

    interface: str
    network: ipaddress.IPv4Network


@dataclasses.dataclass(frozen=True)
class InterfaceChoice:
    name: str
    # Why `name` replaces the contract's interface; None when the contract's is used.
    fallback_reason: str | None = None


def _hex_address(field: str) -> ipaddress.IPv4Address:
    """/proc/net/route's addresses: 8 hex digits, in the host's (little-endian) byte order."""
    return ipaddress.IPv4Address(int(field, 16).to_bytes(4, "little"))


def parse_routes(text: str) -> tuple[Route, ...]:
    """The routes of /proc/net/route (a header line, then Iface, Destination, Gateway, Flags,
    RefCnt, Use, Metric, Mask, ... per line); lines that do not parse are skipped."""
    routes = []
    for line in text.splitlines()[1:]:
        fields = line.split()
        if len(fields) < 8:
            continue
        try:
            destination, mask = _hex_address(fields[1]), _hex_address(fields[7])
            network = ipaddress.IPv4Network(f"{destination}/{mask}", strict=False)
        except ValueError:
            continue
        routes.append(Route(fields[0], network))
    return tuple(routes)


def route_interface(routes: Sequence[Route], address: ipaddress.IPv4Address) -> str | None:
    """The interface the kernel sends `address`'s packets through: the longest matching prefix
    (the first listed among equals, as the kernel lists lower metrics first)."""
    matching = [route for route in routes if address in route.network]
    if not matching:
        return None
    return max(matching, key=lambda route: route.network.prefixlen).interface


def choose_interface(
    named: str,
    present: Sequence[str],
    routes: Sequence[Route],
    master_address: ipaddress.IPv4Address | None,
) -> InterfaceChoice:
    """The contract's interface when this host has it; else the one routing to the master;
    else the only one besides loopback. Raises ContractError when none of these exists."""
    if named in present:
        return InterfaceChoice(named)
    if master_address is not None:
        routed = route_interface(routes, master_address)
        if routed is not None and routed in present:
            return InterfaceChoice(routed, f"it routes to the master ({master_address})")
    others = sorted(name for name in present if name != LOOPBACK)
    if len(others) == 1:
        return InterfaceChoice(others[0], "it is the only interface besides loopback")
    raise ContractError(
        f"network_interface_name {named!r} does not exist on this host and no interface "
        f"routes to the master (interfaces: {', '.join(sorted(present)) or 'none'})"
    )


def _master_address(master: str) -> ipaddress.IPv4Address | None:
    try:
        infos = socket.getaddrinfo(master, None, socket.AF_INET, socket.SOCK_STREAM)
    except OSError:
        return None
    return ipaddress.IPv4Address(infos[0][4][0]) if infos else None


def usable_interface(
    named: str,
    master: str,
    *,
    sys_class_net: Path = SYS_CLASS_NET,
    proc_net_route: Path = PROC_NET_ROUTE,
) -> str:
    """The interface this host's job traffic uses (choose_interface on this host's interfaces
    and routes); a fallback is logged, once, at the one call."""
    present = sorted(path.name for path in sys_class_net.iterdir())
    if named in present:
        return named
    try:
        routes = parse_routes(proc_net_route.read_text(encoding="ascii"))
    except OSError:
        routes = ()
    choice = choose_interface(named, present, routes, _master_address(master))
    log.warning(
        "network_interface_name %r does not exist on this host; using %s: %s",
        named,
        choice.name,
        choice.fallback_reason,
    )
    return choice.name
