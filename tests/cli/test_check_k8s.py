"""`forgezero-lifecycle check-k8s`: a pod's grace, probe and preStop checked against its drain."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from ._run import run
from .conftest import PROJECT_ROOT

EXAMPLE = PROJECT_ROOT / "examples" / "kubernetes" / "deployment.yaml"


def example_documents() -> list[Any]:
    return list(yaml.safe_load_all(EXAMPLE.read_text()))


def write(tmp_path: Path, documents: list[Any], name: str = "manifest.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump_all(documents))
    return path


def deployment(name: str) -> dict[str, Any]:
    """The example's Deployment ``name`` (a fresh copy to break)."""
    return next(
        d
        for d in example_documents()
        if d["kind"] == "Deployment" and d["metadata"]["name"] == name
    )


def test_example_passes(capsys: pytest.CaptureFixture[str]) -> None:
    """examples/kubernetes/deployment.yaml gives every drain its time: exit 0, a line each."""
    result = run(capsys, "check-k8s", str(EXAMPLE))
    assert result.code == 0, result
    lines = result.out.splitlines()
    assert len(lines) == 3
    assert all(line.startswith("ok  ") for line in lines)
    assert "Deployment/myapp-prestop container app: terminationGracePeriodSeconds 40 s ≥ 39 s" in (
        result.out
    )


