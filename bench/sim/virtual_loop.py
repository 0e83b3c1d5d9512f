"""Virtual-clock loop speed: hfx.sim.clock.VirtualTimeLoop against looptime (if installed).

Ten tasks each sleep N/10 times with distinct periods, the timer pattern of instances stepping.
Reports timer wake-ups per wall second. Writes JSON; not a test.

    pip install --target /tmp/looptime looptime   # optional, kept out of the test environment
    PYTHONPATH=/tmp/looptime python bench/sim/virtual_loop.py --json results/virtual_loop.json
"""

from __future__ import annotations

import argparse
import asyncio
import time

from hfx.evaluation import write_json
from hfx.sim.clock import VirtualTimeLoop


async def workload(n: int) -> float:
    async def worker(k: int) -> None:
        for _ in range(n // 10):
            await asyncio.sleep(0.01 + 0.001 * k)

    await asyncio.gather(*(worker(k) for k in range(10)))
    return asyncio.get_running_loop().time()


def measure(make_loop, n: int) -> dict:
    loop = make_loop()
    try:
        t0 = time.perf_counter()
        virtual_end = loop.run_until_complete(workload(n))
        wall = time.perf_counter() - t0
    finally:
        loop.close()
    return {"sleeps": n, "wall_seconds": wall, "sleeps_per_second": n / wall,
            "virtual_seconds": virtual_end}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sleeps", type=int, default=200_000)
    ap.add_argument("--json", required=True, metavar="PATH")
    args = ap.parse_args()
    out = {"hfx.VirtualTimeLoop": measure(VirtualTimeLoop, args.sleeps)}
    try:
        from importlib.metadata import version

        import looptime

        out[f"looptime {version('looptime')}"] = measure(
            lambda: looptime.new_event_loop(start=0.0), args.sleeps)
    except ImportError:
        out["looptime"] = "not installed"
    for name, r in out.items():
        print(name, r if isinstance(r, str) else f"{r['sleeps_per_second']:,.0f} sleeps/s")
    write_json(args.json, out)


if __name__ == "__main__":
    main()
