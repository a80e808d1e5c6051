"""Harness recipes: how to provision and test each repository, since the records do not say.

SWE-bench records carry a repository and a version but no commands. This module holds our own
table (written from the public SWE-bench harness's documented behaviour, not copied from it) of
what a Python instance needs: interpreter version, install commands, test command, log format,
environment. Java recipes describe a Maven or Gradle build that leaves JUnit XML reports.

The install commands run once in the repository's workdir with the target interpreter first on
``PATH`` (``python`` and ``pip`` are the task's own virtual environment in a local sandbox); a
container image built by SWE-bench already holds their result. Recipes marked ``image_only``
need compiled builds (C extensions, system libraries) that we do not reproduce outside the
image: their ``install`` is empty and the task needs its image.
"""

from __future__ import annotations

import logging
import re
import shlex
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Literal

from crl_worker.tasks.model import Language, LogFormat, TestSpec

logger = logging.getLogger(__name__)

Select = Literal["files", "ids"]
BuildSystem = Literal["maven", "gradle"]

#: Image naming of the public SWE-bench instance images (Docker Hub, x86_64).
SWEBENCH_IMAGE = "swebench/sweb.eval.x86_64.{key}:latest"
#: Image naming of the SWE-Gym instance images.
SWEGYM_IMAGE = "xingyaoww/sweb.eval.x86_64.{key}:latest"
#: Image naming of the Multi-SWE-bench instance images.
MULTI_SWE_BENCH_IMAGE = "mswebench/{owner}_m_{name}:pr-{number}"

#: Glob of Maven Surefire's XML reports, relative to the workdir.
SUREFIRE_REPORTS = "**/target/surefire-reports/TEST-*.xml"
#: Glob of Gradle's XML test reports, relative to the workdir.
GRADLE_REPORTS = "**/build/test-results/test/*.xml"


@dataclass(frozen=True)
class Recipe:
    """How to provision and test one repository (at one version)."""

    language: Language
    """Language of the repository."""
    test_command: str
    """Shell command with ``{tests}`` where the selected tests go."""
    log_format: LogFormat
    """Parser of the test command's output."""
    select: Select = "files"
    """What ``{tests}`` receives: test files (SWE-bench's way) or test ids."""
    python: str | None = None
    """Interpreter version (Python tasks)."""
    install: tuple[str, ...] = ()
    """Provisioning commands, run once in the workdir."""
    env: Mapping[str, str] = field(default_factory=dict)
    """Environment variables of every command."""
    junit_reports: tuple[str, ...] = ()
    """Report globs (``junit`` log format)."""
    pre: tuple[str, ...] = ()
    """Commands run before each test run (e.g. removing stale reports)."""
    scm_version: bool = False
    """The repository takes its version from git tags (setuptools-scm): an export without
    tags needs ``SETUPTOOLS_SCM_PRETEND_VERSION``, derived from the task's version."""
    image_only: bool = False
    """Needs compiled builds: only the instance's container image is known to work."""
    notes: str = ""
    """Why the recipe looks the way it does (shown in the docs, kept in task metadata)."""

    def environment(self, version: str | None) -> dict[str, str]:
        """Environment variables for a task at ``version``."""
        env = dict(self.env)
        if self.scm_version and version:
            env.setdefault("SETUPTOOLS_SCM_PRETEND_VERSION", _full_version(version))
        return env

    def test_spec(self) -> TestSpec:
        """The :class:`TestSpec` this recipe gives a task."""
        return TestSpec(
            command=self.test_command,
            log_format=self.log_format,
            select=self.select,
            junit_reports=list(self.junit_reports),
            pre=list(self.pre),
        )


# --- building blocks --------------------------------------------------------------------------

# -rA lists every outcome, but a skip there is a location ("SKIPPED [1] t.py:12: why"), not a
# test id; -v adds one "path::test SKIPPED (why)" line per test, so a skipped PASS_TO_PASS test
# is graded skipped (kept), not missing. (A JUnit XML report would carry ids as class names,
# which do not map back to pytest's path::name ids.)
PYTEST = "pytest -rA -v {tests}"
# Old astropy releases print one line per test only in the classic console style.
PYTEST_CLASSIC = "pytest -rA -vv -o console_output_style=classic --tb=no {tests}"
# SymPy's own runner; --verbose lists every test with its outcome, -C turns the cache off so
# results do not depend on test order.
SYMPY_TEST = "bin/test -C --verbose {tests}"
# Django's runner takes dotted test labels (tests/app/test_x.py -> app.test_x); one process
# keeps the output in order for the log parser.
DJANGO_TEST = "./tests/runtests.py --verbosity 2 --settings=test_sqlite --parallel 1 {tests}"
# Django 1.9's runner has no --parallel flag.
DJANGO_TEST_NO_PARALLEL = "./tests/runtests.py --verbosity 2 --settings=test_sqlite {tests}"

