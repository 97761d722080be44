"""A real S3-compatible server for the tests: moto's server mode (`python -m moto.server`) in its own
process, with IAM authentication switched on, so that wrong credentials are refused as AWS refuses them.

    s3_server (fixture) -> S3Server     .endpoint, .key_id, .secret, .env (what a client needs), .bucket()
    use_s3(monkeypatch, server, tmp)    this process's environment pointed at it (and a fresh cache)

The tests skip (with the reason) where moto or s3fs is not installed: pip install 'wsi[cloud,dev]'.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

#: requests moto answers without authentication: the three that create our IAM user and its key
_SETUP_ACTIONS = 3
_CREDENTIAL_VARIABLES = (
    "AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN", "AWS_CONFIG_FILE",
    "AWS_SHARED_CREDENTIALS_FILE", "AWS_ENDPOINT_URL_S3",
)  # fmt: skip


@dataclass
class S3Server:
    endpoint: str
    key_id: str
    secret: str
    process: subprocess.Popen[bytes]
    buckets: list[str] = field(default_factory=list)

    @property
    def env(self) -> dict[str, str]:
        """The standard variables a client (s3fs, boto3, a dask worker) reads."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint, "AWS_ACCESS_KEY_ID": self.key_id,
            "AWS_SECRET_ACCESS_KEY": self.secret, "AWS_DEFAULT_REGION": "us-east-1",
        }  # fmt: skip

    def client(self):  # type: ignore[no-untyped-def]
        import boto3

        return boto3.client(
            "s3", endpoint_url=self.endpoint, region_name="us-east-1", aws_access_key_id=self.key_id,
            aws_secret_access_key=self.secret,
        )  # fmt: skip

    def bucket(self, prefix: str = "wsi") -> str:
        """A new empty bucket."""
        name = f"{prefix}-{uuid.uuid4().hex[:10]}"
        self.client().create_bucket(Bucket=name)
        self.buckets.append(name)
        return name

    def objects(self, bucket: str, prefix: str = "") -> dict[str, bytes]:
        """Every object of the bucket under `prefix`: key -> content."""
        s3 = self.client()
        pages = s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
        keys = [o["Key"] for page in pages for o in page.get("Contents", [])]
        return {k: s3.get_object(Bucket=bucket, Key=k)["Body"].read() for k in keys}


#: the server process: moto's own server (its app and request handler, as `python -m moto.server` runs
#: them) on a port the kernel picks when it binds, written to argv[1] once it listens. A port picked here
#: and bound by the server later could be taken in between by another process (pytest-xdist workers start
#: servers and clusters side by side), and the check below would then talk to that process instead.
_SERVE = """
import os, sys, threading
from moto.server import ThreadedMotoServer
server = ThreadedMotoServer("127.0.0.1", 0, verbose=False)
server.start()
port = server.get_host_and_port()[1]
os.environ["MOTO_PORT"] = str(port)  # what `python -m moto.server -p PORT` sets
with open(sys.argv[1] + ".tmp", "w") as f:
    f.write(str(port))
os.replace(sys.argv[1] + ".tmp", sys.argv[1])
threading.Event().wait()  # serves until terminated
"""


@pytest.fixture(scope="module")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    pytest.importorskip("moto.server", reason="moto[server] is not installed (pip install 'wsi[dev]')")
    pytest.importorskip("s3fs", reason="s3fs is not installed (pip install 'wsi[cloud]')")
    import boto3

    folder = tmp_path_factory.mktemp("moto")
    log, port_file = folder / "server.log", folder / "port"
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env["INITIAL_NO_AUTH_ACTION_COUNT"] = str(_SETUP_ACTIONS)
    with open(log, "wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-c", _SERVE, str(port_file)], env=env, stdout=out, stderr=subprocess.STDOUT
        )
    deadline = time.monotonic() + 120  # moto imports in seconds, four times that on a loaded CI machine
    while not port_file.exists():
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            pytest.fail(f"moto server did not start: {log.read_text()[-2000:]}")
        time.sleep(0.05)
    endpoint = f"http://127.0.0.1:{int(port_file.read_text())}"
    iam = boto3.client("iam", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="setup",
                       aws_secret_access_key="setup")  # fmt: skip
    iam.create_user(UserName="wsi-tests")
    policy = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}
    iam.put_user_policy(UserName="wsi-tests", PolicyName="all", PolicyDocument=json.dumps(policy))
    key = iam.create_access_key(UserName="wsi-tests")["AccessKey"]
    server = S3Server(endpoint, key["AccessKeyId"], key["SecretAccessKey"], process)
    try:
        yield server
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()


def use_s3(monkeypatch: pytest.MonkeyPatch, server: S3Server, cache: Path) -> None:
    """Point this process (and the processes it starts) at the server with the right credentials, and
    at a cache folder of its own; s3fs instances made with other credentials are forgotten."""
    for name in _CREDENTIAL_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    for name, value in server.env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("WSI_CACHE_DIR", str(cache))
    forget_filesystems()


def forget_filesystems() -> None:
    """Drop fsspec's cached s3fs instances, so the next one reads the credentials in the environment."""
    import s3fs

    s3fs.S3FileSystem.clear_instance_cache()


@pytest.fixture(scope="module")
def s3(s3_server: S3Server, tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    """This process pointed at the server, with a cache of its own, for the whole module (import it
    beside `s3_server`: `from s3_server import s3 as s3, s3_server as s3_server`)."""
    mp = pytest.MonkeyPatch()
    use_s3(mp, s3_server, tmp_path_factory.mktemp("cache"))
    yield s3_server
    mp.undo()
    forget_filesystems()


def padded_pair(make_slide: Any, prefix: str) -> tuple[bytes, bytes]:
    """Two different slides padded to one size (trailing bytes no TIFF reader looks at): a slide replaced
    by another of the same size."""
    a = make_slide(name=f"{prefix}-a", size_um=800.0, mpp=1.0, seed=3).path.read_bytes()
    b = make_slide(name=f"{prefix}-b", size_um=800.0, mpp=1.0, seed=9, style="b").path.read_bytes()
    n = max(len(a), len(b))
    return a + b"\0" * (n - len(a)), b + b"\0" * (n - len(b))
