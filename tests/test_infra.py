"""Checks of the deployment files under infra/: they parse, carry the keys their tools read, and
keep the security properties infra/README.md promises. Nothing is deployed; no cluster is needed.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
from collections.abc import Iterator
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

INFRA = Path(__file__).resolve().parents[1] / "infra"
RAY_CLUSTER = INFRA / "ray-cluster.yaml"
KUBERAY = INFRA / "kuberay-raycluster.yaml"
COMPOSE = INFRA / "mlflow" / "docker-compose.yaml"
MLFLOW_K8S = INFRA / "mlflow" / "k8s.yaml"
KUSTOMIZATION = INFRA / "mlflow" / "kustomization.yaml"
ENV_EXAMPLE = INFRA / "mlflow" / ".env.example"
README = INFRA / "README.md"

# Names of keys and variables that hold secrets.
SECRET_NAME = re.compile(r"password|passwd|secret|token", re.IGNORECASE)
# A compose / shell reference with no fallback value: ${VAR}, ${VAR:?message}, ${VAR?message}.
REFERENCE = re.compile(r"^\$\{[A-Za-z_]\w*(?::?\?[^}]*)?\}$")
# user:password@ inside a URI; group 1 is the password.
URI_PASSWORD = re.compile(r"://[^/\s:@]+:([^@\s/]+)@")
# VAR=value on a command line, for a secret-named VAR.
SECRET_ASSIGNMENT = re.compile(r"\b\w*(PASSWORD|TOKEN|SECRET)=(\S+)")


def load(path: Path) -> Any:
    """The single YAML document of a file."""
    return yaml.safe_load(path.read_text())


def load_all(path: Path) -> list[Any]:
    """Every YAML document of a file, empty ones dropped."""
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]


def yaml_files() -> list[Path]:
    """Every YAML file under infra/."""
    return sorted([*INFRA.rglob("*.yaml"), *INFRA.rglob("*.yml")])


def is_reference(value: object) -> bool:
    """Whether a value is a ${VAR} reference rather than a literal."""
    return isinstance(value, str) and REFERENCE.fullmatch(value) is not None


def literal_secrets(node: Any, where: str = "") -> Iterator[str]:
    """Yield where a password, token or secret is written as a literal value.

    Allowed: ${VAR} references (no fallback), Kubernetes valueFrom.secretKeyRef, URIs with no
    password, keys that are paths (a file mount of ~/.ray/auth_token).
    """
    if isinstance(node, dict):
        name = node.get("name")
        named_secret = isinstance(name, str) and SECRET_NAME.search(name)
        if named_secret and "value" in node and not is_reference(node["value"]):
            yield f"{where}: env {name} has a literal value (use valueFrom.secretKeyRef)"
        if node.get("kind") == "Secret" and ({"data", "stringData"} & node.keys()):
            yield f"{where}: a Secret with its data written in the file"
        for key, value in node.items():
            here = f"{where}.{key}"
            secret_key = isinstance(key, str) and "/" not in key and SECRET_NAME.search(key)
            if secret_key and isinstance(value, str | int | float) and not is_reference(value):
                yield f"{here}: literal value under a secret's name"
            yield from literal_secrets(value, here)
    elif isinstance(node, list):
        for index, item in enumerate(node):
            yield from literal_secrets(item, f"{where}[{index}]")
    elif isinstance(node, str):
        for match in URI_PASSWORD.finditer(node):
            if not is_reference(match.group(1)):
                yield f"{where}: a password inside a URI"
        for match in SECRET_ASSIGNMENT.finditer(node):
            if not match.group(2).startswith("$"):
                yield f"{where}: {match.group(0).split('=')[0]} assigned a literal"


def ray_starts(commands: list[str]) -> list[tuple[dict[str, str], list[str]]]:
    """Each `ray start` in shell commands: (variables set for it, its arguments)."""
    found = []
    for command in commands:
        exported: dict[str, str] = {}
        for segment in re.split(r";|&&", command):
            words = shlex.split(segment)
            if words[:1] == ["export"]:
                exported.update(word.partition("=")[::2] for word in words[1:] if "=" in word)
                continue
            env = dict(exported)
            while words and re.fullmatch(r"[A-Za-z_]\w*=.*", words[0]):
                key, value = words.pop(0).split("=", 1)
                env[key] = value
            if words[:2] == ["ray", "start"]:
                found.append((env, words[2:]))
    return found


def flag_value(argv: list[str], flag: str) -> str | None:
    """The value after `flag` (or in `flag=value`) in an argument list, None if absent."""
    for index, word in enumerate(argv):
        if word == flag and index + 1 < len(argv):
            return argv[index + 1]
        if word.startswith(flag + "="):
            return word.split("=", 1)[1]
    return None


def as_argv(command: str | list[str]) -> list[str]:
    """A compose or Kubernetes command as an argument list."""
    return shlex.split(command) if isinstance(command, str) else [str(word) for word in command]


def env_map(env: dict[str, Any] | list[Any] | None) -> dict[str, Any]:
    """Compose `environment` (mapping or KEY=VALUE list) or a Kubernetes env list, by name."""
    if env is None:
        return {}
    if isinstance(env, dict):
        return env
    entries: dict[str, Any] = {}
    for item in env:
        if isinstance(item, dict):
            entries[item["name"]] = item
        else:
            key, _, value = str(item).partition("=")
            entries[key] = value
    return entries


def kuberay_containers(cluster: dict[str, Any]) -> list[dict[str, Any]]:
    """Every container of the head and worker pod templates of a RayCluster."""
    spec = cluster["spec"]
    groups = [spec["headGroupSpec"], *spec["workerGroupSpecs"]]
    return [c for group in groups for c in group["template"]["spec"]["containers"]]


def gpu_limit(group: dict[str, Any]) -> int:
    """The nvidia.com/gpu limit of a worker group's first container (0 if none)."""
    limits = group["template"]["spec"]["containers"][0].get("resources", {}).get("limits", {})
    return int(str(limits.get("nvidia.com/gpu", 0)))


