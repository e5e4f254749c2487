"""deploy/ is only text here (no Docker engine): check it runs what the Procfile runs.

Every process command must be the Procfile's, every environment variable must be one
`shared.settings.Settings` reads (or the Procfile's HOST/PORT), and Kubernetes must probe
readiness on /readyz and liveness on /healthz.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml

from shared.backends import parse_url
from shared.settings import Settings

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"


def procfile() -> dict[str, str]:
    lines = (ROOT / "Procfile").read_text().splitlines()
    return {
        name.strip(): cmd.strip() for name, _, cmd in (ln.partition(":") for ln in lines) if cmd
    }


def procfile_program(name: str) -> list[str]:
    """The program and its target, e.g. ["arq", "worker.main.WorkerSettings"]."""
    return procfile()[name].split()[:2]


def allowed_env() -> set[str]:
    """What Settings reads (alias, else field name; case-insensitive), plus HOST and PORT."""
    names = {(field.alias or name).upper() for name, field in Settings.model_fields.items()}
    return names | set(re.findall(r"\$\{(\w+)", (ROOT / "Procfile").read_text()))


def command_of(argv: list[str]) -> list[str]:
    """An argv, with a `sh -c "exec ..."` wrapper unwrapped."""
    if argv[:2] == ["sh", "-c"]:
        argv = shlex.split(argv[2])
    return argv[1:] if argv[:1] == ["exec"] else argv


def test_allowed_env_is_what_settings_reads() -> None:
    allowed = allowed_env()
    assert {"REDIS_URL", "OPENAI_API_KEY", "BERNARD_API_KEYS", "HOST", "PORT"} <= allowed
    assert "ROUTER_MODEL" not in allowed  # aliased: only BERNARD_ROUTER_MODEL is read


# Dockerfile


def dockerfile() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined and comments dropped."""
    text = re.sub(r"\\\n", " ", (DEPLOY / "Dockerfile").read_text())
    pairs = []
    for line in text.splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            instruction, _, args = line.strip().partition(" ")
            pairs.append((instruction.upper(), args.strip()))
    return pairs


def test_dockerfile_runs_the_api_as_a_non_root_user() -> None:
    instructions = dockerfile()
    assert instructions[0] == ("FROM", "python:3.11-slim")
    cmd = [args for instruction, args in instructions if instruction == "CMD"]
    assert len(cmd) == 1
    assert command_of(yaml.safe_load(cmd[0]))[:2] == procfile_program("api")
    users = [args for instruction, args in instructions if instruction == "USER"]
    assert users and users[-1] not in ("root", "0")
    assert not [args for instruction, args in instructions if instruction == "ENTRYPOINT"]


def test_dockerfile_env_is_read_by_bernard_or_python() -> None:
    env: dict[str, str] = {}
    for instruction, args in dockerfile():
        if instruction == "ENV":
            for item in shlex.split(args):
                name, _, value = item.partition("=")
                env[name] = value
    assert env["HOST"] == "0.0.0.0"
    ours = {name for name in env if not name.startswith(("PYTHON", "PIP_"))}
    assert ours <= allowed_env()


# compose.yaml


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    data = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    assert isinstance(data, dict)
    return data


def test_compose_redis_keeps_its_data_and_never_evicts(compose: dict[str, Any]) -> None:
    redis = compose["services"]["redis"]
    assert str(redis["image"]).startswith("redis:7")
    command = " ".join(redis["command"])
    assert "--appendonly yes" in command
    assert "--maxmemory-policy noeviction" in command


def test_compose_runs_two_apis_and_two_workers(compose: dict[str, Any]) -> None:
    services = compose["services"]
    apis = [s for name, s in services.items() if name.startswith("api")]
    workers = [s for name, s in services.items() if name.startswith("worker")]
    api_count = sum(s.get("deploy", {}).get("replicas", 1) for s in apis)
    worker_count = sum(s.get("deploy", {}).get("replicas", 1) for s in workers)
    assert (api_count, worker_count) == (2, 2)
    for api in apis:
        assert "command" not in api  # the image's CMD: the Procfile's api command
        assert api["build"]["dockerfile"] == "deploy/Dockerfile"
    for worker in workers:
        assert command_of(worker["command"]) == procfile()["worker"].split()
    published = sorted(port for api in apis for port in api.get("ports", []))
    assert published == ["8001:8000", "8002:8000"]


def test_compose_env_is_read_by_bernard(compose: dict[str, Any]) -> None:
    for name, service in compose["services"].items():
        if name == "redis":
            continue
        env = service["environment"]
        assert isinstance(env, dict)
        assert set(env) <= allowed_env(), name
        assert env["REDIS_URL"] == "redis://redis:6379/0"


# Kubernetes


def k8s_objects() -> list[dict[str, Any]]:
    objects = []
    for path in sorted((DEPLOY / "k8s").glob("*.yaml")):
        objects += [doc for doc in yaml.safe_load_all(path.read_text()) if doc]
    return objects


def k8s_kind(kind: str) -> dict[str, dict[str, Any]]:
    return {o["metadata"]["name"]: o for o in k8s_objects() if o["kind"] == kind}