EDITABLE = "python -m pip install -e ."


def _pip(*packages: str) -> str:
    return "python -m pip install " + " ".join(shlex.quote(p) for p in packages)


def _versions(*groups: Iterable[str]) -> list[str]:
    out: list[str] = []
    for group in groups:
        out.extend(group)
    return out


def _full_version(version: str) -> str:
    """``5.4`` -> ``5.4.0`` (a PEP 440 release setuptools-scm accepts); ``v5.3`` -> ``5.3.0``."""
    bare = version.lstrip("v")
    return bare if bare.count(".") >= 2 else f"{bare}.0"


# --- SWE-bench Python repositories ------------------------------------------------------------
# Keyed by repository, then by version. Versions not listed fall back to the repository's
# ``"*"`` entry when it has one (a best guess, logged as such).

_SWEBENCH: dict[str, dict[str, Recipe]] = {}


def _add(repo: str, versions: Iterable[str], recipe: Recipe) -> None:
    table = _SWEBENCH.setdefault(repo, {})
    for version in versions:
        table[version] = recipe


# sympy: pure Python; mpmath 1.3.0 is the release the old test suites were written against.
for _v in _versions(
    ["0.7", "1.0", "1.1", "1.2", "1.4", "1.5", "1.6", "1.7", "1.8", "1.9"],
    ["1.10", "1.11", "1.12", "1.13", "1.14", "*"],
):
    _add(
        "sympy/sympy",
        [_v],
        Recipe(
            language="python",
            python="3.9",
            install=(_pip("mpmath==1.3.0"), EDITABLE),
            test_command=SYMPY_TEST,
            log_format="sympy",
            # Old test files trigger deprecation and syntax warnings that flood the log.
            env={"PYTHONWARNINGS": "ignore::UserWarning,ignore::SyntaxWarning"},
            notes="bin/test takes test files; ids are bare test function names",
        ),
    )

# pytest-dev/pytest: tests itself, so each version pins the plugin stack it was released with.
_PYTEST_PINS: dict[str, tuple[str, ...]] = {
    "4.4": ("atomicwrites==1.4.1", "attrs==23.1.0", "more-itertools==10.1.0", "pluggy==0.13.1",
            "py==1.11.0", "setuptools==68.0.0", "six==1.16.0"),
    "4.5": ("atomicwrites==1.4.1", "attrs==23.1.0", "more-itertools==10.1.0", "pluggy==0.11.0",
            "py==1.11.0", "setuptools==68.0.0", "six==1.16.0", "wcwidth==0.2.6"),
    "4.6": ("atomicwrites==1.4.1", "attrs==23.1.0", "more-itertools==10.1.0", "packaging==23.1",
            "pluggy==0.13.1", "py==1.11.0", "six==1.16.0", "wcwidth==0.2.6"),
    "5.0": ("atomicwrites==1.4.1", "attrs==23.1.0", "more-itertools==10.1.0", "packaging==23.1",
            "pluggy==0.13.1", "py==1.11.0", "wcwidth==0.2.6"),
    "5.3": ("attrs==23.1.0", "more-itertools==10.1.0", "packaging==23.1", "pluggy==0.13.1",
            "py==1.11.0", "wcwidth==0.2.6"),
    "5.4": ("py==1.11.0", "packaging==23.1", "attrs==23.1.0", "more-itertools==10.1.0",
            "pluggy==0.13.1"),
    "6.0": ("attrs==23.1.0", "iniconfig==2.0.0", "more-itertools==10.1.0", "packaging==23.1",
            "pluggy==0.13.1", "py==1.11.0", "toml==0.10.2"),
    "6.2": ("attrs==23.1.0", "iniconfig==2.0.0", "packaging==23.1", "pluggy==0.13.1",
            "py==1.11.0", "toml==0.10.2"),
    "7.0": ("attrs==23.1.0", "iniconfig==2.0.0", "packaging==23.1", "pluggy==0.13.1",
            "py==1.11.0"),
    "7.1": ("attrs==23.1.0", "iniconfig==2.0.0", "packaging==23.1", "pluggy==0.13.1",
            "py==1.11.0", "tomli==2.0.1"),
    "7.4": ("iniconfig==2.0.0", "packaging==23.1", "pluggy==1.3.0", "exceptiongroup==1.1.3",
            "tomli==2.0.1"),
}  # fmt: skip
for _alias, _same in {"5.1": "5.0", "5.2": "5.0", "6.3": "6.2", "7.2": "7.1", "8.0": "7.4",
                      "8.1": "7.4", "8.2": "7.4", "8.3": "7.4", "8.4": "7.4"}.items():  # fmt: skip
    _PYTEST_PINS[_alias] = _PYTEST_PINS[_same]
