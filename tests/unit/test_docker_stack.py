"""Static checks of the docker/ stack (this machine has no Docker engine, so nothing here runs a container).

What is checked: compose.yaml parses and references only files that exist; every service has a health
check or waits on one; images are pinned by version; the Airflow image installs this repository at the
``uv.lock`` versions; the Spark image has the same pyspark/pulsar-client/pyarrow as ``uv.lock``; the
connection JSON of the init step parses, with Airflow's and the provider's own parsers, into what the
hooks need. Integration tests run the init's subscription step and the whole init script (real
``airflow`` CLI on SQLite) against the embedded broker.
"""

from __future__ import annotations

import importlib.util
import json
import re
import shlex
import sys
import tomllib
import uuid
from pathlib import Path, PurePosixPath
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
DOCKER = REPO / "docker"
COMPOSE_FILE = DOCKER / "compose.yaml"
AIRFLOW_DOCKERFILE = DOCKER / "airflow" / "Dockerfile"
SPARK_DOCKERFILE = DOCKER / "spark" / "Dockerfile"
SPARK_REQUIREMENTS = DOCKER / "spark" / "requirements.txt"
ENV_EXAMPLE = DOCKER / ".env.example"
#: Where docker/airflow/Dockerfile copies this repository inside the image.
REPO_IN_IMAGE = PurePosixPath("/opt/airflow-provider-dlq")
AIRFLOW_SERVICES = ("airflow-apiserver", "airflow-scheduler", "airflow-dag-processor", "airflow-triggerer")
HEALTH_CONDITIONS = {"service_healthy", "service_completed_successfully"}
VERSION_TAG = re.compile(r"^v?\d+(\.\d+)+([.-][A-Za-z0-9.]+)*$")
#: ``${VAR}``, ``${VAR:-default}``, ``${VAR:?error}``; ``$${VAR}`` is an escaped literal for the container.
COMPOSE_VAR = re.compile(r"(?<!\$)\$\{([A-Za-z_][A-Za-z0-9_]*)(?::?[-?][^}]*)?\}")


# --------------------------------------------------------------------------- helpers


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    with COMPOSE_FILE.open(encoding="utf-8") as fh:
        data = yaml.safe_load(fh)
    assert isinstance(data, dict), "docker/compose.yaml must be a YAML mapping"
    return data


@pytest.fixture(scope="module")
def services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return compose["services"]


@pytest.fixture(scope="module")
def lock_versions() -> dict[str, str]:
    with (REPO / "uv.lock").open("rb") as fh:
        lock = tomllib.load(fh)
    return {pkg["name"]: pkg["version"] for pkg in lock["package"] if "version" in pkg}


def _service_env(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)
    return {str(k): str(v) for k, v in env.items()}


def _depends_on(service: dict[str, Any]) -> dict[str, str]:
    deps = service.get("depends_on") or {}
    if isinstance(deps, list):  # short form: started, not healthy
        return dict.fromkeys(deps, "service_started")
    return {name: spec.get("condition", "service_started") for name, spec in deps.items()}