def containers(deployment: dict[str, Any]) -> list[dict[str, Any]]:
    result: list[dict[str, Any]] = deployment["spec"]["template"]["spec"]["containers"]
    return result


def test_k8s_deployments_run_the_procfile_commands() -> None:
    deployments = k8s_kind("Deployment")
    assert set(deployments) == {"bernard-api", "bernard-worker"}
    (api,) = containers(deployments["bernard-api"])
    assert command_of(api["command"])[:2] == procfile_program("api")
    assert api["command"][api["command"].index("--host") + 1] == "0.0.0.0"
    (worker,) = containers(deployments["bernard-worker"])
    assert command_of(worker["command"]) == procfile()["worker"].split()


def test_k8s_api_probes() -> None:
    (api,) = containers(k8s_kind("Deployment")["bernard-api"])
    assert api["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert api["livenessProbe"]["httpGet"]["path"] == "/healthz"
    port_names = {port["name"]: port["containerPort"] for port in api["ports"]}
    for probe in ("readinessProbe", "livenessProbe"):
        assert api[probe]["httpGet"]["port"] in port_names
    assert port_names["http"] == 8000


def test_k8s_service_selects_the_api_pods() -> None:
    service = k8s_kind("Service")["bernard-api"]
    labels = k8s_kind("Deployment")["bernard-api"]["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= labels.items()
    assert service["spec"]["ports"][0]["targetPort"] == "http"


def test_k8s_env_is_read_by_bernard() -> None:
    (config,) = k8s_kind("ConfigMap").values()
    assert set(config["data"]) <= allowed_env()
    assert "REDIS_URL" in config["data"]
    for deployment in k8s_kind("Deployment").values():
        for container in containers(deployment):
            refs = [
                ref["configMapRef"]["name"] for ref in container["envFrom"] if "configMapRef" in ref
            ]
            assert refs == [config["metadata"]["name"]]
            assert {env["name"] for env in container.get("env", [])} <= allowed_env()


def test_k8s_kustomization_lists_every_manifest() -> None:
    kustomization = yaml.safe_load((DEPLOY / "k8s" / "kustomization.yaml").read_text())
    manifests = {p.name for p in (DEPLOY / "k8s").glob("*.yaml")} - {"kustomization.yaml"}
    assert set(kustomization["resources"]) == manifests


def test_k8s_redis_note_asks_for_aof_and_noeviction() -> None:
    note = (DEPLOY / "k8s" / "redis.md").read_text()
    assert "appendonly yes" in note
    assert "noeviction" in note


# Beyond one Redis (docs/scaling.md)


def test_compose_sentinel_runs_bernard_on_the_primary_its_sentinels_name() -> None:
    compose = yaml.safe_load((DEPLOY / "compose.sentinel.yaml").read_text())
    services = compose["services"]
    sentinels = {name for name in services if name.startswith("sentinel")}
    assert len(sentinels) == 3
    for name in ("redis-primary", "redis-replica"):
        command = " ".join(services[name]["command"])
        assert "--appendonly yes" in command and "--maxmemory-policy noeviction" in command
    conf = services["sentinel1"]["command"][-1]
    monitored = re.search(r"sentinel monitor (\S+) redis-primary 6379 2", conf)
    assert monitored is not None
    for name, service in services.items():
        if name.startswith(("redis", "sentinel")):
            continue
        env = service["environment"]
        assert set(env) <= allowed_env(), name
        address = parse_url(env["REDIS_URL"])
        assert address.kind == "sentinel" and address.service == monitored[1]
        assert {host for host, _ in address.hosts} == sentinels
        assert "BERNARD_QUEUE_REDIS_URL" not in env  # both roles on that primary
    assert command_of(services["worker"]["command"]) == procfile()["worker"].split()


def test_k8s_cluster_overlay_puts_the_data_on_a_cluster_and_the_queue_behind_sentinel() -> None:
    overlay = DEPLOY / "k8s" / "cluster"
    kustomization = yaml.safe_load((overlay / "kustomization.yaml").read_text())
    assert kustomization["resources"] == [".."]
    patched = [
        doc
        for patch in kustomization["patches"]
        for doc in yaml.safe_load_all((overlay / patch["path"]).read_text())
        if doc
    ]
    (config,) = [doc for doc in patched if doc["kind"] == "ConfigMap"]
    assert config["metadata"]["name"] in k8s_kind("ConfigMap")
    assert set(config["data"]) <= allowed_env()
    assert parse_url(config["data"]["REDIS_URL"]).kind == "cluster"
    assert parse_url(config["data"]["BERNARD_QUEUE_REDIS_URL"]).kind == "sentinel"
    Settings(
        redis_url=config["data"]["REDIS_URL"],
        queue_redis_url=config["data"]["BERNARD_QUEUE_REDIS_URL"],
    )  # a Cluster for the queue would be refused
    scaled = {doc["metadata"]["name"] for doc in patched if doc["kind"] == "Deployment"}
    assert scaled == set(k8s_kind("Deployment"))
