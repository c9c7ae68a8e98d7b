"""A real PostgreSQL server for the ingress tests (``ingress.localpg``), started once per
session, and a fresh database on it per test."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from ingress.localpg import PostgresMissing, create_database, local_postgres


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    try:
        with local_postgres() as url:
            yield url
    except PostgresMissing as exc:
        pytest.skip(str(exc))


@pytest.fixture
def postgres_db(postgres_url: str, request: pytest.FixtureRequest) -> str:
    return create_database(postgres_url, "t_" + request.node.name.lower())
