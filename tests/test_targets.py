"""Every URL and path checked before anything is created; no password in any output."""

from __future__ import annotations

import http.server
import logging
import os
import re
import sqlite3
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import run_tuner
from tuner import masking
from tuner.cli import main
from tuner.config import LaunchConfig
from tuner.driver.targets import check_database, check_out, check_targets, check_tracking
from tuner.errors import ConfigError

SECRET = "S3cret-pw"
BASE = os.environ.get("TUNER_TEST_POSTGRES")


def _config(tmp_path: Path, **values: object) -> LaunchConfig:
    defaults = {"storage": f"sqlite:///{tmp_path / 't.db'}", "tracking_uri": f"sqlite:///{tmp_path / 'm.db'}",
                "out": str(tmp_path / "best.yaml")}
    return LaunchConfig(**{**defaults, **values})


@pytest.fixture
def http_server() -> Iterator[tuple[str, list[int]]]:
    """A local HTTP server answering every GET with the status code in ``codes[0]``."""
    codes = [401]

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(codes[0])
            self.end_headers()
            self.wfile.write(b"{}")

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"127.0.0.1:{server.server_address[1]}", codes
    server.shutdown()


@pytest.mark.parametrize(("storage", "message"), [
    ("notadb://x", "unknown database scheme 'notadb'"),
    ("not a url", "not a database URL"),
    (f"mysql+pymysql://u:{SECRET}@127.0.0.1/db", "the database driver for 'mysql+pymysql' is not installed"),
    (f"postgresql+psycopg2://u:{SECRET}@127.0.0.1:1/db", "cannot connect"),
    ("sqlite:///{tmp}/missing/t.db", "does not exist"),
    ("sqlite:///{tmp}/junk.db", "is not a SQLite database"),
    ("sqlite:///{tmp}", "is a folder"),
])
def test_check_targets_bad_storage_names_the_flag_and_creates_nothing(
    tmp_path: Path, storage: str, message: str
) -> None:
    (tmp_path / "junk.db").write_text("not a database")
    before = sorted(tmp_path.iterdir())
    with pytest.raises(ConfigError, match=re.escape(message)) as raised:
        check_targets(_config(tmp_path, storage=storage.format(tmp=tmp_path)))
    text = str(raised.value)
    assert text.startswith("--storage ") and SECRET not in text and "\n" not in text
    assert sorted(tmp_path.iterdir()) == before


def test_check_targets_good_targets_pass_and_create_nothing(tmp_path: Path) -> None:
    check_targets(_config(tmp_path))
    check_database("sqlite://", "--storage")  # in memory
    assert list(tmp_path.iterdir()) == []


