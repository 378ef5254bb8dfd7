"""The object store served beside the sandbox: an address it cannot serve on is an error naming the fix."""

from __future__ import annotations

import pytest
from gpu_offload.sandbox import objectstore


def test_an_address_of_another_machine_is_refused_at_once_naming_the_fix():
    # 192.0.2.0/24 is for documentation (RFC 5737): never an address of this machine
    with pytest.raises(OSError, match="cannot serve S3 on 192.0.2.1 .*RunningOrigin.host_address"), \
            objectstore.s3_server("192.0.2.1", ["never"]):
        pytest.fail("the store started on an address this machine does not have")
