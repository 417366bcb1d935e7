"""A server's state is declared once (Server.state): its checkpoint and its restore follow from it."""
import pytest
import torch

from conftest import small_setup
from mpifed.algorithms.base import Algorithm, Server
from mpifed.registry import ALGORITHMS


def test_a_state_name_the_server_does_not_set_fails_when_the_method_is_built():
    class Misspelt(Server):
        state = ("contrl",)

        def __init__(self, options, setup, tools):
            super().__init__(options, setup, tools)
            self.control = torch.zeros(3)

    class Method(Algorithm):
        Server = Misspelt

    with pytest.raises(TypeError, match=r"Misspelt.state names \['contrl'\], which Misspelt.__init__ does not set"):
        Method(None, small_setup()).server(None)


STATEFUL = [(name, {}) for name in ALGORITHMS.names() if ALGORITHMS.get(name).Server.state]   # as each declares
STATEFUL.append(("feddyn", {"evaluate": "clients_mean"}))     # a state that grows with an option


@pytest.mark.parametrize("name,options", STATEFUL,
                         ids=[f"{n}{'-' if o else ''}{'-'.join(o.values())}" for n, o in STATEFUL])
def test_the_checkpoint_holds_the_declared_state_and_restores_it(name, options):
    setup = small_setup()
    cls = ALGORITHMS.get(name)
    options = cls.Options(**options)
    server, restored = cls(options, setup).server(None), cls(options, setup).server(None)
    w = torch.randn(setup.num_floats)
    for s in (server, restored):
        s.start(w)
    for attr in server.state:                    # a recognisable value of each attribute's kind
        now = getattr(server, attr)
        setattr(server, attr, [w + 1, w + 2] if isinstance(now, list) else
                torch.full(now.shape if now is not None else w.shape, 7.0))
    saved = server.state_dict()
    assert set(saved) == set(server.state) and server.state
    restored.load_state_dict(saved)
    for attr in server.state:
        mine, theirs = getattr(server, attr), getattr(restored, attr)
        if isinstance(mine, list):
            assert all(torch.equal(a, b) for a, b in zip(mine, theirs))
        else:
            assert torch.equal(mine, theirs)
