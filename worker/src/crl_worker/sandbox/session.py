"""The shell-session framing every sandbox backend shares, over any pair of async byte streams.

One interactive ``bash`` per sandbox reads commands from its standard input and writes to its
standard output; the transport is the backend's business (local pipes, a Docker exec socket, a
Kubernetes exec websocket). :class:`ShellSession` needs only a reader with ``await read(n)`` and a
writer with ``write(data)`` / ``await drain()`` / ``close()`` (an asyncio ``StreamReader`` /
``StreamWriter`` pair fits), plus a way to signal the shell's process group out of band.

Framing. Each command travels as one line::

    printf '%s%s\\n' N1 N2B; __crl_rc=0; . /dev/fd/3 3<<<$'<command>' </dev/null 2>&1 \
    || __crl_rc=$?; printf '%s%s%d\\n' N1 N2E "$__crl_rc"

``N1``/``N2`` are the two halves of a random per-session nonce: the full marker (``N1N2B``,
``N1N2E``) never appears in the input the shell echoes or traces (``set -x`` prints the halves
apart), so a command printing marker-like strings cannot fake the end of its output. The output
is everything between the begin marker's line and the end marker, byte for byte: output without
a trailing newline, binary garbage and fake markers come back exactly. The command is quoted with
ANSI-C quoting in which every byte outside printable ASCII is escaped, so the line on the wire is
plain ASCII whatever the command holds (heredocs, quotes, control characters). Sourcing keeps
``cd`` and ``export`` in the shell itself; ``</dev/null`` keeps a command from eating the framing
from standard input; ``|| __crl_rc=$?`` keeps a ``set -e`` the agent typed from ending the shell.
The command is *sourced* from a here-string rather than ``eval``-ed: while sourcing, bash does not
act interactive, so it prints no job notices (``[1] 12345`` after ``cmd &``) into the output,
yet a SIGINT still abandons the whole command, loops included.

Why an interactive shell: on SIGINT an interactive bash abandons the current command line (even a
pure shell loop such as ``while :; do :; done``) and goes back to reading input, where a
non-interactive one would die. Without a terminal it has no job control, so its foreground
commands share its process group and background jobs ignore SIGINT: a SIGINT to the group stops
the command, keeps the shell and keeps earlier ``cmd &`` jobs running.

Timeouts. When a command runs past its timeout the session asks the backend to send SIGINT to the
shell's process group, then writes a resynchronisation line (a third marker with a counter) and
reads up to it; a command that ignores SIGINT gets SIGKILL (every process of the group except the
shell) after a grace period. If the shell still does not answer, the session is declared dead.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import secrets
import signal
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Protocol, TypeVar

from crl_worker.errors import SandboxError
from crl_worker.sandbox.base import DEFAULT_MAX_OUTPUT, CommandResult

logger = logging.getLogger(__name__)

T = TypeVar("T")

#: The command line that starts the session's shell in every backend.
SHELL_ARGV: tuple[str, ...] = ("bash", "--noprofile", "--norc", "--noediting", "-i")

#: Environment every backend gives the shell: commands see no terminal, but some tools still
#: page or colour their output unless told not to.
SESSION_ENV: Mapping[str, str] = {
    "TERM": "dumb",
    "PAGER": "cat",
    "GIT_PAGER": "cat",
    "MANPAGER": "cat",
    "SYSTEMD_PAGER": "",
    "LESS": "-R",
    "NO_COLOR": "1",
    "PIP_PROGRESS_BAR": "off",
    "PIP_DISABLE_PIP_VERSION_CHECK": "1",
    "PIP_NO_INPUT": "1",
    "GIT_TERMINAL_PROMPT": "0",
    "DEBIAN_FRONTEND": "noninteractive",
}

_READ_CHUNK = 1 << 16
_RC_RE = re.compile(rb"(-?\d+)\n")


class ByteReader(Protocol):
    """The read half of a transport (``asyncio.StreamReader`` fits)."""

    async def read(self, n: int = -1) -> bytes:
        """Return up to ``n`` bytes; ``b""`` at end of stream."""
        ...


class ByteWriter(Protocol):
    """The write half of a transport (``asyncio.StreamWriter`` fits)."""

    def write(self, data: bytes) -> None:
        """Queue ``data`` for sending."""
        ...

    async def drain(self) -> None:
        """Wait until the queued data may be sent."""
        ...

    def close(self) -> None:
        """Close the stream (the shell then reads end of file)."""
        ...


Signaller = Callable[[int, "ShellProcess"], Awaitable[None]]
"""Deliver a signal out of band. ``SIGINT``: to the shell's whole process group (the interactive
shell survives it). ``SIGKILL``: to every process of that group except the shell itself."""


@dataclass(frozen=True)
class ShellProcess:
    """Identity of the session's shell as the shell itself reported it at start."""

    pid: int
    pgid: int


