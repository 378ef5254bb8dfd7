"""The NetworkPolicy the spawner hook puts in each user namespace: no egress to the cloud metadata server.

It replaces z2jh's ``singleuser.cloudMetadata.blockWithIptables``, whose init container is privileged and so
refused by the Pod Security level user namespaces enforce. z2jh's own singleuser NetworkPolicy blocks the
same address, but it lives in the hub's namespace and selects no pod of a user namespace. Port 53 stays
open to it, as z2jh's ``dnsPortsCloudMetadataServer`` keeps it, since some clouds serve DNS there.
"""

from __future__ import annotations

from typing import Any

from gpu_offload.liqo_peering import labels as L

POLICY_NAME = "gpu-offload-no-cloud-metadata"
CLOUD_METADATA = "169.254.169.254/32"
CLOUD_METADATA_V6 = ("fd00:ec2::254/128", "fe80::a9fe:a9fe/128")
"""The same servers over IPv6: AWS's instance metadata service on IPv6-enabled (Nitro) instances, and
OpenStack's (Neutron's metadata proxy); on a dual-stack cluster, ``::/0`` with no exception would reach them."""


def metadata_egress_policy(namespace: str) -> dict[str, Any]:
    """Every pod of ``namespace`` may reach anything but the metadata server (except its DNS ports)."""
    dns = [{"port": 53, "protocol": "UDP"}, {"port": 53, "protocol": "TCP"}]
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": POLICY_NAME, "namespace": namespace, "labels": {L.MANAGED_BY: L.MANAGED_BY_VALUE}},
        "spec": {
            "podSelector": {},
            "policyTypes": ["Egress"],
            "egress": [
                {"to": [{"ipBlock": {"cidr": "0.0.0.0/0", "except": [CLOUD_METADATA]}},
                        {"ipBlock": {"cidr": "::/0", "except": list(CLOUD_METADATA_V6)}}]},
                {"to": [{"ipBlock": {"cidr": cidr}} for cidr in (CLOUD_METADATA, *CLOUD_METADATA_V6)], "ports": dns},
            ],
        },
    }
