"""examples/kubernetes: valid resources whose commands, probes and numbers work as written.

The manifests are parsed here, not copied: ``serve``'s command line, the environment (the
downward API and the Secret resolved as the kubelet would), the probes' paths and ports and the
preStop hook's shell command are run against a real ``forgezero-lifecycle serve`` on loopback.
Only what cannot run on a test machine is substituted: the app (``myapp.main:app``: each example
app in turn, the Quick start's, the FastAPI and the Starlette example, which build their own
runtime, and ``tests.cli.apps:plain``, which has none), the host (127.0.0.1), the port (a free
one, everywhere the manifest names it) and the Secret's placeholders (fresh tokens, as the
Secret's comment tells a user to make; the placeholders themselves are refused at start-up, which
a test here checks too).
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

import httpx
import kubernetes_validate
import pytest
import yaml

from forgezero_lifecycle._errors import DrainConflictError
from forgezero_lifecycle.client import SyncControlClient, drain_request
from forgezero_lifecycle.core._httpx import tls_context
from forgezero_lifecycle.serve import parse_duration
from tests.cli.conftest import BOUND, PROJECT_ROOT, free_port

MANIFEST: Final = PROJECT_ROOT / "examples" / "kubernetes" / "deployment.yaml"
#: What must be left after the drain deadline inside terminationGracePeriodSeconds: the hook's
#: process start, uvicorn's shutdown and the exit (docs/deployment.md, "Numbers that must fit
#: together").
MARGIN: Final = 10.0
#: What runs as ``myapp.main:app``: an app without a runtime (serve builds one from its flags),
#: and every example app, each building its own runtime from the settings serve exports.
PLAIN_APP: Final = "tests.cli.apps:plain"
APPS: Final = (
    PLAIN_APP,
    "examples.quickstart.main:app",
    "examples.fastapi_app.app:app",
    "examples.starlette_app.app:app",
)


def resources() -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(MANIFEST.read_text()) if doc]


def of_kind(kind: str) -> list[dict[str, Any]]:
    return [doc for doc in resources() if doc["kind"] == kind]


def deployments() -> dict[str, dict[str, Any]]:
    return {doc["metadata"]["name"]: doc for doc in of_kind("Deployment")}


def container(deployment: dict[str, Any]) -> dict[str, Any]:
    (only,) = deployment["spec"]["template"]["spec"]["containers"]
    result: dict[str, Any] = only
    return result


def flag(command: list[str], name: str) -> str:
    (value,) = [arg.split("=", 1)[1] for arg in command if arg.startswith(name + "=")]
    return value


@pytest.mark.parametrize(
    "resource", resources(), ids=lambda r: f"{r['kind']}-{r['metadata']['name']}"
)
def test_resources_validate_strict(resource: dict[str, Any]) -> None:
    """kubernetes-validate --strict (offline schemas): no unknown or misplaced field."""
    kubernetes_validate.validate(resource, kubernetes_validate.latest_version(), strict=True)


def test_service_selects_variants() -> None:
    """Every variant's pods sit behind the Service; no Deployment adopts the other's pods."""
    (service,) = of_kind("Service")
    selector = service["spec"]["selector"].items()
    pods = {name: d["spec"]["template"]["metadata"]["labels"] for name, d in deployments().items()}
    assert len(pods) == 3
    for name, deployment in deployments().items():
        assert selector <= pods[name].items(), name
        own = deployment["spec"]["selector"]["matchLabels"].items()
        assert own <= pods[name].items()
        for other, labels in pods.items():
            if other != name:
                assert not own <= labels.items(), (name, other)


@pytest.mark.parametrize("name", sorted(deployments()))
def test_revision_in_one_place(name: str) -> None:
    """FORGEZERO_REVISION is the pod's revision label (downward API); no flag repeats it."""
    spec = container(deployments()[name])
    labels = deployments()[name]["spec"]["template"]["metadata"]["labels"]
    (env,) = [e for e in spec["env"] if e["name"] == "FORGEZERO_REVISION"]
    assert env["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.labels['forgezero.dev/revision']"
    assert len(labels["forgezero.dev/revision"]) == 40
    assert not [arg for arg in spec["command"] if arg.startswith("--revision")]


@pytest.mark.parametrize("name", sorted(deployments()))
def test_the_timing_arithmetic_holds(name: str) -> None:
    """terminationGracePeriodSeconds >= deadline (grace inside it, at most half) + margin."""
    deployment = deployments()[name]
    spec = container(deployment)
    deadline = parse_duration(flag(spec["command"], "--drain-timeout"))
    grace = parse_duration(flag(spec["command"], "--not-ready-grace"))
    period = deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert grace <= deadline / 2
    assert period >= deadline + MARGIN
    readiness = spec["readinessProbe"]
    assert readiness["periodSeconds"] * readiness["failureThreshold"] <= grace
    hook = spec.get("lifecycle", {}).get("preStop")
    if hook is not None:
        script = hook["exec"]["command"][-1]
        assert f"--timeout {flag(spec['command'], '--drain-timeout')}" in script


def new_token() -> str:
    """What the Secret's comment says to generate (never one that looks like a flag)."""
    while (token := secrets.token_urlsafe(32)).startswith("-"):
        pass
    return token


class Pod:
    """One container of a manifest, run as the kubelet would run it, on loopback."""

    def __init__(
        self,
        deployment: dict[str, Any],
        log_path: Path,
        *,
        app: str = PLAIN_APP,
        edited_secret: bool = True,
    ) -> None:
        self.deployment = deployment
        self.app = app
        self.edited_secret = edited_secret
        self.spec = container(deployment)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = {**os.environ, **self._resolved_env()}
        self.env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{self.env.get('PATH', '')}"
        # The FastAPI example's job store: a file of this test's, not one in the repository.
        self.env["FORGEZERO_JOBS_DB"] = str(log_path.with_suffix(".jobs.sqlite3"))
        self.log_path = log_path
        self.process: subprocess.Popen[bytes] | None = None

    def _resolved_env(self) -> dict[str, str]:
        labels = self.deployment["spec"]["template"]["metadata"]["labels"]
        (secret,) = of_kind("Secret")
        values: dict[str, str] = {}
        for entry in self.spec["env"]:
            source = entry.get("valueFrom", {})
            if "value" in entry:
                values[entry["name"]] = entry["value"]
            elif "fieldRef" in source:
                path = source["fieldRef"]["fieldPath"]
                assert path.startswith("metadata.labels['"), path
                values[entry["name"]] = labels[path[len("metadata.labels['") : -2]]
            else:
                reference = source["secretKeyRef"]
                assert reference["name"] == secret["metadata"]["name"]
                value = secret["stringData"][reference["key"]]
                assert value.startswith("REPLACE"), "the example must not ship a usable token"
                values[entry["name"]] = new_token() if self.edited_secret else value
        return values

    def command(self) -> list[str]:
        program, *args = self.spec["command"]
        assert program == "forgezero-lifecycle"
        assert args[:2] == ["serve", "myapp.main:app"]
        rewritten = [sys.executable, "-m", "forgezero_lifecycle", "serve", self.app]
        for arg in args[2:]:
            if arg.startswith("--host="):
                arg = "--host=127.0.0.1"
            elif arg.startswith("--port="):
                assert int(arg.split("=")[1]) == self.container_port("http")
                arg = f"--port={self.port}"
            rewritten.append(arg)
        return rewritten

    def container_port(self, name: str) -> int:
        (port,) = [p["containerPort"] for p in self.spec["ports"] if p["name"] == name]
        return int(port)

    def start(self) -> None:
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(
                self.command(),
                cwd=PROJECT_ROOT,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        self.wait_for(lambda: self.probe("livenessProbe") == 200, "live")

    def probe(self, which: str) -> int | None:
        """The probe as the kubelet sends it: GET path on the named port."""
        http_get = self.spec[which]["httpGet"]
        assert http_get["port"] == "http"  # the named container port: the one serve listens on
        try:
            response = httpx.get(
                self.url + http_get["path"], timeout=BOUND, trust_env=False, verify=tls_context()
            )
        except httpx.TransportError:
            return None
        return response.status_code

    def wait_for(self, done: Any, what: str) -> None:
        deadline = time.monotonic() + BOUND
        while not done():
            assert self.process is not None
            assert self.process.poll() is None or what == "exit", self.log()
            assert time.monotonic() < deadline, f"not {what} within {BOUND} s:\n{self.log()}"
            time.sleep(0.05)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=BOUND)


@pytest.fixture(params=APPS)
def pods(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[dict[str, Pod]]:
    """Every Deployment's container, running ``request.param`` as ``myapp.main:app``."""
    made: dict[str, Pod] = {}
    for name, deployment in deployments().items():
        made[name] = Pod(deployment, tmp_path / f"{name}.log", app=request.param)
    try:
        yield made
    finally:
        for pod in made.values():
            pod.stop()


@pytest.mark.server
def test_unedited_secret_refused(tmp_path: Path) -> None:
    """A deployment applied with the example's placeholder tokens does not start (exit 2)."""
    pod = Pod(deployments()["myapp-self-drain"], tmp_path / "unedited.log", edited_secret=False)
    with pod.log_path.open("wb") as log:
        ran = subprocess.run(
            pod.command(),
            cwd=PROJECT_ROOT,
            env=pod.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            timeout=BOUND,
            check=False,
        )
    assert ran.returncode == 2, pod.log()
    assert "RUNTIME_CONFIG_INVALID: FORGEZERO_CONTROL_TOKEN is still a placeholder" in pod.log()


def _refuses_another_revision(pod: Pod) -> None:
    token = pod.env["FORGEZERO_CONTROL_TOKEN"]
    wrong = drain_request(source_revision="f" * 40, target_revision="0" * 40, timeout_ms=1000)
    with (
        SyncControlClient(pod.url, token=token) as control,
        pytest.raises(DrainConflictError) as error,
    ):
        control.begin_drain(wrong)
    assert error.value.code == "RUNTIME_DRAIN_REVISION_MISMATCH"


@pytest.mark.server
def test_self_drain_variant(pods: dict[str, Pod]) -> None:
    """serve's flags as written: probes 200, the revision check on, SIGTERM drains, exit 0."""
    pod = pods["myapp-self-drain"]
    pod.start()
    assert pod.probe("readinessProbe") == 200
    _refuses_another_revision(pod)
    assert pod.probe("readinessProbe") == 200  # the refused drain changed nothing
    assert pod.process is not None
    pod.process.send_signal(signal.SIGTERM)
    pod.wait_for(lambda: pod.probe("readinessProbe") == 503, "not ready")
    assert pod.probe("livenessProbe") == 200
    assert pod.process.wait(timeout=BOUND * 2) == 0, pod.log()
    assert "serve.drain_settled state=drained" in pod.log()


@pytest.mark.server
def test_prestop_variant(pods: dict[str, Pod]) -> None:
    """The preStop command line as written drains the pod (exit 0); SIGTERM then exits 0."""
    pod = pods["myapp-prestop"]
    pod.start()
    assert pod.probe("readinessProbe") == 200
    _refuses_another_revision(pod)
    hook = list(pod.spec["lifecycle"]["preStop"]["exec"]["command"])
    assert hook[:2] == ["sh", "-c"]
    assert "http://127.0.0.1:8000" in hook[2]
    hook[2] = hook[2].replace(":8000", f":{pod.port}")
    ran = subprocess.run(
        hook, env=pod.env, cwd=PROJECT_ROOT, capture_output=True, timeout=BOUND * 3, check=False
    )
    assert ran.returncode == 0, (ran.stdout, ran.stderr, pod.log())
    assert ran.stdout.decode().startswith("drained")
    assert pod.probe("readinessProbe") == 503
    assert pod.probe("livenessProbe") == 200
    assert pod.process is not None
    pod.process.send_signal(signal.SIGTERM)
    assert pod.process.wait(timeout=BOUND) == 0, pod.log()


@pytest.mark.server
def test_workers_variant(
    pods: dict[str, Pod],
) -> None:
    """serve --workers as written: the preStop drain reaches both workers; SIGTERM exits 0."""
    pod = pods["myapp-workers"]
    pod.start()
    pod.wait_for(lambda: "supervisor.serving" in pod.log(), "serving")
    _refuses_another_revision(pod)
    hook = list(pod.spec["lifecycle"]["preStop"]["exec"]["command"])
    hook[2] = hook[2].replace(":8000", f":{pod.port}")
    ran = subprocess.run(
        [*hook[:2], hook[2] + " --json"],
        env=pod.env,
        cwd=PROJECT_ROOT,
        capture_output=True,
        timeout=BOUND * 3,
        check=False,
    )
    assert ran.returncode == 0, (ran.stdout, ran.stderr, pod.log())
    status = json.loads(ran.stdout)
    assert status["status"] == "drained"
    assert len(status["detail"]["workers"]) == 2
    assert {worker["status"] for worker in status["detail"]["workers"]} == {"drained"}
    assert [pod.probe("readinessProbe") for _ in range(10)] == [503] * 10  # every worker
    assert pod.process is not None
    pod.process.send_signal(signal.SIGTERM)
    assert pod.process.wait(timeout=BOUND) == 0, pod.log()
