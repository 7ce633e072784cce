"""ringleader.init with explicit arguments and no torchrun variables: rank 0
hosts a ringleader.Store on a free port; the address reaches the other
ranks through argv (as any side channel would)."""

import sys

import numpy as np

import ringleader

rank, world, store_port = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
store = ringleader.Store(f"127.0.0.1:{store_port}", run_id="explicit-test") if rank == 0 else None
pg = ringleader.init(rank=rank, world_size=world, store_addr=f"127.0.0.1:{store_port}", run_id="explicit-test",
                     timeout=15, init_timeout=30)
x = np.full(3, rank + 1.0)
pg.all_reduce(x)
assert x.tolist() == [world * (world + 1) / 2] * 3, x
print(f"OK rank {pg.rank} of {pg.world_size}", flush=True)
pg.destroy()
if store is not None:
    assert store.wait_idle(10)
    store.close()
