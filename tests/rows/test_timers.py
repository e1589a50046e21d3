"""How a serving point names its timer: the timing key, and the name older rows hold."""

from __future__ import annotations


def test_a_serving_point_names_its_timer_by_key_and_older_rows_by_name():
    from dsv4bench.rows import timers as t

    assert t.point_timer({"timer": "profiler_ms"}) == "profiler makespan"
    assert t.point_timer({"timer": "profiler makespan"}) == "profiler makespan"  # older rows
    assert t.point_timer({}) == "events"
    assert t.point_events_ms({"timer": "median_ms", "value_ms": 2.0}) == 2.0
    assert t.point_events_ms({"timer": "events", "value_ms": 2.0}) == 2.0
    assert t.point_events_ms({"timer": "graph_ms", "value_ms": 2.0}) is None
