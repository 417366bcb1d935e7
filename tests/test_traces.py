"""Traces in FedScale's format (mpifed.federation.traces): its pickles and their CSV form load,
and a pickle that would run code, or build anything but plain data, is refused before it is built."""
import pickle

import numpy as np
import pytest

from mpifed.federation.traces import TraceError, read_availability_trace, read_device_trace

DEVICE = {432802: {"computation": 162.0, "communication": 5648.1}, 7: {"computation": 40.5, "communication": 800.0}}
BEHAVE = {7: {"duration": 100, "inactive": [3600, 50000], "finish_time": 86400, "active": [0, 43200],
              "model": "SM-G930F"}}


def test_fedscales_pickles_load_sorted_by_client_id(tmp_path):
    (tmp_path / "device").write_bytes(pickle.dumps(DEVICE))
    device = read_device_trace(tmp_path / "device")
    assert device.ms_per_sample.tolist() == [40.5, 162.0] and device.kbit_per_s.tolist() == [800.0, 5648.1]
    (tmp_path / "behave").write_bytes(pickle.dumps(BEHAVE, protocol=2))
    trace = read_availability_trace(tmp_path / "behave")
    assert [trace.available(0, t) for t in (0, 3600, 3601, 43200, 86400 + 100, 86400 + 4000)] == [
        True, True, False, True, True, False]


def test_the_csv_form_reads_the_same(tmp_path):
    (tmp_path / "device.csv").write_text("client_id,computation,communication\n432802,162.0,5648.1\n7,40.5,800\n")
    assert read_device_trace(tmp_path / "device.csv").ms_per_sample.tolist() == [40.5, 162.0]
    (tmp_path / "behave.csv").write_text("client_id,finish_time,active,inactive\n7,86400,0;43200,3600;50000\n")
    trace = read_availability_trace(tmp_path / "behave.csv")
    assert [np.asarray(w).tolist() for w in trace.windows] == [[[0.0, 3600.0], [43200.0, 50000.0]]]


class _Payload:
    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


def test_a_pickle_that_would_run_code_is_refused_before_it_runs(tmp_path):
    ran = tmp_path / "the-payload-ran"
    (tmp_path / "device").write_bytes(pickle.dumps({1: {"computation": _Payload(ran), "communication": 1.0}}))
    with pytest.raises(TraceError, match=r"is refused: it asks for (io|builtins)\.open, and a trace holds only dicts"):
        read_device_trace(tmp_path / "device")
    assert not ran.exists()
    (tmp_path / "numpy").write_bytes(pickle.dumps({1: {"computation": np.float64(3.0), "communication": 1.0}}))
    with pytest.raises(TraceError, match=r"it asks for numpy\."):
        read_device_trace(tmp_path / "numpy")


@pytest.mark.parametrize("content, said", [
    (pickle.dumps([1, 2]), "a trace maps client ids to their entries"),
    (pickle.dumps({1: {"computation": 1.0}}), "client 1's entry lacks computation, communication"),
    (pickle.dumps({1: {"computation": "fast", "communication": 1.0}}),
     "client 1's computation is 'fast', not a number"),
    (pickle.dumps({1: {"computation": 0.0, "communication": 1.0}}), "must be above 0"),
    (b"\x80\x04garbage", "is not a trace pickle"),
])
def test_a_bad_device_trace_is_one_message(tmp_path, content, said):
    (tmp_path / "device").write_bytes(content)
    with pytest.raises(TraceError, match=said):
        read_device_trace(tmp_path / "device")


def test_a_bad_availability_trace_is_one_message(tmp_path):
    (tmp_path / "behave").write_bytes(pickle.dumps({1: {"active": [0, 5], "inactive": [3], "finish_time": 10}}))
    with pytest.raises(TraceError, match="needs as many active as inactive times"):
        read_availability_trace(tmp_path / "behave")
    (tmp_path / "behave.csv").write_text("client_id,active\n1,0\n")
    with pytest.raises(TraceError, match="its header must name client_id, finish_time, active, inactive"):
        read_availability_trace(tmp_path / "behave.csv")
