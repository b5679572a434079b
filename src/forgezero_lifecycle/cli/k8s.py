"""``forgezero-lifecycle check-k8s FILE…``: does a pod give its drain the time it needs?

The most common way a Kubernetes rollout loses requests is arithmetic. For every container of a
Pod, Deployment, StatefulSet, DaemonSet, ReplicaSet, Job or CronJob that runs
``forgezero-lifecycle serve`` or sets the runtime's environment (``FORGEZERO_*``), three
budgets are checked, with the numbers taken from the container's command line and environment
and, where they say nothing, from the library's own defaults:

1. ``terminationGracePeriodSeconds`` ≥ preStop + drain deadline + the stop + margin: the kubelet
   kills the container when the grace runs out. The preStop hook's time counts against it (a
   ``sleep``, or a ``forgezero-lifecycle drain`` hook's ``--timeout``, after which the SIGTERM
   finds the drain done); without a drain hook the SIGTERM begins ``serve``'s drain
   (``--drain-timeout``). The not-ready grace and the stream grace run inside the drain
   deadline (a drain caps each at half of what is left), so they are not added to it. The stop
   is ``serve``'s stop at the socket once drained (first-byte grace + lingering close +
   :data:`~forgezero_lifecycle.stop.server.OVERDUE_MARGIN`); the margin is the hook's
   process start and the exit (``--margin``, default :data:`MARGIN`).
2. The readiness probe notices the drain within the not-ready grace: ``periodSeconds`` x
   ``failureThreshold`` ≤ the grace (the endpoint leaves the Service before intake closes).
3. The drain's deadline leaves the not-ready grace room: a grace longer than half the deadline
   is cut to half of it (docs/drain.md, "The deadline arithmetic"), at the deadline's source
   (the preStop hook's ``--timeout`` or ``serve``'s ``--drain-timeout``).

Each problem is one line naming the manifest, the object, the field path and the numbers; the
exit code is 0 when every budget holds, 1 otherwise, 2 for input that cannot be read. YAML is
read with PyYAML, the ``[k8s]`` extra, imported only by this command.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from ..runtime import Runtime
from ..serve.options import ServeOptions, parse_duration
from ..stop.server import ConnectionStop
from .commands import DEFAULT_DEADLINE
from .output import EXIT_FAILED, EXIT_OK, EXIT_USAGE, fail, printable

__all__ = ["MARGIN", "Problem", "check_manifest", "run"]

#: Seconds kept for what happens outside the drain and the stop: starting the hook's process,
#: the process exit.
MARGIN: Final = 5.0
#: Kubernetes' defaults where a manifest says nothing.
_K8S_GRACE: Final = 30
_K8S_PERIOD: Final = 10
_K8S_FAILURES: Final = 3
_RUNTIME: Final[dict[str, Any]] = Runtime.__init__.__kwdefaults__ or {}
_SERVE: Final = ServeOptions()
#: Where each kind keeps its pod spec.
_POD_SPEC: Final[Mapping[str, tuple[str, ...]]] = {
    "Pod": ("spec",),
    **{
        kind: ("spec", "template", "spec")
        for kind in ("Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job")
    },
    "CronJob": ("spec", "jobTemplate", "spec", "template", "spec"),
}
_SHELLS: Final = frozenset({"sh", "bash", "ash", "dash", "/bin/sh", "/bin/bash", "/bin/ash"})
_SEPARATORS: Final = frozenset({"&&", "||", ";", "|", "&"})


class ManifestError(Exception):
    """A manifest that cannot be read (exit 2)."""


@dataclass(frozen=True, slots=True)
class Problem:
    """One budget that does not hold: where, and the numbers."""

    source: str
    obj: str
    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.source}: {self.obj}: {self.path}: {self.message}"


@dataclass(frozen=True, slots=True)
class _Invocation:
    """A ``forgezero-lifecycle`` command found in a command line, and its timing flags."""

    command: str
    flags: Mapping[str, float | None]

    def get(self, name: str, default: float) -> float:
        value = self.flags.get(name)
        return default if value is None else value


def _s(seconds: float) -> str:
    return f"{seconds:g} s"


def check_manifest(
    documents: Sequence[object], source: str, *, margin: float = MARGIN
) -> tuple[list[Problem], list[str]]:
    """The problems of every pod spec in ``documents``, and one line per container that passed."""
    problems: list[Problem] = []
    passed: list[str] = []
    for index, document in enumerate(documents):
        if document is None:
            continue  # an empty document (a trailing ---)
        if not isinstance(document, Mapping):
            raise ManifestError(f"document {index + 1} is not a mapping")
        for obj, prefix, spec in _pod_specs(document, ""):
            found = list(_check_pod(spec, prefix, obj, source, margin))
            problems.extend(p for p in found if isinstance(p, Problem))
            passed.extend(p for p in found if isinstance(p, str))
    return problems, passed


def _pod_specs(document: Mapping[str, Any], prefix: str) -> Iterator[tuple[str, str, Any]]:
    kind = document.get("kind")
    if kind == "List":
        for index, item in enumerate(document.get("items") or ()):
            if isinstance(item, Mapping):
                yield from _pod_specs(item, f"{prefix}items[{index}].")
        return
    keys = _POD_SPEC.get(kind) if isinstance(kind, str) else None
    if keys is None:
        return
    metadata = document.get("metadata")
    name = metadata.get("name", "?") if isinstance(metadata, Mapping) else "?"
    spec: Any = document
    for key in keys:
        spec = spec.get(key) if isinstance(spec, Mapping) else None
    if isinstance(spec, Mapping):
        yield f"{kind}/{name}", prefix + ".".join(keys), spec


def _check_pod(
    spec: Mapping[str, Any], path: str, obj: str, source: str, margin: float
) -> Iterator[Problem | str]:
    grace = spec.get("terminationGracePeriodSeconds", _K8S_GRACE)
    for index, container in enumerate(spec.get("containers") or ()):
        if not isinstance(container, Mapping):
            continue
        where = f"{path}.containers[{index}]"
        settings = _Settings.of(container)
        if settings is None:
            continue
        yield from settings.check(grace, path, where, obj, source, margin)


@dataclass(frozen=True, slots=True)
class _Settings:
    """One container's drain, as its command line, environment and preStop hook set it."""

    name: str
    serve: bool
    drain_timeout: float
    not_ready_grace: float
    stream_grace: float
    stop: float
    #: The preStop hook: seconds of ``sleep``, and a ``drain``'s ``--timeout`` (None: none).
    pre_stop_sleep: float
    pre_stop_drain: float | None
    probe: tuple[int, int] | None

    @classmethod
    def of(cls, container: Mapping[str, Any]) -> _Settings | None:
        argv = [str(a) for a in [*(container.get("command") or ()), *(container.get("args") or ())]]
        serve = next((i for i in _invocations(argv) if i.command == "serve"), None)
        env = {
            str(e.get("name")): str(e["value"])
            for e in container.get("env") or ()
            if isinstance(e, Mapping) and "value" in e
        }
        named = {str(e.get("name")) for e in container.get("env") or () if isinstance(e, Mapping)}
        if serve is None and not any(name.startswith("FORGEZERO_") for name in named):
            return None
        sleep, drain = _pre_stop(container.get("lifecycle"))
        probe = container.get("readinessProbe")
        first_byte = _SERVE.first_byte_grace
        if serve is not None:
            first_byte = serve.get("--first-byte-grace", first_byte)
            drain_timeout = serve.get("--drain-timeout", _SERVE.drain_timeout)
            not_ready = serve.flags["--not-ready-grace"]
            stream = serve.flags["--stream-grace"]
        else:  # the app's own Runtime under a server the user runs: its signal drain
            drain_timeout = float(_RUNTIME["signal_drain_timeout"])
            not_ready = stream = None
        return cls(
            name=str(container.get("name", "?")),
            serve=serve is not None,
            drain_timeout=drain_timeout,
            not_ready_grace=_seconds(
                not_ready, env, "FORGEZERO_NOT_READY_GRACE", "not_ready_grace"
            ),
            stream_grace=_seconds(stream, env, "FORGEZERO_STREAM_GRACE", "stream_grace"),
            stop=ConnectionStop(first_byte).bound,
            pre_stop_sleep=sleep,
            pre_stop_drain=drain,
            probe=(
                (
                    int(probe.get("periodSeconds", _K8S_PERIOD)),
                    int(probe.get("failureThreshold", _K8S_FAILURES)),
                )
                if isinstance(probe, Mapping)
                else None
            ),
        )

    def check(
        self, grace: object, pod: str, where: str, obj: str, source: str, margin: float
    ) -> Iterator[Problem | str]:
        of = f"{obj} container {self.name}"
        parts: list[tuple[str, float]] = []
        if self.pre_stop_sleep:
            parts.append(("preStop sleep", self.pre_stop_sleep))
        deadline = self.drain_timeout
        if self.pre_stop_drain is not None:
            deadline = self.pre_stop_drain
            parts.append(("preStop drain --timeout", deadline))
        else:
            source_of = "drain deadline" if self.serve else "the runtime's signal drain"
            parts.append((source_of, deadline))
        parts += [("stop at the socket", self.stop), ("margin", margin)]
        needed = sum(seconds for _, seconds in parts)
        sums = " + ".join(f"{label} {_s(seconds)}" for label, seconds in parts)
        inside = (
            f"(not-ready grace {_s(self.not_ready_grace)} and stream grace "
            f"{_s(self.stream_grace)} run inside the drain deadline)"
        )
        ok = True
        if not isinstance(grace, int | float) or isinstance(grace, bool):
            yield Problem(source, of, f"{pod}.terminationGracePeriodSeconds", "not a number")
            return
        if grace < needed:
            yield Problem(
                source,
                of,
                f"{pod}.terminationGracePeriodSeconds",
                f"{_s(grace)} < {_s(needed)} needed = {sums} {inside}",
            )
            ok = False
        granted = min(self.not_ready_grace, deadline / 2)
        if granted < self.not_ready_grace:
            at = (
                f"{where}.lifecycle.preStop"
                if self.pre_stop_drain is not None
                else f"{where}.args --drain-timeout"
            )
            yield Problem(
                source,
                of,
                at,
                f"a drain deadline of {_s(deadline)} cuts the not-ready grace "
                f"{_s(self.not_ready_grace)} to {_s(granted)} (at most half the deadline); "
                f"give the drain at least {_s(2 * self.not_ready_grace)}",
            )
            ok = False
        if self.probe is not None:
            period, failures = self.probe
            noticed = period * failures
            if noticed > granted:
                yield Problem(
                    source,
                    of,
                    f"{where}.readinessProbe",
                    f"periodSeconds {period} x failureThreshold {failures} = {_s(noticed)} > "
                    f"not-ready grace {_s(granted)}: the Service may send requests after intake "
                    f"closed; set --not-ready-grace (FORGEZERO_NOT_READY_GRACE) to at least "
                    f"{_s(noticed)}, or probe more often",
                )
                ok = False
        if ok:
            line = (
                f"ok  {source}: {of}: terminationGracePeriodSeconds {_s(grace)} ≥ "
                f"{_s(needed)} = {sums}"
            )
            if self.probe is not None:
                period, failures = self.probe
                line += f"; readiness {_s(period * failures)} ≤ not-ready grace {_s(granted)}"
            yield line


