"""The client-state store: memory within its budget, packed slots on disk, versions a resume needs."""
import json

import numpy as np
import pytest
import torch

from mpifed.round.client_state import ClientStateError, ClientStates
from mpifed.round.protocol import Layout


def layout(floats=4):
    return Layout("client state", {"w": ((floats,), np.float32), "flag": ((1,), np.float32)})


def state(v, floats=4):
    return {"w": torch.full((floats,), float(v)), "flag": torch.ones(1)}


def store(root, budget_mb=0, versions=3, floats=4):
    return ClientStates(root, layout(floats), budget_mb=budget_mb, versions=versions)


def stored(root, cid):
    """The rounds in client ``cid``'s slots, read from the files as the format says (empty: -1)."""
    meta = json.loads((root / "store.json").read_text())
    block, j = divmod(cid, meta["clients_per_file"])
    raw = (root / f"block_{block:05d}.bin").read_bytes()
    out = []
    for v in range(meta["versions"]):
        head = raw[(j * meta["versions"] + v) * meta["slot_bytes"]:][:56]
        ok = len(head) == 56 and head[:8] == b"MPIFEDCS" and int(np.frombuffer(head[8:16], np.int64)[0]) == cid
        out.append(int(np.frombuffer(head[16:24], np.int64)[0]) if ok else -1)
    return out


def test_states_stay_in_memory_within_the_budget_and_reach_disk_at_flush(tmp_path):
    s = store(tmp_path, budget_mb=1)
    for cid in range(3):
        s.put(cid, 0, state(cid), resume_rounds=())
    assert not tmp_path.exists() or not any(tmp_path.iterdir()), "no disk write per client per round"
    assert s.get(2, 0)["w"].tolist() == [2.0] * 4 and s.get(7, None) is None
    s.flush(resume_rounds=())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["block_00000.bin", "store.json"]
    assert [stored(tmp_path, c) for c in range(3)] == [[0, -1, -1]] * 3
    fresh = store(tmp_path, budget_mb=1)     # a resumed worker reads them back
    assert fresh.get(1, 0)["w"].tolist() == [1.0] * 4


def test_states_beyond_the_budget_spill_to_disk(tmp_path):
    s = store(tmp_path)
    s.put(5, 3, state(9), resume_rounds=(4,))
    assert stored(tmp_path, 5) == [3, -1, -1]
    assert s.get(5, 3)["w"].tolist() == [9.0] * 4


def test_a_state_moves_between_workers_with_its_round(tmp_path):
    a, b = store(tmp_path, budget_mb=1), store(tmp_path, budget_mb=1)
    a.put(3, 2, state(7), resume_rounds=())
    message = a.export(3, 2)
    with pytest.raises(ClientStateError, match="missing"):
        a.get(3, 2)                             # handed over, not copied
    b.adopt(3, message)
    assert b.get(3, 2)["w"].tolist() == [7.0] * 4
    b.flush(resume_rounds=())
    assert stored(tmp_path, 3)[0] == 2         # the version is the round the client last trained in


def test_a_million_clients_are_a_few_files(tmp_path):
    s = store(tmp_path, budget_mb=0, versions=2)
    for cid in (0, 4095, 4096, 999_999):
        s.put(cid, 1, state(cid), resume_rounds=())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["block_00000.bin", "block_00001.bin", "block_00244.bin",
                                                          "store.json"]
    assert store(tmp_path).get(999_999, 1)["w"].tolist() == [999_999.0] * 4


def test_a_new_version_never_replaces_one_a_resume_needs(tmp_path):
    s = store(tmp_path)
    for rnd in (1, 3, 6):
        s.put(0, rnd, state(rnd), resume_rounds=(4,))
    assert stored(tmp_path, 0) == [1, 3, 6]
    s.put(0, 8, state(8), resume_rounds=(4, 7))     # a resume at 4 needs round 3's, one at 7 round 6's
    assert stored(tmp_path, 0) == [8, 3, 6]
    s.put(0, 9, state(9), resume_rounds=(7,))       # the checkpoint after round 4 is gone: 3 is free
    assert stored(tmp_path, 0) == [8, 9, 6]


def test_a_resume_writes_over_the_versions_of_the_attempt_it_abandoned(tmp_path):
    s = store(tmp_path)
    for rnd in (1, 3, 6):
        s.put(0, rnd, state(rnd), resume_rounds=(2,))
    resumed = store(tmp_path)                        # from the checkpoint after round 2: 3 and 6 were abandoned
    resumed.put(0, 3, state(30), resume_rounds=(2,))
    assert stored(tmp_path, 0) == [1, 3, 6] and store(tmp_path).get(0, 3)["w"].tolist() == [30.0] * 4
    resumed.put(0, 4, state(4), resume_rounds=(2,))
    assert stored(tmp_path, 0) == [1, 3, 4] or stored(tmp_path, 0) == [1, 4, 6]
    assert store(tmp_path).get(0, 1)["w"].tolist() == [1.0] * 4