_PYTEST_PINS["*"] = _PYTEST_PINS["7.4"]
for _v, _pins in _PYTEST_PINS.items():
    # setuptools 81+ has no pkg_resources, which the namespace-package tests' fixtures import
    # (test_cmdline_python_namespace_package failed with the gold patch); the environment's
    # seeded setuptools would be the newest.
    _install = [_pip(*_pins, "setuptools==68.0.0")]
    if _v == "6.3":
        # That release's setup.cfg has a doubled ">=>=" that modern pip rejects.
        _install.insert(0, "sed -i 's/>=>=/>=/' setup.cfg")
    _install.append(EDITABLE)
    _add(
        "pytest-dev/pytest",
        [_v],
        Recipe(
            language="python",
            python="3.9",
            install=tuple(_install),
            test_command=PYTEST,
            log_format="pytest",
            scm_version=True,
        ),
    )

# pallets/flask: the test suite of each release expects the Werkzeug/Jinja it shipped with.
_FLASK_20 = ("setuptools==70.0.0", "Werkzeug==2.3.7", "Jinja2==3.0.1", "itsdangerous==2.1.2",
             "click==8.0.1", "MarkupSafe==2.1.3", "pytest==7.2.0")  # fmt: skip
_FLASK_21 = ("setuptools==70.0.0", "click==8.1.3", "itsdangerous==2.1.2", "Jinja2==3.1.2",
             "MarkupSafe==2.1.1", "Werkzeug==2.3.7", "pytest==7.2.0")  # fmt: skip
_add("pallets/flask", ["2.0"], Recipe(language="python", python="3.9",
     install=(_pip(*_FLASK_20), EDITABLE), test_command=PYTEST, log_format="pytest"))  # fmt: skip
_add("pallets/flask", ["2.1"], Recipe(language="python", python="3.10",
     install=(_pip(*_FLASK_21), EDITABLE), test_command=PYTEST, log_format="pytest"))  # fmt: skip
_add("pallets/flask", ["2.2", "2.3", "3.0", "3.1", "*"], Recipe(language="python", python="3.11",
     install=(_pip(*_FLASK_21), EDITABLE), test_command=PYTEST, log_format="pytest"))  # fmt: skip

# django/django: the interpreter follows the release's supported Pythons; tests need a UTF-8
# locale (several assert on non-ASCII file names).
_DJANGO_ENV = {
    "LANG": "en_US.UTF-8",
    "LC_ALL": "en_US.UTF-8",
    "LANGUAGE": "en_US:en",
    "PYTHONIOENCODING": "utf8",
}
_DJANGO_INSTALL = ("python -m pip install -r tests/requirements/py3.txt", EDITABLE)
for _versions_list, _python in (
    (["1.4", "1.5", "1.6", "1.7", "1.8", "1.9", "1.10", "1.11", "2.0", "2.1", "2.2"], "3.5"),
    (["3.0", "3.1", "3.2"], "3.6"),
    (["4.0"], "3.8"),
    (["4.1", "4.2"], "3.9"),
    (["5.0", "5.1", "5.2", "*"], "3.11"),
):
    _add(
        "django/django",
        _versions_list,
        Recipe(
            language="python",
            python=_python,
            install=_DJANGO_INSTALL,
            test_command=DJANGO_TEST,
            log_format="django",
            env=_DJANGO_ENV,
            notes="test files become dotted labels relative to tests/",
        ),
    )
