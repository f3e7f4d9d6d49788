"""Credentials without argv: a storage URL from ``$TUNER_STORAGE``, a PostgreSQL password from
``PGPASSWORD`` or a mode-600 ``.pgpass``, MLflow's from ``MLFLOW_TRACKING_USERNAME`` /
``_PASSWORD`` or ``~/.mlflow/credentials``; whatever the environment holds is masked in all output.

The launches run on a real PostgreSQL (``TUNER_TEST_POSTGRES``, started by ``.ci/postgres.sh``);
the HTTP checks use a local server that answers MLflow's experiments API only to the right
credentials, asked by tuner's pre-flight and by MLflow's own client alike.
"""

from __future__ import annotations

import base64
import http.server
import json
import os
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import optuna
import pytest

from tests.conftest import FINISHED, NO_VERIFY, run_tuner
from tuner import masking
from tuner.cli import launch_flags, main, parser
from tuner.config import environment_secrets, load_launch, storage_url
from tuner.driver.targets import check_tracking
from tuner.errors import ConfigError

SECRET = "Env-S3cret-pw"
BASE = os.environ.get("TUNER_TEST_POSTGRES")
TINY = ["--trials", "1", "--steps", "20", "--seeds", "1", *NO_VERIFY, "--no-margin", "--num-cpus", "2"]


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No credential of the machine's own leaks into a test (HOME: no ~/.mlflow/credentials, ~/.pgpass)."""
    for name in ("TUNER_STORAGE", "MLFLOW_TRACKING_URI", "PGPASSWORD", "PGPASSFILE", "MLFLOW_TRACKING_USERNAME",
                 "MLFLOW_TRACKING_PASSWORD", "MLFLOW_TRACKING_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    (tmp_path / "home").mkdir()
    monkeypatch.setenv("HOME", str(tmp_path / "home"))


def test_storage_comes_from_the_flag_then_the_launch_yaml_then_the_environment(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    assert load_launch(launch_flags(parser().parse_args(["launch"]))).storage == "sqlite:///tuner.db"
    monkeypatch.setenv("TUNER_STORAGE", "sqlite:///env.db")
    assert load_launch(launch_flags(parser().parse_args(["launch"]))).storage == "sqlite:///env.db"
    launch_yaml = tmp_path / "launch.yaml"
    launch_yaml.write_text("storage: sqlite:///yaml.db\n")
    assert load_launch({}, str(launch_yaml)).storage == "sqlite:///yaml.db"
    flags = launch_flags(parser().parse_args(["launch", "--storage", "sqlite:///flag.db"]))
    assert load_launch(flags, str(launch_yaml)).storage == "sqlite:///flag.db"
    assert (storage_url(None), storage_url("sqlite:///flag.db")) == ("sqlite:///env.db", "sqlite:///flag.db")


def test_report_reads_its_storage_from_the_environment(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    optuna.create_study(study_name="from-env", storage=f"sqlite:///{tmp_path / 'env.db'}")
    monkeypatch.setenv("TUNER_STORAGE", f"sqlite:///{tmp_path / 'env.db'}")
    assert main(["report", "--study", "from-env", "--no-tracking", "--out-dir", str(tmp_path)]) == 0
    assert main(["report", "--study", "elsewhere", "--no-tracking", "--out-dir", str(tmp_path)]) == 2
    assert "env.db" in capsys.readouterr().err  # the study was looked for in $TUNER_STORAGE


def test_passwords_from_the_environment_are_masked(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PGPASSWORD", SECRET + "-pg")
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", SECRET + "-mlflow")
    monkeypatch.setenv("MLFLOW_TRACKING_TOKEN", SECRET + "-token")
    monkeypatch.setenv("TUNER_STORAGE", f"postgresql+psycopg2://u:{SECRET}-url@127.0.0.1:1/db")
    assert sorted(environment_secrets()) == sorted(SECRET + s for s in ("-pg", "-mlflow", "-token", "-url"))
    main(["report", "--study", "x", "--no-tracking", "--out-dir", str(tmp_path)])  # registers them (and fails)
    for suffix in ("-pg", "-mlflow", "-token", "-url"):
        assert masking.mask(f"a library printed {SECRET}{suffix}") == "a library printed ***"


@pytest.fixture
def mlflow_api() -> Iterator[tuple[str, list[str]]]:
    """A local server answering MLflow's experiments API (no experiments) to Basic u:SECRET alone, else 401;
    yields its address and the Authorization headers it received."""
    expected = "Basic " + base64.b64encode(f"u:{SECRET}".encode()).decode()
    seen: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.append(self.headers.get("Authorization") or "")
            ok = seen[-1] == expected
            self.send_response(200 if ok else 401)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(json.dumps({"experiments": []} if ok else {"error_code": "UNAUTHENTICATED"}).encode())

        do_POST = do_GET

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}", seen
    server.shutdown()


def test_tracking_preflight_sends_the_credentials_mlflow_sends(
    mlflow_api: tuple[str, list[str]], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from mlflow.tracking import MlflowClient

    uri, seen = mlflow_api
    with pytest.raises(ConfigError, match=r"refused these credentials \(HTTP 401\)"):
        check_tracking(uri)
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", "u")
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", SECRET)
    check_tracking(uri)
    assert MlflowClient(uri).search_experiments() == []  # MLflow's own client, with the same variables
    assert seen[-1] == seen[-2] and SECRET not in uri

    monkeypatch.delenv("MLFLOW_TRACKING_PASSWORD")  # the mode-600 file MLflow reads instead
    credentials = tmp_path / "home" / ".mlflow" / "credentials"
    credentials.parent.mkdir()
    credentials.write_text(f"[mlflow]\nmlflow_tracking_username = u\nmlflow_tracking_password = {SECRET}\n")
    credentials.chmod(0o600)
    check_tracking(uri)
    assert MlflowClient(uri).search_experiments() == []
    assert SECRET in environment_secrets()


@pytest.fixture
def postgres() -> dict[str, str]:
    """The PostgreSQL of ``TUNER_TEST_POSTGRES``: its user, password, host and port."""
    if not BASE:
        if os.environ.get("CI"):
            pytest.fail("CI must start PostgreSQL and set TUNER_TEST_POSTGRES (see .ci/run)")
        pytest.skip("no PostgreSQL: run `export TUNER_TEST_POSTGRES=$(bash .ci/postgres.sh)` (as root)")
    parts = urlsplit(BASE)
    assert parts.username and parts.password and parts.hostname and parts.port
    return {"user": parts.username, "password": parts.password, "host": parts.hostname, "port": str(parts.port)}


def _url(pg: dict[str, str], database: str) -> str:
    """A URL with no password in it."""
    return f"postgresql+psycopg2://{pg['user']}@{pg['host']}:{pg['port']}/{database}"


def _assert_launched_without_leaking(
    result: subprocess.CompletedProcess[str], pg: dict[str, str], study: str, tmp_path: Path
) -> None:
    out = result.stdout + result.stderr
    assert result.returncode in FINISHED, out[-3000:]
    assert pg["password"] not in out + (tmp_path / "best.yaml").read_text()
    full = f"postgresql+psycopg2://{pg['user']}:{pg['password']}@{pg['host']}:{pg['port']}/tuner_optuna"
    trials = optuna.load_study(study_name=study, storage=full).trials
    assert len(trials) == 1 and trials[0].state.is_finished()


@pytest.mark.slow
@pytest.mark.ray
@pytest.mark.tf
def test_launch_on_postgres_with_the_password_only_in_pgpassword(
    postgres: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    study = f"pgpassword-{os.getpid()}"
    monkeypatch.setenv("PGPASSWORD", postgres["password"])
    argv = ["launch", *TINY, "--study", study, "--storage", _url(postgres, "tuner_optuna"),
            "--tracking-uri", _url(postgres, "tuner_mlflow"), "--out", str(tmp_path / "best.yaml")]
    assert postgres["password"] not in " ".join(argv)  # nothing for `ps` to show
    _assert_launched_without_leaking(run_tuner(argv, cwd=tmp_path), postgres, study, tmp_path)


@pytest.mark.slow
@pytest.mark.ray
@pytest.mark.tf
def test_launch_on_postgres_with_the_url_in_the_environment_and_the_password_in_a_pgpass_file(
    postgres: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    study = f"pgpass-{os.getpid()}"
    pgpass = tmp_path / "pgpass"
    pgpass.write_text(f"{postgres['host']}:{postgres['port']}:*:{postgres['user']}:{postgres['password']}\n")
    pgpass.chmod(0o600)  # libpq ignores a password file others can read
    monkeypatch.setenv("PGPASSFILE", str(pgpass))
    monkeypatch.setenv("TUNER_STORAGE", _url(postgres, "tuner_optuna"))
    argv = ["launch", *TINY, "--study", study, "--no-tracking", "--out", str(tmp_path / "best.yaml")]
    _assert_launched_without_leaking(run_tuner(argv, cwd=tmp_path), postgres, study, tmp_path)
    report = run_tuner(["report", "--study", study, "--no-tracking", "--out-dir", str(tmp_path)], cwd=tmp_path)
    assert report.returncode == 0, report.stderr[-2000:]
    assert postgres["password"] not in report.stdout + report.stderr
