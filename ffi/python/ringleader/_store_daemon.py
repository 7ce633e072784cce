"""A ringleader store in a process of its own, for jobs without `ringleader launch`.

Under torchrun, or ranks started by hand (``RANK=... python train.py``),
some process must host the job's ringleader store. Hosted inside rank 0, it
would die with rank 0 (rank 0 is the rank most often OOM-killed: it logs and
checkpoints), and with it the one place that tells the other ranks who
died. So rank 0 starts this module as a detached process (a session of its
own, so that a signal to rank 0's process group, or rank 0's death, does not
reach it): it hosts the store, writes its port on stdout, closes stdout, and
serves until the job is over, i.e. every rank that joined has left or
vanished (``rl_store_serve_job``). It exits on its own, also when no rank
joins within the join timeout.

Usage (by ringleader.torch; not meant to be run by hand)::

    RINGLEADER_TOKEN=... python -m ringleader._store_daemon --bind 127.0.0.1:0 --run-id ID --join-timeout 300
"""

import argparse
import os
import sys


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m ringleader._store_daemon")
    p.add_argument("--bind", required=True, help="HOST:PORT to listen on (port 0: any free port)")
    p.add_argument("--run-id", required=True)
    p.add_argument("--join-timeout", type=float, default=300.0, help="seconds to wait for a first rank")
    args = p.parse_args(argv)

    from . import Store, _check, _L  # imported here: the parent only needs this module's path

    token = os.environ.get("RINGLEADER_TOKEN") or None
    try:
        store = Store(args.bind, run_id=args.run_id, token=token)
    except Exception as e:  # noqa: BLE001 - reported to the parent on stdout
        sys.stdout.write(f"ERROR {e}\n")
        sys.stdout.flush()
        return 1
    sys.stdout.write(f"PORT {store.port}\n")
    sys.stdout.flush()
    # Nothing more to say: the parent stops reading, and a pipe held open
    # would keep a launcher reading it waiting.
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    try:
        _check(_L.rl_store_serve_job(store._h, float(args.join_timeout)))
    except Exception:  # noqa: BLE001 - no rank joined in time: nothing to serve
        pass
    finally:
        store.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
