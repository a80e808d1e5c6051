"""Task images for the Docker and Kubernetes sandboxes, built from any task file.

Three layers, as SWE-bench builds its images, each tagged by the hash of what it is made of
(its Dockerfile, its parent's image id and its files' identity), so a layer whose inputs did not
change is found by its tag and reused:

``toolchain``   ``{prefix}-toolchain:<hash>``: the language's base image (a build argument:
                ``python:{python}-slim-bookworm`` and ``maven:3.9-eclipse-temurin-17`` by
                default; Go, Rust, C++ and JavaScript have their official images) with bash
                and git, and git told that any folder is safe.
``environment`` ``{prefix}-env/<owner>__<name>:<hash>``, one per repository and interpreter:
                for Python, the virtual environment the install commands fill, first on
                ``PATH`` (the local sandbox's venv, at ``/opt/crl/venv``); for Go, Rust, C++
                and JavaScript, the language's tools checked (CMake and make installed with
                apt where missing); for JavaScript, the local sandboxes' shared Jest install
                copied to ``/opt/crl/jest`` (a ``jest`` command, ``NODE_PATH``).
``instance``    ``{prefix}-task/<instance id>:<hash>``: the repository at its base commit in the
                task's workdir, cloned by the local sandbox's own code
                (:func:`crl_worker.sandbox.repos.checkout`), the task's environment variables,
                then each install command in its own step, in the workdir, as the local sandbox
                runs them. A Maven repository's dependencies and plugins are fetched once at
                build time (a test run whose result is discarded), so its tests run offline.

The three backends thus give the same verdicts: the same checkout, the same install commands,
the interpreter first on ``PATH``. A failing step names the task, the layer and the step; a
task whose image cannot be built is a per-task error and the others still build.
"""

from __future__ import annotations

import asyncio
import hashlib
import io
import json
import logging
import re
import shlex
import shutil
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import docker
import docker.errors

from crl_worker.errors import SandboxError
from crl_worker.sandbox import node, repos
from crl_worker.sandbox.docker import connect
from crl_worker.tasks.model import Task

logger = logging.getLogger(__name__)

#: Base images a user's build starts from, by language (``{python}``: the task's version).
DEFAULT_BASES: dict[str, str] = {
    "python": "python:{python}-slim-bookworm",
    "java": "maven:3.9-eclipse-temurin-17",
    "go": "golang:1.24-bookworm",
    "rust": "rust:1-bookworm",
    "cpp": "gcc:14-bookworm",
    "javascript": "node:20-bookworm",
}
#: Where the environment layer puts Jest for JavaScript tasks (a copy of the local sandboxes'
#: shared install, :mod:`crl_worker.sandbox.node`).
JEST_HOME = "/opt/crl/jest"
#: Tools a language's environment layer checks, with the Debian packages that bring them when
#: the base image lacks them (a plain ``gcc`` image has no CMake).
_LANGUAGE_TOOLS: dict[str, tuple[tuple[str, str], ...]] = {
    "go": (("go", ""),),
    "rust": (("cargo", ""), ("rustc", "")),
    "cpp": (("cmake", "cmake"), ("make", "make"), ("g++", "g++")),
    "javascript": (("node", ""),),
}
#: Interpreter version of Python tasks that name none.
DEFAULT_PYTHON = "3.12"
#: Where the environment layer puts a Python task's virtual environment.
VENV = "/opt/crl/venv"
#: Lines of a failing step's output kept in its error.
_TAIL = 40

_STEP = re.compile(r"^Step (\d+)/(\d+) : (.*)$")


class ImageBuildError(SandboxError):
    """A task image could not be built; the message names the task, the layer and the step."""


@dataclass(frozen=True)
class Layer:
    """One image to build: its Dockerfile, its parent and the files it copies."""

    kind: str
    """``toolchain``, ``environment`` or ``instance`` (for messages)."""
    repository: str
    """Image name without the tag."""
    dockerfile: str
    parent: str
    """The image ``FROM`` names."""
    identity: str = ""
    """What the copied files are (the base commit), for the content hash."""
    files: Path | None = None
    """A folder sent as ``repo/`` in the build context."""
    patch: str = ""
    """A test patch sent as :data:`WARM_PATCH` in the build context (part of the tag)."""


