"""Readers of a networked tensor store for test_store_network.py.

    store_reader.py watch STORE KEY FOLDER INDEX
        reads KEY whole, again and again, until FOLDER/done exists; makes
        FOLDER/reader-INDEX-saw-N when it sees its N-th distinct state and
        writes every distinct state it saw (the SHA-1 of each tensor) to
        FOLDER/reader-INDEX.json
    store_reader.py layout STORE KEY OUT
        reads every tensor of KEY as 3 devices would hold it split on its
        last dimension (uneven splits as torch.chunk makes them, Replicate
        for a scalar), only their boxes, puts the boxes together and saves
        them to OUT with this host's name"""

import hashlib
import json
import os
import socket
import sys
import time


def hashes(state):
    return {name: hashlib.sha1(t.detach().contiguous().numpy().tobytes()).hexdigest()
            for name, t in sorted(state.items())}


def watch(store, key, folder, index):
    seen = []
    gets = 0
    while not os.path.exists(os.path.join(folder, "done")):
        if not store.exists(key):
            time.sleep(0.02)
            continue
        h = hashes(store.get(key))
        gets += 1
        if h not in seen:
            seen.append(h)
            open(os.path.join(folder, f"reader-{index}-saw-{len(seen)}"), "w").close()
    with open(os.path.join(folder, f"reader-{index}.json"), "w") as f:
        json.dump({"seen": seen, "gets": gets}, f)


def layout(store, key, out):
    import torch
    import tdx

    state = {}
    for name, (t, _) in store.tensors(key).items():
        if not t:
            state[name] = store.get(key, name, mesh=(3,), placements=[tdx.Replicate()],
                                    coords=(0,))
            continue
        boxes = [store.get(key, name, mesh=(3,), placements=[tdx.Shard(len(t) - 1)],
                           coords=(c,)) for c in range(3)]
        state[name] = torch.cat(boxes, dim=len(t) - 1)
    torch.save({"host": socket.gethostname(), "state": state}, out)


if __name__ == "__main__":
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
    import tdx.store

    mode, where, key = sys.argv[1], tdx.store.Store(sys.argv[2]), sys.argv[3]
    if mode == "watch":
        watch(where, key, sys.argv[4], int(sys.argv[5]))
    else:
        layout(where, key, sys.argv[4])
