"""Trace formats: replay HFX's own traces, served-request records and public LLM traces.

Each format has one reader (registered in ``FORMATS``) that turns a file into raw rows
(``TraceRow``); ``read_trace`` turns rows into ``Request`` objects: SLOs assigned, arrivals shifted
to start at 0, optionally sped up or rescaled to a target rate (content hashes kept).

- ``hfx``: HFX's own trace columns, JSONL or CSV (``hfx.workloads.load.load_trace``).
- ``hfx-record``: the JSONL rows ``hfx serve --record FILE`` writes, one per served request.
- ``azure``: Azure LLM inference traces, 2023 and 2024 (github.com/Azure/AzurePublicDataset,
  ``AzureLLMInferenceTrace_code.csv`` / ``_conv.csv``).
- ``burstgpt``: BurstGPT (github.com/HPMLL/BurstGPT, ``BurstGPT_*.csv``; vLLM's
  ``benchmark_serving`` reads it too).
- ``mooncake``: Mooncake's FAST'25 traces (github.com/kvcache-ai/Mooncake, e.g.
  ``conversation_trace.jsonl``, ``toolagent_trace.jsonl``).

The public traces carry no SLOs: give an ``SLOMap`` (``--slo-map``), e.g.
``default=2000:500,GPT-4=1000:100,input<=512=800:80`` (milliseconds TTFT:TPOT); a row that
still has none gets hfx serve's default (``DEFAULT_SLO``, Table 1's sharegpt: 2 s / 0.5 s), and
a warning says how many did. In them, a row
with 0 output tokens (a failed request) cannot be replayed by length: it is skipped and counted
(``TraceReport.skipped``).

Prompts that repeat (issue 46): Mooncake's rows name their prompts' content by ``hash_ids``, one
per 512-token block (the last may cover a partial block; equal ids at equal positions, equal
content), and a request keeps them (``Request.block_hashes``, ``hash_block`` 512) for the
engine's prefix cache. An engine of another block size caches units of lcm(512, block_size)
tokens: with 16-token KV blocks a hashed 512-token block is 32 engine blocks, cached or evicted
together; a prompt's tail past its last full 512-token block is never cached, since the trace
cannot say whether it repeats. ``hfx serve --record`` rows may carry ``block_hashes`` and
``hash_block`` too. Azure and BurstGPT traces carry no prefix information: their requests (as
HFX's own columns') name no content, so a prefix cache never hits for them.
"""

from __future__ import annotations

import csv
import json
import logging
import math
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Literal, overload

from hfx.request import DEFAULT_TENANT, SLO, Request, check_block_hashes
from hfx.workloads.tasks import DEFAULT_SLO, TASKS

log = logging.getLogger(__name__)

# HFX's own trace columns (hfx/workloads/load.py's ``load_trace``).
TRACE_FIELDS = ("arrival", "input_len", "output_len", "ttft", "tpot", "task", "priority",
                "tenant")


class TraceError(ValueError):
    """A malformed trace file; the message names the file and line."""


@dataclass(frozen=True, slots=True)
class TraceRow:
    """One request as a trace file gives it: arrival in seconds (any origin), lengths in tokens.

    ``from_priority``: the SLO is HFX-PM's to map from ``priority`` again (a recorded request
    whose SLO came from its priority), so no SLO map or Table 1 SLO is applied to it.
    """

    arrival: float
    input_len: int
    output_len: int
    task: str | None = None
    slo: SLO | None = None
    priority: int | None = None
    id: str | None = None
    from_priority: bool = False
    where: str = field(default="", compare=False)  # file:line, for messages about the row
    # Its content, one hash per ``hash_block`` tokens (``Request.block_hashes``); None: unknown.
    block_hashes: tuple[int, ...] | None = None
    hash_block: int = 16
    tenant: str = DEFAULT_TENANT  # whose it is (fair shares: hfx/cluster/fair_share.py)