@dataclass
class TaskImage:
    """What building one task's image gave."""

    instance_id: str
    image: str | None = None
    """The instance image's name and tag, when it was built or found."""
    built: list[str] = field(default_factory=list)
    """Layers built by this call (the others were found by their tags)."""
    seconds: float = 0.0
    error: str | None = None

    @property
    def ok(self) -> bool:
        """Whether the task has its image."""
        return self.error is None and self.image is not None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready summary."""
        return {
            "instance_id": self.instance_id,
            "image": self.image,
            "built": self.built,
            "seconds": round(self.seconds, 2),
            "error": self.error,
        }


def _safe(text: str) -> str:
    """A form of `text` Docker accepts in a repository name (lowercase, no odd characters)."""
    return re.sub(r"[^a-z0-9._-]+", "-", text.lower()).strip(".-_")[:100] or "x"


def _exec_form(command: str) -> str:
    """A ``RUN`` in exec form: bash runs the command as given (no Dockerfile re-parsing)."""
    return "RUN " + json.dumps(["/bin/bash", "-c", command])


def _env_lines(env: Mapping[str, str]) -> list[str]:
    return [f"ENV {name}={json.dumps(value)}" for name, value in sorted(env.items())]


def toolchain_dockerfile(base: str) -> str:
    """The toolchain layer: bash and git on the base image, any folder safe for git."""
    ensure = (
        "set -e; if ! command -v git >/dev/null || ! command -v bash >/dev/null; then "
        "apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "
        "--no-install-recommends git bash ca-certificates >/dev/null "
        "&& rm -rf /var/lib/apt/lists/*; fi"
    )
    return "\n".join(
        [
            f"FROM {base}",
            "RUN " + json.dumps(["/bin/sh", "-c", ensure]),
            'SHELL ["/bin/bash", "-c"]',
            _exec_form("git config --system --add safe.directory '*'"),
            "",
        ]
    )


def environment_dockerfile(parent: str, task: Task) -> str:
    """The environment layer: for Python, the task's interpreter checked and its virtual
    environment first on ``PATH``; for Java, the JDK checked; for Go, Rust, C++ and JavaScript,
    the language's tools checked, and for JavaScript a ``jest`` command over the Jest install
    the layer's files bring (:func:`environment_layer`)."""
    lines = [f"FROM {parent}"]
    if task.language == "python":
        wanted = task.python or ""
        check = (
            'python3 -c \'import sys; w=sys.argv[1]; v="%d.%d.%d" % sys.version_info[:3]; '
            'ok = not w or v == w or v.startswith(w + "."); '
            'print(v if ok else f"the base image has Python {v}; the task needs {w}: '
            "give a base image with it (--base python=...)\"); sys.exit(0 if ok else 1)' "
            + repr(wanted)
        )
        lines += [
            _exec_form(check),
            _exec_form(f"python3 -m venv {VENV} && {VENV}/bin/python -m pip --version"),
            f"ENV VIRTUAL_ENV={VENV}",
            f"ENV PATH={VENV}/bin:$PATH",
        ]
    elif task.language == "java":
        lines.append(_exec_form("java -version"))
    elif task.language in _LANGUAGE_TOOLS:
        lines += _tool_checks(task.language)
        if task.language == "javascript":
            lines += [
                f"COPY repo/ {JEST_HOME}/",
                _exec_form(
                    f"printf '#!/bin/sh\\nexec node {JEST_HOME}/node_modules/jest/bin/jest.js"
                    ' "$@"\\n\' > /usr/local/bin/jest && chmod 755 /usr/local/bin/jest '
                    "&& jest --version"
                ),
                f"ENV NODE_PATH={JEST_HOME}/node_modules",
            ]
    lines.append("")
    return "\n".join(lines)


def _tool_checks(language: str) -> list[str]:
    """``RUN`` steps that install the language's missing tools where Debian packages them, then
    fail, naming the tool and the ``--base`` option, when one is still missing."""
    tools = _LANGUAGE_TOOLS[language]
    packages = " ".join(package for _, package in tools if package)
    steps: list[str] = []
    if packages:
        missing = " || ".join(f"! command -v {tool} >/dev/null" for tool, _ in tools)
        steps.append(
            _exec_form(
                f"if {{ {missing}; }} && command -v apt-get >/dev/null; then apt-get update -qq "
                "&& DEBIAN_FRONTEND=noninteractive "
                f"apt-get install -y -qq --no-install-recommends {packages} >/dev/null "
                "&& rm -rf /var/lib/apt/lists/*; fi"
            )
        )
    names = " ".join(tool for tool, _ in tools)
    steps.append(
        _exec_form(
            f'for t in {names}; do command -v $t >/dev/null || {{ echo "the base image has no '
            f"$t, which {language} tasks need: give a base image with it (--base {language}=...)"
            '"; exit 1; }; done'
        )
    )
    return steps


