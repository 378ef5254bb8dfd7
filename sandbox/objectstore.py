"""An S3 object store beside the sandbox (moto's S3 server, a real S3 API), as storage outside a cluster is.

Tests (Metaflow's datastore, the kernels' large inputs and outputs) and a quickstart need one that both
this process and the pods reach. As root, pods have their own network namespace and loopback, so a server
on the host's 127.0.0.1 is out of their reach: serve it at ``RunningOrigin.host_address`` (the pod
network's bridge, or 127.0.0.1 where pods share the host's network)::

    with running_origin(tmp_path) as origin, s3_server(origin.host_address, ["bucket"]) as endpoint:
        ...  # endpoint: http://<host>:<port>, for the kernel and the pods alike
"""

from __future__ import annotations

import logging
import socket
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager


def _check_bindable(host: str) -> None:
    # moto's server binds in its own thread, and a failed bind there leaves start() waiting for ever
    try:
        with socket.socket() as probe:
            probe.bind((host, 0))
    except OSError as exc:
        raise OSError(exc.errno, f"cannot serve S3 on {host} ({exc.strerror}): pass an address of this "
                                 "machine, e.g. RunningOrigin.host_address of a running sandbox") from exc


@contextmanager
def s3_server(host: str, buckets: Sequence[str] = ()) -> Iterator[str]:
    """moto's S3 server on a free port of ``host`` with the empty ``buckets``; yields its endpoint URL.

    It runs in a thread of this process and stops when the ``with`` block ends. moto accepts any credentials.
    """
    from moto.server import ThreadedMotoServer  # a test and quickstart dependency, not the sandbox's

    _check_bindable(host)
    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # else every request is logged on stderr
    server = ThreadedMotoServer(ip_address=host, port=0, verbose=False)
    server.start()
    try:
        bound_host, port = server.get_host_and_port()
        endpoint = f"http://{bound_host}:{port}"
        for bucket in buckets:
            # S3's CreateBucket is a PUT on the bucket, which moto takes unsigned: no AWS settings of this
            # process (a profile, a real endpoint) play a part
            urllib.request.urlopen(urllib.request.Request(f"{endpoint}/{bucket}", method="PUT"), timeout=30).close()
        yield endpoint
    finally:
        server.stop()