def _seconds(flag: float | None, env: Mapping[str, str], name: str, default: str) -> float:
    """A grace: the ``serve`` flag, else the container's ``$name``, else the runtime's default."""
    if flag is not None:
        return float(flag)
    text = env.get(name)
    if text is not None:
        try:
            return parse_duration(text)
        except argparse.ArgumentTypeError:
            pass  # the app reads it itself; an unreadable one is its own start-up error
    return float(_RUNTIME[default])


def _pre_stop(lifecycle: object) -> tuple[float, float | None]:
    """Seconds of ``sleep`` in the preStop hook, and its drain's ``--timeout`` (None: none)."""
    hook = lifecycle.get("preStop") if isinstance(lifecycle, Mapping) else None
    if not isinstance(hook, Mapping):
        return 0.0, None
    sleep = 0.0
    seconds = (
        hook.get("sleep", {}).get("seconds") if isinstance(hook.get("sleep"), Mapping) else None
    )
    if isinstance(seconds, int | float):
        sleep += float(seconds)
    drain: float | None = None
    run = hook.get("exec")
    argv = [str(a) for a in run.get("command") or ()] if isinstance(run, Mapping) else []
    for segment in _segments(argv):
        if segment[:1] == ["sleep"] and len(segment) == 2:
            try:
                sleep += parse_duration(segment[1])
            except argparse.ArgumentTypeError:
                continue
    for invocation in _invocations(argv):
        if invocation.command == "drain":
            drain = invocation.get("--timeout", DEFAULT_DEADLINE)
    return sleep, drain


