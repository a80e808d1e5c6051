r"""Go, Rust and C++ test runs the candidate's code cannot read the hidden tests in.

A polyglot exercise's hidden tests are compiled into one binary with the candidate's code, which
runs first (Go: an ``init`` function; Rust: a function in ``.init_array``; C++: a static
initializer) and owns the
process's output: it can print the runner's framing for every test it knows of and exit before
any test runs. Canaries (:mod:`crl_worker.harness.mutants_native`) catch a forger that does not
tell them apart; the integrity check's run (:func:`harden`) makes telling them apart, or even
learning the real tests' names, a matter of taking the binary apart:

- **Go**: the test binary is built (``go test -c``), the hidden ``*_test.go`` files are removed,
  then the binary runs under ``go tool test2json`` from the package's folder; a package that
  embeds files (``//go:embed``, which could carry the test files into the binary) is graded a
  build failure;
- **Rust**: the library is built with the hidden test files away (so ``include_str!``,
  ``#[path]`` or ``include!`` of them does not compile), then the integration tests
  (``--test '*'``: the hidden tests, not the candidate's own unit or doc tests) against that
  same library (a library rebuilt once the tests are there is a build failure), then their
  binaries are copied out, the hidden files and ``target/`` removed, and the binaries run from the
  crate's folder;
- **C++** (Catch2): the test binary is built as the task's command builds it, the hidden test
  sources are removed, then the binary runs. Its build is not split: a solution that
  ``#include``\ s the test file is not stopped here (the canaries still are);
- **ids**: a run that reports a passing test the harness did not plant or list
  (:func:`unexpected`) is tampered: a forger that prints the exercise's published test names is
  caught, since the real tests run under drawn names.

Only the polyglot format's own commands (``cd DIR && go test -json ./...``, ``cd DIR && cargo
test --offline --test '*' -- ARGS``, the CMake build and Catch2 run) are rewritten; another
command runs as it is, with the canaries but no id check (:func:`settle`).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Collection, Mapping

from crl_worker.harness.canary import Canary
from crl_worker.harness.parsers import go_events
from crl_worker.harness.result import TestStatus
from crl_worker.tasks.model import Task

_CPP_COMMAND = re.compile(
    r"^cd (?P<dir>\S+) && (?P<build>cmake -S \. -B build .* && cmake --build build --target \S+)"
    r" && (?P<run>\./build/\S+ --reporter junit --out \S+)$"
)
_GO_COMMAND = re.compile(r"^cd (?P<dir>\S+) && go test -json \./\.\.\.$")
_CARGO_COMMAND = re.compile(
    r"^cd (?P<dir>\S+) && cargo test --offline --test '\*' -- (?P<args>.*)$"
)
#: The polyglot format's Jest command (``polyglot_test_spec``): its lists name every test.
_JEST_COMMAND = re.compile(
    r"^cd \S+ && sed -i -E .* && \{ jest --ci --no-cache --runInBand --config '\{\}' --json "
)
#: Starts a line of the hardened run's own (printed before any of the candidate's code runs)
#: saying what of the candidate's answer makes it tampered with.
REFUSED = "crl-integrity: refused: "
#: The exit status of a hardened run whose toolchain is older than the run needs (Go 1.20 for
#: test2json's framing, Rust 1.66 for ``std::hint::black_box`` in the canaries): it reports no
#: test, so grading calls it an environment error, never a wrong answer.
OLD_TOOLCHAIN = 86


def _needs(version: str, prefix: str, minor: int) -> list[str]:
    """Lines that stop the run with :data:`OLD_TOOLCHAIN` unless ``version`` (a command that
    prints the toolchain's version) prints ``prefix`` and a minor version of at least
    ``minor`` (``go1.20``, ``rustc 1.66``)."""
    return [
        f"__crl_v=$({version} 2>/dev/null); __crl_m=${{__crl_v#{prefix}}}",
        "__crl_m=${__crl_m%%[!0-9]*}",
        f'if [ -z "$__crl_m" ] || [ "$__crl_m" -lt {minor} ]; then',
        f'  echo "crl-integrity: ${{__crl_v:-no version}} is older than this run needs'
        f' ({prefix}{minor})"',
        f"  exit {OLD_TOOLCHAIN}",
        "fi",
    ]


#: A build failure as test2json reports one (``parse_go_json`` records the package ``ERROR``).
_GO_FAILED = '{"Action":"fail","Package":"%s","FailedBuild":"%s"}\\n'


def _relative(paths: Collection[str], folder: str) -> list[str] | None:
    """``paths`` relative to ``folder``, or ``None`` when one is not under it."""
    prefix = folder.rstrip("/") + "/"
    if any(not p.startswith(prefix) for p in paths):
        return None
    return [p[len(prefix) :] for p in paths]


def _go(folder: str, hidden: list[str]) -> str:
    files = " ".join(shlex.quote(f) for f in hidden)
    return "\n".join(
        [
            f"cd {shlex.quote(folder)} || exit 1",
            *_needs("go env GOVERSION", "go1.", 20),
            "__crl_t=$(mktemp -d) || exit 1",
            "trap 'rm -rf \"$__crl_t\"' EXIT",
            # No module index: loading a package may write one to the build cache, which a local
            # sandbox shares read-only, and a failed write there fails the load.
            '__crl_godebug="${GODEBUG-}"; export GODEBUG="${GODEBUG:+$GODEBUG,}goindex=0"',
            "__crl_p=$(go list -e -f '{{.ImportPath}}' .) || exit 1",
            '__crl_e=$(go list -e -f \'{{join .EmbedFiles " "}}{{join .TestEmbedFiles " "}}'
            '{{join .XTestEmbedFiles " "}}\' .)',
            'if [ -n "$__crl_e" ]; then',
            f'  echo "{REFUSED}the package embeds files ($__crl_e)"',
            f"  printf '{_GO_FAILED}' \"$__crl_p\" 'embedded files'; exit 1",
            "fi",
            'if ! go test -c -o "$__crl_t/crl.test" . 2>&1; then',
            f"  printf '{_GO_FAILED}' \"$__crl_p\" 'build failed'; exit 1",
            "fi",
            f"rm -f -- {files}",
            'GODEBUG="$__crl_godebug"',
            'go tool test2json -t -p "$__crl_p" "$__crl_t/crl.test" -test.v=test2json'
            " -test.paniconexit0",
        ]
    )


def _cargo(folder: str, hidden: list[str], args: str) -> str:
    files = " ".join(shlex.quote(f) for f in hidden)
    # One test at a time: a copy runs beside the test it copies otherwise, and tests that write
    # and remove files of fixed names (Exercism's grep) race with their copies: a test failed,
    # or a panic while dropping aborted the binary and the tests after it went unreported.
    threads = "" if "--test-threads" in args else " --test-threads=1"
    fail = f"echo '{REFUSED}{{}}'; echo 'error: could not compile `crl-hidden-tests`'; exit 1"
    return "\n".join(
        [
            f"cd {shlex.quote(folder)} || exit 1",
            *_needs("rustc --version", "rustc 1.", 66),
            "__crl_t=$(mktemp -d) || exit 1",
            "trap 'rm -rf \"$__crl_t\"' EXIT",
            f'tar -cf "$__crl_t/hidden.tar" -- {files} && rm -f -- {files} || exit 1',
            "cargo build --offline --lib 2>&1 || exit 1",
            'tar -xf "$__crl_t/hidden.tar" && rm -f "$__crl_t/hidden.tar" || exit 1',
            "cargo test --offline --no-run --test '*' --message-format=json-render-diagnostics"
            ' > "$__crl_t/build.json" || exit 1',
            'if grep -q \'"kind":\\["lib"\\].*"fresh":false\' "$__crl_t/build.json"; then',
            "  " + fail.format("the library was rebuilt once the tests were there"),
            "fi",
            "__crl_n=0",
            "while read -r __crl_x; do",
            '  __crl_n=$((__crl_n + 1)); cp -- "$__crl_x" "$__crl_t/test-$__crl_n" || exit 1',
            'done < <(sed -n \'s/.*"kind":\\["test"\\].*"executable":"\\([^"]*\\)".*/\\1/p\''
            ' "$__crl_t/build.json")',
            f"rm -rf -- {files} target",
            "__crl_rc=0",
            'for __crl_i in $(seq 1 "$__crl_n"); do',
            f'  "$__crl_t/test-$__crl_i" {args}{threads} || __crl_rc=1',
            "done",
            'exit "$__crl_rc"',
        ]
    )


def harden(command: str, log_format: str, hidden: Collection[str]) -> str | None:
    """``command`` (the task's test command) as a run the candidate's code cannot read the
    ``hidden`` test files (paths from the repository's root) in, or ``None`` when it is not a
    command this knows (see the module's docstring)."""
    if log_format == "go":
        match = _GO_COMMAND.match(command)
        # Only a package's own test files: one in a sub-package would not be built here.
        go_files = [h for h in hidden if h.endswith("_test.go")]
        relative = _relative(go_files, match.group("dir")) if match else None
        if match is None or not relative or any("/" in f for f in relative):
            return None
        script = _go(match.group("dir"), relative)
    elif log_format == "cargo":
        match = _CARGO_COMMAND.match(command)
        rust_files = [h for h in hidden if h.endswith(".rs")]
        relative = _relative(rust_files, match.group("dir")) if match else None
        if match is None or not relative:
            return None
        script = _cargo(match.group("dir"), relative, match.group("args") or "")
    elif log_format == "junit":
        match = _CPP_COMMAND.match(command)
        cpp_files = [h for h in hidden if h.endswith(".cpp")]
        relative = _relative(cpp_files, match.group("dir")) if match else None
        if match is None or not relative:
            return None
        files = " ".join(shlex.quote(f) for f in relative)
        build, run = match.group("build"), match.group("run")
        script = f"cd {shlex.quote(match.group('dir'))} && {build} && rm -f -- {files} && {run}"
    else:
        return None
    return f"bash -c {shlex.quote(script)}"


def unexpected(
    statuses: Mapping[str, TestStatus], known: Collection[str], separator: str
) -> str | None:
    """Why a run is tampered with: it reports a passing test that is none of ``known`` (the
    task's tests and the canaries, by the ids the run gives them), a subtest or parameter of one
    (after ``separator``) nor the test a known subtest belongs to; ``None`` when every passing
    test is known."""
    listed = set(known)
    # The test a listed subtest or section belongs to (Catch2 reports a test case's own
    # assertions outside its sections under the test case's name: the check every test ends
    # with is one).
    listed |= {i.partition(separator)[0] for i in known if separator in i}
    odd = sorted(
        test_id
        for test_id, status in statuses.items()
        if status is TestStatus.PASSED
        and test_id not in listed
        and test_id.partition(separator)[0] not in listed
    )
    if not odd:
        return None
    shown = ", ".join(odd[:10]) + (f" and {len(odd) - 10} more" if len(odd) > 10 else "")
    return (
        f"the run reports passing tests the harness neither planted nor lists ({shown}): "
        "the test run was tampered with"
    )


def hardened_run(test_command: str, command: str, log_format: str) -> bool:
    """Whether a native run (``command``, made of the task's ``test_command``) is the polyglot
    format's own, whose ids :func:`settle` checks for unknown passing ones: a rewritten
    command (:func:`harden`), or the format's Jest command (run as it is: the spec file is
    Jest's to read, and the candidate's module runs in Jest's process either way)."""
    if log_format == "jest":
        return _JEST_COMMAND.match(test_command) is not None
    return command != test_command


def go_packages(log: str) -> set[str]:
    """The packages ``go test -json`` output (``log``) reports a result of their own for."""
    found: set[str] = set()
    for event in go_events(log):
        if event.get("Action") in ("pass", "fail"):
            package = event.get("Package")
            if isinstance(package, str) and package and not event.get("Test"):
                found.add(package)
    return found


def settle(
    statuses: Mapping[str, TestStatus],
    log: str,
    log_format: str,
    task: Task,
    canary: Canary | None,
    *,
    hardened: bool = True,
) -> tuple[dict[str, TestStatus], str | None]:
    """A native (Go, Rust, C++) or Jest canary run's statuses as grading reads them, and why the run is
    tampered with (:func:`unexpected`; a refusal of the hardened run: :data:`REFUSED`), if it
    is. ``task`` is the task as the run was built
    (:func:`~crl_worker.harness.canary.with_canary`: the ids the run gives its tests).
    Unknown passing ids count only in a ``hardened`` run (the polyglot format's own command,
    whose lists name every test its reference run reported); another task's lists may leave
    tests out.

    A Go package's own result fails with its canaries; it is the result of the package's other
    tests here (passed when each of them passed; a build failure stays an error). When the
    build failed, the canaries failed with it."""
    settled = dict(statuses)
    separator = canary.separator if canary is not None else "["
    planted = set(canary.ids) if canary is not None else set()
    # A Go copy whose canary is one subtest (``TestCopy/row``): the copy and its other subtests
    # are planted too (they pass or fail as the test's own rows do, and are not graded).
    planted |= {i.partition(separator)[0] for i in planted}

    def is_canary(test_id: str) -> bool:
        return test_id in planted or test_id.partition(separator)[0] in planted

    packages = go_packages(log) if log_format == "go" else set()
    if any(
        s is TestStatus.ERROR and (i in packages or i.endswith(" [build failed]"))
        for i, s in settled.items()
    ):
        # Nothing ran: the canaries failed with the build (an answer that does not compile, or
        # that embeds files), which is no tampering.
        settled.update(dict.fromkeys(planted, TestStatus.ERROR))
    tests = {*task.fail_to_pass, *task.pass_to_pass}
    if log_format == "jest" and not any(i in tests for i in settled):
        # No test of the spec reported (it failed to run: the candidate's module does not
        # parse, or ended the process): the canaries did not run either, which is no tampering.
        settled.update(dict.fromkeys(planted, TestStatus.ERROR))
    if log_format == "go":
        others = [s for i, s in settled.items() if i not in packages and not is_canary(i)]
        for package in packages:
            if settled.get(package) is TestStatus.FAILED and others:
                passed = all(s is TestStatus.PASSED for s in others)
                settled[package] = TestStatus.PASSED if passed else TestStatus.FAILED
    known = [*task.fail_to_pass, *task.pass_to_pass, *planted]
    refused = [line[len(REFUSED) :] for line in log.splitlines() if line.startswith(REFUSED)]
    why = [f"{r}: the test run was tampered with" for r in refused[:1]]
    odd = unexpected(settled, known, separator) if hardened else None
    return settled, "; ".join([*why, *filter(None, [odd])]) or None