def _dockerfile_instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs with line continuations joined and comments dropped."""
    lines: list[str] = []
    current = ""
    for raw in path.read_text(encoding="utf-8").splitlines():
        stripped = raw.strip()
        if not current and (not stripped or stripped.startswith("#")):
            continue
        if stripped.endswith("\\"):
            current += stripped[:-1] + " "
            continue
        lines.append(current + stripped)
        current = ""
    if current:
        lines.append(current)
    out = []
    for line in lines:
        instruction, _, args = line.partition(" ")
        out.append((instruction.upper(), args.strip()))
    return out


def _from_images(path: Path) -> list[str]:
    """Base images of every FROM, with global ARG defaults substituted; stage references dropped."""
    args: dict[str, str] = {}
    stages: set[str] = set()
    images = []
    for instruction, rest in _dockerfile_instructions(path):
        if instruction == "ARG" and not images:
            name, _, default = rest.partition("=")
            args[name.strip()] = default.strip().strip('"')
        if instruction == "FROM":
            words = [w for w in rest.split() if not w.startswith("--")]
            image = re.sub(r"\$\{?(\w+)\}?", lambda m: args.get(m.group(1), m.group(0)), words[0])
            if len(words) >= 3 and words[1].upper() == "AS":
                stages.add(words[2])
            if image not in stages:
                images.append(image)
    return images


def _assert_pinned(image: str, where: str) -> None:
    assert "$" not in image, f"{where}: image {image!r} depends on an unset variable"
    if "@sha256:" in image:
        return
    _name, sep, tag = image.rpartition(":")
    assert sep, f"{where}: image {image!r} has no tag; pin a version, e.g. {image}:1.2.3"
    assert "/" not in tag, f"{where}: image {image!r} has no tag; pin a version, e.g. {image}:1.2.3"
    assert tag != "latest", f"{where}: image {image!r} uses 'latest'; pin a version"
    version = tag.split("-", 1)[0]
    assert VERSION_TAG.match(version), f"{where}: image {image!r} tag {tag!r} does not start with a version"


def _load_module(path: Path, name: str) -> Any:
    """Import a script that is not in a package (docker/airflow/*.py, examples/*.py)."""
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve annotations through sys.modules
    spec.loader.exec_module(module)
    return module


def _load_docker_script(name: str) -> Any:
    return _load_module(DOCKER / "airflow" / f"{name}.py", f"docker_{name}")


def _load_init_pulsar() -> Any:
    return _load_docker_script("init_pulsar")


def _repo_path_for_image_path(path: str) -> Path:
    """Map a path under /opt/airflow-provider-dlq in the Airflow image to this repository."""
    relative = PurePosixPath(path).relative_to(REPO_IN_IMAGE)
    return REPO / relative


# --------------------------------------------------------------------------- compose structure


def test_compose_parses_and_has_every_part_of_the_stack(services):
    expected = {"postgres", "pulsar", "spark-master", "spark-worker", "airflow-init", *AIRFLOW_SERVICES}
    missing = expected - set(services)
    assert not missing, f"docker/compose.yaml lacks services {sorted(missing)}"


def test_build_contexts_dockerfiles_and_copied_files_exist(services):
    checked = 0
    for name, service in services.items():
        build = service.get("build")
        if build is None:
            continue
        context = (DOCKER / (build if isinstance(build, str) else build["context"])).resolve()
        assert context.is_dir(), f"service {name}: build context {context} does not exist"
        dockerfile = context / (
            build.get("dockerfile", "Dockerfile") if isinstance(build, dict) else "Dockerfile"
        )
        assert dockerfile.is_file(), f"service {name}: dockerfile {dockerfile} does not exist"
        for instruction, rest in _dockerfile_instructions(dockerfile):
            if instruction not in ("COPY", "ADD") or "--from=" in rest:
                continue
            sources = [w for w in shlex.split(rest) if not w.startswith("--")][:-1]
            for source in sources:
                assert (context / source).exists(), (
                    f"{dockerfile}: COPY source {source!r} missing in {context}"
                )
                checked += 1
    assert checked >= 3, "expected COPY instructions in the Airflow and Spark Dockerfiles"


def test_bind_mounts_and_env_files_exist(compose, services):
    named_volumes = set(compose.get("volumes") or {})
    for name, service in services.items():
        for volume in service.get("volumes") or []:
            source = volume.split(":", 1)[0] if isinstance(volume, str) else volume.get("source", "")
            if source.startswith((".", "/", "~")):
                assert (DOCKER / source).exists(), (
                    f"service {name}: bind mount source {source} does not exist"
                )
            else:
                assert source in named_volumes, f"service {name}: volume {source!r} is not declared"
        for env_file in service.get("env_file") or []:
            path = env_file if isinstance(env_file, str) else env_file["path"]
            assert (DOCKER / path).exists(), f"service {name}: env_file {path} does not exist"


def test_every_service_has_a_healthcheck_or_waits_on_one(services):
    for name, service in services.items():
        deps = _depends_on(service)
        for dep, condition in deps.items():
            assert dep in services, f"service {name} depends on unknown service {dep!r}"
            assert condition in HEALTH_CONDITIONS, (
                f"service {name}: depends_on {dep} with condition {condition!r}; use service_healthy "
                "(or service_completed_successfully for the init job)"
            )
            if condition == "service_healthy":
                assert "healthcheck" in services[dep], f"{name} waits for {dep} to be healthy but it has none"
            else:
                assert services[dep].get("restart") == "no", f"one-shot {dep} must not restart"
        has_check = bool((service.get("healthcheck") or {}).get("test"))
        assert has_check or deps, f"service {name} has neither a healthcheck nor a dependency on one"


def test_start_order_has_no_cycle_and_airflow_waits_for_init_and_pulsar(services):
    order: list[str] = []
    visiting: set[str] = set()

    def visit(name: str) -> None:
        if name in order:
            return
        assert name not in visiting, f"depends_on cycle through {name}"
        visiting.add(name)
        for dep in _depends_on(services[name]):
            visit(dep)
        visiting.discard(name)
        order.append(name)

    for name in services:
        visit(name)
    init_deps = _depends_on(services["airflow-init"])
    assert init_deps == {"postgres": "service_healthy", "pulsar": "service_healthy"}
    for name in AIRFLOW_SERVICES:
        assert _depends_on(services[name]).get("airflow-init") == "service_completed_successfully", name
    scheduler = _depends_on(services["airflow-scheduler"])
    assert scheduler["spark-master"] == scheduler["pulsar"] == "service_healthy"
    assert order.index("airflow-init") < order.index("airflow-scheduler")


def test_images_are_pinned_by_version(services):
    for name, service in services.items():
        assert "image" in service, f"service {name} needs an image: a pinned one, or the tag of its build"
        _assert_pinned(service["image"], f"service {name}")
    for dockerfile in (AIRFLOW_DOCKERFILE, SPARK_DOCKERFILE):
        images = _from_images(dockerfile)
        assert images, f"{dockerfile} has no FROM"
        for image in images:
            _assert_pinned(image, str(dockerfile.relative_to(REPO)))


def test_locally_built_image_tags_follow_the_project_and_lock(services, lock_versions):
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]["version"]
    for name, service in services.items():
        if "build" not in service:
            continue
        image = service["image"]
        if image.rsplit("/", 1)[-1].startswith("airflow:"):
            assert image.endswith(f":{project}"), f"{name}: tag the Airflow build {project} (pyproject)"
        else:
            assert image.endswith(f":{lock_versions['pyspark']}"), f"{name}: tag the Spark build as pyspark"


# --------------------------------------------------------------------------- images


def test_airflow_dockerfile_installs_this_repository_at_the_lock_versions(lock_versions):
    instructions = _dockerfile_instructions(AIRFLOW_DOCKERFILE)
    images = _from_images(AIRFLOW_DOCKERFILE)
    assert f"apache/airflow:{lock_versions['apache-airflow']}-python3.11" in images
    copies = [rest for ins, rest in instructions if ins == "COPY" and "--from=" not in rest]
    assert any(shlex.split(c)[-2:] == [".", str(REPO_IN_IMAGE)] for c in copies), "COPY the repository"
    runs = " ".join(rest for ins, rest in instructions if ins == "RUN")
    assert "uv export --frozen" in runs, "derive the pinned requirements from uv.lock with uv export --frozen"
    assert "pip install --no-cache-dir --no-deps -r" in runs, "install exactly the locked set"
    assert re.search(rf"pip install [^&]*{re.escape(str(REPO_IN_IMAGE))}(\s|$)", runs), "install this package"
    assert "openjdk-17" in runs, "the Spark driver runs in the Airflow image and needs Java 17"
    args = dict(rest.split("=", 1) for ins, rest in instructions if ins == "ARG" and "=" in rest)
    assert args["PYSPARK_VERSION"] == lock_versions["pyspark"], (
        "the image check must expect the locked pyspark"
    )
    ignore = (DOCKER / "airflow" / "Dockerfile.dockerignore").read_text(encoding="utf-8").split()
    for entry in (".venv", ".git", "docker/.env"):
        assert entry in ignore, f"Dockerfile.dockerignore must exclude {entry}"
    # The lock must hold what the Airflow image relies on, without pyspark-client (it would overwrite
    # pyspark's Python files).
    assert "pyspark-client" not in lock_versions


def test_spark_image_has_the_locked_native_packages(lock_versions):
    instructions = _dockerfile_instructions(SPARK_DOCKERFILE)
    images = _from_images(SPARK_DOCKERFILE)
    assert len(images) == 1
    assert images[0].startswith("python:3.11."), "Python 3.11, as in the Airflow image"
    runs = " ".join(rest for ins, rest in instructions if ins == "RUN")
    assert "openjdk-17" in runs
    copies = [shlex.split(rest) for ins, rest in instructions if ins == "COPY"]
    target = next(c[-1] for c in copies if c[0] == SPARK_REQUIREMENTS.name)
    assert f"pip install --no-cache-dir -r {target}" in runs, "install docker/spark/requirements.txt"
    pins = {}
    for line in SPARK_REQUIREMENTS.read_text(encoding="utf-8").splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, version = line.partition("==")
            assert version, f"docker/spark/requirements.txt: pin {line!r} with =="
            pins[name.strip().lower()] = version.strip()
    for package in ("pyspark", "pulsar-client", "pyarrow"):
        assert package in pins, f"docker/spark/requirements.txt must install {package}"
    for package, version in pins.items():
        assert lock_versions.get(package) == version, (
            f"docker/spark/requirements.txt pins {package}=={version} but uv.lock has "
            f"{lock_versions.get(package)}; executors and driver must run the same versions"
        )


# --------------------------------------------------------------------------- wiring


def test_shared_data_volume_is_mounted_at_the_same_path_for_driver_and_executors(services):
    mounts = {}
    for name in (*AIRFLOW_SERVICES, "spark-worker"):
        targets = {v.split(":")[1] for v in services[name]["volumes"] if v.split(":")[0] == "dlq-data"}
        mounts[name] = targets
    assert all(t == {"/data/dlq"} for t in mounts.values()), mounts
    assert _service_env(services["airflow-scheduler"])["DLQ_DATA_DIR"] == "/data/dlq"


def test_init_runs_the_scripts_copied_into_the_image(services):
    command = services["airflow-init"]["command"]
    script = next(c for c in command if c.endswith(".sh"))
    script_path = _repo_path_for_image_path(script)
    assert script_path.is_file(), f"airflow-init runs {script}, but {script_path} does not exist"
    body = script_path.read_text(encoding="utf-8")
    for needed in ("airflow db migrate", "airflow connections import", "init_pulsar.py"):
        assert needed in body, f"{script_path.name} must run {needed!r}"
    assert (script_path.parent / "init_pulsar.py").is_file()
    dags = _service_env(services["airflow-scheduler"])["AIRFLOW__CORE__DAGS_FOLDER"]
    assert _repo_path_for_image_path(dags).is_dir(), f"DAGS_FOLDER {dags} is not a folder of this repository"


def test_pulsar_runs_the_tested_version_and_settings(services):
    """docker/ runs the Apache Pulsar version and the standalone.conf the test suite runs on."""
    from pulsar_standalone import PULSAR_VERSION
    from pulsar_standalone.broker import CONF_TEMPLATE, read_conf

    pulsar = services["pulsar"]
    assert pulsar["image"] == f"apachepulsar/pulsar:{PULSAR_VERSION}"
    pom = (REPO / "pulsar_standalone" / "pom.xml").read_text(encoding="utf-8")
    assert f"<pulsar.version>{PULSAR_VERSION}</pulsar.version>" in pom
    mounts = {m.split(":")[1]: m.split(":")[0] for m in pulsar["volumes"] if m.startswith("../")}
    source = mounts["/opt/airflow-provider-dlq/standalone.conf"]
    assert (DOCKER / source).resolve() == CONF_TEMPLATE
    command = " ".join(pulsar["command"])
    assert "cp /opt/airflow-provider-dlq/standalone.conf /pulsar/conf/standalone.conf" in command
    conf = read_conf(CONF_TEMPLATE)
    assert conf["brokerDeduplicationEnabled"] == "true"
    assert conf["brokerDeleteInactiveTopicsEnabled"] == "false"
    assert conf["exposeTopicLevelMetricsInPrometheus"] == "true"
    # Only networking is overridden in the container.
    overrides = {
        k.removeprefix("PULSAR_PREFIX_") for k in _service_env(pulsar) if k.startswith("PULSAR_PREFIX_")
    }
    assert overrides <= {
        "bindAddress",
        "advertisedAddress",
        "brokerServicePort",
        "webServicePort",
        "advertisedListeners",
        "bindAddresses",
        "internalListenerName",
    }


def test_pulsar_is_configured_for_both_networks(services):
    pulsar = services["pulsar"]
    env = _service_env(pulsar)
    assert "apply-config-from-env.py" in " ".join(pulsar["command"]), (
        "the image applies env only via this script"
    )
    listeners = dict(item.split(":", 1) for item in env["PULSAR_PREFIX_advertisedListeners"].split(","))
    assert env["PULSAR_PREFIX_internalListenerName"] in listeners
    assert listeners["internal"] == "pulsar://pulsar:6650"
    bind_name, _, bind_url = env["PULSAR_PREFIX_bindAddresses"].partition(":")
    assert bind_name == "external"
    assert bind_name in listeners
    external_container_port = bind_url.rsplit(":", 1)[1]
    ports = [p.split(":") for p in pulsar["ports"]]
    assert any(p[-1] == external_container_port for p in ports), "publish the external listener's port"
    assert any(p[-1] == "8080" for p in ports), "publish the admin REST / metrics port"


def test_every_compose_variable_is_documented_in_env_example(compose):
    text = COMPOSE_FILE.read_text(encoding="utf-8")
    used = set(COMPOSE_VAR.findall(text))
    documented = {
        line.split("=", 1)[0].strip()
        for line in ENV_EXAMPLE.read_text(encoding="utf-8").splitlines()
        if "=" in line and not line.lstrip().startswith("#")
    }
    assert used, "compose.yaml reads no settings from .env?"
    missing = used - documented
    assert not missing, f"docker/.env.example lacks {sorted(missing)}"
    required = set(re.findall(r"(?<!\$)\$\{([A-Za-z_][A-Za-z0-9_]*):\?", text))
    assert {"POSTGRES_PASSWORD", "AIRFLOW_FERNET_KEY", "AIRFLOW_JWT_SECRET"} <= required


# --------------------------------------------------------------------------- connections


@pytest.fixture(scope="module")
def init_env(services) -> dict[str, str]:
    return _service_env(services["airflow-init"])


def test_pulsar_default_connection_parses_into_the_hook_fields(init_env, services, monkeypatch):
    from airflow.models.connection import Connection

    from airflow_provider_dlq.hooks.connection import parse_pulsar_connection

    raw = init_env["DLQ_CONN_PULSAR_DEFAULT"]
    conn = Connection.from_json(
        raw, conn_id="pulsar_default"
    )  # what `airflow connections add --conn-json` does
    assert conn.conn_type == "pulsar"
    assert conn.host == "pulsar://pulsar:6650"
    extra = conn.extra_dejson
    assert extra == {"admin_url": "http://pulsar:8080", "metrics_url": "http://pulsar:8080/metrics"}
    config = parse_pulsar_connection(
        "pulsar_default", conn_type=conn.conn_type, host=conn.host, port=conn.port, extra=extra
    )
    assert config.service_url == "pulsar://pulsar:6650"
    assert config.admin_url == "http://pulsar:8080"
    assert config.metrics_url == "http://pulsar:8080/metrics"
    assert config.ignored_extras == ()
    # The whole hook, reading the same JSON the way Airflow hands it over (AIRFLOW_CONN_<ID> env form).
    from airflow_provider_dlq.hooks.pulsar import PulsarHook

    monkeypatch.setenv("AIRFLOW_CONN_PULSAR_DOCKER_STACK", raw)
    hook_config = PulsarHook("pulsar_docker_stack").config
    assert (hook_config.service_url, hook_config.admin_url, hook_config.metrics_url) == (
        config.service_url,
        config.admin_url,
        config.metrics_url,
    )
    # The host the URLs name is the compose service of the broker.
    assert "pulsar" in services


def test_spark_default_connection_resolves_to_the_compose_master(init_env, services, monkeypatch):
    from airflow.models.connection import Connection
    from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook

    raw = init_env["DLQ_CONN_SPARK_DEFAULT"]
    conn = Connection.from_json(raw, conn_id="spark_default")
    assert (conn.conn_type, conn.host, conn.port) == ("spark", "spark://spark-master", 7077)
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DOCKER_STACK", raw)
    resolved = SparkSubmitHook(conn_id="spark_docker_stack")._resolve_connection()
    assert resolved["master"] == "spark://spark-master:7077"
    assert resolved["deploy_mode"] == "client", "PySpark apps on a standalone master run in client mode"
    assert resolved["spark_binary"] == "spark-submit"
    master_cmd = services["spark-master"]["command"]
    assert master_cmd[master_cmd.index("--port") + 1] == "7077"
    assert master_cmd[master_cmd.index("--host") + 1] == "spark-master"
    assert "spark://spark-master:7077" in services["spark-worker"]["command"]


def test_init_pulsar_parses_the_same_connection_and_topics(init_env):
    init_pulsar = _load_init_pulsar()
    target = init_pulsar.parse_pulsar_connection(init_env["DLQ_CONN_PULSAR_DEFAULT"])
    assert (target.service_url, target.admin_url) == ("pulsar://pulsar:6650", "http://pulsar:8080")
    assert init_pulsar.parse_pulsar_connection(init_env["DLQ_CONN_PULSAR_DEFAULT"], "t0k3n").token == "t0k3n"
    topics = init_pulsar.parse_topics(
        " orders-DLQ, acme/payments/pay-DLQ,persistent://acme/payments/pay-DLQ,, "
    )
    assert [t.full for t in topics] == [
        "persistent://public/default/orders-DLQ",
        "persistent://acme/payments/pay-DLQ",
    ]
    assert topics[1].namespace_path == "acme/payments"
    with pytest.raises(init_pulsar.InitError, match="must be persistent://"):
        init_pulsar.parse_topic("non-persistent://public/default/x")
    with pytest.raises(init_pulsar.InitError, match="DLQ_TOPICS"):
        init_pulsar.parse_topic("a/b")
    with pytest.raises(init_pulsar.InitError, match="not valid JSON"):
        init_pulsar.parse_pulsar_connection("{oops")
    with pytest.raises(init_pulsar.InitError, match="conn_type"):
        init_pulsar.parse_pulsar_connection(json.dumps({"conn_type": "http", "host": "pulsar://x:6650"}))
    assert init_pulsar.namespaces_to_prepare(
        topics,
        "persistent://public/default/orders*, persistent://shop/*/x, re:^persistent://a/b/.*$, acme/eu/y",
    ) == ["public/default", "acme/payments", "acme/eu"]
    assert init_pulsar.main({"DLQ_INIT_TOPICS": " , "}) == 0  # nothing to prepare, no network


