"""What a minute of GPU history keeps: the means of the readings that had each value."""

from __future__ import annotations

from hangd.analysis.gpuminutes import minute_means, reading


def test_a_minute_is_the_mean_of_the_readings_that_had_each_value():
    got = minute_means([reading({"util_gpu": 100, "gpm": {"SM_UTIL": 18.0}, "power_w": 124.0, "mem_used": 4 << 30}),
                        reading({"util_gpu": 50, "gpm": None, "power_w": 700.0, "mem_used": None}),
                        reading({"util_gpu": 0, "power_w": None, "mem_used": 2 << 30})])
    assert got == {"util": 50.0, "sm": 18.0, "power_w": 412.0, "mem_used": float(3 << 30)}


def test_a_value_no_reading_had_stays_unknown_not_zero():
    got = minute_means([reading({"util_gpu": None, "gpm": {}}), reading({})])
    assert got == {"util": None, "sm": None, "power_w": None, "mem_used": None}