@dataclass
class SessionResult:
    """What one command returned, as bytes."""

    exit_code: int | None
    head: bytes
    tail: bytes
    omitted: int
    timed_out: bool
    duration: float

    @property
    def output(self) -> bytes:
        """The kept output (head and tail joined; whole when nothing was omitted)."""
        return self.head + self.tail

    @property
    def truncated(self) -> bool:
        """Whether bytes beyond the cap were dropped."""
        return self.omitted > 0

    def to_command_result(self) -> CommandResult:
        """Decode into the protocol's :class:`CommandResult` (UTF-8 with replacement)."""
        if self.omitted:
            # Decode the two halves apart so a character cut at the seam spoils only itself.
            text = (
                self.head.decode("utf-8", "replace")
                + f"\n[... {self.omitted} bytes of output omitted ...]\n"
                + self.tail.decode("utf-8", "replace")
            )
        else:
            text = self.output.decode("utf-8", "replace")
        return CommandResult(
            exit_code=self.exit_code,
            output=text,
            timed_out=self.timed_out,
            truncated=self.truncated,
            duration=self.duration,
        )


class OutputCollector:
    """Keeps the first and the last bytes of a stream up to a cap, and counts the rest."""

    def __init__(self, cap: int) -> None:
        if cap < 0:
            raise ValueError(f"output cap must be >= 0, got {cap}")
        self._head_cap = cap // 2
        self._tail_cap = cap - self._head_cap
        self._head = bytearray()
        self._tail = bytearray()
        self.total = 0

    def feed(self, data: bytes) -> None:
        """Take the next bytes of the stream."""
        if not data:
            return
        self.total += len(data)
        room = self._head_cap - len(self._head)
        if room > 0:
            self._head += data[:room]
            data = data[room:]
        if data:
            self._tail += data
            # Trim lazily: amortised O(1) per byte instead of a copy on every chunk.
            if len(self._tail) > 2 * self._tail_cap + _READ_CHUNK:
                del self._tail[: len(self._tail) - self._tail_cap]

    def strip_suffix(self, pattern: re.Pattern[bytes]) -> None:
        """Remove a trailing match of ``pattern`` from the kept tail (or head)."""
        for buf in (self._tail, self._head):
            if buf:
                match = pattern.search(bytes(buf[-256:]))
                if match is not None and match.end() == len(buf[-256:]):
                    removed = len(match.group(0))
                    del buf[len(buf) - removed :]
                    self.total -= removed
                return

    def result(self) -> tuple[bytes, bytes, int]:
        """Head, tail, and the number of bytes dropped between them."""
        tail = bytes(self._tail[-self._tail_cap :]) if self._tail_cap else b""
        omitted = self.total - len(self._head) - len(tail)
        return bytes(self._head), tail, omitted


def end_line(end: bytes) -> re.Pattern[bytes]:
    """The end marker ``end`` with its exit code, as it may stand at the end of a timed-out
    command's output: whole, or cut short where the interrupt stopped bash's ``printf`` (no
    code or part of it, no newline; seen once in a thousand 0.1 ms timeouts on a loaded
    machine). Framing, never output: the nonce is joined only in the stream."""
    return re.compile(re.escape(end) + rb"-?\d*\n?\Z")


def quote_command(command: str) -> str:
    """Quote ``command`` as a bash ANSI-C string (``$'...'``) made of printable ASCII only."""
    out = ["$'"]
    for byte in command.encode("utf-8", "surrogateescape"):
        if byte == 0x5C:  # backslash
            out.append("\\\\")
        elif byte == 0x27:  # single quote
            out.append("\\'")
        elif 0x20 <= byte < 0x7F:
            out.append(chr(byte))
        else:
            out.append(f"\\x{byte:02x}")
    out.append("'")
    return "".join(out)