@pytest.fixture(scope="module")
def ray_start_cli() -> Any:
    """Ray's own `ray start` click command (parses arguments; starts nothing)."""
    from ray.scripts.scripts import start

    return start


# --- every file ----------------------------------------------------------------------------


def test_infra_yaml_files_all_parse() -> None:
    expected = {RAY_CLUSTER, KUBERAY, COMPOSE, MLFLOW_K8S, KUSTOMIZATION}
    found = set(yaml_files())
    assert expected <= found, f"missing: {sorted(map(str, expected - found))}"
    for path in found:
        docs = load_all(path)
        assert docs, f"{path} is empty"
        assert all(isinstance(doc, dict) for doc in docs), f"{path} has a non-mapping document"


def test_secret_scan_flags_literal_passwords_and_tokens() -> None:
    flagged = [
        {"POSTGRES_PASSWORD": "hunter2"},
        {"POSTGRES_PASSWORD": "${POSTGRES_PASSWORD:-hunter2}"},
        {"env": [{"name": "RAY_AUTH_TOKEN", "value": "abc123"}]},
        {"command": ["mlflow", "server", "--backend-store-uri", "postgresql://u:pw@db/mlflow"]},
        {"setup_commands": ["export RAY_AUTH_TOKEN=abc123; ray start --head"]},
        {"kind": "Secret", "stringData": {"password": "x"}},
    ]
    for doc in flagged:
        assert list(literal_secrets(doc)), f"not flagged: {doc}"
    allowed = {
        "POSTGRES_PASSWORD": "${POSTGRES_PASSWORD:?set it in .env}",
        "env": [{"name": "PGPASSWORD", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}],
        "uri": "postgresql://tuner@postgres:5432/mlflow",
        "file_mounts": {"~/.ray/auth_token": "~/.ray/auth_token"},
        "start": "export RAY_AUTH_MODE=token; ray start --head",
    }
    assert list(literal_secrets(allowed)) == []


@pytest.mark.parametrize("path", yaml_files(), ids=lambda p: str(p.relative_to(INFRA)))
def test_infra_yaml_has_no_literal_secrets(path: Path) -> None:
    problems = [p for doc in load_all(path) for p in literal_secrets(doc)]
    assert problems == []


def test_readme_mentions_every_infra_file() -> None:
    text = README.read_text()
    # .env is the user's own, git-ignored copy of .env.example.
    files = [p for p in INFRA.rglob("*") if p.is_file() and p != README and p.name != ".env"]
    assert len(files) >= 9
    missing = [str(p.relative_to(INFRA)) for p in files if p.relative_to(INFRA).as_posix() not in text]
    assert missing == []
    assert "What was tested" in text


def test_readme_shows_launch_against_the_deployed_services() -> None:
    text = README.read_text()
    for needed in [
        "python -m tuner launch",
        "--address auto",
        "--storage postgresql://",
        "/optuna",
        "--tracking-uri http://mlflow:5000",
        "--gpus-per-trial 0.5",
        "--cpus-per-trial 1",
        "ray job submit --address http://127.0.0.1:8265",
        "RAY_AUTH_MODE=token",
        "port-forward",
    ]:
        assert needed in text, needed


# --- Ray cluster launcher ------------------------------------------------------------------


def test_ray_cluster_matches_ray_schema() -> None:
    ray_dir = find_spec("ray").submodule_search_locations[0]  # type: ignore[union-attr,index]
    schema = json.loads((Path(ray_dir) / "autoscaler" / "ray-schema.json").read_text())
    jsonschema.validate(load(RAY_CLUSTER), schema)


