"""Pod networks: a network namespace per pod, joined by a veth to a bridge the sandbox owns.

Where the sandbox runs as root and ``ip`` (iproute2) is installed, it claims a bridge ``gpobr<N>`` (the
first free N from 200) with 10.N.0.1/16, and gives each pod a namespace ``gpo<N>-<k>`` whose ``eth0`` has
10.N.x.y/16 and, as its only other route, the Service range through the bridge. Pods reach each other, the
host (on 10.N.0.1) and ClusterIPs (addresses of the bridge); the host reaches them; each pod has its own
loopback and port space. Any other address is unreachable from a pod (no default route, whatever the
host's IP forwarding): pod traffic stays on the bridge.

The bridge's alias names the owning process (``gpu-offload-sandbox pid=<pid>``): a new sandbox removes the
bridges and namespaces of owners that are gone (a crashed or SIGKILLed sandbox), and never touches those of
a live one (several sandboxes may run at once on one machine). ``close()`` removes everything it made.

Elsewhere, pods share the host's network with addresses from 127.10.0.0/16 that nothing listens on, as before.
"""

from __future__ import annotations

import ipaddress
import itertools
import logging
import os
import re
import shutil
import subprocess
from collections.abc import Iterator

LOG = logging.getLogger(__name__)
ALIAS = "gpu-offload-sandbox pid="
FIRST, LAST = 200, 254
HOST_NETWORK = "127.10.0.0/16"
SERVICE_RANGE = "10.96.0.0/12"  # where the API hands out ClusterIPs (defaults.py)


class NetworkError(RuntimeError):
    """An ``ip`` command failed while building a pod's network."""


def _ip(*args: str, batch: str | None = None, check: bool = True) -> str:
    done = subprocess.run(["ip", *args], input=batch, capture_output=True, text=True, timeout=30)
    if check and done.returncode != 0:
        raise NetworkError(f"ip {' '.join(args)} failed: {done.stderr.strip()} (input: {batch!r})")
    return done.stdout


def _alive(pid: int) -> bool:
    return os.path.exists(f"/proc/{pid}")  # pod networks exist only on Linux, as root


def remove_leftovers() -> list[str]:
    """Delete bridges and namespaces of sandboxes whose process is gone; the names removed."""
    removed: list[str] = []
    for line in _ip("-o", "-d", "link", "show", "type", "bridge").splitlines():
        found = re.match(r"\d+: (gpobr(\d+))[:@].*alias " + re.escape(ALIAS) + r"(\d+)", line)
        if found is None or _alive(int(found.group(3))):
            continue
        index = found.group(2)
        for name in _ip("netns", "list").split():
            if name.startswith(f"gpo{index}-"):
                _ip("netns", "del", name, check=False)
                removed.append(name)
        _ip("link", "del", found.group(1), check=False)
        removed.append(found.group(1))
    return removed


def bridge_mac(index: int) -> str:
    """The sandbox bridge's own MAC address (locally administered, one per bridge index)."""
    return f"02:67:6f:62:72:{index:02x}"


class PodNetwork:
    """The pod network of one sandbox: namespaces and addresses, or the host's network."""

    def __init__(self, isolated: bool) -> None:
        self.isolated = isolated
        self.index: int | None = None
        self._names: dict[str, str] = {}  # pod uid -> namespace name
        self._counter = itertools.count(1)
        self._ips: Iterator[ipaddress.IPv4Address]
        if isolated:
            self.index = self._claim()
            self._ips = itertools.islice(ipaddress.IPv4Network(f"10.{self.index}.0.0/16").hosts(), 1, None)
        else:
            self._ips = ipaddress.IPv4Network(HOST_NETWORK).hosts()

    @classmethod
    def for_this_machine(cls, want_isolated: bool = True) -> PodNetwork:
        """Isolated where root and ``ip`` allow it (else the host's network, said once in the log)."""
        if want_isolated and os.geteuid() == 0 and shutil.which("ip"):
            try:
                remove_leftovers()
                return cls(True)
            except (NetworkError, OSError) as exc:
                LOG.warning("sandbox: pods share the host's network: cannot build pod networks (%s)", exc)
                return cls(False)
        if want_isolated:
            LOG.warning("sandbox: pods share the host's network (one port space, no pod IPs): network "
                        "namespaces need root and iproute2's `ip`")
        return cls(False)

    @property
    def gateway(self) -> str | None:
        """The bridge's address: the host as the pods see it."""
        return f"10.{self.index}.0.1" if self.isolated else None

    def _claim(self) -> int:
        for index in range(FIRST, LAST + 1):
            bridge = f"gpobr{index}"
            # a fixed address: a bridge without one takes its ports' lowest, so it changes when the pod whose
            # veth has it goes, and every other pod's cached address of the gateway is then wrong until its ARP
            # entry expires: their new connections to the host stall 35-68 s (a session's first checkpoint upload
            # after a move did, while the moved-from pod was deleted)
            created = subprocess.run(["ip", "link", "add", bridge, "address", bridge_mac(index), "type", "bridge"],
                                     capture_output=True, timeout=30)
            if created.returncode != 0:
                continue  # another sandbox's (creating a link is atomic: the first one wins)
            _ip("-batch", "-", batch=f"link set {bridge} alias \"{ALIAS}{os.getpid()}\"\n"
                                    f"addr add 10.{index}.0.1/16 dev {bridge}\nlink set {bridge} up\n")
            return index
        raise NetworkError(f"no free sandbox bridge among gpobr{FIRST}..gpobr{LAST}: remove leftovers with "
                           "`ip link del gpobr<N>`")

    def attach(self, pod_uid: str) -> tuple[str, str | None]:
        """A new address for a pod, and the ``/run/netns`` file of its namespace (None: host network)."""
        address = str(next(self._ips))
        if not self.isolated:
            return address, None
        name = f"gpo{self.index}-{next(self._counter)}"
        veth = f"gv{self.index}-{name.split('-')[1]}"
        _ip("-batch", "-", batch=f"netns add {name}\nlink add {veth} type veth peer name eth0 netns {name}\n"
                                f"link set {veth} master gpobr{self.index} up\n")
        _ip("-n", name, "-batch", "-", batch=f"addr add {address}/16 dev eth0\nlink set eth0 up\nlink set lo up\n"
                                             f"route add {SERVICE_RANGE} via {self.gateway}\n")
        self._names[pod_uid] = name
        return address, f"/run/netns/{name}"

    def add_address(self, address: str) -> None:
        """Give the bridge one more address (a Service's ClusterIP), if it has not got it yet."""
        done = subprocess.run(["ip", "addr", "add", f"{address}/32", "dev", f"gpobr{self.index}"],
                              capture_output=True, text=True, timeout=30)
        if done.returncode != 0 and "File exists" not in done.stderr:
            raise NetworkError(f"cannot add {address} to the sandbox bridge: {done.stderr.strip()}")

    def detach(self, pod_uid: str) -> None:
        """Remove a pod's namespace (and with it its veth pair)."""
        name = self._names.pop(pod_uid, None)
        if name is not None:  # the veth first: a namespace is freed asynchronously, its veth with it
            _ip("-force", "-batch", "-", batch=f"link del gv{self.index}-{name.split('-')[1]}\nnetns del {name}\n",
                check=False)

    def close(self) -> None:
        """Remove every namespace and the bridge."""
        for uid in list(self._names):
            self.detach(uid)
        if self.index is not None:
            _ip("link", "del", f"gpobr{self.index}", check=False)
            self.index = None
