"""The asynchronous event queue (mpifed.federation.events): events in (end time, sequence, client)
order, a pure function of the seed; at most `concurrency` in flight, never a client twice; only
available clients dispatched; dropouts keyed; a restored queue continues as the uninterrupted one."""
import numpy as np
import pytest

from mpifed.federation.events import EventQueue


def seconds_of(cid):
    return 1.0 + (cid * 7919 % 13) / 3.0


def run(queue, pops, version=0):
    out = []
    for _ in range(pops):
        queue.fill(version)
        out.append(queue.pop())
    return out


def test_events_come_in_time_order_and_the_order_is_a_pure_function_of_the_seed():
    a = run(EventQueue(3, 20, 5, seconds_of), 200)
    b = run(EventQueue(3, 20, 5, seconds_of), 200)
    assert a == b
    assert [e.end for e in a] == sorted(e.end for e in a)
    assert [e.seq for e in a] != sorted(e.seq for e in a)        # a fast client overtakes a slow one
    assert run(EventQueue(4, 20, 5, seconds_of), 200) != a


def test_at_most_concurrency_clients_in_flight_never_one_twice_and_each_lasts_its_duration():
    queue = EventQueue(0, 6, 4, seconds_of)
    for _ in range(100):
        new = queue.fill(version=2)
        assert len(queue) == 4 and len(queue.busy()) == 4
        for e in new:
            assert e.end == pytest.approx(queue.now + seconds_of(e.cid)) and e.start_version == 2
        queue.pop()
    assert queue.seq == 103


def test_only_available_clients_are_dispatched_and_an_empty_federation_waits():
    def available(t):
        mask = np.zeros(10, dtype=bool)
        if t >= 100:
            mask[[3, 8]] = True
        return mask
    queue = EventQueue(1, 10, 4, seconds_of, available=available, idle_wait=60.0)
    assert queue.fill(0) == [] and queue.pop() is None and queue.now == 60.0
    assert queue.fill(0) == [] and queue.pop() is None and queue.now == 120.0
    assert sorted(e.cid for e in queue.fill(0)) == [3, 8]        # two available: two of the four slots filled


def test_dropouts_are_keyed_draws_at_the_clock_probability():
    events = run(EventQueue(5, 50, 10, seconds_of, dropout=0.3), 3000)
    share = np.mean([e.dropped for e in events])
    assert abs(share - 0.3) < 0.03
    assert events == run(EventQueue(5, 50, 10, seconds_of, dropout=0.3), 3000)


def test_a_restored_queue_continues_as_the_uninterrupted_one():
    whole = run(EventQueue(9, 30, 7, seconds_of), 120)
    first = EventQueue(9, 30, 7, seconds_of)
    head = run(first, 50)
    saved = first.state_dict()
    again = EventQueue(9, 30, 7, seconds_of)
    again.load_state_dict(saved)
    assert head + run(again, 70) == whole


def test_bad_settings_say_what_to_change():
    with pytest.raises(ValueError, match="concurrency 0"):
        EventQueue(0, 5, 0, seconds_of)
    with pytest.raises(ValueError, match="idle_wait"):
        EventQueue(0, 5, 2, seconds_of, idle_wait=0)