def test_ray_cluster_has_head_cpu_and_gpu_node_types() -> None:
    config = load(RAY_CLUSTER)
    types = config["available_node_types"]
    head = config["head_node_type"]
    assert head in types
    workers = [t["resources"] for name, t in types.items() if name != head]
    assert any(r.get("GPU", 0) >= 1 for r in workers), "no GPU worker type"
    assert any(r.get("CPU", 0) > 0 and not r.get("GPU") for r in workers), "no CPU worker type"
    assert config["max_workers"] >= 1
    assert config["provider"]["type"] and config["provider"]["region"]
    assert config["auth"]["ssh_user"]


def test_ray_cluster_setup_installs_the_project() -> None:
    config = load(RAY_CLUSTER)
    mounted = {local: remote for remote, local in config["file_mounts"].items()}
    assert "./dist" in mounted, "the wheel folder is not mounted"
    installs = [c for c in config["setup_commands"] if "pip install" in c]
    assert any(mounted["./dist"] in c and ".whl" in c for c in installs)


@pytest.mark.parametrize("commands", ["head_start_ray_commands", "worker_start_ray_commands"])
def test_ray_cluster_every_ray_start_enables_token_auth(commands: str) -> None:
    starts = ray_starts(load(RAY_CLUSTER)[commands])
    assert starts, f"no `ray start` in {commands}"
    for env, _ in starts:
        assert env.get("RAY_AUTH_MODE") == "token"


def test_ray_cluster_ray_start_lines_parse_with_ray_cli(ray_start_cli: Any) -> None:
    config = load(RAY_CLUSTER)
    (_, head_argv), *_ = ray_starts(config["head_start_ray_commands"])
    head = ray_start_cli.make_context("start", head_argv).params
    assert head["head"] is True
    assert head["dashboard_host"] == "127.0.0.1"
    for _, argv in ray_starts(config["worker_start_ray_commands"]):
        worker = ray_start_cli.make_context("start", argv).params
        assert worker["head"] is False
        assert worker["address"]


def test_ray_cluster_token_is_mounted_from_a_file_never_inline() -> None:
    config = load(RAY_CLUSTER)
    assert config["file_mounts"].get("~/.ray/auth_token") == "~/.ray/auth_token"
    assert "RAY_AUTH_TOKEN" not in RAY_CLUSTER.read_text()


# --- KubeRay -------------------------------------------------------------------------------


def test_kuberay_raycluster_has_head_and_gpu_worker_group() -> None:
    cluster = load(KUBERAY)
    assert cluster["apiVersion"] == "ray.io/v1"
    assert cluster["kind"] == "RayCluster"
    head = cluster["spec"]["headGroupSpec"]
    assert isinstance(head["rayStartParams"], dict)
    assert head["template"]["spec"]["containers"]
    groups = cluster["spec"]["workerGroupSpecs"]
    for group in groups:
        assert group["groupName"] and isinstance(group["rayStartParams"], dict)
        assert group["minReplicas"] <= group["replicas"] <= group["maxReplicas"]
    assert any(gpu_limit(g) >= 1 for g in groups), "no worker group limits nvidia.com/gpu"
    assert any(gpu_limit(g) == 0 for g in groups), "no CPU-only worker group"


def test_kuberay_raycluster_every_ray_container_takes_token_from_secret() -> None:
    containers = kuberay_containers(load(KUBERAY))
    assert len(containers) >= 3
    for container in containers:
        env = env_map(container.get("env"))
        assert env["RAY_AUTH_MODE"].get("value") == "token", container["name"]
        token = env["RAY_AUTH_TOKEN"]
        assert "value" not in token, container["name"]
        ref = token["valueFrom"]["secretKeyRef"]
        assert ref["name"] and ref["key"]


def test_kuberay_raycluster_dashboard_is_not_exposed() -> None:
    head = load(KUBERAY)["spec"]["headGroupSpec"]
    # KubeRay binds the dashboard to 0.0.0.0 when dashboard-host is absent.
    assert head["rayStartParams"].get("dashboard-host") == "127.0.0.1"
    assert head.get("serviceType", "ClusterIP") == "ClusterIP"
    assert not head.get("enableIngress", False)


def test_kuberay_raycluster_start_params_are_ray_start_options(ray_start_cli: Any) -> None:
    spec = load(KUBERAY)["spec"]
    options = {opt for param in ray_start_cli.params for opt in param.opts}
    for group in [spec["headGroupSpec"], *spec["workerGroupSpecs"]]:
        for key, value in group["rayStartParams"].items():
            assert f"--{key}" in options, key
            # The CRD types rayStartParams as map[string]string.
            assert isinstance(value, str), f"{key}: {value!r} is not a string"


# --- MLflow + PostgreSQL: docker compose ---------------------------------------------------