def remote_signal_script(sig: int, shell: ShellProcess) -> str:
    """A POSIX shell script doing what a :data:`Signaller` must, for backends that reach the
    sandbox only by running another command in it (Docker exec, Kubernetes exec).

    When the shell leads its own process group, the group is signalled (SIGKILL spares the
    shell). When it does not (an exec that did not start a new session), signalling the group
    could hit the container's init, so the shell's descendants are signalled one by one instead
    (plus the shell itself for SIGINT, which an interactive bash survives).
    """
    # 'kill -s NAME -- -PGID' is the spelling every POSIX shell's kill takes (dash's included).
    name = signal.Signals(sig).name.removeprefix("SIG")
    # Fields of /proc/PID/stat after the parenthesised command name: state ppid pgrp ...
    table = (
        "for f in /proc/[0-9]*/stat; do "
        'read -r line < "$f" 2>/dev/null || continue; '
        'rest=${line##*) }; set -- $rest; echo "${line%% *} $2 $3"; done'
    )
    if shell.pgid == shell.pid:
        if sig == signal.SIGINT:
            return f"kill -s {name} -- -{shell.pgid} 2>/dev/null; true"
        select = f"$3 == {shell.pgid} && $1 != {shell.pid} {{ print $1 }}"
    else:
        # Descendants of the shell: walk the parent links up from every process.
        select = (
            "{ parent[$1] = $2 } END { for (p in parent) { q = parent[p]; n = 0; "
            f'while (q != "" && q != 0 && n < 64) {{ if (q == {shell.pid}) {{ print p; break }} '
            "q = parent[q]; n++ } } }"
        )
        if sig == signal.SIGINT:
            select = select.replace("END {", f"END {{ print {shell.pid}; ", 1)
    kill = f'while read -r p; do kill -s {name} "$p" 2>/dev/null; done; true'
    return f"{table} | awk '{select}' | {kill}"


