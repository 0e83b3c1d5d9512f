"""hfx serve --ray: instances as Ray actors on a local Ray instance; a killed worker process."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

ray = pytest.importorskip("ray")
pytest.importorskip("torch")
pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")

from live import Running  # noqa: E402

from hfx.cluster.ray_instance import RayInstance  # noqa: E402

PROMPTS = ["The cat", "Once upon a time", "HFX serves", "zzz"]


@pytest.fixture(scope="module")
def local_ray():
    # Logical CPUs: each actor asks for 0.5, so a 2-core machine holds the fleet and a spare.
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def complete(url: str, prompt: str, max_tokens: int, **extra) -> str:
    r = httpx.post(f"{url}/v1/completions", timeout=60, json={
        "model": "tiny-random", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
        "ignore_eos": True, **extra})
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["text"]


def stream(url: str, prompt: str, max_tokens: int, first) -> tuple[str, str]:
    """Stream a completion; ``first`` is set once a token has arrived. (text, finish)."""
    text, finish = [], None
    body = {"model": "tiny-random", "prompt": prompt, "max_tokens": max_tokens,
            "temperature": 0, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=60) as r:
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            choice = json.loads(line[6:])["choices"][0]
            text.append(choice["text"])
            finish = choice["finish_reason"] or finish
            first.set()
    return "".join(text), finish


@pytest.fixture(scope="module")
def local_texts():
    """What an in-process instance answers: greedy for PROMPTS, then one seeded sample."""
    local = Running(instances=1)
    try:
        return ([complete(local.url, p, 12) for p in PROMPTS],
                complete(local.url, "seeded", 12, temperature=1.0, seed=7))
    finally:
        local.close()


def test_ray_actors_serve_what_local_instances_serve(local_ray, local_texts):
    gw = Running(ray=True, instances=2, ray_cpus_per_instance=0.5)
    try:
        instances = list(gw.server.control.instances.values())
        assert all(isinstance(i, RayInstance) for i in instances)
        pids = {ray.get(i.actor.where.remote())["pid"] for i in instances}
        assert len(pids) == 2 and os.getpid() not in pids  # two worker processes
        remote = [complete(gw.url, p, 12) for p in PROMPTS]
        seeded = complete(gw.url, "seeded", 12, temperature=1.0, seed=7)
        assert gw.client.models.list().data[0].id == gw.model
        metrics = httpx.get(f"{gw.url}/metrics").text
        assert 'hfx_instance_kv_usage{instance="1",role="colocated"}' in metrics
        # The engine's own admission check runs in the proxy: a clear 4xx, no round trip.
        r = httpx.post(f"{gw.url}/v1/completions", json={
            "model": gw.model, "prompt": [999999], "max_tokens": 2})
        assert r.status_code == 400 and "token ids" in r.json()["error"]["message"]
    finally:
        gw.close()
    assert (remote, seeded) == local_texts


def test_pd_over_ray_moves_kv_between_actors(local_ray, local_texts):
    """One prefill and one decode actor: the KV of every request goes through the object
    store, and the tokens are the colocated ones."""
    gw = Running(ray=True, mode="pd", prefill=1, decode=1, ray_cpus_per_instance=0.5)
    try:
        roles = [i.role.value for i in gw.server.control.instances.values()]
        assert roles == ["prefill", "decode"]
        assert [complete(gw.url, p, 12) for p in PROMPTS] == local_texts[0]
        assert complete(gw.url, "seeded", 12, temperature=1.0, seed=7) == local_texts[1]
        decode = gw.server.control.instances[1].stats()
        assert decode.kv_used_blocks == 0  # every imported request finished and freed
    finally:
        gw.close()


def test_a_killed_worker_does_not_hang_clients_and_is_replaced(local_ray):
    gw = Running(ray=True, instances=2, max_instances=2, ray_cpus_per_instance=0.5, policy="rr")
    control = gw.server.control
    try:
        victim = control.instances[0]
        pid = ray.get(victim.actor.where.remote())["pid"]
        started = [threading.Event() for _ in PROMPTS]
        with ThreadPoolExecutor(len(PROMPTS)) as pool:
            futures = [pool.submit(stream, gw.url, p, 160, ev)
                       for p, ev in zip(PROMPTS, started, strict=True)]
            for ev in started:
                assert ev.wait(30), "no first token"
            os.kill(pid, signal.SIGKILL)  # the worker process of instance 0, mid-stream
            results = [f.result(timeout=60) for f in futures]  # nobody hangs
        assert control.num_instance_failures == 1
        assert control.num_resumed == 2  # round robin put two of the four on instance 0
        assert all(finish == "length" for _, finish in results)
        deadline = time.monotonic() + 60
        while 2 not in control.instances:  # the Scaler's replacement actor
            assert time.monotonic() < deadline, "the failed instance was not replaced"
            time.sleep(0.1)
        assert 0 in control.retired and isinstance(control.instances[2], RayInstance)
        # A resumed request continues exactly (greedy): the same text as an uninterrupted run.
        again = [complete(gw.url, p, 160) for p in PROMPTS]
        assert [text for text, _ in results] == again
        metrics = httpx.get(f"{gw.url}/metrics").text
        assert "hfx_instance_failures_total 1" in metrics
    finally:
        gw.close()