def test_mlflow_compose_runs_postgres_and_mlflow_server() -> None:
    services = load(COMPOSE)["services"]
    postgres, mlflow = services["postgres"], services["mlflow"]
    assert str(postgres["image"]).startswith("postgres:")
    assert env_map(postgres["environment"])["POSTGRES_DB"] == "mlflow"
    assert any(str(v).endswith(":/docker-entrypoint-initdb.d:ro") for v in postgres["volumes"])
    argv = as_argv(mlflow["command"])
    assert argv[:2] == ["mlflow", "server"]
    assert (flag_value(argv, "--backend-store-uri") or "").startswith("postgresql")
    assert flag_value(argv, "--artifacts-destination")
    assert "postgres" in mlflow["depends_on"]


def test_mlflow_compose_publishes_ports_on_loopback_only() -> None:
    services = load(COMPOSE)["services"]
    published = []
    for name, service in services.items():
        assert service.get("network_mode") != "host", name
        for port in service.get("ports", []):
            host_ip = port.get("host_ip") if isinstance(port, dict) else str(port).split(":")[0]
            assert host_ip == "127.0.0.1", f"{name}: {port}"
            published.append(port)
    assert any(str(p).endswith(":5000") for p in published), "MLflow's port is not published"


def test_mlflow_compose_takes_passwords_from_environment() -> None:
    services = load(COMPOSE)["services"]
    assert is_reference(env_map(services["postgres"]["environment"])["POSTGRES_PASSWORD"])
    assert is_reference(env_map(services["mlflow"]["environment"])["PGPASSWORD"])
    uri = flag_value(as_argv(services["mlflow"]["command"]), "--backend-store-uri") or ""
    assert URI_PASSWORD.search(uri) is None


def test_env_example_defines_every_variable_compose_requires() -> None:
    entries = dict(
        line.split("=", 1)
        for line in ENV_EXAMPLE.read_text().splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    )
    required = set(re.findall(r"\$\{([A-Za-z_]\w*)[:?}]", COMPOSE.read_text()))
    assert required <= entries.keys(), f"not in .env.example: {sorted(required - entries.keys())}"
    for key, value in entries.items():
        if SECRET_NAME.search(key):
            assert value == "change-me", f"{key} in .env.example must stay a placeholder"
    assert ".env" in (INFRA / "mlflow" / ".gitignore").read_text().split()


# --- MLflow + PostgreSQL: Kubernetes -------------------------------------------------------


def test_mlflow_k8s_services_stay_inside_the_cluster() -> None:
    docs = load_all(MLFLOW_K8S)
    kinds = [doc["kind"] for doc in docs]
    assert "Ingress" not in kinds
    services = [doc for doc in docs if doc["kind"] == "Service"]
    assert {s["metadata"]["name"] for s in services} >= {"postgres", "mlflow"}
    for service in services:
        assert service["spec"].get("type", "ClusterIP") == "ClusterIP", service["metadata"]["name"]


def test_mlflow_k8s_server_accepts_its_service_name() -> None:
    (deployment,) = [d for d in load_all(MLFLOW_K8S) if d["kind"] == "Deployment" and d["metadata"]["name"] == "mlflow"]
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    argv = as_argv(container["command"])
    assert argv[:2] == ["mlflow", "server"]
    assert (flag_value(argv, "--backend-store-uri") or "").startswith("postgresql://")
    # MLflow 3 answers 403 to Host headers it does not list (localhost and private IPs aside).
    allowed = (flag_value(argv, "--allowed-hosts") or "").split(",")
    assert "mlflow:5000" in allowed
    assert "*" not in allowed
    assert "secretKeyRef" in env_map(container["env"])["PGPASSWORD"]["valueFrom"]


def test_mlflow_kustomization_names_files_that_exist() -> None:
    kustomization = load(KUSTOMIZATION)
    assert kustomization["namespace"] == "tuner"
    for resource in kustomization["resources"]:
        assert (KUSTOMIZATION.parent / resource).is_file(), resource
    generated = {g["name"]: g["files"] for g in kustomization["configMapGenerator"]}
    for path in generated["postgres-initdb"]:
        assert (KUSTOMIZATION.parent / path).is_file(), path
    volumes = [
        v
        for d in load_all(MLFLOW_K8S)
        if d["kind"] == "Deployment"
        for v in d["spec"]["template"]["spec"].get("volumes", [])
    ]
    assert any(v.get("configMap", {}).get("name") == "postgres-initdb" for v in volumes)


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed")
def test_mlflow_kustomization_builds() -> None:
    built = subprocess.run(
        ["kubectl", "kustomize", str(KUSTOMIZATION.parent)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert built.returncode == 0, built.stderr
    kinds = {doc["kind"] for doc in yaml.safe_load_all(built.stdout) if doc}
    assert {"ConfigMap", "Deployment", "Service"} <= kinds