@dataclass(slots=True)
class TraceReport:
    """What a reader got from a file: its rows, and how many it skipped (0 output tokens)."""

    path: Path
    format: str
    rows: list[TraceRow] = field(default_factory=list)
    skipped: int = 0

    def add_public(self, where: str, arrival: float, input_len: int, output_len: int,
                   task: str | None, block_hashes: tuple[int, ...] | None = None,
                   hash_block: int = 16) -> None:
        """A public trace's row; one with no output tokens (a request that failed in the
        trace) is skipped and counted."""
        if output_len == 0:
            self.skipped += 1
            return
        _check_lengths(where, input_len, output_len)
        self.rows.append(TraceRow(arrival, input_len, output_len, task, where=where,
                                  block_hashes=block_hashes, hash_block=hash_block))


Reader = Callable[[Path], TraceReport]


# ---- parsing helpers ---------------------------------------------------------------------------
# Typed per call: an int for kind=int, a float otherwise, None only where not required.
@overload
def _number(row: dict, key: str, where: str, kind: type[int],
            required: Literal[True] = ...) -> int: ...
@overload
def _number(row: dict, key: str, where: str, kind: type[int],
            required: Literal[False]) -> int | None: ...
@overload
def _number(row: dict, key: str, where: str, kind: type[float] = ...,
            required: Literal[True] = ...) -> float: ...
@overload
def _number(row: dict, key: str, where: str, kind: type[float] = ...,
            *, required: Literal[False]) -> float | None: ...
def _number(row: dict, key: str, where: str, kind: type = float,
            required: bool = True) -> float | int | None:
    """``row[key]`` as a finite, non-negative ``kind``; errors name ``where`` (file:line)."""
    value = row.get(key)
    if value is None or value == "":
        if required:
            raise TraceError(f"{where}: missing required field {key!r}")
        return None
    try:
        out = kind(float(value)) if kind is int else kind(value)
    except (TypeError, ValueError, OverflowError):
        raise TraceError(f"{where}: field {key!r} is not a number: {value!r}") from None
    if kind is int and float(value) != out:
        raise TraceError(f"{where}: field {key!r} must be a whole number: {value!r}")
    if not math.isfinite(out) or out < 0:
        raise TraceError(f"{where}: field {key!r} must be finite and >= 0: {value!r}")
    return out


def _jsonl(path: Path) -> Iterator[tuple[str, dict]]:
    """(file:line, object) for each non-blank line of a JSONL file."""
    with path.open() as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = f"{path}:{lineno}"
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise TraceError(f"{where}: not valid JSON ({e.msg})") from None
            if not isinstance(row, dict):
                raise TraceError(f"{where}: expected a JSON object")
            yield where, row


def _csv(path: Path, required: tuple[str, ...]) -> Iterator[tuple[str, dict]]:
    """(file:line, row) for each row of a CSV file whose header has the ``required`` columns."""
    with path.open(newline="") as f:
        reader = csv.DictReader(f)
        missing = set(required) - set(reader.fieldnames or ())
        if missing:
            raise TraceError(f"{path}:1: header lacks {sorted(missing)}")
        for row in reader:
            where = f"{path}:{reader.line_num}"
            if None in row:
                raise TraceError(f"{where}: more values than header columns")
            yield where, row


def _check_lengths(where: str, input_len: int, output_len: int) -> None:
    if input_len < 1 or output_len < 1:
        raise TraceError(f"{where}: input_len and output_len must be >= 1")


def _hashes(row: dict, key: str, where: str) -> tuple[int, ...] | None:
    """``row[key]`` as a tuple of non-negative ints (None where absent or null)."""
    value = row.get(key)
    if value is None:
        return None
    # bool is an int to Python, not to a trace
    if not isinstance(value, list) or not all(type(h) is int and h >= 0 for h in value):
        raise TraceError(f"{where}: {key} must be a list of non-negative integers")
    return tuple(value)


