"""An exception in a hook of the method's own code (mpifed.round.method_errors): reported once by
rank 0 (the method, hook, client, round, rank and line), and the fix continued from the last
checkpoint with ``--resume --trust-changed-code``, both versions of the code in the provenance."""
import json
import re

import pytest

from conftest import plugin_method, run_mpi, tiny
from mpifed.algorithms.base import NonFiniteLoss
from mpifed.round.method_errors import hook_failure, method_sources

BROKEN = plugin_method("plug_broken").replace("class PenaltyClient(Client):\n", """class PenaltyClient(Client):
    def begin_client(self, ctx):
        if ctx.server_round == 2:
            self.scale(ctx)

    def scale(self, ctx):
        return 1 / 0

""")


def failing(source):
    """The exception that ``scale`` of ``source``'s client raises, and the file it was defined in."""
    from mpifed.registry import ALGORITHMS
    space = {}
    exec(compile(source, "/somewhere/broken.py", "exec"), space)
    ALGORITHMS.forget("plug_broken")            # registered by the exec: gone, so that later tests may load it
    client = space["PenaltyClient"]
    try:
        client.scale(None, None)
    except ZeroDivisionError as exc:
        return exc


def test_a_failure_passing_through_the_methods_file_names_the_hook_and_line():
    exc = failing(BROKEN)
    found = hook_failure(exc, "plug_broken", {"/somewhere/broken.py"}, rank=2, client=7, server_round=3)
    assert (found.hook, found.where, found.client, found.rank) == ("scale", "broken.py, line 15", 7, 2)
    assert found.text.startswith("Traceback (most recent call last):\n  File \"/somewhere/broken.py\"")
    assert found.text.rstrip().endswith("ZeroDivisionError: division by zero")
    assert hook_failure(exc, "plug_broken", {"/elsewhere/other.py"}, 2, 7, 3) is None   # mpifed's own: as before
    try:
        raise NonFiniteLoss("the loss is nan")
    except NonFiniteLoss as diverged:
        assert hook_failure(diverged, "plug_broken", {__file__}, 2, 7, 3) is None       # a diverged run stays one


def test_the_methods_sources_leave_out_mpifeds_base_classes():
    from mpifed.algorithms.fedprox import FedProx
    found = method_sources(FedProx.Client)
    assert any(f.endswith("fedprox.py") for f in found) and not any(f.endswith("base.py") for f in found)


@pytest.mark.mpi
@pytest.mark.e2e
def test_a_hook_that_raises_on_the_workers_is_reported_once_and_the_fix_continues_the_run(tmp_path):
    plugin = tmp_path / "broken.py"
    plugin.write_text(BROKEN)
    args = [*tiny(tmp_path, "algorithm.name=plug_broken", "train.rounds=3", "run.checkpoint_every=1"),
            "--plugin", str(plugin)]
    failed = run_mpi(3, args, check=False)
    out = failed.stdout + failed.stderr
    assert failed.returncode == 2, out
    assert out.count("Traceback") == 1 and out.count("ZeroDivisionError") == 1, out
    assert re.search(r"the method plug_broken failed in its hook begin_client \(client \d+, round 2, rank [12]\) at "
                     r"broken\.py, line 15:", out), out
    assert re.search(r"It failed as well on: client \d+, round 2, rank [12] \(begin_client\)", out), out
    assert "--resume" in out and "--trust-changed-code" in out and "after round 1" in out
    run = tmp_path / "runs" / "run"
    assert "MethodFailed" in json.loads((run / "status.json").read_text())["error"]

    plugin.write_text(BROKEN.replace("return 1 / 0", "return 1"))          # the fix
    refused = run_mpi(3, [*args, "--resume", str(run)], check=False)
    assert refused.returncode == 2 and "changed since the run started" in refused.stderr, refused.stderr
    assert "add --trust-changed-code" in refused.stderr

    run_mpi(3, [*args, "--resume", str(run), "--trust-changed-code"])
    assert json.loads((run / "status.json").read_text())["state"] == "finished"
    first, last = json.loads((run / "provenance.json").read_text())["segments"]
    assert last["start_round"] == 1 and last["code_changed"]["algorithm"] == {
        "from": first["plugins"][0]["sha256"], "to": last["plugins"][0]["sha256"]}
    assert first["plugins"][0]["sha256"] != last["plugins"][0]["sha256"]


@pytest.mark.e2e
@pytest.mark.usefixtures("unload_plugins")
def test_the_api_continues_a_fixed_run_with_trust_changed_code(tmp_path):
    from mpifed import api
    plugin = tmp_path / "broken.py"
    plugin.write_text(BROKEN)
    sets = [s for s in tiny(tmp_path, "algorithm.name=plug_broken", "train.rounds=3", "run.checkpoint_every=1")[1:]]
    with pytest.raises(api.MpifedError, match="failed in its hook begin_client"):
        api.run(overrides=sets, plugins=[str(plugin)], quiet=True)
    plugin.write_text(BROKEN.replace("return 1 / 0", "return 1"))
    with pytest.raises(api.MpifedError, match="add --trust-changed-code"):
        api.run(overrides=sets, plugins=[str(plugin)], resume=True, quiet=True)
    done = api.run(overrides=sets, plugins=[str(plugin)], resume=True, quiet=True, trust_changed_code=True)
    assert done.status == "finished"
