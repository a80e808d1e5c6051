"""Shared fixtures."""

from __future__ import annotations

from pathlib import Path

import pytest

from .paths import ROOT


@pytest.fixture(scope="session")
def root() -> Path:
    return ROOT
