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


def load_batch():
    # A data loader that hangs: rank 1 never reaches its second all_reduce.
    time.sleep(30)


def main():
    scenario = sys.argv[1]
    pg = ringleader.init(timeout=float(os.environ.get("TEST_TIMEOUT", "20")))
    r = pg.rank
    x = np.ones(4, dtype=np.float32)
    pg.all_reduce(x)  # FIRST CALL
    print("READY", flush=True)
    t0 = time.monotonic()
    try:
        if scenario == "skip":
            if r == 0:  # THE BUG: only rank 0 makes this call
                pg.all_reduce(x)
        elif scenario == "sleep_in_function":
            if r == 1:
                load_batch()
            pg.all_reduce(x)  # SECOND CALL
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
        elif scenario == "panic":
            # Rank 1's engine panics in collective #3 (the test-only hook,
            # not in the header): every wait ends in InternalError, the
            # handles dropped unwaited are freed without a hang.
            import ctypes

            from ringleader import _lib

            if r == 1:
                arm = _lib.lib.rl_testonly_inject_panic
                arm.argtypes = [ctypes.c_char_p, ctypes.c_uint64]
                arm.restype = ctypes.c_int
                assert arm(b"engine", 3) == 0
            works = [pg.all_reduce(np.ones(1024, dtype=np.float32), async_op=True) for _ in range(4)]
            outcomes, errors = [], []
            for w in works[:3]:
                try:
                    w.wait()
                    outcomes.append("ok")
                except ringleader.InternalError as e:
                    outcomes.append("internal")
                    errors.append(e)
            print("WAITED " + " ".join(outcomes), flush=True)
            del works, w  # the last one, never waited: freed (rl_work_free waits for it)
            print("FREED", flush=True)
            raise errors[0]
        elif scenario == "destroy_race":
            # Rank 1: one thread blocks in an all_reduce rank 0 never joins;
            # the main thread destroys the group under it. Rank 0 waits for
            # rank 1 to be done (a marker file), then leaves.
            mark = os.environ["TEST_MARK"]
            if r == 0:
                deadline = time.monotonic() + 30
                while not os.path.exists(mark) and time.monotonic() < deadline:
                    time.sleep(0.02)
                print("DONE", flush=True)
                pg.destroy()
                return
            import threading

            got = []

            def inside():
                try:
                    pg.all_reduce(np.ones(1 << 16, dtype=np.float32))
                    got.append(None)
                except ringleader.Error as e:
                    got.append(e)

            t = threading.Thread(target=inside)
            t.start()
            deadline = time.monotonic() + 20
            while not any(e["state"] == "started" for e in pg.flight_recorder()):
                assert time.monotonic() < deadline, "the all_reduce never started"
                time.sleep(0.005)
            t1 = time.monotonic()
            pg.destroy()
            took = time.monotonic() - t1
            alive = t.is_alive()
            t.join(30)
            e = got[0] if got else None
            print("DESTROYED " + json.dumps({"took": took, "alive_after_destroy": alive,
                                             "cls": type(e).__name__, "message": str(e)}), flush=True)
            try:
                pg.barrier()
            except ringleader.Error as later:
                print("LATER " + type(later).__name__, flush=True)
            open(mark, "w").close()
            return
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