def test_init_admin_calls_create_missing_namespaces_and_enable_dedup():
    """The admin REST sequence against a fake Pulsar admin (pulsar-lite has no admin API)."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    init_pulsar = _load_init_pulsar()
    calls: list[tuple[str, str, Any, str | None]] = []
    namespaces = {"public/default"}

    class FakeAdmin(BaseHTTPRequestHandler):
        def _reply(self, status: int, body: Any = None) -> None:
            data = b"" if body is None else json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _handle(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(length)) if length else None
            calls.append((self.command, self.path, body, self.headers.get("Authorization")))
            if self.path == "/admin/v2/clusters":
                self._reply(200, ["standalone"])
            elif self.path == "/admin/v2/tenants":
                self._reply(200, ["public", "pulsar"])
            elif self.command == "PUT" and self.path.startswith("/admin/v2/namespaces/"):
                ns = self.path.removeprefix("/admin/v2/namespaces/")
                self._reply(409 if ns in namespaces else 204)
                namespaces.add(ns)
            else:
                self._reply(204)

        do_GET = do_PUT = do_POST = _handle

        def log_message(self, format: str, *args: Any) -> None:
            return

    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeAdmin)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        admin = init_pulsar.AdminClient(f"http://127.0.0.1:{server.server_port}/", "s3cret")
        clusters = admin.wait_ready(attempts=3, delay_s=0.1)
        for ns in ("public/default", "acme/payments"):
            admin.ensure_namespace(ns, clusters)
    finally:
        server.shutdown()
        server.server_close()
    assert clusters == ["standalone"]
    assert all(auth == "Bearer s3cret" for *_, auth in calls)
    writes = [(method, path, body) for method, path, body, _ in calls if method != "GET"]
    assert writes == [
        ("PUT", "/admin/v2/namespaces/public/default", {}),  # 409: exists, fine
        ("POST", "/admin/v2/namespaces/public/default/deduplication", True),
        ("PUT", "/admin/v2/tenants/acme", {"adminRoles": [], "allowedClusters": ["standalone"]}),
        ("PUT", "/admin/v2/namespaces/acme/payments", {}),
        ("POST", "/admin/v2/namespaces/acme/payments/deduplication", True),
    ]


@pytest.mark.integration
def test_init_subscription_keeps_failures_that_arrive_later(pulsar_broker, pulsar_client, topic_factory):
    """The replayer subscription made by the init holds messages produced after it (no admin URL here)."""
    init_pulsar = _load_init_pulsar()
    topic = topic_factory("init-dlq")
    subscription = f"replayer-{uuid.uuid4().hex[:6]}"
    conn = json.dumps({"conn_type": "pulsar", "host": pulsar_broker.service_url})
    env = {
        "DLQ_INIT_TOPICS": topic,
        "DLQ_CONN_PULSAR_DEFAULT": conn,
        "DLQ_REPLAYER_SUBSCRIPTION": subscription,
    }
    assert init_pulsar.main(env) == 0
    assert init_pulsar.main(env) == 0  # idempotent

    producer = pulsar_client.create_producer(topic)
    for i in range(3):
        producer.send(f"failure-{i}".encode())
    producer.close()
    import pulsar

    consumer = pulsar_client.subscribe(topic, subscription, consumer_type=pulsar.ConsumerType.Shared)
    try:
        received = []
        for _ in range(3):
            msg = consumer.receive(timeout_millis=10_000)
            received.append(msg.data())
            consumer.acknowledge(msg)
    finally:
        consumer.close()
    assert sorted(received) == [b"failure-0", b"failure-1", b"failure-2"]


def test_env_example_points_at_the_demo_and_the_dag_variables():
    """.env.example targets the demo "orders" service; compose hands its values to the DAGs' Variables."""
    orders = _load_module(REPO / "examples" / "orders_service.py", "docker_demo_orders_service")
    settings = dict(
        line.split("=", 1) for line in ENV_EXAMPLE.read_text(encoding="utf-8").splitlines() if "=" in line
    )
    assert settings["DLQ_TOPICS"] == orders.DLQ_TOPIC
    assert settings["DLQ_ORIGIN_ALLOWLIST"] == orders.ORDERS_TOPIC
    assert settings["DLQ_REPLAYER_SUBSCRIPTION"] == orders.REPLAY_SUBSCRIPTION
    playbook = PurePosixPath(settings["DLQ_PLAYBOOK"])
    assert _repo_path_for_image_path(str(playbook)).is_file(), f"DLQ_PLAYBOOK {playbook} is not in the image"