_KILLED_WRITER = """
import os, signal, sqlite3, sys
db = sqlite3.connect(sys.argv[1], isolation_level=None)
db.execute("create table t (x text)")
db.execute("pragma cache_size=1")  # spill to the file mid-transaction: the journal left behind is hot
db.execute("begin")
for _ in range(2000):
    db.execute("insert into t values (?)", ("x" * 500,))
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_check_targets_pass_a_database_whose_writer_was_killed_mid_transaction(tmp_path: Path) -> None:
    """A launch killed with SIGKILL leaves a hot journal; the same command must go on, not call it junk."""
    subprocess.run([sys.executable, "-c", _KILLED_WRITER, str(tmp_path / "t.db")], check=False)
    assert (tmp_path / "t.db-journal").exists()
    check_targets(_config(tmp_path))
    with sqlite3.connect(tmp_path / "t.db") as db:  # the next writer rolls the journal back
        assert db.execute("select count(*) from t").fetchone() == (0,)


@pytest.mark.parametrize(("uri", "message"), [
    ("foo://x", "unknown database scheme 'foo'"),
    ("sqlite:///{tmp}/missing/m.db", "does not exist"),
    (f"http://u:{SECRET}@127.0.0.1:1", "cannot reach the MLflow tracking store at http://u:***@127.0.0.1:1"),
])
def test_check_tracking_bad_uri_names_the_flag(tmp_path: Path, uri: str, message: str) -> None:
    with pytest.raises(ConfigError, match="--tracking-uri") as raised:
        check_tracking(uri.format(tmp=tmp_path))
    assert message in str(raised.value) and SECRET not in str(raised.value)


def test_check_tracking_http_credentials_refused_or_not_mlflow(http_server: tuple[str, list[int]]) -> None:
    address, codes = http_server
    with pytest.raises(ConfigError, match=r"refused these credentials \(HTTP 401\)") as raised:
        check_tracking(f"http://u:{SECRET}@{address}")
    assert SECRET not in str(raised.value)
    codes[0] = 404
    with pytest.raises(ConfigError, match="answered HTTP 404 to MLflow's API"):
        check_tracking(f"http://{address}")
    codes[0] = 200
    check_tracking(f"http://u:{SECRET}@{address}")


def test_check_out_folder_or_missing_folder(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"--out .*: is a folder"):
        check_out(str(tmp_path))
    with pytest.raises(ConfigError, match=r"--out .*: the folder .*nowhere does not exist"):
        check_out(str(tmp_path / "nowhere" / "best.yaml"))
    check_out(str(tmp_path / "best.yaml"))


def test_check_targets_space_must_be_a_readable_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"--space .*nope.yaml: no such file"):
        check_targets(_config(tmp_path, space=str(tmp_path / "nope.yaml")))


def test_mask_hides_registered_passwords_in_any_text() -> None:
    masking.register(f"postgresql://u:{SECRET}@h/db", None, "sqlite:///x.db")
    text = masking.mask(f"API request to http://u:{SECRET}@h/api failed; password {SECRET!r}; pw%2Fx")
    assert SECRET not in text and "http://u:***@h/api" in text
    assert masking.mask("no secret here") == "no secret here"


def test_masked_stream_masks_a_third_party_logger(capsys: pytest.CaptureFixture[str]) -> None:
    masking.register(f"http://u:{SECRET}@127.0.0.1:1")
    masking.install()
    handler = logging.StreamHandler(sys.stderr)  # as a library sets one up once tuner has started
    logger = logging.getLogger("third.party")
    logger.addHandler(handler)
    try:
        logger.error("request failed, token=%s", SECRET)
    finally:
        logger.removeHandler(handler)
    err = capsys.readouterr().err
    assert "token=***" in err and SECRET not in err


def test_tracking_connect_masks_mlflow_exception_text() -> None:
    """MLflow's own exception quotes the URL with its password: tuner's message must not."""
    from tuner.driver.tracking import connect
    from tuner.errors import TrackingError

    with pytest.raises(TrackingError) as raised:
        connect(f"http://u:{SECRET}@127.0.0.1:1")
    assert SECRET not in str(raised.value) and "u:***@127.0.0.1:1" in str(raised.value)


def test_main_bad_storage_one_line_exit_2_nothing_created(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["launch", "--storage", "notadb://x"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("tuner: error: --storage notadb://x: unknown database scheme")
    assert list(tmp_path.iterdir()) == []  # no mlflow.db, no tuner.db


@pytest.mark.parametrize("flags", [
    ["--storage", f"postgresql+psycopg2://tuner:{SECRET}@127.0.0.1:1/optuna"],
    ["--tracking-uri", f"http://tuner:{SECRET}@127.0.0.1:1"],
])
def test_launch_bad_url_subprocess_one_line_no_password_nothing_created(tmp_path: Path, flags: list[str]) -> None:
    result = run_tuner(["launch", *flags], cwd=tmp_path, timeout=120)
    assert result.returncode == 2
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"tuner: error: {flags[0]}"), result.stderr
    assert SECRET not in result.stdout + result.stderr and "Traceback" not in result.stderr
    assert list(tmp_path.iterdir()) == []


def test_check_database_wrong_postgres_password_is_one_line(tmp_path: Path) -> None:
    if not BASE:
        pytest.skip("no PostgreSQL: export TUNER_TEST_POSTGRES=$(bash .ci/postgres.sh)")
    user_host = BASE.split("//", 1)[1]
    user, host = user_host.split(":", 1)[0], user_host.split("@", 1)[1]
    with pytest.raises(ConfigError, match="cannot connect") as raised:
        check_database(f"postgresql+psycopg2://{user}:{SECRET}@{host}/tuner_optuna", "--storage")
    assert SECRET not in str(raised.value) and "\n" not in str(raised.value)
    check_database(f"{BASE}/tuner_optuna", "--storage")
