"""The API as a pod reaches it: what client libraries' in-cluster configuration reads.

A pod on a cluster finds the API server through ``KUBERNETES_SERVICE_HOST`` and ``KUBERNETES_SERVICE_PORT``
(the kubelet sets them in every container) and authenticates with its service account's token, checking
the server against the cluster's CA, both in ``/var/run/secrets/kubernetes.io/serviceaccount`` with its
``namespace`` (the ServiceAccount admission plugin adds that projected volume unless
``automountServiceAccountToken`` is false on the pod or its ServiceAccount). ``load_incluster_config`` of
the official client (and of kubernetes_asyncio) reads exactly these, and only over HTTPS.

So that the same code runs unchanged in a sandbox pod (a user's server spawned by KubeSpawner), the
sandbox, where pods have their own network (``podnet.py``), also serves its API over TLS on the pod
network's gateway, port 443, with a certificate from a CA of its own made at start, and the kubelet gives
each container the variables and (bound at the real path) the three files. Left out: the ``kubernetes``
Service and its ClusterIP (``KUBERNETES_SERVICE_HOST`` is the gateway's address), the projected volume in
the stored pod spec, and a real token (the sandbox authenticates nobody; see docs/sandbox.md).
"""

from __future__ import annotations

import datetime
import ipaddress
import socket
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

TOKEN_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
VOLUME = "kube-api-access-sandbox"
"""The pod folder's ``volumes/`` entry holding the three files."""
PORT = 443


@dataclass(frozen=True)
class TlsFiles:
    """PEM files of the sandbox's CA and of the API's serving certificate (signed by it)."""

    ca: Path
    cert: Path
    key: Path


def make_certificates(folder: Path, addresses: list[str]) -> TlsFiles:
    """A CA and a serving certificate for ``addresses`` (IP SANs), written to ``folder``."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.timezone.utc)
    start, end = now - datetime.timedelta(hours=1), now + datetime.timedelta(days=365)
    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "gpu-offload-sandbox-ca")])
    ca_ski = x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key())
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number()).not_valid_before(start).not_valid_after(end)
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=False, content_commitment=False, key_encipherment=False,
                                       data_encipherment=False, key_agreement=False, key_cert_sign=True,
                                       crl_sign=True, encipher_only=False, decipher_only=False), critical=True)
          .add_extension(ca_ski, critical=False)
          .sign(ca_key, hashes.SHA256()))
    sans = [x509.IPAddress(ipaddress.ip_address(a)) for a in dict.fromkeys(addresses)]
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kube-apiserver")]))
            .issuer_name(ca_name).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(start).not_valid_after(end)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.SubjectAlternativeName(sans), critical=False)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_ski), critical=False)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .sign(ca_key, hashes.SHA256()))
    folder.mkdir(parents=True, exist_ok=True)
    files = TlsFiles(folder / "ca.crt", folder / "apiserver.crt", folder / "apiserver.key")
    files.ca.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    files.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    files.key.touch(mode=0o600)
    files.key.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                            serialization.NoEncryption()))
    return files


@dataclass(frozen=True)
class InClusterApi:
    """The API's TLS endpoint for pods: where it listens and what a container is given to reach it."""

    host: str
    port: int
    tls: TlsFiles
    sock: socket.socket
    """Bound and listening; the API server serves it (``ApiServer.serve_socket``)."""

    def ssl_context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(self.tls.cert, self.tls.key)
        return context

    def environment(self) -> dict[str, str]:
        """The variables a kubelet sets for the ``kubernetes`` Service in every container."""
        return {"KUBERNETES_SERVICE_HOST": self.host, "KUBERNETES_SERVICE_PORT": str(self.port),
                "KUBERNETES_SERVICE_PORT_HTTPS": str(self.port), "KUBERNETES_PORT": f"tcp://{self.host}:{self.port}"}

    def write_token_files(self, folder: Path, namespace: str, account: str) -> Path:
        """``token``, ``ca.crt`` and ``namespace`` of the service account volume, in ``folder``."""
        folder.mkdir(parents=True, exist_ok=True)
        # the sandbox accepts any bearer token; this one says whose it stands for
        files = {"token": f"sandbox-serviceaccount:{namespace}:{account}", "ca.crt": self.tls.ca.read_text(),
                 "namespace": namespace}
        for name, text in files.items():
            (folder / name).write_text(text)
            (folder / name).chmod(0o644)
        return folder


def bind(host: str, state_dir: Path, port: int = PORT) -> InClusterApi:
    """Make the certificates and bind the TLS listener on ``host:port`` (the pod network's gateway)."""
    tls = make_certificates(state_dir / "pki", [host, "127.0.0.1"])
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(128)
    sock.setblocking(False)
    return InClusterApi(host, sock.getsockname()[1], tls, sock)


def automounts(pod: Mapping[str, Any], account: Mapping[str, Any] | None) -> bool:
    """Whether the pod gets its service account's token: the pod's setting, else the account's, else yes."""
    own = (pod.get("spec") or {}).get("automountServiceAccountToken")
    if own is not None:
        return bool(own)
    theirs = (account or {}).get("automountServiceAccountToken")
    return True if theirs is None else bool(theirs)
