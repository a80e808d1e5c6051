"""Regenerate every generated file from the models, or check that none has drifted.

    python -m crl_operator.generate          # write crds/, the chart's crds/, docs/api-reference.md,
                                             # gitops/argocd/argocd-cm.yaml, the chart's dashboard
    python -m crl_operator.generate --check  # exit 1 and name the stale files

CI runs the check; the tests do too.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from crl_operator.apidocs import api_reference
from crl_operator.crds import crd_files
from crl_operator.dashboard import DASHBOARD_PATH, dashboard_json
from crl_operator.gitops import ARGOCD_CM, argocd_cm

log = logging.getLogger(__name__)

CHART = Path("charts/coderepairrl")


def generated_files(root: Path) -> dict[Path, str]:
    """Path -> expected content of every generated file under the repository `root`."""
    files: dict[Path, str] = {}
    for name, text in crd_files().items():
        files[root / "crds" / name] = text
        files[root / CHART / "crds" / name] = text
    files[root / "docs" / "api-reference.md"] = api_reference()
    files[root / ARGOCD_CM] = argocd_cm(root)
    files[root / DASHBOARD_PATH] = dashboard_json()
    return files


def _differs(path: Path, text: str) -> bool:
    return not path.exists() or path.read_text(encoding="utf-8") != text


def stale_files(root: Path) -> list[Path]:
    """Generated files that are missing or differ from what the models produce."""
    return [path for path, text in generated_files(root).items() if _differs(path, text)]


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--check", action="store_true", help="fail on drift instead of writing")
    parser.add_argument("--root", type=Path, default=Path("."), help="repository root")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.check:
        stale = stale_files(args.root)
        for path in stale:
            log.error("stale: %s (run: python -m crl_operator.generate)", path)
        return 1 if stale else 0
    for path, text in generated_files(args.root).items():
        if _differs(path, text):
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
            log.info("wrote %s", path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