def test_short_grace_fails_naming_the_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """terminationGracePeriodSeconds 10 fails, one line per Deployment, field and numbers named."""
    documents = example_documents()
    for document in documents:
        if document["kind"] == "Deployment":
            document["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = 10
    result = run(capsys, "check-k8s", str(write(tmp_path, documents)))
    assert result.code == 1
    problems = result.out.splitlines()
    assert len(problems) == 3
    assert problems[0] == (
        f"{tmp_path / 'manifest.yaml'}: Deployment/myapp-self-drain container app: "
        "spec.template.spec.terminationGracePeriodSeconds: 10 s < 39 s needed = drain deadline "
        "30 s + stop at the socket 4 s + margin 5 s (not-ready grace 5 s and stream grace 5 s "
        "run inside the drain deadline)"
    )
    assert "preStop drain --timeout 30 s" in problems[1]


def test_slow_readiness_probe_fails(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A readiness probe with Kubernetes' defaults (10 s x 3) is slower than a 5 s not-ready
    grace: the endpoint may still get requests after intake closed."""
    broken = deployment("myapp-self-drain")
    container = broken["spec"]["template"]["spec"]["containers"][0]
    container["readinessProbe"] = {"httpGet": {"path": "/.forgezero/runtime/ready", "port": 8000}}
    result = run(capsys, "check-k8s", str(write(tmp_path, [broken])))
    assert result.code == 1
    [problem] = result.out.splitlines()
    assert "spec.template.spec.containers[0].readinessProbe: periodSeconds 10 x " in problem
    assert "failureThreshold 3 = 30 s > not-ready grace 5 s" in problem


def test_prestop_drain_too_short_for_the_grace(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A preStop drain of 6 s cuts a 5 s not-ready grace to 3 s, which a 2 s probe still fits."""
    broken = deployment("myapp-prestop")
    hook = broken["spec"]["template"]["spec"]["containers"][0]["lifecycle"]["preStop"]["exec"]
    hook["command"][2] = hook["command"][2].replace("--timeout 30s", "--timeout 6s")
    result = run(capsys, "check-k8s", str(write(tmp_path, [broken])))
    assert result.code == 1
    [problem] = result.out.splitlines()
    assert "spec.template.spec.containers[0].lifecycle.preStop: a drain deadline of 6 s" in problem
    assert "cuts the not-ready grace 5 s to 3 s" in problem


def test_kinds_env_and_prestop_sleep(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Pods, StatefulSets and CronJobs are read, containers that neither serve nor set
    FORGEZERO_* are left alone, a preStop sleep counts, and an app under plain uvicorn is given
    its runtime's signal drain (30 s by default) with the graces from its environment."""
    uvicorn = {
        "name": "web",
        "image": "x",
        "command": ["uvicorn", "app:app"],
        "env": [{"name": "FORGEZERO_NOT_READY_GRACE", "value": "3"}],
        "readinessProbe": {"periodSeconds": 1, "failureThreshold": 3},
        "lifecycle": {"preStop": {"exec": {"command": ["sh", "-c", "sleep 5"]}}},
    }
    sidecar = {"name": "proxy", "image": "envoy"}
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "one"},
        "spec": {"terminationGracePeriodSeconds": 44, "containers": [sidecar, uvicorn]},
    }
    stateful = {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": "db"},
        "spec": {"template": {"spec": {"containers": [sidecar]}}},
    }
    served = {
        "name": "job",
        "image": "x",
        "args": ["python", "-m", "forgezero_lifecycle", "serve", "m:app", "--drain-timeout", "1m"],
    }
    cron = {
        "apiVersion": "batch/v1",
        "kind": "CronJob",
        "metadata": {"name": "nightly"},
        "spec": {"jobTemplate": {"spec": {"template": {"spec": {"containers": [served]}}}}},
    }
    result = run(capsys, "check-k8s", str(write(tmp_path, [pod, None, stateful, cron])))
    assert result.code == 1
    ok, problem = result.out.splitlines()
    assert ok.endswith(
        "Pod/one container web: terminationGracePeriodSeconds 44 s ≥ 44 s = preStop sleep 5 s "
        "+ the runtime's signal drain 30 s + stop at the socket 4 s + margin 5 s; "
        "readiness 3 s ≤ not-ready grace 3 s"
    )
    assert problem.endswith(
        "CronJob/nightly container job: "
        "spec.jobTemplate.spec.template.spec.terminationGracePeriodSeconds: 30 s < 69 s needed "
        "= drain deadline 60 s + stop at the socket 4 s + margin 5 s (not-ready grace 0 s and "
        "stream grace 5 s run inside the drain deadline)"
    )


def test_margin_flag(capsys: pytest.CaptureFixture[str]) -> None:
    """--margin changes what is kept: the example's 40 s do not hold 30 + 4 + 7."""
    result = run(capsys, "check-k8s", str(EXAMPLE), "--margin", "7s")
    assert result.code == 1
    assert "40 s < 41 s needed" in result.out


def test_nothing_to_check(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A manifest with no container of the runtime passes, saying there was nothing to check."""
    service = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s"}}
    result = run(capsys, "check-k8s", str(write(tmp_path, [service])))
    assert (result.code, result.out) == (0, "")
    assert "nothing to check" in result.err


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("kind: Pod\nspec: [unclosed\n", "not YAML"),
        ("just a string\n", "document 1 is not a mapping"),
    ],
)
def test_unreadable_input_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, says: str
) -> None:
    """Input that is not a manifest is a usage error (2), one line saying what is wrong."""
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    result = run(capsys, "check-k8s", str(path))
    assert result.code == 2
    assert says in result.err
    assert len(result.err.splitlines()) == 1


def test_missing_file_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A file that cannot be read exits 2 naming it."""
    result = run(capsys, "check-k8s", str(tmp_path / "absent.yaml"))
    assert result.code == 2
    assert "absent.yaml: cannot be read" in result.err


def test_without_pyyaml_names_the_extra(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without PyYAML the command says which extra brings it (exit 2)."""
    monkeypatch.setitem(sys.modules, "yaml", None)
    result = run(capsys, "check-k8s", str(EXAMPLE))
    assert result.code == 2
    assert "pip install 'forgezero-lifecycle[k8s]'" in result.err


def test_help_lists_the_checks(capsys: pytest.CaptureFixture[str]) -> None:
    """`check-k8s --help` gives the budgets it checks and its exit codes."""
    result = run(capsys, "check-k8s", "--help")
    assert result.code == 0
    assert "terminationGracePeriodSeconds >= preStop" in result.out
    assert "1  a budget does not hold" in result.out
