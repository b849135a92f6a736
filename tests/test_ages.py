"""One parser of ages and times for --before, --since and --stale-after (polarproxy/ages.py)."""

from __future__ import annotations

import datetime

import pytest

from polarproxy.ages import parse_age, parse_time


def test_ages_take_seconds_minutes_hours_days_weeks_with_or_without_a_space():
    assert parse_age("90s") == 90
    assert parse_age("10min") == 600
    assert parse_age(" 2 h ") == 7200
    assert parse_age("1.5d") == 1.5 * 86400
    assert parse_age("2w") == 14 * 86400


def test_a_bare_m_is_refused_naming_both_readings():
    with pytest.raises(ValueError, match="minutes or months") as e:
        parse_age("1m")
    assert "1min" in str(e.value)


@pytest.mark.parametrize("bad", ["ten", "10", "10 parsecs", "-5s", ""])
def test_bad_ages_name_the_value_and_the_units(bad):
    with pytest.raises(ValueError, match="s, min, h, d or w"):
        parse_age(bad)


def test_times_are_iso_dates_datetimes_or_ages_ago():
    now = 1_800_000_000.0
    assert parse_time("30d", now=now) == now - 30 * 86400
    assert parse_time("90min", now=now) == now - 5400
    utc = datetime.datetime(2026, 1, 31, 12, tzinfo=datetime.UTC).timestamp()
    assert parse_time("2026-01-31T12:00:00Z") == utc
    assert parse_time("2026-01-31T12:00:00+00:00") == utc
    assert parse_time(" 2026-01-31 ") == datetime.datetime(2026, 1, 31).timestamp()  # local time


def test_a_bad_time_names_the_forms_it_takes():
    with pytest.raises(ValueError, match="ISO date"):
        parse_time("yesterday")
    with pytest.raises(ValueError, match="minutes or months"):
        parse_time("3m")
