"""The ``aggregation:`` choice: sync by default, absent from a default run's fingerprint; fedbuff and
fedasync validated (the clock, concurrency, no rounds' settings, methods that need synchronous rounds
refused, saying why and how to fix it; fedavg, fedprox, fedntd and fedgkd accepted)."""
import pytest

from mpifed.config import ConfigError, load, math_fingerprint

ASYNC = ["aggregation.name=fedbuff", "system.clock=true", "aggregation.concurrency=5"]


def errors(overrides):
    with pytest.raises(ConfigError) as e:
        load(None, overrides)
    return str(e.value)


def test_sync_is_the_default_and_leaves_the_fingerprint_as_it_was():
    cfg, d = load()
    assert cfg.aggregation.name == "sync" and d["aggregation"] == {"name": "sync"}
    assert "aggregation" not in math_fingerprint(d)


def test_fedbuff_options_have_the_papers_defaults():
    from mpifed.federation.async_rules import AGGREGATIONS
    buff = AGGREGATIONS.get("fedbuff").Options()
    assert (buff.buffer, buff.staleness, buff.a) == (10, "polynomial", 0.5)     # K = 10, 1 / sqrt(1 + staleness)
    mix = AGGREGATIONS.get("fedasync").Options()
    assert (mix.alpha, mix.staleness, mix.a, mix.b) == (0.6, "polynomial", 0.5, 4.0)


def test_an_asynchronous_server_needs_the_clock_and_at_most_all_clients_in_flight():
    text = errors(["aggregation.name=fedbuff", "aggregation.concurrency=50"])
    assert "set system.clock=true" in text
    assert "aggregation.concurrency: 50 clients cannot train at once among data.num_clients=10" in text


def test_settings_of_rounds_are_refused():
    text = errors(ASYNC + ["system.deadline=100", "selection.name=weighted"])
    assert "system.deadline (100.0), selection (weighted) has no meaning" in text


@pytest.mark.parametrize("method", ["scaffold", "feddyn", "fedproto", "moon"])
def test_methods_that_need_synchronous_rounds_are_refused_saying_why(method):
    text = errors(ASYNC + [f"algorithm.name={method}"])
    assert f"algorithm {method!r} needs synchronous rounds" in text and "set aggregation=sync" in text
    assert "choose a method that runs asynchronously (fedavg, fedgkd, " in text


@pytest.mark.parametrize("method", ["fedavg", "fedprox", "fedntd", "fedgkd", "fedgkd_plus"])
def test_methods_whose_clients_need_only_their_start_downlink_are_accepted(method):
    cfg, d = load(None, ASYNC + [f"algorithm.name={method}"])
    assert d["aggregation"]["name"] == "fedbuff" and d["aggregation"]["concurrency"] == 5
    assert math_fingerprint(d)["aggregation"] == d["aggregation"]


def test_availability_needs_no_deadline_asynchronously_the_server_waits_its_idle_wait():
    load(None, ASYNC + ["system.availability=on-off"])
    assert "needs a deadline" in errors(["system.clock=true", "system.availability=on-off"])