_add(
    "django/django",
    ["1.9"],
    replace(_SWEBENCH["django/django"]["1.9"], test_command=DJANGO_TEST_NO_PARALLEL),
)

# psf/requests: pure Python, no pins beyond pytest.
_add(
    "psf/requests",
    _versions(
        ["0.7", "0.8", "0.9", "0.11", "0.13", "0.14", "1.1", "1.2", "2.0", "2.2", "2.3", "2.4"],
        ["2.5", "2.7", "2.8", "2.9", "2.10", "2.11", "2.12", "2.17", "2.18", "2.19", "2.22"],
        ["2.25", "2.26", "2.27", "2.31", "3.0", "*"],
    ),
    Recipe(
        language="python",
        python="3.9",
        install=(_pip("pytest"), EDITABLE),
        test_command=PYTEST,
        log_format="pytest",
    ),
)

# sphinx-doc/sphinx: old releases declare open-ended dependencies whose new majors break them;
# the sed lines cap them before installing. Tests run through pytest directly (SWE-bench goes
# through tox --current-env, which runs the same pytest in the same environment).
_SPHINX_CAPS_COMMON = (
    "sed -i 's/Jinja2>=2.3/Jinja2<3.0/' setup.py",
    "sed -i 's/sphinxcontrib-applehelp/sphinxcontrib-applehelp<=1.0.7/' setup.py",
    "sed -i 's/sphinxcontrib-devhelp/sphinxcontrib-devhelp<=1.0.5/' setup.py",
    "sed -i 's/sphinxcontrib-qthelp/sphinxcontrib-qthelp<=1.0.6/' setup.py",
    "sed -i 's/alabaster>=0.7,<0.8/alabaster>=0.7,<0.7.12/' setup.py",
    "sed -i \"s/'packaging',/'packaging', 'markupsafe<=2.0.1',/\" setup.py",
    # 3.x asks for docutils>=0.12, open-ended: docutils 0.22 dropped docutils.utils.roman,
    # which sphinx.writers.latex imports, so every test's app failed to start (an ERROR in
    # fixture setup). SWE-bench's environments (2024) had 0.21; 4.x caps <0.18 itself.
    "sed -i \"s/'docutils>=0.12',/'docutils>=0.12,<0.22',/\" setup.py",
)
_HTMLHELP_BOUNDED = (
    "sed -i 's/sphinxcontrib-htmlhelp>=2.0.0/sphinxcontrib-htmlhelp>=2.0.0,<=2.0.4/' setup.py"
)
_HTMLHELP_BARE = "sed -i 's/sphinxcontrib-htmlhelp/sphinxcontrib-htmlhelp<=2.0.4/' setup.py"
_SERIALIZING_BOUNDED = "sed -i 's/sphinxcontrib-serializinghtml>=1.1.5/sphinxcontrib-serializinghtml>=1.1.5,<=1.1.9/' setup.py"
_SERIALIZING_BARE = (
    "sed -i 's/sphinxcontrib-serializinghtml/sphinxcontrib-serializinghtml<=1.1.9/' setup.py"
)


def _sphinx_caps(version: str) -> tuple[str, ...]:
    """Caps for Sphinx 3.x/4.x, whose setup.py leaves dependencies open-ended."""
    if not version.startswith(("3.", "4.")) or version == "4.5":
        return ()
    if version in ("4.2", "4.3", "4.4"):
        tail: tuple[str, ...] = (_HTMLHELP_BOUNDED, _SERIALIZING_BOUNDED)
    elif version == "4.1":
        # 4.1's setup.py was released in both spellings: cap whichever is there.
        tail = (
            f"grep -q 'sphinxcontrib-htmlhelp>=2.0.0' setup.py && {_HTMLHELP_BOUNDED} || {_HTMLHELP_BARE}",
            f"grep -q 'sphinxcontrib-serializinghtml>=1.1.5' setup.py && {_SERIALIZING_BOUNDED} || {_SERIALIZING_BARE}",
        )
    else:
        tail = (_HTMLHELP_BARE, _SERIALIZING_BARE)
    return (*_SPHINX_CAPS_COMMON, *tail)


