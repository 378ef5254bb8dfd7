"""Object storage for one run: presigned URLs the pod uses (it holds no credentials), cleaned up after.

Every object of a user lives under ``<prefix>/<user>/<run id>/``, so credentials limited to that prefix
(docs/security.md) are all a user server needs, and a key outside it is refused before any request. Whoever
else can write to the bucket could replace an object between its upload and its use: each object's
sha256 is recorded by its writer (this kernel for a bundle, the runner for an output) and checked by its
reader before use. Signing a URL is local computation; only uploads, reads and cleanup talk to the service.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import Any

from ...errors import OffloadError
from .config import StorageSettings

OUTPUT_URLS = 32
"""Upload URLs given to a run for its outputs' out-of-band buffers (plus the main pickle)."""
LOG = "log"
"""The object a CLI run's runner uploads its log to; it stays after the run (the bucket's lifecycle ends it)."""
LOG_URL_EXPIRY = 7 * 24 * 3600
"""Seconds the log's upload URL stays valid: the longest a presigned (SigV4) URL may, as a script may run
for days; a run longer than this ends without its log kept."""
LOG_READ_LIMIT = 64 * 2**20
"""Bytes of a stored log that ``gpu-offload logs`` reads (the runner keeps at most 8 MiB)."""
_PLAIN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.@-]{0,127}\Z")


class StorageError(OffloadError):
    """Object storage refused or failed a request; the message names bucket, key and next step."""


@dataclass(frozen=True)
class Stored:
    """An object this kernel uploaded: where the pod reads it and the digest the pod checks."""

    url: str
    """A presigned GET URL."""
    sha256: str


def _plain(kind: str, value: str) -> str:
    if not isinstance(value, str) or not _PLAIN.match(value) or ".." in value:
        raise StorageError(f"{kind} {value!r} cannot be part of an object key (letters, digits, _ . @ - only, "
                           "no '..'); nothing was sent to object storage")
    return value