# ---- readers -----------------------------------------------------------------------------------
def read_hfx(path: Path) -> TraceReport:
    """HFX's own trace, JSONL or CSV: ``arrival`` [s], ``input_len``, ``output_len``, and
    optionally ``ttft`` [s], ``tpot`` [s], ``task``, ``priority``, ``tenant``, ``id`` (see
    ``load_trace``). A row without ttft/tpot has no SLO of its own."""
    if path.suffix == ".csv":
        source = _csv(path, ("arrival", "input_len", "output_len"))
    elif path.suffix == ".jsonl":
        source = _jsonl(path)
    else:
        raise TraceError(f"{path}: an hfx trace is .jsonl or .csv")
    report = TraceReport(path, "hfx")
    for where, row in source:
        unknown = set(row) - set(TRACE_FIELDS) - {"id"}
        if unknown:
            raise TraceError(f"{where}: unknown field(s) {sorted(unknown)}; "
                             f"expected {', '.join(TRACE_FIELDS)}")
        arrival = _number(row, "arrival", where)
        input_len = _number(row, "input_len", where, int)
        output_len = _number(row, "output_len", where, int)
        ttft = _number(row, "ttft", where, required=False)
        tpot = _number(row, "tpot", where, required=False)
        priority = _number(row, "priority", where, int, required=False)
        _check_lengths(where, input_len, output_len)
        if (ttft is None) != (tpot is None):
            raise TraceError(f"{where}: give both ttft and tpot, or neither")
        slo = None
        if ttft is not None and tpot is not None:  # both or neither, checked above
            if ttft <= 0 or tpot <= 0:
                raise TraceError(f"{where}: ttft and tpot must be > 0")
            slo = SLO(ttft, tpot)
        task = str(row.get("task") or "") or None
        report.rows.append(TraceRow(arrival, input_len, output_len, task, slo, priority,
                                    str(row.get("id") or "") or None, where=where,
                                    tenant=_tenant(row)))
    return report


RECORD_OUTCOMES = ("finished", "aborted", "failed", "rejected", "shed")


def read_hfx_record(path: Path) -> TraceReport:
    """Rows ``hfx serve --record FILE`` writes (JSONL): ``id``, ``arrival`` (epoch seconds),
    ``input_len``, ``output_len`` (tokens it got), ``max_tokens``, ``slo`` ({"ttft_ms",
    "tpot_ms"} or null), ``slo_source`` (body, header, priority, task, default), ``task``,
    ``priority``, ``tenant``, ``outcome``; the served latencies (``instance``, ``ttft_s``,
    ...) are ignored.

    Arrivals are relative to the first row. A request that did not finish is replayed with its
    ``max_tokens`` (its own length is unknown). An SLO mapped from a priority is dropped: the
    priority is kept, for HFX-PM to map it again."""
    report = TraceReport(path, "hfx-record")
    first: float | None = None
    for where, row in _jsonl(path):
        arrival = _number(row, "arrival", where)
        first = arrival if first is None else first
        input_len = _number(row, "input_len", where, int)
        outcome = row.get("outcome")
        if outcome not in RECORD_OUTCOMES:
            raise TraceError(f"{where}: outcome must be one of {', '.join(RECORD_OUTCOMES)}, "
                             f"got {outcome!r}")
        if outcome == "finished":
            output_len = _number(row, "output_len", where, int)
        else:
            output_len = max(_number(row, "max_tokens", where, int), 1)
        _check_lengths(where, input_len, output_len)
        priority = _number(row, "priority", where, int, required=False)
        slo = None
        if row.get("slo") is not None:
            spec = row["slo"]
            if not isinstance(spec, dict):
                raise TraceError(f"{where}: slo must be {{\"ttft_ms\", \"tpot_ms\"}} or null")
            ttft, tpot = (_number(spec, k, where) for k in ("ttft_ms", "tpot_ms"))
            if ttft <= 0 or tpot <= 0:
                raise TraceError(f"{where}: slo ttft_ms and tpot_ms must be > 0")
            slo = SLO(ttft / 1e3, tpot / 1e3)
        from_priority = row.get("slo_source") == "priority" and priority is not None
        hashes = _hashes(row, "block_hashes", where)
        hash_block = _number(row, "hash_block", where, int, required=False)
        hash_block = 16 if hash_block is None else hash_block
        if hashes is not None:
            try:
                check_block_hashes(str(row.get("id") or ""), input_len, output_len, len(hashes),
                                   hash_block)
            except ValueError as e:
                raise TraceError(f"{where}: {e}") from None
        report.rows.append(TraceRow(arrival - first, input_len, output_len,
                                    str(row.get("task") or "") or None,
                                    None if from_priority else slo, priority,
                                    str(row.get("id") or "") or None, from_priority,
                                    where=where, block_hashes=hashes, hash_block=hash_block,
                                    tenant=_tenant(row)))
    return report


