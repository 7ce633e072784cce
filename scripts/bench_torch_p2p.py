#!/usr/bin/env python3
"""Point-to-point and the ops beside it through torch.distributed, one backend per launch.

Run under torchrun with the backend as the argument; rank 0 prints one line
per measurement, microseconds per call (per round trip for the ping-pong),
over 2,000 calls after 200 of warm-up and a barrier:

    torchrun --nproc-per-node 2 scripts/bench_torch_p2p.py ringleader
    torchrun --nproc-per-node 2 scripts/bench_torch_p2p.py gloo

- send/recv ping-pong: ``dist.send`` then ``dist.recv`` on rank 0, the
  other way round on rank 1 (pipeline parallelism's hand-off);
- batch_isend_irecv: both ranks post an isend and an irecv to each other
  and wait for both;
- reduce (to rank 0) and all_to_all_single, for reference: collectives
  that take the backend's Python path.

Tensors are 2 float32 (8 B). Alternate the backends over several launches
(as docs/perf/p2p-2026-12-07.md does) and compare medians: the 2-vCPU VM's
state changes between launches. For ringleader, PYTHONPATH=ffi/python and
RINGLEADER_LIBRARY=target/release/libringleader.so run the source tree.
"""

import sys
import time

import torch
import torch.distributed as dist

CALLS, WARMUP = 2000, 200


def main():
    backend = sys.argv[1] if len(sys.argv) > 1 else "ringleader"
    if backend == "ringleader":
        import ringleader.torch  # noqa: F401 - registers the backend
    dist.init_process_group(backend=backend)
    r = dist.get_rank()
    peer = 1 - r if r < 2 else None
    t, out = torch.ones(2), torch.zeros(2)

    def pingpong():
        if r == 0:
            dist.send(t, 1)
            dist.recv(out, 1)
        elif r == 1:
            dist.recv(out, 0)
            dist.send(t, 0)

    def batch():
        if peer is None:
            return
        ops = [dist.P2POp(dist.isend, t, peer), dist.P2POp(dist.irecv, out, peer)]
        for w in dist.batch_isend_irecv(ops):
            w.wait()

    cases = [("send/recv ping-pong (round trip)", pingpong), ("batch_isend_irecv", batch),
             ("reduce", lambda: dist.reduce(t, 0)), ("all_to_all_single", lambda: dist.all_to_all_single(out, t))]
    for name, f in cases:
        for _ in range(WARMUP):
            f()
        dist.barrier()
        start = time.perf_counter()
        for _ in range(CALLS):
            f()
        us = (time.perf_counter() - start) / CALLS * 1e6
        if r == 0:
            print(f"{backend:10s} {name:34s} {us:8.1f} us", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
