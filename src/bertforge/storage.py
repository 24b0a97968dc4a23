"""Object storage (s3://, gs://, https://, ...) through fsspec: failures as one line, retries with backoff.

Where the store is and who the user is come from the store's own conventions, not from bertforge
config: for S3 the standard AWS variables and files that boto3, the AWS CLI and s3fs all honour
(`AWS_ENDPOINT_URL` for MinIO / Ceph / SeaweedFS / R2, `AWS_ACCESS_KEY_ID` +
`AWS_SECRET_ACCESS_KEY` or `AWS_PROFILE`, `AWS_DEFAULT_REGION`). One setting then serves every tool
that touches the bucket, and no secret lands in a run's saved `config.yaml`.

The libraries raise a different class for each failure (s3fs turns S3 errors into
`FileNotFoundError` / `PermissionError` / `OSError`; botocore raises its own `NoCredentialsError`
and `EndpointConnectionError`; aiohttp its connection errors). `storage_errors` turns the ones a
user can cause into a `DataError` naming the URL and the fix; `with_retries` repeats an operation
through transient ones (a server restarting, a dropped connection) with exponential backoff.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import fsspec

from bertforge.console import log
from bertforge.errors import DataError, first_line

T = TypeVar("T")
_ORIGINS: dict[str, str] = {}  # local copy -> the URL it came from (`local_copy`), for messages: see `origin`

RETRY_ATTEMPTS = 6  # tries of one transfer before giving up (each try also has the client's own retries)
RETRY_FIRST_WAIT_S = 1.0  # waits double from here: 1, 2, 4, 8, 16 s (31 s in all)
RETRY_MAX_WAIT_S = 30.0
CREDENTIALS_HINT = ("set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE), and AWS_ENDPOINT_URL for a "
                    "store other than AWS")
# botocore and aiohttp exception classes, by name: neither package is imported unless a URL needs it
NO_CREDENTIALS = frozenset({"NoCredentialsError", "PartialCredentialsError", "NoAuthTokenError"})
TRANSIENT = frozenset({"ConnectionError", "EndpointConnectionError", "ConnectTimeoutError", "ReadTimeoutError",
                       "ConnectionClosedError", "ClientConnectorError", "ServerDisconnectedError",
                       "ClientPayloadError", "ClientOSError", "TimeoutError", "IncompleteReadError",
                       "ResponseStreamingError",
                       # botocore's check of a body against the object's stored CRC (x-amz-checksum-*) failed: a
                       # transfer cut or garbled on the way when the answer had no Content-Length to catch it
                       "FlexibleChecksumError"})
# s3fs's OSError for a throttled or failing server (503 SlowDown, 500 InternalError) is transient too
NOT_TRANSIENT_OS_ERRORS = (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError,
                           FileExistsError)


class TruncatedTransfer(OSError):
    """Fewer (or more) bytes arrived than the object holds, and the client said nothing: a body without a
    length that a dropped connection cut short. An OSError, so `is_transient`: another try fetches it whole."""


def is_remote(url: str | object) -> bool:
    """A URL with a scheme other than file:// (s3://, gs://, https://, memory://, ...)."""
    text = str(url)
    return "://" in text and not text.startswith("file://")


def _class_names(error: BaseException) -> set[str]:
    return {cls.__name__ for cls in type(error).__mro__}


def is_transient(error: BaseException) -> bool:
    """Worth another try: the store or the network failed, not the request."""
    if _class_names(error) & TRANSIENT:
        return True
    return isinstance(error, OSError) and not isinstance(error, NOT_TRANSIENT_OS_ERRORS)


def user_error(url: str, error: BaseException, action: str) -> DataError | None:
    """The one line for a failure the user can fix, or None for anything else."""
    names = _class_names(error)
    message = first_line(error)
    if names & NO_CREDENTIALS:
        return DataError(f"{url}: no credentials to {action} it ({message}); {CREDENTIALS_HINT}")
    if isinstance(error, PermissionError):
        return DataError(f"{url}: access denied while trying to {action} it ({message}); check the credentials "
                         "(AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY or AWS_PROFILE) and that they may "
                         f"{action} this bucket")
    if isinstance(error, ImportError):
        return DataError(f"{url}: this kind of URL needs a package that is not installed ({message}); for s3:// "
                         "install `pip install 'bertforge[s3]'`")
    if isinstance(error, ValueError) and "Protocol not known" in message:
        return DataError(f"{url}: unknown URL scheme; give a local path or an fsspec URL (s3://bucket/path, "
                         "gs://bucket/path, https://...)")
    if isinstance(error, FileNotFoundError) and "bucket does not exist" in message.lower():
        return DataError(f"{url}: the bucket does not exist; create it first or check the URL and AWS_ENDPOINT_URL")
    return None


