"""The package as shipped: its version is the API's, its types are marked, its classes cover
the problem codes of the document it was generated from."""
from __future__ import annotations

import json
import tomllib
from pathlib import Path

import toolexec
from toolexec import errors

ROOT = Path(__file__).resolve().parents[1]
REPO = ROOT.parents[1]


def test_the_client_version_is_the_api_version() -> None:
    api = json.loads((REPO / "openapi" / "openapi.json").read_text())["info"]["version"]
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert project == api == toolexec.__version__


def test_typed_package() -> None:
    assert (ROOT / "src" / "toolexec" / "py.typed").is_file()


def test_every_problem_code_of_the_document_has_its_class() -> None:
    doc = json.loads((REPO / "openapi" / "openapi.json").read_text())
    codes = doc["components"]["schemas"]["ProblemCode"]["enum"]
    assert list(errors.BY_CODE) == codes
    statuses = {}
    for line in (REPO / "docs" / "problems.md").read_text().splitlines():
        if line.startswith("| `"):
            cells = [c.strip() for c in line.split("|")]
            statuses[cells[1].strip("`")] = int(cells[2])
    assert set(statuses) == set(codes)
    base = {400: errors.InvalidRequestError, 401: errors.AuthError, 403: errors.AuthError,
            404: errors.NotFoundError, 405: errors.NotFoundError, 408: errors.InvalidRequestError,
            409: errors.ConflictError, 413: errors.InvalidRequestError, 415: errors.InvalidRequestError,
            422: errors.InvalidRequestError, 429: errors.UnavailableError, 500: errors.UnavailableError,
            502: errors.UnavailableError, 503: errors.UnavailableError}
    for code, status in statuses.items():
        assert issubclass(errors.BY_CODE[code], base[status]), code
