"""Sandbox backend configurations: one pydantic model per backend, told apart by ``type``.

The models live here, apart from the backends, so that validating a config never imports the
Docker or Kubernetes clients. The Kubernetes backend defines its own model next to its code.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from crl_worker.sandbox.limits import parse_size

#: Worker variables a local sandbox inherits by default: network, TLS, package indexes, caches.
DEFAULT_PASSTHROUGH: tuple[str, ...] = (
    "http_proxy", "https_proxy", "no_proxy", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY",
    "SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "GIT_SSL_CAINFO",
    "NODE_EXTRA_CA_CERTS", "PIP_CERT", "PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_FIND_LINKS",
    "PIP_DEFAULT_TIMEOUT", "PIP_CACHE_DIR", "UV_INDEX_URL", "UV_EXTRA_INDEX_URL", "UV_NATIVE_TLS",
    "UV_CACHE_DIR", "MAVEN_OPTS", "GRADLE_USER_HOME", "GOPROXY", "GOMODCACHE", "GOCACHE",
)  # fmt: skip


class LocalSandboxConfig(BaseModel):
    """A sandbox on this machine: a temporary clone and a shell process (the default)."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["local"] = "local"
    root: str | None = None
    """Directory the sandboxes' temporary folders are made in (default: the system temp dir)."""
    missing_python: Literal["error", "fallback"] = "error"
    """When the interpreter a task asks for is not installed: fail (``error``), or use the
    default interpreter with a logged warning (``fallback``)."""
    default_python: str | None = None
    """Interpreter version for Python tasks that name none (default: ``python3`` on PATH)."""
    use_uv: bool = True
    """Create virtual environments with ``uv venv --seed`` when uv is installed (much faster;
    pip from uv's cache, else one request to the package index); otherwise, or when uv fails,
    with ``python -m venv``."""
    system_site_packages: bool = False
    """Give the virtual environment the interpreter's own site-packages."""
    env_passthrough: list[str] = Field(default_factory=lambda: list(DEFAULT_PASSTHROUGH))
    """Variables copied from the worker's environment into the sandbox's when set (the rest of
    the worker's environment, credentials included, stays out). The default list holds proxy,
    certificate, package-index and cache settings, which installs need."""
    tools: list[str] = Field(default_factory=list)
    """Host commands the sandbox may run besides the task's environment and the system
    directories (``PATH`` does not continue into the worker's): each is linked into the sandbox's
    ``tools`` folder when found on the worker's ``PATH``, e.g. ``["node", "make"]``. ``git`` and
    ``patch`` always are, and ``mvn``/``gradle`` for Java tasks."""
    keep: bool = False
    """Leave the sandbox's folder in place on close (for debugging)."""
    isolation: Literal["auto", "namespaces", "none"] = "auto"
    """How the sandbox's processes are kept apart from the worker's (docs/security.md):
    ``namespaces`` starts the shell in its own PID and mount namespaces (``unshare``), so it sees
    only its own processes (not the worker's environment) and every process it started dies when
    the sandbox closes, detached or not, and confines its files (the worker's ``HOME``, other
    sandboxes and the worker's environment hidden, everything else read-only but its own folder
    and a private ``/tmp``); a sandbox fails to start where either is unavailable.
    ``auto`` (default) uses them where available and otherwise runs without, with a warning.
    ``none`` runs the shell as a plain child process."""
    extra_paths: list[str] = Field(default_factory=list)
    """Host paths a confined sandbox also sees, read-only, e.g. ``["/opt/toolchain"]``. Where
    the machine allows, a confined sandbox's root holds only the system directories, a few files
    of ``/etc``, its toolchains and caches and its own folder (docs/security.md): a task that
    needs anything more of the host names it here. Absolute paths; one that does not exist is
    skipped."""
    network: Literal["none", "host"] = "none"
    """The network once the task's ``install`` commands have run: ``none`` (default) gives the
    shell a network namespace of its own with only a loopback interface (needs the namespaces
    and the file confinement of ``isolation``; where they are unavailable the host's network
    stays, with a warning, or the sandbox fails to start under ``namespaces``), so a candidate
    cannot fetch a fix, a later release or anything else while it works or is graded;
    ``host`` keeps the host's network throughout."""
    interrupt_grace: float = Field(default=1.0, gt=0)
    """Seconds a timed-out command gets to stop after SIGINT before it is killed."""
    start_timeout: float = Field(default=30, gt=0)
    """Seconds the shell may take to answer when started."""
    user: str | None = "nobody"
    """Who the agent's commands run as when the worker runs as root (and the sandbox is
    confined): a user name or ``uid[:gid]``. The task's ``install`` commands run as the worker;
    then the sandbox's folder becomes this user's, and the shell and the harness's scripts run
    as it, without capabilities. ``root`` or ``null``: as the worker. A worker that is not root
    runs sandboxes as its own user whatever this says."""
    mem_limit: str | None = "8g"
    """Memory each sandbox may use, e.g. ``8g`` or ``512m`` (its processes together, files it
    writes to its private ``/tmp`` included); past it the kernel kills a process of that sandbox
    and the command's result says it exceeded its memory limit. ``null``: no limit. Needs a
    cgroup of its own (docs/sandboxes.md, "Resource limits")."""
    pids_limit: int | None = Field(default=4096, ge=8)
    """Processes and threads each sandbox may have at once (a JVM counts each thread); past it
    ``fork`` fails, and the command's result says it exceeded its process limit. ``null``: no
    limit."""
    disk_limit: str | None = None
    """Space each sandbox may write, e.g. ``10g``: its folder (checkout, virtual environment,
    ``HOME``) becomes a tmpfs of that size, so writing past it fails with "No space left on
    device" and the command's result says the folder is full. It lives in memory (used only as
    written) and needs a worker running as root; ``null`` (default): the folder is on the disk
    of ``root``, bounded only by it. The private ``/tmp``, ``/var/tmp`` and ``/dev/shm`` are
    512 MiB each either way."""
    cpus: float | None = Field(default=None, gt=0)
    """CPU each sandbox may use, in cores (``1.5``); ``null`` (default): all of the machine's."""

    @field_validator("mem_limit", "disk_limit")
    @classmethod
    def _size(cls, value: str | None) -> str | None:
        if value is not None and parse_size(value) < 16 << 20:
            raise ValueError(f"{value!r} is below 16m: no sandbox fits in that")
        return value

    @field_validator("extra_paths")
    @classmethod
    def _absolute(cls, value: list[str]) -> list[str]:
        for path in value:
            if not path.startswith("/"):
                raise ValueError(f"extra path {path!r} is relative: give an absolute path")
        return value


