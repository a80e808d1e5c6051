"""Which paths of a repository are tests, test infrastructure or package metadata: never part
of a candidate's source change (:mod:`crl_worker.harness.diffsplit`)."""

from __future__ import annotations

import re
from pathlib import PurePosixPath

#: File modes of symbolic links and submodules: never a source change.
LINK_MODES = frozenset({"120000", "160000"})
#: Path components of installed-package metadata: a ``*.dist-info`` folder on an import root
#: is a distribution to ``importlib.metadata``, its ``entry_points.txt`` a plugin of pytest's.
METADATA_SUFFIXES = (".dist-info", ".egg-info", ".egg-link", ".egg")
#: File names of package metadata and service registrations, anywhere.
METADATA_NAMES = frozenset(
    {
        "entry_points.txt",
        "top_level.txt",
        "RECORD",
        "METADATA",
        "PKG-INFO",
        "WHEEL",
        "INSTALLER",
        "direct_url.json",
        "junit-platform.properties",
    }
)
#: Folders whose files register plugins or services (Java's ``ServiceLoader``: JUnit listeners).
METADATA_FOLDERS = frozenset({"META-INF", "__pycache__"})
#: File names that configure or extend the test runner, the interpreter or the build: never
#: part of a confirmed answer.
INFRASTRUCTURE_NAMES = frozenset(
    {
        # Python: pytest's configuration and plugins, interpreter start-up hooks.
        "conftest.py",
        "pytest.ini",
        ".pytest.ini",
        "tox.ini",
        "setup.cfg",
        "pyproject.toml",
        "noxfile.py",
        "sitecustomize.py",
        "usercustomize.py",
        ".coveragerc",
        # Java builds: the build decides which tests run and how failures count.
        "pom.xml",
        "build.gradle",
        "build.gradle.kts",
        "settings.gradle",
        "settings.gradle.kts",
        "gradle.properties",
        "gradle-wrapper.properties",
        "mvnw",
        "gradlew",
        # Builds that a test command may run.
        "Makefile",
        "makefile",
        "GNUmakefile",
        # Go, Rust and C++ builds (the polyglot exercises): modules, build scripts, CMake.
        "go.mod",
        "go.sum",
        "go.work",
        "Cargo.toml",
        "Cargo.lock",
        "build.rs",
        "CMakeLists.txt",
        "CMakeCache.txt",
        # JavaScript (Jest): the package, npm's and yarn's settings, and the configuration
        # files Babel and Jest load from the working directory (a Babel plugin rewrites the
        # test files as Jest loads them; a Jest setup file runs before every test file).
        "package.json",
        "package-lock.json",
        "npm-shrinkwrap.json",
        "yarn.lock",
        ".npmrc",
        ".yarnrc",
        ".yarnrc.yml",
        ".babelrc",
        ".babelrc.js",
        ".babelrc.cjs",
        ".babelrc.mjs",
        ".babelrc.json",
        "babel.config.js",
        "babel.config.cjs",
        "babel.config.mjs",
        "babel.config.cts",
        "babel.config.json",
        "jest.config.js",
        "jest.config.cjs",
        "jest.config.mjs",
        "jest.config.ts",
        "jest.config.json",
        # git's own settings in the tree: attributes steer how git writes the files the harness
        # checks out and applies (line endings, encodings, ``ident``), even inside a package.
        ".gitattributes",
        ".gitmodules",
    }
)
#: Suffixes of files that run code at interpreter start (``.pth``) or hold compiled code.
INFRASTRUCTURE_SUFFIXES = (
    ".pth",
    ".pyc",
    ".pyo",
    ".pyd",
    ".so",
    ".dylib",
    ".jar",
    ".class",
    ".whl",
    ".gradle",
    ".gradle.kts",
)
#: Top-level directories of tests, CI and build tooling.
INFRASTRUCTURE_ROOTS = frozenset(
    {"test", "tests", "testing", ".github", ".circleci", ".mvn", "gradle", ".git"}
)
#: Test runners and their helpers that a module at the top of the repository would shadow (the
#: runner starts in the workdir, first on ``sys.path``), besides the standard library's modules.
RUNNER_MODULES = frozenset(
    {"pytest", "_pytest", "pluggy", "py", "nose", "nose2", "unittest2", "iniconfig", "packaging"}
)
_PY_TEST_NAME = re.compile(r"^(test_.*|.*_test)\.py$")
_JAVA_TEST_NAME = re.compile(r"^(Test.*|.*(Test|Tests|TestCase|IT))\.java$")
# Go's test files (a TestMain there decides what the test binary reports), C++ test sources,
# JavaScript's test files (Jest finds ``*.spec.js``, ``*.test.js`` and their kin).
_COMPILED_TEST_NAME = re.compile(
    r"^.*_test\.(go|cpp|cc|cxx|h|hpp)$|^.*\.(spec|test)\.(js|cjs|mjs|jsx|ts|tsx)$"
)
#: Folders, at any depth, that hold a Rust crate's integration tests or Cargo's configuration,
#: or that Node and Jest read code from without an import naming it: installed packages (ahead
#: of the shared Jest install on Node's search path), Jest's automatic mocks and its test
#: folders.
_COMPILED_TEST_FOLDERS = frozenset({".cargo", "node_modules", "__mocks__", "__tests__"})


def is_test_infrastructure(path: str) -> bool:
    """Whether ``path`` (relative to the repository) is a test or steers the test run."""
    p = PurePosixPath(path)
    if not p.parts:
        return False
    return (
        p.name in INFRASTRUCTURE_NAMES
        or p.name.endswith(INFRASTRUCTURE_SUFFIXES)
        or p.parts[0] in INFRASTRUCTURE_ROOTS
        or bool(_PY_TEST_NAME.match(p.name))
        or bool(_JAVA_TEST_NAME.match(p.name))
        or bool(_COMPILED_TEST_NAME.match(p.name))
        or any(part in _COMPILED_TEST_FOLDERS for part in p.parts[:-1])
        or (p.suffix == ".rs" and "tests" in p.parts[:-1])
        # The vendored Catch2 and its main (the main could write a report of its own).
        or (p.suffix in (".cpp", ".cc", ".hpp", ".h") and "test" in p.parts[:-1])
        or "src/test/" in f"{path}/"
    )
