"""The token comparison behind the audit: first differing position, drifted tokens, changed spans."""

from __future__ import annotations

from polarproxy.audit.compare import common_prefix, compare


def test_identical_sequences_have_no_first_diff():
    d = compare([1, 2, 3], [1, 2, 3])
    assert d.identical and d.first_diff is None
    assert d.drifted_tokens == d.changed_recorded == d.changed_fresh == 0


def test_a_dropped_block_is_a_recorded_span_and_everything_after_it_drifts():
    # the model saw [9, 9] that the re-render lacks; what follows is the same text
    d = compare([1, 2, 3, 9, 9, 4, 5], [1, 2, 3, 4, 5])
    assert d.first_diff == 3
    assert d.drifted_tokens == 4  # recorded tokens at or after the first difference
    assert (d.changed_recorded, d.changed_fresh) == (2, 0)


def test_a_re_serialized_span_changes_on_both_sides():
    d = compare([1, 7, 8, 5], [1, 6, 5])
    assert d.first_diff == 1 and d.drifted_tokens == 3
    assert (d.changed_recorded, d.changed_fresh) == (2, 1)


def test_a_prefix_differs_at_the_shorter_length():
    d = compare([1, 2, 3], [1, 2, 3, 4])
    assert not d.identical and d.first_diff == 3
    assert d.drifted_tokens == 0 and (d.changed_recorded, d.changed_fresh) == (0, 1)


def test_the_common_suffix_never_overlaps_the_common_prefix():
    d = compare([1, 1, 1], [1, 1])
    assert d.first_diff == 2 and d.common_suffix == 0
    assert (d.changed_recorded, d.changed_fresh) == (1, 0)


def test_long_sequences_find_the_exact_position_past_the_fast_path():
    a = list(range(20_000))
    for at in (0, 4095, 4096, 12_289, 19_999):
        b = a.copy()
        b[at] = -1
        assert common_prefix(a, b) == at
        assert compare(a, b).first_diff == at and compare(a, b).changed_recorded == 1
