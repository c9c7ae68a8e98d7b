"""A throwaway PostgreSQL server on this machine, for tests and benchmarks of the ingress
service on a shared database: Debian's binaries, run as the ``postgres`` user when we are
root (initdb and the server refuse root), on a private directory, port and socket
directory, removed afterwards. Never for production: fsync is off."""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from otela.testing.localfed import wait_for


class PostgresMissing(RuntimeError):
    """No PostgreSQL binaries here (scripts/bootstrap installs them with apt)."""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _as_postgres(*argv: str) -> list[str]:
    return list(argv) if os.geteuid() != 0 else ["runuser", "-u", "postgres", "--", *argv]


@contextmanager
def local_postgres() -> Iterator[str]:
    """Start a server; yield its URL without a database name (append ``/<db>``)."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    if not found:
        raise PostgresMissing("PostgreSQL is not installed (scripts/bootstrap installs it)")
    bin_dir = Path(found[-1]).parent
    root = Path(tempfile.mkdtemp(prefix="otela-pg-"))
    data, sockets = root / "data", root / "sock"
    sockets.mkdir()
    if os.geteuid() == 0:
        shutil.chown(root, "postgres")
        shutil.chown(sockets, "postgres")
    port = _free_port()
    try:
        subprocess.run(_as_postgres(str(bin_dir / "initdb"), "-D", str(data), "-A", "trust",
                                    "-U", "postgres", "--no-sync"),
                       check=True, capture_output=True)
        subprocess.run(_as_postgres(
            str(bin_dir / "pg_ctl"), "-D", str(data), "-l", str(root / "server.log"), "-o",
            f"-p {port} -k {sockets} -c listen_addresses=127.0.0.1 -c fsync=off "
            "-c max_connections=200", "start"), check=True, capture_output=True)
        url = f"postgresql://postgres@127.0.0.1:{port}"
        import psycopg

        def ready() -> bool:
            try:
                with psycopg.connect(f"{url}/postgres", connect_timeout=2):
                    return True
            except psycopg.OperationalError:
                return False
        wait_for(ready, 30, "PostgreSQL to accept connections")
        yield url
    finally:
        subprocess.run(_as_postgres(str(bin_dir / "pg_ctl"), "-D", str(data), "-m",
                                    "immediate", "stop"), capture_output=True)
        shutil.rmtree(root, ignore_errors=True)


def create_database(server_url: str, name: str) -> str:
    """A fresh, empty database ``name`` on the server; its URL."""
    import psycopg

    safe = "".join(c if c.isalnum() or c == "_" else "_" for c in name)[:60]
    with psycopg.connect(f"{server_url}/postgres", autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{safe}"')
        conn.execute(f'CREATE DATABASE "{safe}"')
    return f"{server_url}/{safe}"