def _segments(argv: list[str]) -> Iterator[list[str]]:
    """The simple commands of a command line (``sh -c 'a && b'`` split at its operators)."""
    if len(argv) >= 3 and argv[0] in _SHELLS and argv[1] == "-c":
        try:
            words = shlex.split(argv[2])
        except ValueError:
            return
    else:
        words = argv
    segment: list[str] = []
    for word in words:
        if word in _SEPARATORS:
            yield segment
            segment = []
        elif not (word == "exec" and not segment):
            segment.append(word)
    yield segment


def _invocations(argv: list[str]) -> Iterator[_Invocation]:
    """Each ``forgezero-lifecycle serve|drain …`` in a command line, with the flags that time a
    drain (a value the shell fills in, such as ``$TIMEOUT``, leaves the default)."""
    for words in _segments(argv):
        rest: list[str] | None = None
        for index, word in enumerate(words):
            if word.rsplit("/", 1)[-1] == "forgezero-lifecycle":
                rest = words[index + 1 :]
                break
            if word == "-m" and words[index + 1 : index + 2] == ["forgezero_lifecycle"]:
                rest = words[index + 2 :]
                break
        if rest and rest[0] in _FLAGS:
            flags = {name: _flag(rest, name) for name in _FLAGS[rest[0]]}
            yield _Invocation(rest[0], flags)