def _tenant(row: dict) -> str:
    return str(row.get("tenant") or "") or DEFAULT_TENANT


def _azure_time(text: str, where: str) -> datetime:
    """``2023-11-16 18:15:46.6805900`` (7 fractional digits: truncated to microseconds) or
    ``2024-05-10 00:00:00.009930+00:00``; a time without a zone is taken as UTC."""
    head, _, rest = text.strip().partition(".")
    digits = re.match(r"\d*", rest)
    assert digits is not None  # \d* matches the empty string too
    frac = digits[0]
    zone = rest[len(frac):]
    try:
        t = datetime.fromisoformat(head + ("." + (frac + "00000")[:6] if frac else "")
                                   + ("+00:00" if zone == "Z" else zone))
    except ValueError:
        raise TraceError(f"{where}: TIMESTAMP is not a date and time: {text!r}") from None
    return t if t.tzinfo else t.replace(tzinfo=timezone.utc)


def read_azure(path: Path) -> TraceReport:
    """Azure LLM inference trace (CSV): ``TIMESTAMP,ContextTokens,GeneratedTokens``, TIMESTAMP
    a date and time; arrival = seconds since the first row. Task ``azure-code``/``azure-conv``
    from the file name, else ``azure``. The trace has no prefix information (no content
    hashes): its requests never hit a prefix cache."""
    name = path.name.lower()
    task = "azure-code" if "code" in name else "azure-conv" if "conv" in name else "azure"
    report = TraceReport(path, "azure")
    first: datetime | None = None
    for where, row in _csv(path, ("TIMESTAMP", "ContextTokens", "GeneratedTokens")):
        t = _azure_time(row["TIMESTAMP"] or "", where)
        first = t if first is None else first
        report.add_public(where, (t - first).total_seconds(),
                          _number(row, "ContextTokens", where, int),
                          _number(row, "GeneratedTokens", where, int), task)
    return report


def read_burstgpt(path: Path) -> TraceReport:
    """BurstGPT (CSV): ``Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type``,
    Timestamp in seconds; task = the Model (ChatGPT, GPT-4). Rows with 0 response tokens
    (failed requests) are skipped and counted. The trace has no prefix information (no content
    hashes): its requests never hit a prefix cache."""
    report = TraceReport(path, "burstgpt")
    for where, row in _csv(path, ("Timestamp", "Model", "Request tokens", "Response tokens")):
        report.add_public(where, _number(row, "Timestamp", where),
                          _number(row, "Request tokens", where, int),
                          _number(row, "Response tokens", where, int), row["Model"] or None)
    return report


MOONCAKE_BLOCK = 512  # tokens per Mooncake hash id (its traces' README)


