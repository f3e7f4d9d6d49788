"""Every URL and path a launch reads or writes, checked before anything is created.

A bad ``--storage`` used to surface as a 30-line SQLAlchemy traceback after MLflow's database was
already made. Here each target is checked without creating anything, and a problem is one
:class:`ConfigError` naming the flag, with the password masked:

- a database URL (``--storage``, a database ``--tracking-uri``): SQLAlchemy knows the scheme, its
  driver is installed, and then either the SQLite file's folder is writable (an existing file must
  be a SQLite database) or the server accepts a connection with these credentials (5 s timeout);
- an HTTP ``--tracking-uri``: the MLflow server answers its experiments API with the credentials
  MLflow's client would send (the URL's, else ``MLFLOW_TRACKING_USERNAME`` / ``_PASSWORD`` or
  ``~/.mlflow/credentials``, else ``MLFLOW_TRACKING_TOKEN``); a database URL without a password
  connects as libpq would, with ``PGPASSWORD`` or ``~/.pgpass``;
- ``--out``: its folder exists and is writable (the plots go beside it);
- ``--space``: the file exists, is readable and is UTF-8 YAML (its content is checked by
  ``tuner.spaces``).
"""

from __future__ import annotations

import base64
import contextlib
import os
import sqlite3
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import unquote, urlsplit, urlunsplit

from tuner.config import LaunchConfig, read_yaml, redact, tracking_credentials
from tuner.errors import ConfigError
from tuner.masking import mask

TIMEOUT = 5.0  # seconds a server gets to answer a check
_DB_HINT = "write sqlite:///FILE.db, or postgresql+psycopg2:// then user, password, host and database"
_CONNECT_TIMEOUT = {"postgresql": "connect_timeout", "mysql": "connect_timeout", "mariadb": "connect_timeout"}
_UNCHECKED = ("databricks", "databricks-uc", "uc")  # MLflow schemes that need their own credentials


def check_targets(config: LaunchConfig) -> None:
    """Check the launch's storage, tracking URI, ``--out`` and ``--space`` (see the module docs).

    Raises:
        ConfigError: one line naming the flag, what is wrong and how to fix it.
    """
    if config.space:
        check_readable(config.space, "--space")
        read_yaml(config.space, "search space")  # UTF-8 YAML, before the space is validated
    check_out(config.out)
    check_database(config.storage, "--storage")
    if config.tracking_uri and not config.no_tracking:
        check_tracking(config.tracking_uri)


def check_readable(path: str, flag: str) -> None:
    """``path`` is a file this process can read."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"{flag} {path}: no such file" + (" (it is a folder)" if p.is_dir() else ""))
    if not os.access(p, os.R_OK):
        raise ConfigError(f"{flag} {path}: the file is not readable; fix its permissions")


def check_out(path: str) -> None:
    """``--out`` can be written: not a folder, and its folder exists and is writable."""
    p = Path(path)
    if p.is_dir():
        raise ConfigError(f"--out {path}: is a folder; give a file name such as {p / 'best_config.yaml'}")
    folder = p.parent if str(p.parent) else Path(".")
    if not folder.is_dir():
        raise ConfigError(f"--out {path}: the folder {folder} does not exist; create it or choose another path")
    if not os.access(folder, os.W_OK | os.X_OK) or (p.exists() and not os.access(p, os.W_OK)):
        raise ConfigError(f"--out {path}: not writable; choose a path in a folder you can write to")


def check_database(url: str, flag: str) -> None:
    """A database URL's scheme and driver, then the SQLite file's folder or the server's answer."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError, NoSuchModuleError

    shown = redact(url)
    try:
        parsed = make_url(url)
    except (ArgumentError, ValueError) as exc:
        raise ConfigError(f"{flag} {shown}: not a database URL; {_DB_HINT}") from exc
    try:
        dialect = parsed.get_dialect()
    except NoSuchModuleError as exc:
        raise ConfigError(f"{flag} {shown}: unknown database scheme {parsed.drivername!r}; {_DB_HINT}") from exc
    try:
        dialect.import_dbapi()
    except ImportError as exc:
        hint = " (pip install -e '.[postgres]')" if parsed.get_backend_name() == "postgresql" else ""
        raise ConfigError(f"{flag} {shown}: the database driver for {parsed.drivername!r} is not installed: "
                          f"{mask(str(exc))}; install it{hint}") from exc
    if parsed.get_backend_name() == "sqlite":
        _check_sqlite(parsed.database, flag, shown)
    else:
        _check_server(url, parsed.get_backend_name(), flag, shown, has_password=parsed.password is not None)


