"""Which temperature each trainable token is scored at: the row's per-call `logprob_temperatures` mapped
onto the tokens each call sampled; rows that do not say are trained at T = 1 (or
--assume-logprob-temperature) with a warning that counts them."""

from __future__ import annotations

import pytest

from polarproxy.train.config import TrainConfig
from polarproxy.train.data import DataError, sample_from_row, samples_from_rows


def _row(**extra):
    row = {
        "episode_id": "ep",
        "call_ids": ["a", "b"],
        "input_ids": list(range(10)),
        "loss_mask": [0, 0, 1, 1, 0, 0, 0, 1, 1, 1],
        "logprobs": [None, None, -0.5, -0.5, None, None, None, -0.1, -0.2, -0.3],
        "advantage": 1.0,
        "metadata": {"call_output_spans": [[2, 4], [7, 10]]},
    }
    return {**row, **extra}


def test_each_call_s_tokens_get_its_temperature():
    s = sample_from_row(_row(logprob_temperatures=[0.6, 0.8]))
    assert s.temperatures[2:4] == [0.6, 0.6] and s.temperatures[7:10] == [0.8] * 3
    assert not s.temperature_assumed
    same = sample_from_row(_row(logprob_temperatures=[0.7, 0.7], metadata={}))  # no spans needed
    assert same.temperatures == [0.7] * 10
    assert sample_from_row(_row(logprob_temperatures=[1.0, 1]), "x").temperatures == []  # T = 1: no scaling


def test_rows_that_cannot_say_which_token_is_at_which_temperature_are_refused():
    with pytest.raises(
        DataError, match=r"different logprob temperatures \(\[0.6, 0.8\]\).*call_output_spans"
    ):
        sample_from_row(_row(logprob_temperatures=[0.6, 0.8], metadata={}))
    with pytest.raises(DataError, match=r"logprob temperature -1.*positive number or null"):
        sample_from_row(_row(logprob_temperatures=[-1, 0.6]))


def test_rows_without_a_logprob_temperature_train_at_1_or_the_assumed_one_with_a_warning():
    told: list[str] = []
    rows = [_row(), _row(logprob_temperatures=[None, None]), _row(logprob_temperatures=[0.6, 0.6])]
    samples = samples_from_rows(rows, warn=told.append)
    assert [s.temperature_assumed for s in samples] == [True, True, False]
    assert samples[0].temperatures == [] and samples[2].temperatures == [0.6] * 10
    assert len(told) == 1 and told[0].startswith("2 rows do not say which temperature")
    assert "--assume-logprob-temperature" in told[0]
    told.clear()
    assumed = samples_from_rows(rows, assume_temperature=0.6, warn=told.append)
    assert assumed[0].temperatures == [0.6] * 10 and not told  # the user said so: no warning
    with pytest.raises(ValueError, match=r"--assume-logprob-temperature must be > 0"):
        TrainConfig(assume_logprob_temperature=0.0).check()