class ShellSession:
    """One framed interactive bash session over a byte-stream pair.

    The backend starts ``bash`` with :data:`SHELL_ARGV` (standard input and output connected to
    ``reader``/``writer``, standard error discarded or kept apart), then calls :meth:`start`.
    """

    def __init__(
        self,
        reader: ByteReader,
        writer: ByteWriter,
        *,
        signaller: Signaller,
        interrupt_grace: float = 1.0,
        kill_grace: float = 3.0,
        name: str = "sandbox",
    ) -> None:
        self._reader = reader
        self._writer = writer
        self._signaller = signaller
        self._interrupt_grace = interrupt_grace
        self._kill_grace = kill_grace
        self._name = name
        nonce = secrets.token_hex(12)
        # Two halves joined only in the output: see the module docstring.
        self._n1, self._n2 = nonce[:12], nonce[12:]
        self._begin = f"{nonce}B\n".encode()
        self._end = f"{nonce}E".encode()
        self._end_line = end_line(self._end)
        self._buf = bytearray()
        self._lock = asyncio.Lock()
        self._alive = False
        self._syncs = 0
        self.shell: ShellProcess | None = None

    @property
    def alive(self) -> bool:
        """Whether the shell still answers (false after end of stream or :meth:`close`)."""
        return self._alive

    async def start(self, *, timeout: float = 30.0) -> ShellProcess:
        """Configure the shell and wait until it answers; return its pid and process group."""
        ready = f"{self._n1}{self._n2}R ".encode()
        # PS1/PS2 empty: the prompt goes to stderr anyway, but keep it quiet where stderr is
        # merged. History and history expansion off: commands may contain '!'.
        line = (
            "PS1= PS2= PS3= PS4='+ '; unset PROMPT_COMMAND; set +H +o history +o monitor; "
            "__crl_s=; read -r __crl_s < /proc/$$/stat 2>/dev/null; __crl_a=(${__crl_s##*) }); "
            f'printf \'%s%s %d %s\\n\' {self._n1} {self._n2}R "$$" "${{__crl_a[2]:-$$}}"; '
            "unset __crl_s __crl_a\n"
        )
        self._alive = True
        try:
            async with asyncio.timeout(timeout):
                await self._send(line)
                await self._skip_to(ready)
                while b"\n" not in self._buf:
                    await self._fill()
        except TimeoutError:
            await self._die()
            raise SandboxError(
                f"{self._name}: the shell did not answer within {timeout:.0f} s of starting"
            ) from None
        eol = self._buf.index(b"\n")
        pid_s, pgid_s = bytes(self._buf[:eol]).split()
        del self._buf[: eol + 1]
        self.shell = ShellProcess(pid=int(pid_s), pgid=int(pgid_s))
        logger.debug("%s: shell started (pid %d)", self._name, self.shell.pid)
        return self.shell

    async def run(
        self,
        command: str,
        *,
        timeout: float | None = None,
        max_output: int = DEFAULT_MAX_OUTPUT,
    ) -> SessionResult:
        """Run ``command`` and return its exit code and capped output.

        Raises :class:`SandboxError` when the shell is gone or stops answering.
        """
        async with self._lock:
            if not self._alive or self.shell is None:
                raise SandboxError(f"{self._name}: the shell session is not running")
            collector = OutputCollector(max_output)
            started = time.monotonic()
            line = (
                f"printf '%s%s\\n' {self._n1} {self._n2}B; __crl_rc=0; "
                f". /dev/fd/3 3<<<{quote_command(command)} </dev/null 2>&1 || __crl_rc=$?; "
                f"printf '%s%s%d\\n' {self._n1} {self._n2}E \"$__crl_rc\"\n"
            )
            # Where the stream is when a timeout strikes: before the begin marker (the shell may
            # still be reading the line), in the output, or between the end marker and its code.
            phase = "begin"
            try:
                await self._send(line)
                try:
                    async with asyncio.timeout(timeout):
                        await self._skip_to(self._begin)
                        phase = "output"
                        await self._scan(self._end, collector.feed)
                        phase = "code"
                        exit_code = await self._read_exit_code()
                except TimeoutError:
                    if phase == "code":
                        # The command had ended: its exit code is in flight, not late.
                        exit_code = await self._finish(self._read_exit_code(), "its exit code")
                    else:
                        if phase == "begin":
                            await self._finish(self._skip_to(self._begin), "the command")
                        await self._interrupt(collector)
                        head, tail, omitted = collector.result()
                        return SessionResult(
                            None, head, tail, omitted, True, time.monotonic() - started
                        )
            except asyncio.CancelledError:
                # The stream is now somewhere inside a frame: the session cannot be trusted.
                await self._die()
                raise
            head, tail, omitted = collector.result()
            return SessionResult(exit_code, head, tail, omitted, False, time.monotonic() - started)

    async def close(self) -> None:
        """Stop using the session and close the write half (the shell reads end of file)."""
        self._alive = False
        try:
            self._writer.close()
        except Exception:
            logger.debug("%s: closing the writer failed", self._name, exc_info=True)

    # --- internals -------------------------------------------------------------------------

    async def _finish(self, step: Awaitable[T], what: str) -> T:
        """Complete a step of reading a frame that a timeout cut short, within a grace period.

        A timeout that strikes before the begin marker is not acted on at once: until the shell
        has started the command it may still be reading the command line, and bash drops the
        input it has buffered when SIGINT arrives, so the sync line written after the signal
        was lost now and then (the session then died), and the begin marker ended up in the
        output. Once the shell has printed it, it has parsed the whole line.
        """
        grace = max(5.0, self._interrupt_grace + self._kill_grace)
        try:
            async with asyncio.timeout(grace):
                return await step
        except TimeoutError:
            await self._die()
            raise SandboxError(
                f"{self._name}: the shell sent no {what} within {grace:.0f} s of a timeout; "
                "the sandbox must be recreated"
            ) from None

    async def _interrupt(self, collector: OutputCollector) -> None:
        """Stop the running command and read up to a fresh sync marker."""
        assert self.shell is not None
        self._syncs += 1
        sync = f"{self._n1}{self._n2}S{self._syncs}\n".encode()
        sync_line = f"printf '%s%s\\n' {self._n1} {self._n2}S{self._syncs}\n"
        logger.info("%s: command timed out, interrupting", self._name)
        scan: asyncio.Future[None] | None = None
        try:
            await self._signaller(signal.SIGINT, self.shell)
            await self._send(sync_line)
            scan = asyncio.ensure_future(self._scan(sync, collector.feed))
            if not await self._await_sync(scan, sync_line, self._interrupt_grace):
                logger.warning("%s: the command ignored SIGINT; killing its processes", self._name)
                await self._signaller(signal.SIGKILL, self.shell)
                if not await self._await_sync(scan, sync_line, self._kill_grace):
                    await self._die()
                    raise SandboxError(
                        f"{self._name}: the shell did not come back after a timed-out command "
                        "was interrupted and killed; the sandbox must be recreated"
                    )
        except SandboxError:
            raise
        except Exception as exc:
            await self._die()
            raise SandboxError(f"{self._name}: interrupting the command failed: {exc}") from exc
        finally:
            if scan is not None and not scan.done():
                scan.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await scan
        # The command may have ended on its own (and printed its end marker) just before the
        # signal; that line is framing, not output.
        collector.strip_suffix(self._end_line)

    async def _await_sync(self, scan: asyncio.Future[None], sync_line: str, grace: float) -> bool:
        """Wait up to ``grace`` seconds for ``scan`` (the read up to the sync marker); whether it
        completed. The sync line is sent again, with backoff, while it is not answered: bash
        drops the input it has buffered when a SIGINT reaches it while it reads (the command
        having just ended), and a line sent right after the signal was lost now and then. A
        copy answered after the first is stray output, skipped before the next command."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace
        interval = 0.05
        while True:
            left = deadline - loop.time()
            if left <= 0:
                return False
            done, _ = await asyncio.wait({scan}, timeout=min(interval, left))
            if done:
                scan.result()
                return True
            await self._send(sync_line)
            interval = min(interval * 2, 0.5)

    async def _send(self, line: str) -> None:
        try:
            self._writer.write(line.encode("ascii"))
            await self._writer.drain()
        except (ConnectionError, OSError, RuntimeError) as exc:
            await self._die()
            raise SandboxError(f"{self._name}: the shell session is gone ({exc})") from exc

    async def _fill(self) -> None:
        try:
            data = await self._reader.read(_READ_CHUNK)
        except (ConnectionError, OSError) as exc:
            await self._die()
            raise SandboxError(f"{self._name}: the shell session broke ({exc})") from exc
        if not data:
            await self._die()
            raise SandboxError(f"{self._name}: the shell exited; the sandbox must be recreated")
        self._buf += data

    async def _skip_to(self, marker: bytes) -> None:
        """Drop everything up to and including ``marker`` (stray output between commands)."""
        skipped = bytearray()

        def sink(data: bytes) -> None:
            if len(skipped) < 4096:
                skipped.extend(data[: 4096 - len(skipped)])

        await self._scan(marker, sink)
        if skipped.strip():
            logger.debug("%s: output between commands: %r", self._name, bytes(skipped))

    async def _scan(self, marker: bytes, sink: Callable[[bytes], None]) -> None:
        """Consume the stream through ``marker``, passing the bytes before it to ``sink``."""
        keep = len(marker) - 1
        while True:
            at = self._buf.find(marker)
            if at >= 0:
                sink(bytes(self._buf[:at]))
                del self._buf[: at + len(marker)]
                return
            if len(self._buf) > keep:
                cut = len(self._buf) - keep
                sink(bytes(self._buf[:cut]))
                del self._buf[:cut]
            await self._fill()

    async def _read_exit_code(self) -> int:
        while True:
            match = _RC_RE.match(bytes(self._buf[:32]))
            if match is not None:
                del self._buf[: match.end()]
                return int(match.group(1))
            if len(self._buf) > 32:
                await self._die()
                raise SandboxError(
                    f"{self._name}: malformed frame after a command: {bytes(self._buf[:32])!r}"
                )
            await self._fill()

    async def _die(self) -> None:
        self._alive = False
        try:
            self._writer.close()
        except Exception:
            logger.debug("%s: closing a broken writer failed", self._name, exc_info=True)
