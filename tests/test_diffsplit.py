"""The diff parser agrees with git, and the source/test split is an allowlist (diffsplit.py).

The diffs here are free text, as a predictions file or ``crl tasks check --patch`` hands them
over, so each path trick of the red team (quoted names, other first components, ``/dev/null``
games, renames, links, modes, binary patches, text after the last hunk) is checked against
``git apply`` itself: what git would write is what the split judges.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from crl_worker.harness.diffsplit import (
    DiffError,
    Tree,
    git_numstat,
    parse_diff,
    split_diff,
    touched_files,
)


def block(path: str, old: str = "a", new: str = "b", a: str = "a/", b: str = "b/") -> str:
    """A one-line change of ``path`` with the given prefixes."""
    return f"diff --git {a}{path} {b}{path}\n--- {a}{path}\n+++ {b}{path}\n@@ -1 +1 @@\n-{old}\n+{new}\n"


def new_file(path: str, text: str = "x", mode: str = "100644") -> str:
    """A block creating ``path``."""
    return (
        f"diff --git a/{path} b/{path}\nnew file mode {mode}\n--- /dev/null\n+++ b/{path}\n"
        f"@@ -0,0 +1 @@\n+{text}\n"
    )


TREE = Tree(
    files=frozenset(
        {
            "intervals/__init__.py",
            "intervals/ops.py",
            "src/lib/mod.py",
            "bin/test",
            "README.md",
            "bob/bob.js",
            "bob/bob.test.mjs",
            "bob/babel.config.js",
            "bob/package.json",
        }
    ),
    links=frozenset({"intervals/data"}),
    import_roots=frozenset({"", "src"}),
)

#: (name, diff, the paths git writes, kept in the split?)
CASES = [
    ("plain source", block("intervals/ops.py"), ["intervals/ops.py"], True),
    ("other prefixes", block("tests/conftest.py", a="x/", b="y/"), ["tests/conftest.py"], False),
    (
        "traditional diff, other prefix",
        "--- foo/conftest.py\t2024-01-01\n+++ foo/conftest.py\n@@ -1 +1 @@\n-a\n+b\n",
        ["conftest.py"],
        False,
    ),
    (
        "C-quoted test file",
        'diff --git "a/tests/conftest.py" "b/tests/conftest.py"\n--- "a/tests/conftest.py"\n'
        '+++ "b/tests/conftest.py"\n@@ -1 +1 @@\n-a\n+b\n',
        ["tests/conftest.py"],
        False,
    ),
    (
        "non-ASCII path to a pom.xml",
        'diff --git "a/m\\303\\263dulo/pom.xml" "b/m\\303\\263dulo/pom.xml"\n'
        '--- "a/m\\303\\263dulo/pom.xml"\n+++ "b/m\\303\\263dulo/pom.xml"\n@@ -1 +1 @@\n-a\n+b\n',
        ["módulo/pom.xml"],
        False,
    ),
    (
        "octal-escaped name that reads as conftest.py",
        'diff --git "a/\\143onftest.py" "b/\\143onftest.py"\n--- "a/\\143onftest.py"\n'
        '+++ "b/\\143onftest.py"\n@@ -1 +1 @@\n-a\n+b\n',
        ["conftest.py"],
        False,
    ),
    (
        "rename into conftest.py",
        "diff --git a/intervals/ops.py b/conftest.py\nsimilarity index 100%\n"
        "rename from intervals/ops.py\nrename to conftest.py\n",
        ["conftest.py"],
        False,
    ),
    (
        "dist-info entry point",
        new_file("x-1.dist-info/entry_points.txt"),
        ["x-1.dist-info/entry_points.txt"],
        False,
    ),
    ("egg-info", new_file("x.egg-info/PKG-INFO"), ["x.egg-info/PKG-INFO"], False),
    (
        "Java service registration",
        new_file("src/main/resources/META-INF/services/x.Listener"),
        ["src/main/resources/META-INF/services/x.Listener"],
        False,
    ),
    ("new top-level module", new_file("pluggy.py"), ["pluggy.py"], False),
    ("new top-level package", new_file("iniconfig/__init__.py"), ["iniconfig/__init__.py"], False),
    ("new module at a src root", new_file("src/pytest.py"), ["src/pytest.py"], False),
    ("new module in the package", new_file("intervals/helpers.py"), ["intervals/helpers.py"], True),
    (
        "new module beyond a link",
        new_file("intervals/data/conftest2.py"),
        ["intervals/data/conftest2.py"],
        False,
    ),
    (
        "symbolic link",
        new_file("intervals/link.py", "../tests", "120000"),
        ["intervals/link.py"],
        False,
    ),
    (
        "mode change",
        "diff --git a/intervals/ops.py b/intervals/ops.py\nold mode 100644\nnew mode 100755\n",
        ["intervals/ops.py"],
        False,
    ),
    ("the test command's script", block("bin/test"), ["bin/test"], False),
    (
        "sitecustomize",
        new_file("intervals/sitecustomize.py"),
        ["intervals/sitecustomize.py"],
        False,
    ),
    ("usercustomize", block("usercustomize.py"), ["usercustomize.py"], False),
    ("pth file", new_file("intervals/x.pth"), ["intervals/x.pth"], False),
    # JavaScript (Jest): the configuration Babel and Jest load, tests, packages, mocks.
    ("Babel's configuration", block("bob/babel.config.js"), ["bob/babel.config.js"], False),
    ("a .babelrc", new_file("bob/.babelrc"), ["bob/.babelrc"], False),
    ("Jest's configuration", new_file("bob/jest.config.js"), ["bob/jest.config.js"], False),
    ("package.json", block("bob/package.json"), ["bob/package.json"], False),
    ("a spec file", new_file("bob/extra.spec.js"), ["bob/extra.spec.js"], False),
    ("a test file", block("bob/bob.test.mjs"), ["bob/bob.test.mjs"], False),
    (
        "a package ahead of the shared Jest",
        new_file("bob/node_modules/expect/index.js"),
        ["bob/node_modules/expect/index.js"],
        False,
    ),
    ("an automatic mock", new_file("bob/__mocks__/fs.js"), ["bob/__mocks__/fs.js"], False),
    ("the solution", block("bob/bob.js"), ["bob/bob.js"], True),
    # git's settings in the tree steer how the harness's checkouts and applies write files.
    (
        "attributes inside a package",
        new_file("intervals/.gitattributes"),
        ["intervals/.gitattributes"],
        False,
    ),
    ("submodules", block(".gitmodules"), [".gitmodules"], False),
]


@pytest.mark.parametrize(("name", "diff", "paths", "kept"), CASES, ids=[c[0] for c in CASES])
def test_the_parser_agrees_with_git_and_the_split_is_an_allowlist(
    name: str, diff: str, paths: list[str], kept: bool
) -> None:
    changes = parse_diff(diff)
    assert [c.path for c in changes] == paths
    assert [row[2] for row in git_numstat(diff)] == paths
    split = split_diff(diff, tree=TREE, runner_files=["bin/test"])
    assert bool(split.source) == kept, (split.stripped, split.refused)
    if not kept:
        assert split.stripped or split.refused


def test_text_after_a_hunk_is_dropped_not_handed_to_patch(tmp_path: Path) -> None:
    """GNU patch finds a context diff in the text after a hunk, which git ignores: the split
    re-renders the kept blocks from their parsed hunks only."""
    hidden = "*** conftest.py\n--- conftest.py\n***************\n*** 0 ****\n--- 1 ----\n+ evil\n"
    diff = block("intervals/ops.py") + "trailing words\n" + hidden
    split = split_diff(diff, tree=TREE)
    assert split.source == block("intervals/ops.py").replace(
        "diff --git a/intervals/ops.py b/intervals/ops.py\n",
        "diff --git a/intervals/ops.py b/intervals/ops.py\n",
    )
    assert "evil" not in split.source


def test_a_diff_git_reads_differently_is_refused() -> None:
    # Lines beyond a hunk's counts are text that git ignores: so does the split.
    longer = block("intervals/ops.py") + "+c\n"
    assert git_numstat(longer) == [("1", "1", "intervals/ops.py")]
    assert split_diff(longer, tree=TREE).source == block("intervals/ops.py")
    # A hunk shorter than its header says: git stops ("corrupt patch"), so does the parser,
    # and the whole diff is refused.
    shorter = block("intervals/ops.py").replace("@@ -1 +1 @@", "@@ -1,2 +1,2 @@")
    with pytest.raises(DiffError):
        git_numstat(shorter)
    with pytest.raises(DiffError):
        parse_diff(shorter)
    assert split_diff(shorter, tree=TREE).refused is not None
    # A /dev/null game: the header names a source file, the ---/+++ lines create another. Git
    # writes the +++ name; so reads the parser, and the split judges that name.
    games = "diff --git a/intervals/ops.py b/intervals/ops.py\n--- /dev/null\n+++ b/conftest.py\n"
    games += "@@ -0,0 +1 @@\n+x\n"
    assert [row[2] for row in git_numstat(games)] == [c.path for c in parse_diff(games)]
    assert parse_diff(games)[0].path == "conftest.py"
    assert split_diff(games, tree=TREE).source == ""


def test_binary_patches_are_stripped(tmp_path: Path) -> None:
    repo = tmp_path / "r"
    repo.mkdir()
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@e", "-C", str(repo)]
    subprocess.run([*git, "init", "-q"], check=True)
    (repo / "blob.py").write_bytes(b"\x00\x01 binary\n")
    subprocess.run([*git, "add", "-N", "blob.py"], check=True)
    diff = subprocess.run(
        [*git, "diff", "--binary"], check=True, capture_output=True, text=True
    ).stdout
    assert "GIT binary patch" in diff
    split = split_diff(diff + block("intervals/ops.py"), tree=TREE)
    assert split.stripped == ["blob.py (binary)"]
    assert touched_files(split.source) == ["intervals/ops.py"]


def test_touched_files_reads_quoted_and_renamed_names() -> None:
    rename = (
        "diff --git a/old.py b/new.py\nsimilarity index 90%\nrename from old.py\nrename to new.py\n"
    )
    quoted = 'diff --git "a/t\\303\\251st.py" "b/t\\303\\251st.py"\nnew file mode 100644\n'
    assert touched_files(rename + quoted) == ["old.py", "new.py", "tést.py"]
