"""Re-admission of attached vLLM servers (``--backend``) that left the fleet.

HFX does not own these servers, so nothing replaces one that failed (the Scaler starts servers
from ``--checkpoint``); without this, each failure shrank the fleet for good. Every ``interval``
seconds the healer asks each attached URL that no serving instance has for its health; one that
answers 200 and its model card joins the fleet again as a new instance, in the role it served.
With a Scaler attached it stays out of the way: the Scaler replaces failed instances itself and
owns the instance count against ``--max-instances``.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

import aiohttp

from hfx.sim.clock import cancel

if TYPE_CHECKING:
    from hfx.backends.vllm.process import VLLMPlacement
    from hfx.cluster.control import ControlPlane

log = logging.getLogger(__name__)

_TIMEOUT = aiohttp.ClientTimeout(total=5.0)


class BackendHealer:
    def __init__(self, control: ControlPlane, placement: VLLMPlacement,
                 interval: float) -> None:
        self.control = control
        self.placement = placement
        self.interval = interval
        self.readmitted: list[tuple[int, str]] = []  # (new instance id, URL), in order
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="backend-healer")

    async def stop(self) -> None:
        await cancel(self._task)

    async def _run(self) -> None:
        async with aiohttp.ClientSession(timeout=_TIMEOUT) as session:
            while True:
                await asyncio.sleep(self.interval)
                try:
                    await self.check(session)
                except Exception:  # a bug here must not end re-admission for good
                    log.exception("checking the attached vLLM servers failed")

    def missing(self) -> list[str]:
        """Attached URLs that no serving (accepting) instance has now."""
        control = self.control
        served = {getattr(control.instances[i], "url", None) for i in control.instances
                  if control.accepting(i)}
        return [url for url in self.placement.attached if url not in served]

    async def check(self, session: aiohttp.ClientSession) -> list[int]:
        """Re-admit every missing server that is healthy; returns the new instance ids."""
        if self.control.scaler is not None:
            return []
        added = []
        for url in self.missing():
            try:
                async with session.get(f"{url}{self.placement.health_path(url)}") as r:
                    if r.status != 200:
                        continue
            except (aiohttp.ClientError, asyncio.TimeoutError, OSError):
                continue
            control = self.control
            iid = max([*control.instances, *control.retired]) + 1
            role = self.placement.attached[url]
            try:  # its model card and KV size, blocking: off the loop
                instance = await asyncio.to_thread(self.placement.attach, iid, url, role)
            except Exception as e:
                log.warning("the server at %s is healthy but could not join: %s", url, e)
                continue
            control.add_instance(instance, asyncio.get_running_loop().time())
            self.readmitted.append((iid, url))
            added.append(iid)
            log.warning("the server at %s is healthy again: re-admitted as instance %d", url,
                        iid)
        return added