@contextlib.contextmanager
def storage_errors(url: str, action: str) -> Iterator[None]:
    """Turn a failure the user can fix (credentials, URL, bucket, unreachable store) into one line."""
    try:
        yield
    except DataError:
        raise
    except Exception as error:
        known = user_error(url, error, action)
        if known is not None:
            raise known from None
        if is_transient(error):
            raise DataError(f"{url}: could not {action} it ({type(error).__name__}: {first_line(error)}); check "
                            "the network, that the store is up and AWS_ENDPOINT_URL") from None
        raise


def with_retries(url: str, action: str, operation: Callable[[], T], *, attempts: int = RETRY_ATTEMPTS) -> T:
    """`operation()`, tried again after transient failures with waits of 1, 2, 4, ... s.

    A failure the user must fix (credentials, URL, bucket) is one line at once; a missing object is
    raised as `FileNotFoundError` for the caller to name; after the last attempt a transient failure
    becomes one line naming the URL and the number of attempts.
    """
    wait = RETRY_FIRST_WAIT_S
    for attempt in range(1, attempts + 1):
        try:
            return operation()
        except Exception as error:
            known = user_error(url, error, action)
            if known is not None:
                raise known from None
            if not is_transient(error):
                raise
            if attempt == attempts:
                raise DataError(f"{url}: could not {action} it after {attempts} attempts ({type(error).__name__}: "
                                f"{first_line(error)}); check the network, that the store is up, and "
                                "AWS_ENDPOINT_URL") from None
            log.warning(f"{url}: {action} failed ({type(error).__name__}: {first_line(error)}); retrying in "
                        f"{wait:.0f} s (attempt {attempt + 1} of {attempts})")
        time.sleep(wait)
        wait = min(2 * wait, RETRY_MAX_WAIT_S)
    raise AssertionError("unreachable: the last attempt returns or raises")


def filesystem(url: str) -> tuple[fsspec.AbstractFileSystem, str]:
    """fsspec's file system and path for `url`, with an unknown scheme or a missing package as one line."""
    with storage_errors(url, "open"):
        return fsspec.core.url_to_fs(url)


def cat_whole(fs: fsspec.AbstractFileSystem, path: str, size: int) -> bytes:
    """`fs.cat_file(path)` of an object of `size` bytes; a body of another length raises `TruncatedTransfer`
    while the store still holds `size` bytes (a cut transfer: retry it), and is returned when the object
    itself changed (for the caller's checksum to name)."""
    data = fs.cat_file(path)
    if len(data) != size and fs.size(path) == size:
        raise TruncatedTransfer(f"{len(data):,} of {size:,} bytes arrived")
    return data


def cache_root() -> Path:
    """Where remote data is copied: $BERTFORGE_CACHE, else ~/.cache/bertforge."""
    return Path(os.environ.get("BERTFORGE_CACHE", Path.home() / ".cache" / "bertforge"))


def local_copy(url: str) -> Path:
    """A remote file (or directory) copied into the cache, under its own name; reused while it is unchanged.

    The copy is keyed by the URL and the object's size and ETag (or modification time), so a changed
    object is fetched again. Each file appears by `os.replace`, so a reader never sees half of one.
    Labeled data is small next to shards and is read whole, so it is copied rather than streamed.
    """
    fs, path = filesystem(url)
    try:
        info = with_retries(url, "read", lambda: fs.info(path))
    except FileNotFoundError:
        raise DataError(f"{url}: no such object; check the URL (bucket and key) and AWS_ENDPOINT_URL") from None
    version = info.get("ETag") or info.get("etag") or info.get("LastModified") or info.get("mtime") or ""
    key = hashlib.sha256(f"{url}\0{info.get('size')}\0{version}".encode()).hexdigest()[:20]
    name = path.rstrip("/").rsplit("/", 1)[-1]
    target = cache_root() / "files" / key / name
    if info.get("type") == "directory":
        files = with_retries(url, "list", lambda: fs.find(path, detail=True))
        for remote, details in files.items():
            _copy_file(fs, remote, details["size"], target / remote[len(path.rstrip("/")) + 1:], url)
    else:
        _copy_file(fs, path, info["size"], target, url)
    _ORIGINS[str(target)] = url
    return target


def origin(path: str | Path) -> str:
    """What to call `path` in a message: the URL it was copied from when it is a `local_copy`, else the path.
    (A reader's `cache/files/3f2a.../train.csv:3` is the user's `s3://bucket/train.csv:3`.)"""
    return _ORIGINS.get(str(path), str(path))


def _copy_file(fs: fsspec.AbstractFileSystem, remote: str, size: int, target: Path, url: str) -> None:
    if target.is_file():
        return
    data = with_retries(url, "download", lambda: cat_whole(fs, remote, size))
    target.parent.mkdir(parents=True, exist_ok=True)
    temporary = target.with_name(f"{target.name}.tmp-{os.getpid()}")
    temporary.write_bytes(data)
    os.replace(temporary, target)
