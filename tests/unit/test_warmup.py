"""A warming replica: a model the ingress does not know yet is waited for, then a 503 to
retry, never a 404; once warm, a 404 at once (otela.routing.hold)."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from otela.dataplane.errors import RequestError
from otela.routing.hold import WARM_WAIT_S, Warmup, route_or_hold


def not_found() -> RequestError:
    return RequestError(404, "no such model", code="model_not_found")


class Federation:
    """Routes once the model is known (``known_at``, on trio's clock)."""

    def __init__(self, known_at: float | None) -> None:
        self.known_at = known_at
        self.calls = 0

    async def route(self) -> str:
        self.calls += 1
        if self.known_at is None or trio.current_time() < self.known_at:
            raise not_found()
        return "routed"


def test_warmup_ends_when_caught_up_or_at_its_deadline() -> None:
    now = [0.0]
    caught = [False]
    warmup = Warmup(lambda: caught[0], 10.0, clock=lambda: now[0])
    assert warmup.warming()
    caught[0] = True
    assert not warmup.warming()
    caught[0] = False  # once warm, warm for good
    assert not warmup.warming()
    late = Warmup(lambda: False, 10.0, clock=lambda: now[0])
    now[0] = 10.0
    assert not late.warming()
    assert not Warmup(lambda: False, 0.0).warming()  # 0: off


@pytest.mark.parametrize("known_at, warm_at, expected", [
    (2.0, 100.0, "routed"),  # learned while warming: routed, no error at all
    (None, 100.0, "registry_warming"),  # still warming after WARM_WAIT_S: 503, retry
    (None, 1.0, "model_not_found"),  # warm, and nobody serves it: the usual 404
])
def test_a_request_waits_for_a_warming_replica(known_at: float | None, warm_at: float,
                                               expected: str) -> None:
    async def main() -> None:
        federation = Federation(known_at)

        def warming() -> bool:
            return trio.current_time() < warm_at

        try:
            result = await route_or_hold(None, "m", federation.route, warming)
        except RequestError as error:
            assert error.code == expected
            if expected == "registry_warming":
                assert error.status == 503 and error.headers["Retry-After"]
                assert trio.current_time() == pytest.approx(WARM_WAIT_S, abs=0.2)
            return
        assert result == expected

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


def test_without_warmup_an_unknown_model_is_a_404_at_once() -> None:
    async def main() -> None:
        with pytest.raises(RequestError) as caught:
            await route_or_hold(None, "m", Federation(None).route, lambda: False)
        assert caught.value.code == "model_not_found"
        assert trio.current_time() == 0

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
