"""The lock files (make lock) pin what pyproject.toml asks for: a dependency
added or narrowed there without `make lock` fails here, not on a fresh
machine."""

import re
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _pins(name: str) -> dict[str, str]:
    text = (ROOT / name).read_text()
    pins = dict(re.findall(r"^([A-Za-z0-9_.\-]+)==([^\s;\\]+)", text, re.M))
    assert pins, f"{name} pins nothing"
    return {canonicalize_name(k): v for k, v in pins.items()}


RUNTIME = _pins("requirements.lock")
DEV = _pins("requirements-dev.lock")


def _wanted(extra: str | None) -> list[Requirement]:
    lines = (
        PYPROJECT["dependencies"] if extra is None else PYPROJECT["optional-dependencies"][extra]
    )
    return [Requirement(line) for line in lines]


@pytest.mark.parametrize(
    ("requirement", "lock"),
    [
        *((r, "requirements.lock") for r in _wanted(None)),
        *((r, "requirements-dev.lock") for r in _wanted(None) + _wanted("dev")),
    ],
    ids=str,
)
def test_every_requirement_is_pinned_within_its_range(requirement, lock):
    pins = RUNTIME if lock == "requirements.lock" else DEV
    name = canonicalize_name(requirement.name)
    assert name in pins, f"{requirement} is not in {lock}: run make lock"
    assert requirement.specifier.contains(pins[name], prereleases=True), (
        f"{lock} pins {name}=={pins[name]}, outside {requirement}: run make lock"
    )


def test_the_runtime_lock_is_the_dev_lock_without_the_dev_tools():
    assert {name: DEV.get(name) for name in RUNTIME} == RUNTIME


def test_every_pin_has_hashes():
    for name in ("requirements.lock", "requirements-dev.lock"):
        text = (ROOT / name).read_text()
        pins = re.findall(
            r"^[A-Za-z0-9_.\-]+==[^\n]*(?:\n\s+--hash=sha256:[0-9a-f]{64}[^\n]*)+", text, re.M
        )
        assert len(pins) == len(_pins(name)), f"{name}: a pin without --hash"
