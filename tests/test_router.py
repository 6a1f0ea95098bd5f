"""The router's table: path parameters, optional parts, 404/405, and its cache of recent matches."""

import pytest

from tensorgate.codec.errors import InferError
from tensorgate.server.router import MATCHES_KEPT, MethodNotAllowed, Router, body_response


async def _answer(request):
    return body_response(b"{}")


def _errors(error: InferError):
    return body_response(error.message.encode(), status=400)


@pytest.fixture
def router() -> Router:
    router = Router(fallback_errors=_errors)
    router.add("POST", "/v2/models/{model}[/versions/{version}]/infer", _answer, _errors)
    router.add("GET", "/v2/models/{model}[/versions/{version}]", _answer, _errors)
    return router


def test_parameters_belong_to_the_path_asked_each_time(router: Router) -> None:
    for _ in range(3):  # again and again: answers from the cache must not mix paths up
        assert router.match("POST", "/v2/models/a/infer")[1] == {"model": "a", "version": ""}
        assert router.match("POST", "/v2/models/b/versions/7/infer")[1] == {"model": "b", "version": "7"}


def test_matches_stay_right_past_the_cache_size(router: Router) -> None:
    for n in range(MATCHES_KEPT * 2 + 3):
        route, params = router.match("GET", f"/v2/models/m{n}")
        assert params == {"model": f"m{n}", "version": ""}
        assert route.method == "GET"
    assert router.match("GET", "/v2/models/m0")[1]["model"] == "m0"


def test_a_route_added_later_is_found_for_a_path_matched_before(router: Router) -> None:
    with pytest.raises(InferError, match="no endpoint"):
        router.match("GET", "/v2/health/live")
    router.add("GET", "/v2/health/live", _answer, _errors)
    assert router.match("GET", "/v2/health/live")[0].method == "GET"


def test_the_other_method_of_a_matched_path_is_refused(router: Router) -> None:
    router.match("GET", "/v2/models/a")
    with pytest.raises(MethodNotAllowed) as refused:
        router.match("POST", "/v2/models/a")
    assert refused.value.allowed == ["GET", "HEAD"]
    with pytest.raises(InferError, match="no endpoint PUT /nowhere"):
        router.match("PUT", "/nowhere")


def test_the_match_cache_stays_bounded(router: Router) -> None:
    """Paths a client makes up (a model name each) never grow the cache past its size."""
    for n in range(MATCHES_KEPT * 3):
        router.match("GET", f"/v2/models/made-up-{n}")
        assert len(router._matched) <= MATCHES_KEPT
    with pytest.raises(InferError):
        router.match("GET", "/nowhere/at/all")  # refusals are not remembered either
    assert len(router._matched) <= MATCHES_KEPT