def read_mooncake(path: Path) -> TraceReport:
    """Mooncake trace (JSONL): ``{"timestamp": ms, "input_length", "output_length",
    "hash_ids"}``; task ``mooncake``. ``hash_ids``: one per 512-token block of the prompt, the
    last maybe partial (ceil(input_length / 512) of them), kept as the request's
    ``block_hashes`` (``hash_block`` 512); a row without them names no content."""
    report = TraceReport(path, "mooncake")
    for where, row in _jsonl(path):
        input_len = _number(row, "input_length", where, int)
        hashes = _hashes(row, "hash_ids", where)
        if hashes is not None and len(hashes) != -(-input_len // MOONCAKE_BLOCK):
            raise TraceError(f"{where}: {len(hashes)} hash_ids for {input_len} input tokens; "
                             f"expected ceil({input_len} / {MOONCAKE_BLOCK}) = "
                             f"{-(-input_len // MOONCAKE_BLOCK)}")
        report.add_public(where, _number(row, "timestamp", where) / 1000, input_len,
                          _number(row, "output_length", where, int), "mooncake", hashes,
                          MOONCAKE_BLOCK)
    return report


FORMATS: dict[str, Reader] = {
    "hfx": read_hfx,
    "hfx-record": read_hfx_record,
    "azure": read_azure,
    "burstgpt": read_burstgpt,
    "mooncake": read_mooncake,
}


def detect_format(path: str | Path) -> str:
    """The format of ``path`` from its extension and first row (JSONL) or header (CSV)."""
    path = Path(path)
    if not path.exists():
        raise TraceError(f"{path}: no such trace file")
    fmt = None
    if path.suffix == ".jsonl":
        row = next(_jsonl(path), (None, {}))[1]
        fmt = ("mooncake" if "input_length" in row else "hfx-record" if "slo_source" in row
               else "hfx" if "arrival" in row else None)
    elif path.suffix == ".csv":
        with path.open(newline="") as f:
            header = set(next(csv.reader(f), ()))
        fmt = ("azure" if "ContextTokens" in header else "burstgpt" if "Response tokens" in header
               else "hfx" if "arrival" in header else None)
    if fmt is None:
        raise TraceError(f"{path}: unknown trace format; give one of {', '.join(FORMATS)}")
    return fmt


def load_rows(path: str | Path, fmt: str = "auto") -> TraceReport:
    """The raw rows of ``path`` read as ``fmt`` (``auto``: ``detect_format``)."""
    path = Path(path)
    if fmt == "auto":
        fmt = detect_format(path)
    if fmt not in FORMATS:
        raise ValueError(f"unknown trace format {fmt!r}; choose auto or one of "
                         f"{', '.join(FORMATS)}")
    if not path.exists():
        raise TraceError(f"{path}: no such trace file")
    return FORMATS[fmt](path)


# ---- SLO maps ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class SLOMap:
    """SLOs for rows that carry none: by task name, else by input-length class (in order),
    else the default."""

    tasks: dict[str, SLO] = field(default_factory=dict)
    classes: tuple[tuple[str, int, SLO], ...] = ()  # ("<=" or ">", N, SLO)
    default: SLO | None = None

    def slo_for(self, task: str | None, input_len: int) -> SLO | None:
        if task is not None and task in self.tasks:
            return self.tasks[task]
        for op, n, slo in self.classes:
            if (input_len <= n) if op == "<=" else (input_len > n):
                return slo
        return self.default


def parse_slo_map(text: str) -> SLOMap:
    """``default=2000:500,GPT-4=1000:100,input<=512=800:80``: comma-separated KEY=TTFT:TPOT in
    milliseconds; KEY is ``default``, a task name, or ``input<=N`` / ``input>N``."""
    tasks: dict[str, SLO] = {}
    classes: list[tuple[str, int, SLO]] = []
    default: SLO | None = None
    seen: set[str] = set()
    for entry in text.split(","):
        key, eq, value = (s.strip() for s in entry.rpartition("="))
        if not eq or not key:
            raise ValueError(f"SLO map entry {entry.strip()!r}: expected KEY=TTFT_MS:TPOT_MS")
        if key in seen:
            raise ValueError(f"SLO map: {key!r} is given twice")
        seen.add(key)
        ttft, colon, tpot = value.partition(":")
        try:
            slo = SLO(float(ttft) / 1e3, float(tpot) / 1e3) if colon else None
        except ValueError:
            slo = None
        if slo is None:
            raise ValueError(f"SLO map entry {entry.strip()!r}: expected TTFT_MS:TPOT_MS, two "
                             "positive numbers of milliseconds")
        length = re.fullmatch(r"input\s*(<=|>)\s*(\d+)", key)
        if key == "default":
            default = slo
        elif length:
            classes.append((length[1], int(length[2]), slo))
        elif re.match(r"input\s*[<>=]", key):
            raise ValueError(f"SLO map key {key!r}: a length class is input<=N or input>N")
        else:
            tasks[key] = slo
    return SLOMap(tasks, tuple(classes), default)


# ---- rows to requests --------------------------------------------------------------------------
def to_requests(report: TraceReport, slo_map: SLOMap | None = None, time_scale: float = 1.0,
                target_qps: float | None = None) -> list[Request]:
    """Requests from a reader's rows, sorted by arrival with the first at 0 — but for HFX's own
    format, whose arrivals are kept (see ``read_trace``)."""
    if target_qps is not None and time_scale != 1.0:
        raise ValueError("give time_scale or target_qps, not both")
    if not (0 < time_scale < math.inf):
        raise ValueError(f"time_scale must be positive and finite, got {time_scale}")
    if target_qps is not None and not (0 < target_qps < math.inf):
        raise ValueError(f"target_qps must be positive and finite, got {target_qps}")
    rows, path = report.rows, report.path
    if not rows:
        skipped = f" ({report.skipped} rows with 0 output tokens skipped)" if report.skipped else ""
        raise TraceError(f"{path}: the trace has no requests{skipped}")
    # HFX's own columns are seconds from the run's start already (a trace written for hfx sim
    # replays exactly as it always did); the other formats' clocks start anywhere.
    origin = 0.0 if report.format == "hfx" else min(r.arrival for r in rows)
    span = max(r.arrival for r in rows) - origin
    divisor = time_scale
    if target_qps is not None and len(rows) > 1:
        if span == 0:
            raise TraceError(f"{path}: every request arrives at once; target_qps cannot "
                             "rescale it")
        divisor = target_qps * span / len(rows)
    requests = []
    defaulted = 0
    for i, row in enumerate(rows):
        rid = row.id or f"trace-{i}"
        slo = row.slo
        if slo is None and not row.from_priority:
            slo = slo_map.slo_for(row.task, row.input_len) if slo_map is not None else None
            if slo is None and row.task in TASKS:
                slo = TASKS[row.task].slo
        if slo is None and row.priority is None:
            slo, defaulted = DEFAULT_SLO, defaulted + 1  # as hfx serve gives one without
        requests.append(Request(id=rid, arrival=(row.arrival - origin) / divisor,
                                prompt_len=row.input_len, max_tokens=row.output_len, slo=slo,
                                task=row.task or "default", priority=row.priority,
                                block_hashes=row.block_hashes, hash_block=row.hash_block,
                                tenant=row.tenant))
    ids = {r.id for r in requests}
    if len(ids) != len(requests):
        raise TraceError(f"{path}: request ids are not unique")
    if defaulted:
        log.warning("%s: %d of %d requests carry no SLO of their own (no ttft/tpot, priority, "
                    "Table 1 task or --slo-map entry): applied hfx serve's default, TTFT %g ms, "
                    "TPOT %g ms; --slo-map default=TTFT_MS:TPOT_MS sets another", path,
                    defaulted, len(requests), DEFAULT_SLO.ttft * 1e3, DEFAULT_SLO.tpot * 1e3)
    requests.sort(key=lambda r: r.arrival)
    return requests


def read_trace(path: str | Path, fmt: str = "auto", slo_map: SLOMap | None = None,
               time_scale: float = 1.0, target_qps: float | None = None) -> list[Request]:
    """Requests from a trace file in ``fmt`` (``auto``: detected), sorted by arrival, the first
    at 0 (HFX's own format: as written). A row's SLO is its own, else ``slo_map``'s, else its
    Table 1 task's; a row with only
    a priority keeps it (SLO None, for HFX-PM); otherwise it is an error. ``time_scale`` X
    divides arrivals by X (2: twice as fast); ``target_qps`` Q rescales them so that
    requests / last arrival = Q. ``load_rows`` + ``to_requests`` also give the skipped count."""
    return to_requests(load_rows(path, fmt), slo_map, time_scale, target_qps)