_SQLITE_HEADER = b"SQLite format 3\x00"


def _check_sqlite(database: str | None, flag: str, shown: str) -> None:
    if not database or database == ":memory:" or database.startswith("file:"):
        return
    path = Path(database)
    folder = path.parent if str(path.parent) else Path(".")
    if path.is_dir():
        raise ConfigError(f"{flag} {shown}: {path} is a folder, not a database file")
    if not folder.is_dir():
        raise ConfigError(f"{flag} {shown}: the folder {folder} does not exist; create it or fix the path")
    if not os.access(folder, os.W_OK | os.X_OK) or (path.exists() and not os.access(path, os.R_OK | os.W_OK)):
        raise ConfigError(f"{flag} {shown}: {path} cannot be written; fix its permissions or choose another path")
    # The file's header, not a connection: a launch killed mid-write leaves a hot journal, and a
    # read-only connection then fails ("attempt to write a readonly database") where the next
    # writer would simply roll the journal back.
    if path.exists():
        with path.open("rb") as file:
            header = file.read(len(_SQLITE_HEADER))
        if header and header != _SQLITE_HEADER:
            raise ConfigError(f"{flag} {shown}: {path} is not a SQLite database (it does not start with "
                              "SQLite's header); point it at a database file or a new path")
        check_intact(path, flag, shown)


def check_sqlite_intact(url: str, flag: str) -> None:
    """If ``url`` names an existing SQLite file, it passes :func:`check_intact` (for ``tuner report``,
    which reads a store and may not write beside it)."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        parsed = make_url(url)
    except (ArgumentError, ValueError):
        return  # not a database URL: the store's own open says what is wrong
    database = parsed.database
    if parsed.get_backend_name() == "sqlite" and database and Path(database).is_file():
        check_intact(Path(database), flag, redact(url))


def check_intact(path: Path, flag: str, shown: str) -> None:
    """SQLite's ``PRAGMA quick_check`` on an existing database file, opened read-only (``mode=ro``:
    it cannot create or change anything): a truncated or corrupt file is refused before any store
    or cluster is made, instead of two tracebacks ("database disk image is malformed") after.

    A file with a hot journal is not checked: a writer killed mid-transaction left it, the next
    writer rolls it back, and a read-only connection cannot (d61cdee). A file that cannot be read
    now (locked by a live launch) is left to the launch's own open.

    Raises:
        ConfigError: the file is damaged: the flag, SQLite's first complaint and the fix.
    """
    journal = path.with_name(path.name + "-journal")
    if journal.is_file() and journal.stat().st_size > 0:
        return
    try:
        with contextlib.closing(sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True,
                                                timeout=TIMEOUT)) as db:
            problems = [str(row[0]) for row in db.execute("PRAGMA quick_check(1)")]
    except sqlite3.OperationalError:  # busy, locked, or a journal to roll back: not a verdict
        return
    except sqlite3.DatabaseError as exc:  # "database disk image is malformed", "file is not a database"
        problems = [str(exc)]
    if problems != ["ok"]:
        said = " ".join(problems[0].split())
        raise ConfigError(f"{flag} {shown}: {path} is damaged (SQLite's quick_check: {said}); restore it from a "
                          f"backup, or point {flag} at a new file (`sqlite3 {path} .recover` may salvage what is left)")


def _check_server(url: str, backend: str, flag: str, shown: str, has_password: bool = True) -> None:
    """The database server accepts a connection (creates nothing: the database must exist); a URL
    without a password connects with the driver's own (libpq: ``PGPASSWORD``, ``~/.pgpass``)."""
    import sqlalchemy
    from sqlalchemy.pool import NullPool

    key = _CONNECT_TIMEOUT.get(backend)
    args = {key: int(TIMEOUT)} if key else {}
    try:
        engine = sqlalchemy.create_engine(url, poolclass=NullPool, connect_args=args)
        with engine.connect():
            pass
        engine.dispose()
    except Exception as exc:  # OperationalError (host, password, database), or a driver's own error
        password = "password" if has_password else "password (PGPASSWORD, or ~/.pgpass with mode 0600)"
        raise ConfigError(f"{flag} {shown}: cannot connect: {_first_line(exc)}; check the host, port, user, "
                          f"{password} and that the database exists") from exc