for _v in _versions(
    ["1.5", "1.6", "1.7", "1.8", "2.0", "2.1", "2.2", "2.3", "2.4", "3.0", "3.1", "3.2", "3.3"],
    ["3.4", "3.5", "4.0", "4.1", "4.2", "4.3", "4.4", "4.5", "5.0", "5.1", "5.2", "5.3", "6.0"],
    ["6.2", "7.0", "7.1", "7.2", "7.3", "7.4", "8.0", "8.1", "*"],
):
    _add(
        "sphinx-doc/sphinx",
        [_v],
        Recipe(
            language="python",
            python="3.10" if _v in ("8.0", "8.1") else "3.9",
            # Jinja2 3.0.3 first: the releases that cap Jinja2<3.0 downgrade it again.
            # setuptools 68: sphinx.registry imports pkg_resources, which setuptools 81+ lacks
            # (every module failed to import: an environment error).
            install=(
                *_sphinx_caps(_v),
                _pip("Jinja2==3.0.3", "setuptools==68.0.0"),
                "python -m pip install -e .[test]",
            ),
            test_command=PYTEST,
            log_format="pytest",
            notes="7.2 and later need graphviz (a system package) for the graphviz tests",
        ),
    )

# pylint-dev/pylint: requirements_test.txt pins astroid and the test plugins, and installs pylint
# itself editable (-e .). Two traps in that editable install, both fixed by building it with the
# environment's setuptools 68 in "compat" mode (the project folder in a .pth, as `setup.py
# develop` did and as in SWE-bench's environments):
# - an isolated build takes the newest setuptools (no pyproject.toml before 2.15), whose editable
#   install is an import hook, not a sys.path entry; pylint loads its checkers from files through
#   astroid's modpath_from_file, which searches sys.path, finds no checker ("Problem importing
#   module typecheck.py: Unable to find module"), and every test of the command line or the
#   configuration fails with "No such message id or symbol 'c-extension-no-member'";
# - 2.15's pyproject.toml asks for setuptools~=62.6, which has no PEP 660 hook, and today's pip
#   no longer falls back to `setup.py develop`: the install fails.
_PYLINT_PIP = "python -m pip install --no-build-isolation --config-settings editable_mode=compat"
for _v in _versions(
    ["2.8", "2.9", "2.10", "2.11", "2.13", "2.14", "2.15", "2.16", "2.17"],
    ["3.0", "3.1", "3.2", "3.3", "4.0", "*"],
):
    _pylint_install: tuple[str, ...] = (
        _pip("setuptools==68.0.0", "wheel"),
        f"{_PYLINT_PIP} -r requirements_test.txt",
        f"{_PYLINT_PIP} -e .",
    )
    if _v.startswith(("3.", "4.")):
        _pylint_install = (_pip("astroid==3.0.0a6", "setuptools"), *_pylint_install)
    _add(
        "pylint-dev/pylint",
        [_v],
        Recipe(
            language="python",
            python="3.9",
            install=_pylint_install,
            test_command=PYTEST,
            log_format="pytest",
            notes="2.8 also needs pyenchant and the enchant system library",
        ),
    )

# pydata/xarray: pure Python on top of numpy/pandas wheels; version from git tags.
_XARRAY_PINS = ("numpy==1.23.0", "packaging==23.1", "pandas==1.5.3", "pytest==7.4.0",
                "python-dateutil==2.8.2", "pytz==2023.3", "six==1.16.0", "scipy==1.11.1",
                "setuptools==68.0.0", "dask==2022.8.1")  # fmt: skip
for _v in ["0.12", "0.18", "0.19", "0.20", "2022.03", "2022.06", "2022.09", "2023.07", "2024.05",
           "*"]:  # fmt: skip
    _add(
        "pydata/xarray",
        [_v],
        Recipe(
            language="python",
            python="3.10",
            install=(_pip(*_XARRAY_PINS), EDITABLE),
            test_command=PYTEST,
            log_format="pytest",
            scm_version=True,
        ),
    )

# Compiled builds (C/C++/Cython extensions, system libraries): image only.
for _v in ["0.1", "0.2", "0.3", "0.4", "1.1", "1.2", "1.3"]:
    _add("astropy/astropy", [_v], Recipe(language="python", python="3.6", image_only=True,
         test_command=PYTEST_CLASSIC, log_format="pytest"))  # fmt: skip