def test_a_large_state_sits_on_page_boundaries(tmp_path):
    s = store(tmp_path, floats=2048)
    s.put(1, 0, state(1, 2048), resume_rounds=())
    meta = json.loads((tmp_path / "store.json").read_text())
    assert meta["slot_bytes"] % 4096 == 0 and meta["slot_bytes"] >= 56 + 2048 * 4 + 8
    path, offset = s.locate(1, 0)
    assert offset % 4096 == 0 and path.name == "block_00000.bin"


def test_a_slot_changed_in_place_fails_its_checksum(tmp_path):
    s = store(tmp_path)
    s.put(0, 1, state(1), resume_rounds=())
    path, offset = s.locate(0, 1)
    raw = bytearray(path.read_bytes())
    raw[offset + 56: offset + 60] = np.array([1e30], dtype=np.float32).tobytes()    # one float set to 1e30
    path.write_bytes(bytes(raw))
    with pytest.raises(ClientStateError, match="client 0's state after round 2 in .*block_00000.bin is damaged "
                                               r"\(its content does not match its SHA-256\)"):
        store(tmp_path).get(0, 1)


def test_a_missing_state_is_an_error_not_zeros_or_an_older_state(tmp_path):
    s = store(tmp_path)
    s.put(0, 1, state(1), resume_rounds=(1,))
    s.put(0, 4, state(4), resume_rounds=(1,))
    path, offset = s.locate(0, 4)
    raw = bytearray(path.read_bytes())
    raw[offset: offset + 8] = bytes(8)                # the slot's header wiped
    path.write_bytes(bytes(raw))
    fresh = store(tmp_path)
    with pytest.raises(ClientStateError, match="client 0's state after round 5 is missing"):
        fresh.get(0, 4)                               # never the older round 1's
    assert fresh.get(0, 1)["w"].tolist() == [1.0] * 4


def test_a_store_of_another_method_is_refused(tmp_path):
    store(tmp_path).put(0, 1, state(1), resume_rounds=())
    with pytest.raises(ClientStateError, match="holds client states of 24 bytes, and this method's have 40"):
        store(tmp_path, floats=8).get(0, 1)


def test_the_store_keeps_its_own_number_of_versions_on_resume(tmp_path):
    store(tmp_path, versions=3).put(0, 1, state(1), resume_rounds=())
    resumed = store(tmp_path, versions=5)            # run.keep_checkpoints raised on resume
    resumed.put(0, 2, state(2), resume_rounds=())
    assert stored(tmp_path, 0) == [1, 2, -1] and resumed.get(0, 1)["w"].tolist() == [1.0] * 4


def test_checked_state_files_of_an_earlier_mpifed_are_read_unchecked_ones_refused(tmp_path):
    import hashlib
    (tmp_path / "2").mkdir()
    payload = layout().pack(state(5)).tobytes()
    (tmp_path / "2" / "r0.bin").write_bytes(payload)                                         # no header
    (tmp_path / "2" / "r3.bin").write_bytes(b"MPIFEDCS" + hashlib.sha256(payload).digest() + payload)
    assert store(tmp_path).get(2, 3)["w"].tolist() == [5.0] * 4
    with pytest.raises(ClientStateError, match=r"r0.bin is not a client state mpifed can check: it lacks the "
                                               r"MPIFEDCS header and SHA-256 of one \(24 bytes"):
        store(tmp_path).get(2, 0)
    (tmp_path / "2" / "r3.bin").write_bytes(b"MPIFEDCS" + hashlib.sha256(payload[:-4]).digest() + payload[:-4])
    with pytest.raises(ClientStateError, match="r3.bin holds 20 bytes of state, the method's client state has 24"):
        store(tmp_path).get(2, 3)


def test_a_block_file_that_is_a_link_is_refused(tmp_path):
    store(tmp_path / "elsewhere").put(0, 1, state(1), resume_rounds=())
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "store.json").write_bytes((tmp_path / "elsewhere" / "store.json").read_bytes())
    (tmp_path / "run" / "block_00000.bin").symlink_to(tmp_path / "elsewhere" / "block_00000.bin")
    with pytest.raises(ClientStateError, match="block_00000.bin is a symbolic link"):
        store(tmp_path / "run").get(0, 1)
