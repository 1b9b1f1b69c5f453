"""The routing rules the simulated fleet and the Ray Serve router share
(`kvblocks.router._policy`)."""

from __future__ import annotations

import kvblocks as kb
import pytest
from kvblocks.router._policy import route_scores


def test_dynamo_cost_is_uncached_blocks_plus_weighted_active_blocks() -> None:
    scores = route_scores(
        [4, 0, 2], 10, load_weight=0.5, cache_threshold=0.3, active_blocks=[8, 0, 2]
    )
    assert scores == [10 - 4 + 4.0, 10.0, 10 - 2 + 1.0]


def test_threshold_rule_follows_the_prefix_only_above_the_threshold() -> None:
    # 3 of 10 blocks is not above 0.3: the least loaded engine decides (None).
    assert route_scores([3, 1], 10, load_weight=0, cache_threshold=0.3) is None
    assert route_scores([4, 1], 10, load_weight=0, cache_threshold=0.3) == [-4.0, -1.0]
    assert route_scores([], 0, load_weight=0, cache_threshold=0.3) is None


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"load_weight": -1.0, "cache_threshold": 0.3, "active_blocks": [0]}, "load_weight"),
        ({"load_weight": 0.0, "cache_threshold": 1.5}, "cache_threshold"),
        ({"load_weight": 1.0, "cache_threshold": 0.3}, "active blocks"),
        ({"load_weight": 1.0, "cache_threshold": 0.3, "active_blocks": []}, "active blocks"),
    ],
)
def test_bad_rule_arguments_are_refused(kwargs: dict[str, object], needle: str) -> None:
    with pytest.raises(kb.InvalidArgumentError, match=needle):
        route_scores([1], 4, **kwargs)  # type: ignore[arg-type]