#: The task's test patch in an instance image's build context (Java tasks whose tests arrive
#: with it: :func:`instance_dockerfile`).
WARM_PATCH = "crl-warm-tests.patch"
#: Fetches a Maven build's plugins and dependencies into the image (``~/.m2``), so the tests
#: run offline in the sandbox; the run's result is discarded and its outputs removed.
#: ``{properties}``: the ``-Dkey=value`` words of the task's test command (:func:`maven_warm`).
MAVEN_WARM = (
    "if [ -f pom.xml ]; then "
    "if [ -x ./mvnw ]; then m=./mvnw; else m=mvn; fi; "
    "$m -B -q -Dmaven.test.failure.ignore=true{properties} test >/tmp/crl-maven-warm.log 2>&1 "
    "|| { tail -n 30 /tmp/crl-maven-warm.log; echo 'fetching the Maven build failed'; exit 1; }; "
    "git clean -fdxq; rm -f /tmp/crl-maven-warm.log; fi"
)
#: Test command words the warm run leaves out: its test selection.
_SELECTION = ("-Dtest=", "-DfailIfNoTests=", "-Dsurefire.failIfNoSpecifiedTests=")


def maven_warm(task: Task) -> str:
    """:data:`MAVEN_WARM` with the Maven properties of the task's test command (a Defects4J
    record's ``-Dmaven.compiler.source=8``, without which an old revision does not compile on
    Java 17), less its test selection."""
    try:
        words = shlex.split(task.test_spec.command)
    except ValueError:
        words = []
    keep = [w for w in words if w.startswith("-D") and "=" in w and "{" not in w
            and not w.startswith(_SELECTION)]  # fmt: skip
    return MAVEN_WARM.replace("{properties}", "".join(" " + shlex.quote(w) for w in keep))


def instance_dockerfile(parent: str, task: Task) -> str:
    """The instance layer: the checkout, the task's variables, each install command.

    A Java task's Maven build is fetched by one test run. Where the task's tests arrive with
    its test patch (QuixBugs, Aider's exercises), that run has the patch applied, since
    Surefire fetches its JUnit provider only for a build that has tests; the tree is then
    restored and the patch deleted in the same step, so the sandbox's file system holds
    neither."""
    lines = [
        f"FROM {parent}",
        f"COPY repo/ {task.workdir}/",
        f"WORKDIR {task.workdir}",
        *_env_lines(task.env),
        *(_exec_form(command) for command in task.install),
    ]
    if task.language == "java" and task.test_patch.strip():
        lines += [
            f"COPY {WARM_PATCH} /tmp/{WARM_PATCH}",
            _exec_form(
                f"git apply --whitespace=nowarn /tmp/{WARM_PATCH} && rm -f /tmp/{WARM_PATCH} "
                f"&& {{ {maven_warm(task)}; }}; rc=$?; rm -f /tmp/{WARM_PATCH}; "
                "git checkout -q -- . && git clean -fdxq && exit $rc"
            ),
        ]
    elif task.language == "java":
        lines.append(_exec_form(maven_warm(task)))
    lines += [
        "LABEL "
        + " ".join(
            f"{k}={json.dumps(v)}"
            for k, v in (
                ("org.opencontainers.image.title", task.instance_id),
                ("org.opencontainers.image.source", task.repo),
                ("org.opencontainers.image.revision", task.base_commit),
            )
        ),
        "",
    ]
    return "\n".join(lines)


def _context(dockerfile: str, files: Path | None, patch: str = "") -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        data = dockerfile.encode()
        info = tarfile.TarInfo("Dockerfile")
        info.size = len(data)
        info.mtime = 0
        tar.addfile(info, io.BytesIO(data))
        if files is not None:
            tar.add(str(files), arcname="repo")
        if patch:
            data = patch.encode()
            info = tarfile.TarInfo(WARM_PATCH)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def _stream_lines(chunks: Iterable[Mapping[str, Any]]) -> Iterator[tuple[str, str]]:
    """("stream" | "error", text) for each line of the engine's build output."""
    for chunk in chunks:
        if "error" in chunk or "errorDetail" in chunk:
            detail = chunk.get("errorDetail") or {}
            yield "error", str(chunk.get("error") or detail.get("message") or chunk)
        for line in str(chunk.get("stream") or "").splitlines():
            if line.strip():
                yield "stream", line.rstrip()


