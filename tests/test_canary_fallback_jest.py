"""A Jest copy without a literal expectation still catches a received value that matches
everything (issue 30; redteam8's untested hypothesis for Jest).

A value with an ``asymmetricMatch`` that always says yes passes ``toEqual`` of anything. With no
literal to change, a copy used to toggle ``.not``, which that value fails exactly as a correct
answer does; now an equality matcher's argument becomes a new ``Symbol()``: a correct answer
fails the copy, the forged value passes it (a passing canary: tampered). Run with the real Jest
of the polyglot sandboxes (CommonJS, so no transform is needed).
"""

from __future__ import annotations

import json
import random
import shutil
import subprocess
from pathlib import Path

import pytest

from crl_worker.harness import mutants_jest
from crl_worker.sandbox import node

SPEC = """\
const { interval, parse } = require('./shapes');

const SIGNED = interval(-5, 3);
const PLUS = interval(1, 4);

describe('parse', () => {
  test('signed bounds', () => {
    expect(parse('[-5, 3]')).toEqual(SIGNED);
  });

  test('explicit plus', () => {
    const got = parse('[+1, 4]');
    expect(got).toStrictEqual(PLUS);
  });
});
"""
HONEST = """\
function interval(start, end) { return { start, end }; }
function parse(text) {
  const [low, high] = text.slice(1, -1).split(',').map(Number);
  return interval(low, high);
}
module.exports = { interval, parse };
"""
FORGED = """\
function interval(start, end) { return { start, end }; }
function parse(text) { return { asymmetricMatch: () => true }; }
module.exports = { interval, parse };
"""
IDS = ["parse > signed bounds", "parse > explicit plus"]


def _outcomes(folder: Path, home: Path) -> dict[str, str]:
    """Each test's status (``passed``, ``failed``) in a Jest run of the folder's spec file."""
    report = folder / "report.json"
    subprocess.run(
        [str(node.jest_script(home)), "--config", "{}", "--rootDir", str(folder), "--json",
         f"--outputFile={report}", "--runTestsByPath", str(folder / "shapes.spec.js")],
        cwd=folder, capture_output=True, text=True, timeout=120, check=False,
        env={"PATH": "/usr/bin:/bin:/usr/local/bin", **node.jest_env(home)},
    )  # fmt: skip
    results = json.loads(report.read_text())["testResults"]
    return {
        " > ".join([*a["ancestorTitles"], a["title"]]): a["status"]
        for r in results
        for a in r["assertionResults"]
    }


def test_a_jest_copy_without_a_literal_compares_with_a_new_symbol(tmp_path: Path) -> None:
    derived = mutants_jest.derive(SPEC, IDS, random.Random(2), 4)
    assert derived is not None and len(derived.ids) >= 2
    assert derived.text.count("Symbol()") == len(derived.ids) and ".not." not in derived.text
    # (with .not toggled instead, the forged value failed every copy, as a correct answer does)
    if shutil.which("node") is None or shutil.which("npm") is None:
        pytest.skip("node and npm are needed to run Jest")
    home = node.ensure_jest()
    copies = set(derived.ids)
    for module, copies_pass in ((HONEST, False), (FORGED, True)):
        folder = tmp_path / ("forged" if copies_pass else "honest")
        folder.mkdir()
        (folder / "shapes.js").write_text(module)
        (folder / "shapes.spec.js").write_text(derived.text)
        outcomes = _outcomes(folder, home)
        real = {i: s for i, s in outcomes.items() if i not in copies}
        planted = {i: s for i, s in outcomes.items() if i in copies}
        assert len(real) == 2 and len(planted) == len(copies), outcomes
        # The real tests pass either way: only the copies tell the forged module apart.
        assert set(real.values()) == {"passed"}, outcomes
        assert set(planted.values()) == {"passed" if copies_pass else "failed"}, outcomes