class DockerSandboxConfig(BaseModel):
    """A sandbox in a Docker container made from the task's image (workstations)."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["docker"] = "docker"
    base_url: str | None = None
    """Docker engine address (default: ``DOCKER_HOST`` or the local socket)."""
    image: str | None = None
    """Image to use instead of the task's ``image``; ``{instance_id}``, ``{repo}``, ``{owner}``
    and ``{name}`` are filled in."""
    pull: Literal["missing", "always", "never"] = "missing"
    """When to pull the image."""
    network: str = Field(default="none", min_length=1)
    """Docker network mode of the sandbox's container: ``none`` (default) gives it only a
    loopback interface, so a candidate cannot fetch a fix, a later release or anything else
    while it works or is graded (the task's install ran when its image was built, with the
    network: :class:`~crl_worker.sandbox.images.TaskImageBuilder`; a Maven build's plugins and
    dependencies are fetched then); ``bridge``, ``host`` or a network's name give it that
    network throughout."""
    mem_limit: str | None = None
    """Memory limit, e.g. ``8g``."""
    cpus: float | None = Field(default=None, gt=0)
    """CPU limit."""
    user: str | None = None
    """User the shell runs as (default: the image's)."""
    platform: str | None = None
    """Image platform, e.g. ``linux/amd64``."""
    interrupt_grace: float = Field(default=1.0, gt=0)
    """Seconds a timed-out command gets to stop after SIGINT before it is killed."""
    start_timeout: float = Field(default=600, gt=0)
    """Seconds pulling and starting the container may take."""


SandboxConfig = Annotated[LocalSandboxConfig | DockerSandboxConfig, Field(discriminator="type")]
"""The built-in backends' configs (the registry also takes the Kubernetes one)."""