def environment_layer(prefix: str, toolchain: str, task: Task, jest: Path | None = None) -> Layer:
    """The environment layer of `task` on `toolchain`. A JavaScript task's copies in `jest`,
    the local sandboxes' shared Jest install (:func:`crl_worker.sandbox.node.ensure_jest`),
    so the image needs ``node`` only; its lock file's digest is part of the layer's tag."""
    files, identity = None, ""
    if task.language == "javascript":
        if jest is None:
            raise ImageBuildError(f"{task.instance_id}: a JavaScript task's image needs Jest")
        files = jest
        identity = hashlib.sha256(
            (node.MANIFEST_DIR / "package-lock.json").read_bytes()
        ).hexdigest()
    return Layer(
        "environment",
        f"{prefix}-env/{_safe(task.owner)}__{_safe(task.name)}",
        environment_dockerfile(toolchain, task),
        toolchain,
        identity=identity,
        files=files,
    )


class TaskImageBuilder:
    """Builds the three layers of each task's image with a Docker engine.

    `bases`: base image per language (``{python}`` is replaced by the task's version).
    `prefix`: the first part of every image name (a registry path such as
    ``registry.example.com/team/crl`` names where the images will be pushed).
    `network`: the build's network mode (install commands fetch packages).
    `no_cache`: build every step again, even where the engine's build cache holds it (a
    layer whose content tag exists is still reused: remove the image to rebuild it).
    """

    def __init__(
        self,
        client: docker.DockerClient,
        *,
        prefix: str = "crl",
        bases: Mapping[str, str] | None = None,
        network: str | None = "host",
        no_cache: bool = False,
    ) -> None:
        self.client = client
        self.prefix = prefix.rstrip("/")
        self.bases = {**DEFAULT_BASES, **(bases or {})}
        self.network = network
        self.no_cache = no_cache
        self._locks: dict[tuple[int, str], asyncio.Lock] = {}

    @classmethod
    def connect(cls, base_url: str | None = None, **kwargs: Any) -> TaskImageBuilder:
        """A builder on the engine at `base_url` (default: ``DOCKER_HOST`` or the local
        socket); a clear :class:`SandboxError` when the engine cannot be reached."""
        return cls(connect(base_url), **kwargs)

    # --- layers ---------------------------------------------------------------------------

    def base_of(self, task: Task) -> str:
        """The base image `task` starts from."""
        base = self.bases.get(task.language)
        if base is None:
            raise ImageBuildError(
                f"{task.instance_id}: no base image for {task.language} tasks; give one with "
                f"--base {task.language}=IMAGE"
            )
        return base.replace("{python}", task.python or DEFAULT_PYTHON)

    def _image_id(self, ref: str) -> str:
        try:
            return str(self.client.images.get(ref).id)
        except docker.errors.ImageNotFound:
            return ref  # pulled by the build: its name stands for it
        except docker.errors.DockerException as exc:
            raise SandboxError(f"cannot inspect image {ref}: {exc}") from exc

    def tag_of(self, layer: Layer) -> str:
        """`layer`'s name and content tag (hash of its Dockerfile, parent id and files)."""
        digest = hashlib.sha256()
        parts = [layer.dockerfile, self._image_id(layer.parent), layer.identity]
        for part in parts + ([layer.patch] if layer.patch else []):
            digest.update(part.encode())
            digest.update(b"\0")
        return f"{layer.repository}:{digest.hexdigest()[:20]}"

    def _exists(self, tag: str) -> bool:
        try:
            self.client.images.get(tag)
        except docker.errors.ImageNotFound:
            return False
        return True

    def _build(self, task: Task, layer: Layer, tag: str) -> None:
        """Build `layer` as `tag` (blocking); an :class:`ImageBuildError` naming the step."""
        context = _context(layer.dockerfile, layer.files, layer.patch)
        step, tail = "before the first step", list[str]()
        try:
            chunks = self.client.api.build(
                fileobj=io.BytesIO(context),
                custom_context=True,
                tag=tag,
                rm=True,
                forcerm=True,
                decode=True,
                network_mode=self.network,
                nocache=self.no_cache,
            )
            for kind, text in _stream_lines(chunks):
                if kind == "error":
                    raise ImageBuildError(
                        f"{task.instance_id}: the {layer.kind} image failed at {step}: {text}"
                        + ("\n" + "\n".join(tail[-_TAIL:]) if tail else "")
                    )
                match = _STEP.match(text)
                if match:
                    step = f"step {match[1]}/{match[2]} ({_short(match[3])})"
                    tail = []
                else:
                    tail.append(text)
        except docker.errors.DockerException as exc:
            raise ImageBuildError(
                f"{task.instance_id}: the {layer.kind} image failed at {step}: {exc}"
            ) from exc

    async def _ensure(self, task: Task, layer: Layer, result: TaskImage) -> str:
        tag = await asyncio.to_thread(self.tag_of, layer)
        # One lock per layer and event loop (a lock belongs to the loop it was made in).
        lock = self._locks.setdefault((id(asyncio.get_running_loop()), tag), asyncio.Lock())
        async with lock:  # tasks sharing a layer build it once
            if not await asyncio.to_thread(self._exists, tag):
                started = time.perf_counter()
                await asyncio.to_thread(self._build, task, layer, tag)
                logger.info(
                    "%s: built %s in %.1f s", task.instance_id, tag, time.perf_counter() - started
                )
                result.built.append(layer.kind)
        return tag

    async def build(self, task: Task) -> TaskImage:
        """Build (or find) the three layers of `task`'s image; errors are in the result."""
        result = TaskImage(task.instance_id)
        started = time.perf_counter()
        checkout: Path | None = None
        try:
            toolchain = await self._ensure(
                task,
                Layer(
                    "toolchain",
                    f"{self.prefix}-toolchain",
                    toolchain_dockerfile(self.base_of(task)),
                    self.base_of(task),
                ),
                result,
            )
            jest = None
            if task.language == "javascript":  # npm ci once per machine, as for local sandboxes
                jest = await asyncio.to_thread(node.ensure_jest)
            environment = await self._ensure(
                task, environment_layer(self.prefix, toolchain, task, jest), result
            )
            recipe = instance_dockerfile(environment, task)
            repository = f"{self.prefix}-task/{_safe(task.instance_id)}"
            patch = task.test_patch if WARM_PATCH in recipe else ""
            probe = Layer(
                "instance", repository, recipe, environment, identity=task.base_commit, patch=patch
            )
            tag = await asyncio.to_thread(self.tag_of, probe)
            if not await asyncio.to_thread(self._exists, tag):
                checkout = Path(tempfile.mkdtemp(prefix="crl-image-"))
                await standalone_checkout(task, checkout / "repo")
                await self._ensure(
                    task,
                    Layer(
                        "instance",
                        repository,
                        recipe,
                        environment,
                        identity=task.base_commit,
                        files=checkout / "repo",
                        patch=patch,
                    ),
                    result,
                )
            result.image = tag
        except SandboxError as exc:
            result.error = str(exc)
        finally:
            if checkout is not None:
                await asyncio.to_thread(shutil.rmtree, checkout, True)
            result.seconds = time.perf_counter() - started
        return result

    async def build_all(
        self,
        tasks: Iterable[Task],
        *,
        jobs: int = 1,
        progress: Callable[[TaskImage], None] | None = None,
    ) -> list[TaskImage]:
        """Build every task's image, `jobs` at a time; results in the tasks' order."""
        gate = asyncio.Semaphore(max(1, jobs))

        async def one(task: Task) -> TaskImage:
            async with gate:
                found = await self.build(task)
            if progress is not None:
                progress(found)
            return found

        return list(await asyncio.gather(*(one(t) for t in tasks)))


def _short(instruction: str, limit: int = 100) -> str:
    text = " ".join(instruction.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


async def standalone_checkout(task: Task, dest: Path) -> None:
    """The local sandbox's checkout of `task` in `dest`, made self-contained for an image:
    the objects it borrows from the host's cache are copied in (``git repack -a``)."""
    await repos.checkout(task, dest, timeout=task.timeouts.setup)
    what = f"task {task.instance_id}: packing the checkout"
    await repos.git("repack", "-a", "-d", "-q", cwd=dest, what=what, timeout=task.timeouts.setup)
    (dest / ".git" / "objects" / "info" / "alternates").unlink(missing_ok=True)
