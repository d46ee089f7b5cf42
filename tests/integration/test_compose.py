"""docker-compose.yml: the server and a Spark job running the demo pipeline against it.

- ``test_compose_pipeline`` brings the composition up with testcontainers (building both images) and
  checks the spark service's output proves exactly once. It needs a Docker engine and the compose plugin;
  without them it skips, saying which is missing.
- ``test_same_pipeline_against_a_subprocess_server`` runs the same command as the spark service (``--url``
  to an external server) against a server subprocess, with the same checks, so the path the composition
  exercises is tested everywhere.
- The static tests check that the compose file parses, that everything it references exists, that the
  Dockerfiles copy paths that exist and are not excluded by .dockerignore, and that the commands the
  containers run are accepted by the server's and the demo's argument parsers.
"""

from __future__ import annotations

import fnmatch
import re
import shlex
import shutil
import subprocess
import time
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import yaml

from tests.demo.support import assert_demo_passed, assert_exactly_once, run_demo

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_FILE = ROOT / "docker-compose.yml"
COMPOSE_ROWS = 20_000  # the spark service's default --rows
ROWS = 3000


# ---- the composition, where Docker exists ------------------------------------------------------------------


def docker_unavailable() -> str | None:
    """Why the compose test cannot run here, or None if it can."""
    docker = shutil.which("docker")
    if docker is None:
        return "no docker CLI on PATH"
    try:
        info = subprocess.run(
            [docker, "info", "--format", "{{.ServerVersion}}"],
            capture_output=True,
            text=True,
            timeout=20,
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"docker info failed: {error}"
    if info.returncode != 0:
        reason = (info.stderr.strip().splitlines() or ["no output"])[-1]
        return f"no Docker engine reachable (docker info: {reason})"
    compose = subprocess.run(
        [docker, "compose", "version"], capture_output=True, text=True, timeout=20
    )
    if compose.returncode != 0:
        return "the docker compose plugin is not installed (docker compose version failed)"
    return None


@pytest.mark.timeout(1800)
def test_compose_pipeline() -> None:
    reason = docker_unavailable()
    if reason is not None:
        pytest.skip(f"docker compose test skipped: {reason}")
    from testcontainers.compose import DockerCompose

    compose = DockerCompose(
        context=ROOT, compose_file_name="docker-compose.yml", build=True, wait=False
    )
    with compose:
        deadline = time.monotonic() + 900
        while True:
            spark = compose.get_container("spark", include_all=True)
            if spark.State == "exited":
                break
            assert time.monotonic() < deadline, "the spark service did not finish in 15 minutes"
            time.sleep(2)
        stdout, stderr = compose.get_logs("spark")
        assert spark.ExitCode == 0, f"spark exited with {spark.ExitCode}:\n{stdout}\n{stderr}"
        assert compose.get_container("server").Health in ("healthy", "")
        assert_exactly_once(stdout, COMPOSE_ROWS)


# ---- the same pipeline and checks against a server subprocess ----------------------------------------------


def test_same_pipeline_against_a_subprocess_server(durastream_server) -> None:
    url = durastream_server.base_url + "/v1/stream"
    run = run_demo("--url", url, "--rows", str(ROWS), "--seconds", "6", timeout=400)
    assert_demo_passed(run, ROWS)
    assert "Started the bundled" not in run.stdout  # --url: the external server, nothing bundled
    assert f"Stream: {url}/demo/events-" in run.stdout


# ---- static checks -------------------------------------------------------------------------------------------


def compose() -> dict:
    with open(COMPOSE_FILE, encoding="utf-8") as handle:
        return yaml.safe_load(handle)


def interpolate(text: str) -> str:
    """Compose's ``${VAR:-default}`` with the environment empty: the defaults."""
    return re.sub(r"\$\{[A-Z_]+:-([^}]*)\}", r"\1", text)


def dockerfile_instructions(path: Path) -> list[tuple[str, str]]:
    joined = re.sub(r"\\\n", " ", path.read_text(encoding="utf-8"))
    instructions = []
    for line in joined.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            keyword, _, rest = line.partition(" ")
            instructions.append((keyword.upper(), rest.strip()))
    return instructions


def dockerignore() -> list[str]:
    lines = (ROOT / ".dockerignore").read_text(encoding="utf-8").splitlines()
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


def ignored(relative: str, patterns: list[str]) -> bool:
    parts = Path(relative).parts
    for pattern in patterns:
        bare = pattern.removeprefix("**/")
        prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
        if any(fnmatch.fnmatch(prefix, pattern) for prefix in prefixes):
            return True
        if pattern.startswith("**/") and any(fnmatch.fnmatch(part, bare) for part in parts):
            return True
    return False


def build_of(service: str) -> tuple[Path, Path]:
    build = compose()["services"][service]["build"]
    context = (COMPOSE_FILE.parent / build["context"]).resolve()
    return context, context / build.get("dockerfile", "Dockerfile")


def test_compose_file_parses_and_references_files_that_exist() -> None:
    config = compose()
    services = config["services"]
    assert set(services) == {"server", "spark", "prometheus", "grafana"}
    for name in ("server", "spark"):
        context, dockerfile = build_of(name)
        assert context.is_dir(), f"{name}: build context {context} missing"
        assert dockerfile.is_file(), f"{name}: {dockerfile} missing"
    assert build_of("server")[1] == ROOT / "server" / "Dockerfile"

    server = services["server"]
    volume = server["volumes"][0].split(":")[0]
    assert volume in config["volumes"], "the data volume must be a named volume"
    assert "/healthz" in " ".join(server["healthcheck"]["test"])
    assert services["spark"]["depends_on"]["server"]["condition"] == "service_healthy"


def test_the_containers_commands_are_accepted() -> None:
    from durastream_server.cli import build_parser as server_parser
    from durastream_server.http.hosts import HostPolicy
    from durastream_server.http.paths import HEALTH_PATH
    from durastream_spark.demo.cli import build_parser as demo_parser

    services = compose()["services"]
    server_args = server_parser().parse_args(services["server"]["command"])
    assert (server_args.host, server_args.port, str(server_args.data_dir)) == (
        "0.0.0.0",
        4437,
        "/data",
    )
    assert HEALTH_PATH in " ".join(services["server"]["healthcheck"]["test"])
    mount = services["server"]["volumes"][0].split(":")[1]
    assert mount == str(server_args.data_dir)

    demo_args = demo_parser().parse_args([interpolate(a) for a in services["spark"]["command"]])
    assert demo_args.url == f"http://server:{server_args.port}/v1/stream"
    assert demo_args.rows == COMPOSE_ROWS
    # The server answers the names it is reached by (the spark service's URL, the healthcheck, the
    # published loopback port) and no other (DNS rebinding).
    hosts = HostPolicy.for_server(server_args.allowed_host, server_args.host)
    for name in (urlsplit(demo_args.url).netloc, "127.0.0.1:4437", "localhost:4437"):
        assert hosts.refusal([name.encode()]) is None, name
    assert hosts.refusal([b"rebound.example:4437"]) is not None


@pytest.mark.parametrize("service", ["server", "spark"])
def test_dockerfiles_copy_paths_that_exist_and_are_not_ignored(service: str) -> None:
    context, dockerfile = build_of(service)
    patterns = dockerignore()
    copies = [rest for keyword, rest in dockerfile_instructions(dockerfile) if keyword == "COPY"]
    assert copies, f"{dockerfile} copies nothing"
    for rest in copies:
        args = [a for a in shlex.split(rest) if not a.startswith("--")]
        for source in args[:-1]:
            assert (context / source).exists(), f"{dockerfile}: COPY source {source} missing"
            assert not ignored(source.rstrip("/"), patterns), f"{source} is in .dockerignore"


def test_the_images_run_what_exists() -> None:
    server = dockerfile_instructions(ROOT / "server" / "Dockerfile")
    spark = dockerfile_instructions(ROOT / "docker" / "spark.Dockerfile")
    assert ("ENTRYPOINT", '["durastream-server"]') in server
    assert "durastream-server" in (ROOT / "server" / "pyproject.toml").read_text()
    assert any(k == "HEALTHCHECK" and "/healthz" in rest for k, rest in server)
    assert ("ENTRYPOINT", '["python", "-m", "durastream_spark.demo"]') in spark
    assert (ROOT / "durastream_spark" / "demo" / "__main__.py").is_file()
    assert any(k == "RUN" and "openjdk-17" in rest for k, rest in spark)
    # Both images install from directories the .dockerignore keeps: sources only, no venvs.
    patterns = dockerignore()
    for kept in ("server", "durastream_spark", "pyproject.toml", "README.md"):
        assert not ignored(kept, patterns), kept
    for dropped in (".venv", "server/durastream_server.egg-info", "tests", "a/node_modules/x"):
        assert ignored(dropped, patterns), dropped


# ---- the "metrics" profile ----------------------------------------------------------------------------------

METRICS = ROOT / "docker" / "metrics"


def test_the_metrics_profile_scrapes_the_server_and_provisions_the_dashboard() -> None:
    from durastream_server.cli import build_parser as server_parser
    from durastream_server.http.hosts import HostPolicy

    services = compose()["services"]
    for name in ("prometheus", "grafana"):
        assert services[name]["profiles"] == ["metrics"], f"{name} must be optional"
        for volume in services[name]["volumes"]:
            source = volume.split(":")[0]
            assert (COMPOSE_FILE.parent / source).exists(), f"{name}: {source} missing"
    assert "metrics" not in services["server"].get(
        "profiles", []
    )  # the server runs in every profile
    scrape = yaml.safe_load((METRICS / "prometheus.yml").read_text())
    (target,) = scrape["scrape_configs"][0]["static_configs"][0]["targets"]
    server_args = server_parser().parse_args(services["server"]["command"])
    assert target == f"server:{server_args.port}"
    hosts = HostPolicy.for_server(server_args.allowed_host, server_args.host)
    assert hosts.refusal([target.encode()]) is None  # the server answers Prometheus's Host
    provider = yaml.safe_load(
        (METRICS / "grafana" / "provisioning" / "dashboards" / "durastream.yml").read_text()
    )
    mounted = [v for v in services["grafana"]["volumes"] if "dashboards:" in v]
    assert provider["providers"][0]["options"]["path"] == mounted[0].split(":")[1]


def test_every_dashboard_query_names_a_metric_the_server_exposes(durastream_server) -> None:
    import json

    import requests
    from prometheus_client.parser import text_string_to_metric_families

    text = requests.get(durastream_server.base_url + "/metrics", timeout=10).text
    exposed = {s.name for f in text_string_to_metric_families(text) for s in f.samples}
    dashboard = json.loads((METRICS / "grafana" / "dashboards" / "durastream.json").read_text())
    queries = [t["expr"] for panel in dashboard["panels"] for t in panel["targets"]]
    assert len(queries) >= 13
    named = {name for query in queries for name in re.findall(r"durastream_\w+", query)}
    assert named and named <= exposed, f"not exposed: {sorted(named - exposed)}"
