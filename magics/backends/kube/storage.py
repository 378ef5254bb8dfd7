"""Object storage for one run: presigned URLs the pod uses (it holds no credentials), cleaned up after.

Signing a URL is local computation; only uploads and the final cleanup talk to the storage service.
"""

from __future__ import annotations

from typing import Any

from ...errors import OffloadError
from .config import StorageSettings

OUTPUT_URLS = 32
"""Upload URLs given to a run for its outputs' out-of-band buffers (plus the main pickle)."""


class StorageError(OffloadError):
    """Object storage refused or failed a request; the message names bucket, key and next step."""


class RunStorage:
    """The objects of one run live under ``<prefix>/<run id>/`` in the bucket."""

    def __init__(self, settings: StorageSettings, client: Any = None) -> None:
        self.settings = settings
        if client is None:
            import boto3

            client = boto3.client("s3", endpoint_url=settings.endpoint)
        self.client = client

    def key(self, run_id: str, name: str) -> str:
        """The object key of ``name`` for ``run_id``."""
        return f"{self.settings.prefix}/{run_id}/{name}"

    def _presign(self, method: str, key: str) -> str:
        return str(
            self.client.generate_presigned_url(
                method, Params={"Bucket": self.settings.bucket, "Key": key}, ExpiresIn=self.settings.url_expiry
            )
        )

    def put_url(self, run_id: str, name: str) -> str:
        """A presigned PUT URL for ``name`` of ``run_id``."""
        return self._presign("put_object", self.key(run_id, name))

    def get_url(self, run_id: str, name: str) -> str:
        """A presigned GET URL for ``name`` of ``run_id``."""
        return self._presign("get_object", self.key(run_id, name))

    def output_urls(self, run_id: str) -> list[str]:
        """Upload URLs for a run's outputs, ``out-0`` ... in the order the runner uses them."""
        return [self.put_url(run_id, f"out-{i}") for i in range(OUTPUT_URLS)]

    def upload(self, run_id: str, name: str, data: bytes) -> str:
        """Store ``data`` and return a presigned GET URL for the pod."""
        key = self.key(run_id, name)
        try:
            self.client.put_object(Bucket=self.settings.bucket, Key=key, Body=data)
        except Exception as exc:
            raise StorageError(
                f"uploading {len(data)} bytes to s3://{self.settings.bucket}/{key} failed: {exc}; check the "
                "bucket and the credentials (AWS_ACCESS_KEY_ID...) or unset GPU_OFFLOAD_S3_BUCKET"
            ) from exc
        return self.get_url(run_id, name)

    def remove_run(self, run_id: str) -> int:
        """Delete every object of ``run_id``; returns how many. Failures are left for the bucket's lifecycle."""
        prefix = self.key(run_id, "")
        try:
            listed = self.client.list_objects_v2(Bucket=self.settings.bucket, Prefix=prefix)
            keys = [{"Key": item["Key"]} for item in listed.get("Contents") or []]
            if keys:
                self.client.delete_objects(Bucket=self.settings.bucket, Delete={"Objects": keys})
        except Exception:  # noqa: BLE001 - cleanup must not hide the run's own result
            return 0
        return len(keys)