for _v in ["3.0", "3.1", "3.2", "4.1", "4.2", "4.3", "5.0", "5.1", "5.2", "v5.3", "*"]:
    _add("astropy/astropy", [_v], Recipe(language="python", python="3.10" if _v == "v5.3" else "3.9",
         image_only=True, test_command=PYTEST, log_format="pytest"))  # fmt: skip
for _versions_list, _python in (
    (["1.0", "1.1", "1.2", "1.3", "1.4", "1.5", "2.0", "2.1", "2.2"], "3.5"),
    (["3.0"], "3.7"),
    (["3.1", "3.2", "3.3", "3.4"], "3.8"),
    (["3.5", "3.6", "3.7", "3.8", "3.9", "*"], "3.11"),
):
    _add("matplotlib/matplotlib", _versions_list, Recipe(language="python", python=_python,
         image_only=True, test_command=PYTEST, log_format="pytest"))  # fmt: skip
_add("scikit-learn/scikit-learn", ["0.20", "0.21", "0.22"], Recipe(language="python",
     python="3.6", image_only=True, test_command=PYTEST, log_format="pytest"))  # fmt: skip
_add("scikit-learn/scikit-learn", ["1.3", "1.4", "1.5", "1.6", "*"], Recipe(language="python",
     python="3.9", image_only=True, test_command=PYTEST, log_format="pytest"))  # fmt: skip

# mwaskom/seaborn: pure Python on numpy/pandas/matplotlib wheels (issue 18: every instance in
# shared/data resolves with gold and not without in a local sandbox with these pins).
_SEABORN_PINS = ("contourpy==1.1.0", "cycler==0.11.0", "fonttools==4.42.1",
                 "importlib-resources==6.0.1", "kiwisolver==1.4.5", "matplotlib==3.7.2",
                 "numpy==1.25.2", "packaging==23.1", "pandas==1.5.3", "pillow==10.0.0",
                 "pyparsing==3.0.9", "pytest==7.4.0", "python-dateutil==2.8.2",
                 "pytz==2023.3.post1", "scipy==1.11.2", "six==1.16.0", "tzdata==2023.1",
                 "zipp==3.16.2")  # fmt: skip
_add("mwaskom/seaborn", ["0.11", "0.12", "0.13", "0.14", "*"], Recipe(language="python",
     python="3.9", install=(_pip(*_SEABORN_PINS), EDITABLE), test_command=PYTEST,
     log_format="pytest"))  # fmt: skip

# getmoto/moto (SWE-Gym): its `make init`, as SWE-Gym's environments run it: the checkout
# editable, then requirements-dev.txt (the `all` and `server` extras, the test tools: freezegun,
# pytest-xdist, ...). With only the checkout, test modules that import freezegun do not collect.
_add("getmoto/moto", ["*"], Recipe(language="python", python="3.12", install=(EDITABLE,
     "python -m pip install -r requirements-dev.txt"), test_command=PYTEST,
     log_format="pytest"))  # fmt: skip

#: The generic recipe's test command: the task environment's own pytest (``python -m``, never a
#: ``pytest`` found elsewhere), no cache folder written into the checkout, and per-test lines.
GENERIC_PYTEST = "python -m pytest -rA -v -p no:cacheprovider {tests}"

#: Used for a Python repository the table does not know (SWE-Gym's repositories, new ones):
#: pytest installed into the task's environment with the checkout (editable, so the tests import
#: the checkout, not another copy of the package), run over the patch's test files. A record's
#: own ``python``, ``install``, ``test_cmd`` and ``env`` replace these (docs/tasks.md).
GENERIC_PYTHON = Recipe(
    language="python",
    python=None,
    install=(_pip("pytest"), EDITABLE),
    test_command=GENERIC_PYTEST,
    log_format="pytest",
    notes="generic: the repository is not in the recipe table",
)


def swebench_recipe(repo: str, version: str | None) -> Recipe | None:
    """The recipe of a SWE-bench repository at a version; ``None`` for an unknown repository.

    A version missing from the table falls back to the repository's default entry (the newest
    known setup), with a debug log: SWE-bench's versions are ``major.minor`` strings, so a new
    minor release usually behaves like the last known one.
    """
    table = _SWEBENCH.get(repo)
    if table is None:
        return None
    if version is not None and version in table:
        return table[version]
    if "*" in table:
        logger.debug("no recipe for %s version %s; using the repository's default", repo, version)
        return table["*"]
    return None


