"""ExportStats counts the trainable tokens exactly, whatever the mask and the call spans say."""

from __future__ import annotations

import pytest

from polarproxy.export.rows import ExportStats
from polarproxy.reconstruct.trajectory import Trajectory


def _traj(mask: list[int], spans: list[tuple[int, int]]) -> Trajectory:
    n = len(mask)
    return Trajectory(
        episode_id="ep",
        call_ids=[f"c{i}" for i in range(len(spans))],
        strategy="prefix-merge",
        input_ids=list(range(n)),
        loss_mask=mask,
        logprobs=[None] * n,
        model="m",
        weight_version=None,
        finish_reason="stop",
        call_spans=spans,
    )


@pytest.mark.parametrize(
    ("mask", "spans", "trainable"),
    [
        ([0, 0, 1, 1, 0, 1], [(2, 4), (5, 6)], 3),  # ones exactly on the spans
        ([1, 0, 1, 1, 0, 1], [(2, 4), (5, 6)], 4),  # a 1 outside every span is still counted
        ([0, 0, 1, 0, 0, 1], [(2, 4), (5, 6)], 2),  # a span with a masked token
        ([0, 0, 1, 1, 0, 1], [(2, 4), (3, 6)], 3),  # overlapping spans are not counted twice
        ([0, 0, 1, 1, 0, 1], [(5, 6), (2, 4)], 3),  # spans out of order
        ([0, 0, 2, 1, 0, 1], [(2, 4), (5, 6)], 2),  # a value that is neither 0 nor 1 is no trainable token
        ([1, 1], [], 2),  # no spans at all
    ],
)
def test_trainable_tokens_are_the_ones_of_the_loss_mask(mask, spans, trainable):
    stats = ExportStats()
    stats.add(_traj(mask, spans))
    assert stats.trainable_tokens == trainable == mask.count(1)
