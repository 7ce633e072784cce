"""Failure scenarios through the Python API; argv[1] names one. The rank
that gets an error prints it as one ERROR line (JSON) and exits 3."""

import json
import os
import signal
import sys
import time

import numpy as np

import ringleader


def report(e, t0):
    fields = {"cls": type(e).__name__, "kind": getattr(e, "kind", None), "ranks": getattr(e, "ranks", None),
              "seq": getattr(e, "seq", None), "op": getattr(e, "op", None), "message": str(e),
              "is_runtime_error": isinstance(e, RuntimeError), "elapsed": time.monotonic() - t0}
    print("ERROR " + json.dumps(fields), flush=True)


def main():
    scenario = sys.argv[1]
    pg = ringleader.init(timeout=float(os.environ.get("TEST_TIMEOUT", "20")))
    r = pg.rank
    x = np.ones(4, dtype=np.float32)
    pg.all_reduce(x)
    print("READY", flush=True)
    t0 = time.monotonic()
    try:
        if scenario == "skip":
            if r == 0:  # THE BUG: only rank 0 makes this call
                pg.all_reduce(x)
        elif scenario == "mismatch":
            pg.all_reduce(np.ones(4 if r == 0 else 5, dtype=np.float32))
            pg.barrier()
        elif scenario == "killed":
            if r == 1:
                os.kill(os.getpid(), signal.SIGKILL)
            pg.all_reduce(x)
        elif scenario == "sigint":
            # Rank 0 blocks in a collective rank 1 enters only much later; the
            # test sends SIGINT to rank 0 once it is blocked.
            if r == 1:
                time.sleep(8)
            else:
                print("BLOCKING", flush=True)
            try:
                pg.all_reduce(x)
            except KeyboardInterrupt:
                print(f"KEYBOARD_INTERRUPT after {time.monotonic() - t0:.2f} s", flush=True)
                pg.destroy()
                sys.exit(4)
        elif scenario == "async_skip":
            if r == 0:
                w = pg.all_reduce(x, async_op=True)
                w.wait()
    except ringleader.Error as e:
        report(e, t0)
        sys.exit(3)
    print("DONE", flush=True)
    pg.destroy()


if __name__ == "__main__":
    main()