def swebench_repos() -> list[str]:
    """Repositories with a SWE-bench recipe."""
    return sorted(_SWEBENCH)


def swebench_versions(repo: str) -> list[str]:
    """Versions with an explicit recipe for ``repo`` (without the ``*`` default)."""
    return [v for v in _SWEBENCH.get(repo, {}) if v != "*"]


# --- images -------------------------------------------------------------------------------------


def swebench_image(instance_id: str) -> str:
    """SWE-bench's public image of an instance.

    Docker names cannot hold ``__``, so SWE-bench writes it as ``_1776_``, and names are lower
    case: ``sympy__sympy-20590`` -> ``swebench/sweb.eval.x86_64.sympy_1776_sympy-20590:latest``.
    """
    return SWEBENCH_IMAGE.format(key=instance_id.replace("__", "_1776_").lower())


def swegym_image(instance_id: str) -> str:
    """SWE-Gym's public image of an instance (``__`` written as ``_s_``, lower case)."""
    return SWEGYM_IMAGE.format(key=instance_id.replace("__", "_s_").lower())


def multi_swe_bench_image(owner: str, name: str, number: int | str) -> str:
    """Multi-SWE-bench's public image of a pull request, e.g. ``mswebench/apache_m_druid:pr-13704``."""
    return MULTI_SWE_BENCH_IMAGE.format(owner=owner, name=name, number=number).lower()


def render_image_template(
    template: str, *, instance_id: str, repo: str, version: str | None
) -> str:
    """Fill an image template's ``{instance_id}``, ``{repo}``, ``{owner}``, ``{name}``,
    ``{version}`` placeholders (the ``imageTemplate`` field of a task source)."""
    owner, _, name = repo.partition("/")
    values = {
        "instance_id": instance_id,
        "repo": repo,
        "owner": owner,
        "name": name,
        "version": version or "",
    }
    # str.format would choke on other braces; replace only the known placeholders.
    return re.sub(
        r"\{(instance_id|repo|owner|name|version)\}", lambda m: values[m.group(1)], template
    )


# --- Java -----------------------------------------------------------------------------------------

# Surefire refuses to run when -Dtest matches nothing in a module; multi-module builds have
# modules without the selected tests, hence both failIfNo... switches.
_MAVEN_TEST = (
    "mvn -B -q test -DfailIfNoTests=false -Dsurefire.failIfNoSpecifiedTests=false -Dtest={tests}"
)
_MAVEN_CLEAN_REPORTS = "find . -path '*/target/surefire-reports' -type d -prune -exec rm -rf {} +"
# The repository's wrapper pins its Gradle version; without one, the gradle on PATH.
_GRADLE_TEST = "$(test -x ./gradlew && echo ./gradlew || echo gradle) test --continue {tests}"
_GRADLE_CLEAN_REPORTS = "find . -path '*/build/test-results' -type d -prune -exec rm -rf {} +"


def java_recipe(build: BuildSystem, *, modules: Iterable[str] = ()) -> Recipe:
    """The recipe of a Java build: Maven with Surefire reports or Gradle with its XML reports.

    ``modules`` (Maven only) restricts the build to the modules holding the selected tests and
    what they depend on (``-pl … -am``), which matters in large multi-module repositories.
    """
    if build == "maven":
        command = _MAVEN_TEST
        mods = sorted({m for m in modules if m and m != "."})
        if mods:
            command = command.replace(
                "mvn -B -q test", f"mvn -B -q test -pl {shlex.quote(','.join(mods))} -am"
            )
        return Recipe(
            language="java",
            test_command=command,
            log_format="junit",
            select="ids",
            junit_reports=(SUREFIRE_REPORTS,),
            pre=(_MAVEN_CLEAN_REPORTS,),
            notes="{tests} is one -Dtest value: Class#m1+m2,Other#m3",
        )
    if build == "gradle":
        return Recipe(
            language="java",
            test_command=_GRADLE_TEST,
            log_format="junit",
            select="ids",
            junit_reports=(GRADLE_REPORTS,),
            pre=(_GRADLE_CLEAN_REPORTS,),
            notes="{tests} is a list of --tests Class.method pairs",
        )
    raise ValueError(f"unknown Java build system {build!r}: use 'maven' or 'gradle'")