def check_tracking(uri: str) -> None:
    """The MLflow tracking URI: a database, an MLflow server over HTTP, or a local folder."""
    scheme = urlsplit(uri).scheme.lower()
    if scheme in ("http", "https"):
        _check_http(uri)
    elif scheme in _UNCHECKED:
        return
    elif scheme in ("", "file"):
        folder = Path(urlsplit(uri).path if scheme else uri)
        target = folder if folder.exists() else folder.parent
        if not os.access(target, os.W_OK):
            raise ConfigError(f"--tracking-uri {redact(uri)}: {target} is not a writable folder")
    else:
        check_database(uri, "--tracking-uri")


def _check_http(uri: str) -> None:
    """An MLflow server answers ``GET /api/2.0/mlflow/experiments/search`` with these credentials."""
    parts = urlsplit(uri)
    netloc = parts.hostname or ""
    if parts.port:
        netloc += f":{parts.port}"
    base = urlunsplit((parts.scheme, netloc, parts.path.rstrip("/"), "", ""))
    request = urllib.request.Request(f"{base}/api/2.0/mlflow/experiments/search?max_results=1")
    authorization = _authorization(parts.username, parts.password)
    if authorization:
        request.add_header("Authorization", authorization)
    shown = redact(uri)
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT):
            return
    except urllib.error.HTTPError as exc:
        if exc.code in (401, 403):
            raise ConfigError(f"--tracking-uri {shown}: the MLflow server refused these credentials "
                              f"(HTTP {exc.code}); fix the user or password") from exc
        raise ConfigError(f"--tracking-uri {shown}: answered HTTP {exc.code} to MLflow's API: is it an MLflow "
                          "server? Fix --tracking-uri or pass --no-tracking") from exc
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        raise ConfigError(f"--tracking-uri: cannot reach the MLflow tracking store at {shown} ({mask(str(reason))}); "
                          "start it (mlflow server --host 127.0.0.1 --port 5000), fix --tracking-uri / "
                          "MLFLOW_TRACKING_URI, or pass --no-tracking") from exc


def _authorization(username: str | None, password: str | None) -> str | None:
    """The header MLflow's client would send: the URL's ``user:password@``, else MLflow's own
    credentials (``MLFLOW_TRACKING_USERNAME`` / ``_PASSWORD``, ``~/.mlflow/credentials``), else
    ``MLFLOW_TRACKING_TOKEN`` as a bearer token (None: no credentials)."""
    env_user, env_password, token = tracking_credentials()
    if username is not None:  # in the URL: percent-encoded
        username, password = unquote(username), unquote(password or "")
    elif env_user and env_password:
        username, password = env_user, env_password
    else:
        return f"Bearer {token}" if token else None
    return "Basic " + base64.b64encode(f"{username}:{password}".encode()).decode()


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return mask(lines[0][:300] if lines else type(exc).__name__)
