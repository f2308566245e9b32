"""A throwaway PostgreSQL server from Debian's packages (`postgresql`, which ./start.sh test installs): initdb
into a temporary folder, listening on a Unix socket there only, trust authentication, fsync off. As root it runs
as the `postgres` user, as PostgreSQL insists."""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

#: Where Debian puts the server's programs (one folder per major version).
BIN_GLOB = "/usr/lib/postgresql/*/bin"
USER = "hmt"


def bin_dir() -> Path | None:
    found = sorted(glob.glob(BIN_GLOB), key=lambda p: int(Path(p).parent.name) if Path(p).parent.name.isdigit()
                   else 0)
    return Path(found[-1]) if found and (Path(found[-1]) / "initdb").is_file() else None


def _as_server_user(command: list[str]) -> list[str]:
    if os.geteuid() != 0:
        return command
    return ["runuser", "-u", "postgres", "--", *command]


@contextmanager
def postgres_server(port: int) -> Iterator[str]:
    """A running server; yields the URL of its `postgres` database as user `hmt` (a superuser)."""
    programs = bin_dir()
    if programs is None:
        raise RuntimeError("PostgreSQL is not installed: run 'sudo apt-get install -y postgresql' (./start.sh test "
                           "does it where it can)")
    folder = Path(tempfile.mkdtemp(prefix="hmt-pg-"))
    data = folder / "data"
    if os.geteuid() == 0:
        entry = pwd.getpwnam("postgres")
        os.chown(folder, entry.pw_uid, entry.pw_gid)
    try:
        subprocess.run(_as_server_user([str(programs / "initdb"), "-D", str(data), "-U", USER, "-A", "trust",
                                        "--no-sync", "-E", "UTF8"]),
                       check=True, capture_output=True, text=True, timeout=120)
        options = f"-k {folder} -p {port} -c listen_addresses='' -c fsync=off -c full_page_writes=off"
        subprocess.run(_as_server_user([str(programs / "pg_ctl"), "-D", str(data), "-o", options, "-w", "-t", "60",
                                        "-l", str(folder / "log"), "start"]),
                       check=True, capture_output=True, text=True, timeout=120)
        try:
            yield f"postgresql+psycopg://{USER}@/postgres?host={folder}&port={port}"
        finally:
            subprocess.run(_as_server_user([str(programs / "pg_ctl"), "-D", str(data), "-m", "immediate", "stop"]),
                           capture_output=True, timeout=60)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def fresh_database(server_url: str, name: str) -> str:
    """A new, empty database on the server at `server_url`; returns its URL."""
    import psycopg
    from sqlalchemy.engine import make_url

    url = make_url(server_url)
    host, port = url.query["host"], url.query["port"]
    with psycopg.connect(host=host, port=port, user=USER, dbname="postgres", autocommit=True) as connection:
        connection.execute(f'DROP DATABASE IF EXISTS "{name}"')
        connection.execute(f'CREATE DATABASE "{name}"')
    return url.set(database=name).render_as_string(hide_password=False)
