"""``hfx serve --record FILE``: what was served, one JSONL row per request, to replay
later with ``hfx sim --workload FILE`` or ``hfx whatif --trace FILE``.

A row is taken when a request ends, from its record in the deciding process, and kept in
memory; a background task writes what gathered every ``FLUSH_SECONDS`` on a worker thread, so
serving never waits on the disk. A file past ``max_bytes`` is rotated (FILE → FILE.1 → … →
FILE.``KEEP``). Beside it, ``FILE.profile.json`` is the step-time profile the dispatcher plans
with at the latest flush (calibrated while serving, if it is: its ``meta`` then holds the
decode scale and the token delivery latency fitted, which the simulator does not model), so a
replay plans as the server did. Prompt text is never written; ``--record-prompts`` adds the
prompt's token ids.

Row fields: ``id``, ``arrival`` (epoch seconds), ``input_len``, ``output_len`` (tokens the
request got), ``max_tokens``, ``slo`` ({ttft_ms, tpot_ms} or null), ``slo_source``, ``task``,
``priority``, ``outcome``, ``error``, ``instance``, and as served ``queue_s``, ``ttft_s``,
``tpot_s``, ``e2e_s``, ``cached_tokens`` (prompt tokens its engine found cached), and
``block_hashes`` with ``hash_block``: a hash per ``hash_block`` tokens of the prompt (its
token ids' at the engine's block size; hfx/engine/prefix_cache.py), never its text, so that a
replay finds the same prefix-cache hits. With ``--record-prompts`` also ``prompt_token_ids``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from hfx.cluster.control import ControlPlane
from hfx.engine.prefix_cache import request_block_hashes
from hfx.evaluation.calibration import Calibration
from hfx.request import RequestRecord
from hfx.sim.clock import cancel

log = logging.getLogger(__name__)

FLUSH_SECONDS = 1.0  # how often gathered rows reach the file
KEEP = 5  # rotated files kept beside the current one
DEFAULT_MAX_BYTES = 100 << 20


class Recorder:
    def __init__(self, path: str | Path, control: ControlPlane, prompts: bool = False,
                 max_bytes: int = DEFAULT_MAX_BYTES,
                 calibration: Callable[[], Calibration | None] = lambda: None) -> None:
        self.path = Path(path)
        self.profile_path = self.path.with_name(self.path.name + ".profile.json")
        self.control = control
        self.prompts = prompts
        self.max_bytes = max_bytes
        self.calibration = calibration  # the live calibration in force, if any
        self.rows: list[dict[str, Any]] = []
        self.written = 0  # rows written, all files together
        self._sources: dict[str, str] = {}  # request id → where its SLO came from
        self._epoch = 0.0  # wall clock minus the loop's clock, for epoch arrivals
        self._task: asyncio.Task[None] | None = None
        self._writing: asyncio.Future[None] | None = None  # the write in its thread, if any

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._epoch = time.time() - loop.time()  # the only wall-clock read: row timestamps
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._task = loop.create_task(self._forever(), name="recorder")

    async def stop(self) -> None:
        await cancel(self._task)
        if self._writing is not None:  # a write the cancel interrupted goes on: let it end
            await asyncio.wait([self._writing])
        await self.flush()

    def opened(self, request_id: str, source: str) -> None:
        self._sources[request_id] = source

    def observe(self, record: RequestRecord) -> None:
        req = record.request
        slo = record.slo
        row: dict[str, Any] = {
            "id": req.id, "arrival": round(req.arrival + self._epoch, 6),
            "input_len": req.prompt_len, "output_len": record.num_tokens,
            "max_tokens": req.max_tokens,
            "slo": None if slo is None else {"ttft_ms": slo.ttft * 1e3,
                                             "tpot_ms": slo.tpot * 1e3},
            "slo_source": self._sources.pop(req.id, "default"), "task": req.task,
            "tenant": req.tenant,
            "priority": req.priority, "outcome": record.outcome.value, "error": record.error,
            "instance": record.instance, "queue_s": record.queue_time, "ttft_s": record.ttft,
            "tpot_s": record.tpot, "e2e_s": record.e2e, "cached_tokens": record.cached_tokens}
        if self.prompts and req.prompt_token_ids is not None:
            row["prompt_token_ids"] = list(req.prompt_token_ids)
        hashes = request_block_hashes(req.prompt_token_ids, req.block_hashes, req.hash_block,
                                      self.control.profile.block_size)
        if hashes is not None:
            row["block_hashes"], row["hash_block"] = hashes
        self.rows.append(row)

    async def _forever(self) -> None:
        while True:
            await asyncio.sleep(FLUSH_SECONDS)
            try:
                await self.flush()
            except OSError:  # a full disk costs the recording, never the serving
                log.exception("writing the record %s failed; rows are kept for the next try",
                              self.path)

    async def flush(self) -> None:
        rows, self.rows = self.rows, []
        profile = replace(self.control.profile, model=self.control.step_model)
        fit = self.calibration()
        if fit is not None:  # what the simulator does not model: said beside the model
            profile = replace(profile, meta={**profile.meta, "decode_scale": fit.decode_scale,
                                             "token_delivery_seconds": fit.delivery})
        write = self._writing = asyncio.ensure_future(
            asyncio.to_thread(self._write, rows, profile.to_json()))
        try:
            # Shielded: a cancel (stop) leaves the thread writing these rows, so they must
            # not go back to be written twice.
            await asyncio.shield(write)
        except asyncio.CancelledError:
            write.add_done_callback(lambda w: self._wrote(w, rows))
            raise
        except BaseException:
            self.rows[:0] = rows  # not lost: written with the next flush
            raise
        self.written += len(rows)

    def _wrote(self, write: asyncio.Future[None], rows: list[dict[str, Any]]) -> None:
        """A write that went on after its flush was cancelled: count its rows, or keep them."""
        if write.cancelled() or write.exception() is not None:
            self.rows[:0] = rows
        else:
            self.written += len(rows)

    def _write(self, rows: list[dict[str, Any]], profile: dict[str, Any]) -> None:
        if rows:
            if self.path.exists() and self.path.stat().st_size >= self.max_bytes:
                self._rotate()
            with self.path.open("a") as f:
                f.write("".join(json.dumps(r, separators=(",", ":")) + "\n" for r in rows))
        tmp = self.profile_path.with_name(self.profile_path.name + ".tmp")
        tmp.write_text(json.dumps(profile, indent=1))
        os.replace(tmp, self.profile_path)  # a reader never sees half a profile

    def _rotate(self) -> None:
        for i in range(KEEP - 1, 0, -1):
            older = self.path.with_name(f"{self.path.name}.{i}")
            if older.exists():
                os.replace(older, self.path.with_name(f"{self.path.name}.{i + 1}"))
        os.replace(self.path, self.path.with_name(f"{self.path.name}.1"))