#: The flags read per command, and which are durations.
_FLAGS: Final = {
    "serve": ("--drain-timeout", "--not-ready-grace", "--stream-grace", "--first-byte-grace"),
    "drain": ("--timeout",),
}


def _flag(words: list[str], name: str) -> float | None:
    """The last ``name VALUE`` or ``name=VALUE`` in ``words`` as seconds, or None."""
    value: str | None = None
    for index, word in enumerate(words):
        if word == name and index + 1 < len(words):
            value = words[index + 1]
        elif word.startswith(name + "="):
            value = word[len(name) + 1 :]
    if value is None:
        return None
    try:
        return parse_duration(value)
    except argparse.ArgumentTypeError:
        return None


def _load(path: Path) -> list[object]:
    try:
        import yaml
    except ImportError:
        raise ManifestError(
            "check-k8s reads YAML with PyYAML: pip install 'forgezero-lifecycle[k8s]'"
        ) from None
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise ManifestError(f"{path}: cannot be read ({error})") from None
    try:
        return list(yaml.safe_load_all(text))
    except yaml.YAMLError as error:
        raise ManifestError(f"{path}: not YAML: {' '.join(str(error).split())}") from None


def run(args: argparse.Namespace) -> int:
    """The command: every file, every pod spec; the exit code the module docstring gives."""
    problems: list[Problem] = []
    passed: list[str] = []
    for path in args.files:
        try:
            found, ok = check_manifest(_load(path), str(path), margin=args.margin)
        except ManifestError as error:
            return fail(EXIT_USAGE, f"check-k8s: {error}")
        problems.extend(found)
        passed.extend(ok)
    for line in passed:
        print(printable(line))
    for problem in problems:
        print(printable(str(problem)))
    if not problems and not passed:
        print(
            "check-k8s: no container runs `forgezero-lifecycle serve` or sets FORGEZERO_*; "
            "nothing to check",
            file=sys.stderr,
        )
    return EXIT_FAILED if problems else EXIT_OK
