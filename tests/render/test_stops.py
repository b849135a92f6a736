from polarproxy.render.stops import StopTrimmer


def run(stops, pieces, matched=None):
    t = StopTrimmer(stops)
    return "".join(t.push(p) for p in pieces) + t.finish(matched)


def test_text_before_a_stop_string_is_kept_and_the_rest_cut():
    assert run(["END"], ["abc E", "N", "D tail"]) == "abc "


def test_partial_stop_string_is_released_when_it_does_not_complete():
    assert run(["END"], ["abc EN", "x"]) == "abc ENx"


def test_no_stops_passes_everything():
    assert run([], ["a", "b"]) == "ab"


def test_held_text_is_dropped_when_the_backend_matched_a_stop_string():
    assert run(["END"], ["abc EN"], matched="END") == "abc "