class RunStorage:
    """The objects of one user's runs: ``<prefix>/<user>/<run id>/<name>`` in the bucket."""

    def __init__(self, settings: StorageSettings, user: str, client: Any = None) -> None:
        self.settings = settings
        self.user = _plain("user name", user)
        self.root = f"{settings.prefix.strip('/')}/{self.user}/"
        """The user's prefix; every key this storage touches starts with it."""
        if client is None:
            import boto3

            client = boto3.client("s3", endpoint_url=settings.endpoint)
        self.client = client

    def key(self, run_id: str, name: str) -> str:
        """The object key of ``name`` for ``run_id``."""
        return f"{self.root}{_plain('run id', run_id)}/{_plain('object name', name)}"

    def check_key(self, key: str) -> str:
        """``key`` if it lies under this user's prefix, else :class:`StorageError` (another user's object)."""
        if not key.startswith(self.root) or ".." in key or "//" in key:
            raise StorageError(f"object key {key!r} is outside {self.root} (this user's prefix): it belongs to "
                               "another user or to nothing this project wrote; refused")
        return key

    def _presign(self, method: str, key: str, expiry: int | None = None) -> str:
        return str(
            self.client.generate_presigned_url(
                method, Params={"Bucket": self.settings.bucket, "Key": self.check_key(key)},
                ExpiresIn=expiry or self.settings.url_expiry,
            )
        )

    def log_url(self, run_id: str) -> str:
        """A presigned PUT URL for the log of ``run_id``, valid as long as S3 allows (a run may be long)."""
        return self._presign("put_object", self.key(run_id, LOG), LOG_URL_EXPIRY)

    def read_log(self, run_id: str) -> bytes | None:
        """The stored log of ``run_id`` (its first :data:`LOG_READ_LIMIT` bytes), ``None`` when there is none.

        Written by the run's pod: untrusted text, which the caller shows as text only."""
        key = self.key(run_id, LOG)
        try:
            found = self.client.get_object(Bucket=self.settings.bucket, Key=key,
                                           Range=f"bytes=0-{LOG_READ_LIMIT - 1}")
        except Exception as exc:
            if _missing(exc):
                return None
            raise StorageError(f"reading s3://{self.settings.bucket}/{key} failed: {exc}; check the bucket "
                               "and the credentials (AWS_ACCESS_KEY_ID...)") from exc
        return bytes(found["Body"].read(LOG_READ_LIMIT))

    def put_url(self, run_id: str, name: str) -> str:
        """A presigned PUT URL for ``name`` of ``run_id``."""
        return self._presign("put_object", self.key(run_id, name))

    def get_url(self, run_id: str, name: str) -> str:
        """A presigned GET URL for ``name`` of ``run_id``."""
        return self._presign("get_object", self.key(run_id, name))

    def output_urls(self, run_id: str) -> list[str]:
        """Upload URLs for a run's outputs, ``out-0`` ... in the order the runner uses them."""
        return [self.put_url(run_id, f"out-{i}") for i in range(OUTPUT_URLS)]

    def upload(self, run_id: str, name: str, data: bytes) -> Stored:
        """Store ``data``; returns a presigned GET URL for the pod and the digest it checks."""
        key = self.key(run_id, name)
        try:
            self.client.put_object(Bucket=self.settings.bucket, Key=key, Body=data)
        except Exception as exc:
            raise StorageError(
                f"uploading {len(data)} bytes to s3://{self.settings.bucket}/{key} failed: {exc}; check the "
                "bucket and the credentials (AWS_ACCESS_KEY_ID...) or unset GPU_OFFLOAD_S3_BUCKET"
            ) from exc
        return Stored(self.get_url(run_id, name), hashlib.sha256(data).hexdigest())

    def read(self, run_id: str, name: str, sha256: object, size: object) -> bytes:
        """The bytes of ``name`` of ``run_id``, if they are the ``size`` bytes whose sha256 the writer recorded.

        At most ``size + 1`` bytes are read: an object larger than its writer declared (a donor's, or one
        another writer of the bucket put there) never reaches this process's memory whole."""
        key = self.key(run_id, name)
        where = f"s3://{self.settings.bucket}/{key}"
        if not isinstance(sha256, str) or not re.fullmatch(r"[0-9a-f]{64}", sha256):
            raise StorageError(f"{where}: the runner recorded no sha256 for it, so it cannot be checked and "
                               "was not loaded; use a runner of this release")
        if type(size) is not int or size < 0:
            raise StorageError(f"{where}: the runner declared no size for it, so its read cannot be bounded; "
                               "nothing was loaded. Use a runner of this release")
        try:
            body = self.client.get_object(Bucket=self.settings.bucket, Key=key)["Body"]
            try:
                data = bytes(body.read(size + 1))
            finally:
                body.close()
        except Exception as exc:
            raise StorageError(f"reading {where} failed: {exc}; the run's outputs were not loaded") from exc
        if len(data) > size:
            raise StorageError(f"{where} holds more than the {size} bytes the runner declared; nothing was "
                               "loaded (an object larger than declared is not read whole)")
        actual = hashlib.sha256(data).hexdigest()
        if actual != sha256:
            raise StorageError(f"{where} changed after the runner wrote it (sha256 {actual[:16]}..., the runner "
                               f"recorded {sha256[:16]}...): another writer of the bucket replaced it; nothing "
                               "was loaded. Limit who may write the bucket (docs/security.md) and run the cell again")
        if len(data) != size:
            raise StorageError(f"{where} holds {len(data)} bytes where the runner declared {size}; nothing was "
                               "loaded")
        return data

    def remove_run(self, run_id: str, keep: tuple[str, ...] = ()) -> int:
        """Delete every object of ``run_id`` but those named in ``keep``; returns how many. Failures are
        left for the bucket's lifecycle."""
        prefix = self.key(run_id, "x")[:-1]
        kept = {prefix + name for name in keep}
        try:
            listed = self.client.list_objects_v2(Bucket=self.settings.bucket, Prefix=prefix)
            keys = [{"Key": self.check_key(item["Key"])} for item in listed.get("Contents") or []
                    if item["Key"] not in kept]
            if keys:
                self.client.delete_objects(Bucket=self.settings.bucket, Delete={"Objects": keys})
        except Exception:  # noqa: BLE001 - cleanup must not hide the run's own result
            return 0
        return len(keys)


def _missing(exc: Exception) -> bool:
    """Whether S3 said the object does not exist (botocore's ClientError with code NoSuchKey or 404)."""
    error = getattr(exc, "response", None)
    code = str(((error or {}).get("Error") or {}).get("Code", "")) if isinstance(error, dict) else ""
    return code in ("NoSuchKey", "404", "NotFound")
