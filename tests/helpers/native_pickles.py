"""What crosses a process, built the same way on both sides of tests/test_native.py's
cross-mode check. Run as a script (``python -m tests.helpers.native_pickles``) it unpickles the
objects it is given on stdin, checks them against its own, and writes its own, pickled, to
stdout; stderr's first line says whether it ran compiled."""

from __future__ import annotations

import pickle
import sys
from array import array

from hfx import native
from hfx.engine.admission import Admission
from hfx.engine.core import StepOutput
from hfx.engine.sequence import RequestStatus, Role, Sequence
from hfx.engine.stats import InstanceStats
from hfx.request import SLO, Outcome, Request, RequestRecord, TokenRun
from hfx.sampling import SamplingParams
from hfx.stepmodel.step_time import BatchShape, StepTimeModel


def samples() -> list[object]:
    slo = SLO(0.5, 0.05)
    request = Request("r1", 1.25, 100, 20, slo, "chat", 2, [1, 2, 3],
                      SamplingParams(0.7, 0.9, 5), frozenset({7}))
    log = array("d", [2.0, 2.5, 3.0, 3.5])  # an instance's tick log, shared by its runs
    record = RequestRecord(request, dispatch_time=1.5, instance=3, token_times=array("d", [1.75]),
                           finish_time=4.0, outcome=Outcome.FINISHED, best_effort=True,
                           retries=1, runs=[TokenRun(1, log, 0, 2), TokenRun(3, log, 2)], seq=9)
    stats = InstanceStats(4, Role.DECODE, 2.0, 1, 2, 3, 5, 6, 7, 16, 900, 8, 0.75, 11)
    seq = Sequence("r1", 100, 20, [1, 2, 3], tpot=0.05, output_token_ids=[4, 5],
                   num_computed_tokens=101, in_cohort=True, cohort_base=102)
    seq.num_tokens = 104  # a cohort member's: it trails the cohort's counter, not its output
    out = StepOutput(2.5, ["r1", "r2"], None, [("r2", RequestStatus.FINISHED_STOPPED)])
    shape = BatchShape(prefill_tokens=7, prefill_sq=49.0, num_prefill=1, decode_ctx=900,
                       num_decode=3)
    model = StepTimeModel(0.010, 5e-5, 2e-9, 0.020, 4e-8, 1e-4)
    admission = Admission(4096, 512, 16, True, 32000)  # what a remote instance's proxy holds
    return [slo, request, record, stats, seq, out, shape, model, admission]


def key(obj: object) -> object:
    """A comparable form: a sequence compares by identity, a record's runs share one log."""
    if isinstance(obj, Sequence):
        return tuple(getattr(obj, name) for name in Sequence.__dataclass_fields__)
    if isinstance(obj, RequestRecord):
        assert obj.runs is not None and obj.runs[0].log is obj.runs[1].log
        return obj, list(obj.times())
    return obj


def main() -> int:
    print(f"compiled={native.active()}", file=sys.stderr)
    theirs = pickle.loads(sys.stdin.buffer.read())
    mine = samples()
    for a, b in zip(theirs, mine, strict=True):
        if key(a) != key(b):
            print(f"not equal: {a!r} against {b!r}", file=sys.stderr)
            return 1
    sys.stdout.buffer.write(pickle.dumps(mine))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
