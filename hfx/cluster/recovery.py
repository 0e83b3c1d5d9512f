"""What becomes of the requests of an instance that failed (its executor raised, its process
or node died): resumed elsewhere where that is safe, at most ``max_retries`` times, or failed
with the reason. Never left hanging.

A resumed request is a new placement of its prompt plus the tokens it already streamed, for the
remaining ``max_tokens``; its record keeps its token times and its listener, so the client's
stream simply goes on (greedy and seeded sampling draw per position, so the continuation is
exact). In P/D only a request that had no first token resumes: the later ones are in the
Migrator's hands.
"""

from __future__ import annotations

from dataclasses import replace

from hfx.request import Request, RequestRecord


class Recovery:
    def __init__(self, max_retries: int = 1, pd: bool = False) -> None:
        if max_retries < 0:
            raise ValueError(f"max_retries must be >= 0, got {max_retries}")
        self.max_retries = max_retries
        self.pd = pd
        self.num_instance_failures = 0
        self.num_resumed = 0  # requests resumed elsewhere after their instance failed
        self.num_lost_resumed = 0  # of those, lost alone on an instance that went on

    def resumable(self, record: RequestRecord, instance_id: int, suspect: bool = False) -> bool:
        """``suspect``: it was in the step that broke the instance; it may be the cause, and a
        request that broke one instance is never sent to break another."""
        if suspect or record.retries >= self.max_retries:
            return False
        if record.request.prompt_token_ids is not None and record.num_tokens and (
                record.output_ids is None or len(record.output_ids) != record.num_tokens):
            return False  # a real model needs the tokens it produced
        if self.pd:
            return record.num_tokens == 0 and record.instance == instance_id
        return True

    def continuation(self, record: RequestRecord) -> Request:
        """The rest of the request as a new placement; the record is marked resumed. Only for a
        request with tokens still to come (with all of them, only its finish was lost)."""
        req, n = record.request, record.num_tokens
        assert n < req.max_tokens
        ids = (None if req.prompt_token_ids is None
               else req.prompt_token_ids + (record.output_ids or []))
        record.instance = None
        record.retries += 1
        self.num_resumed += 1
        return replace(req, slo=record.slo, prompt_len=req.prompt_len + n,
                       prompt_token_ids=ids, max_tokens=req.max_tokens - n)