def test_compose_feeds_every_variable_the_dags_read(services):
    """Each Variable the DAGs read (``var.value.get('<name>'...``) has an AIRFLOW_VAR_<NAME> in compose."""
    names = set()
    for dag_file in (REPO / "dags").glob("*.py"):
        names |= set(re.findall(r"var\.value\.get\('([a-z0-9_]+)'", dag_file.read_text(encoding="utf-8")))
        names |= set(re.findall(r"(?<!\w)_var\(\s*\"([a-z0-9_]+)\"", dag_file.read_text(encoding="utf-8")))
        names |= set(
            re.findall(r"_param_or_var\(\s*\"\w+\",\s*\"([a-z0-9_]+)\"", dag_file.read_text(encoding="utf-8"))
        )
    assert names, "no Airflow Variable found in dags/*.py"
    env = _service_env(services["airflow-scheduler"])
    missing = {n for n in names if f"AIRFLOW_VAR_{n.upper()}" not in env}
    assert not missing, f"docker/compose.yaml does not set AIRFLOW_VAR_* for {sorted(missing)}"


@pytest.mark.integration
@pytest.mark.slow
def test_init_stack_script_runs_with_the_real_airflow_cli(pulsar_broker, services, tmp_path):
    """docker/airflow/init-stack.sh end to end: real `airflow` CLI (SQLite here), embedded broker.

    The compose JSON of the Spark connection is used as is; only paths, the DB URL and the broker URL
    (no admin REST on pulsar-lite) are local. One run (about 6 `airflow` CLI starts) keeps it short.
    """
    import os
    import subprocess

    init_env = _service_env(services["airflow-init"])
    pulsar_conn = {"conn_type": "pulsar", "host": pulsar_broker.service_url}
    home = tmp_path / "home"
    home.mkdir()
    env = {
        **os.environ,
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home / 'airflow.db'}",
        "AIRFLOW__CORE__FERNET_KEY": "",  # stored in clear here, so the test can read the DB row
        "AIRFLOW__LOGGING__BASE_LOG_FOLDER": str(tmp_path / "logs"),
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(tmp_path / "auth" / "passwords.json"),
        "AIRFLOW_UID": str(os.getuid()),
        "AIRFLOW_GID": str(os.getgid()),
        "DLQ_DATA_DIR": str(tmp_path / "data"),
        "AIRFLOW_ADMIN_USER": "admin",
        "AIRFLOW_ADMIN_PASSWORD": "pw-never-logged",
        "DLQ_CONN_PULSAR_DEFAULT": json.dumps(pulsar_conn),
        "DLQ_CONN_SPARK_DEFAULT": init_env["DLQ_CONN_SPARK_DEFAULT"],
        "DLQ_INIT_TOPICS": f"persistent://public/default/init-smoke-{uuid.uuid4().hex[:8]}-DLQ",
        "DLQ_REPLAYER_SUBSCRIPTION": "dlq-replayer",
    }
    script = DOCKER / "airflow" / "init-stack.sh"
    proc = subprocess.run(
        ["bash", str(script)], env=env, capture_output=True, text=True, timeout=300, check=False
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert "Imported connection pulsar_default" in out, out[-3000:]
    assert "Imported connection spark_default" in out, out[-3000:]
    assert "subscription 'dlq-replayer' ready" in out, out[-3000:]
    assert "pw-never-logged" not in out, "the admin password leaked into the output"
    import sqlite3

    with sqlite3.connect(home / "airflow.db") as db:
        rows = dict(
            (row[0], row[1:])
            for row in db.execute(
                "SELECT conn_id, conn_type, host, port, extra FROM connection ORDER BY conn_id"
            )
        )
    spark = json.loads(init_env["DLQ_CONN_SPARK_DEFAULT"])
    assert rows["spark_default"][:3] == ("spark", spark["host"], spark["port"])
    assert json.loads(rows["spark_default"][3]) == spark["extra"]
    assert rows["pulsar_default"][:2] == ("pulsar", pulsar_broker.service_url)
    passwords = json.loads((tmp_path / "auth" / "passwords.json").read_text(encoding="utf-8"))
    assert passwords == {"admin": "pw-never-logged"}
    assert (tmp_path / "data").is_dir()
