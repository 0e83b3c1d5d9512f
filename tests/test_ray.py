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

from helpers.live import Running, pid_alive  # noqa: E402

from hfx.backends.ray.instance import RayInstance  # noqa: E402
from hfx.request import Outcome  # noqa: E402

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

            def kill() -> int:
                # On the server's loop, so that no token is taken in between: how many
                # requests are still running on instance 0 as it dies (round robin put two
                # of the four there; on a loaded machine one may have finished first).
                running = sum(r.instance == 0 and r.outcome is Outcome.PENDING
                              for r in control.records.values())
                os.kill(pid, signal.SIGKILL)  # the worker process of instance 0, mid-stream
                return running

            running = gw.call(kill)
            results = [f.result(timeout=60) for f in futures]  # nobody hangs
        assert control.num_instance_failures == 1
        assert running >= 1 and control.num_resumed == running  # each resumes elsewhere
        assert all(finish == "length" for _, finish in results)
        # A new actor's process starts in seconds on a quiet machine; on 2 busy cores it has
        # taken over a minute.
        deadline = time.monotonic() + 180
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


def test_vllm_servers_under_ray_actors_serve_and_die_with_the_gateway(local_ray, tmp_path):
    """``hfx serve --engine vllm --ray``: each server a child of a Ray actor (a stand-in
    server, tests/helpers/fake_vllm.py, as the process). Requests reach them over HTTP at the node's
    address; a server killed under its actor fails its instance; the rest are stopped with
    the gateway."""
    from helpers.fake_vllm import as_vllm_python, generate

    from hfx.backends.vllm.ray_actor import RayVLLMServer
    from hfx.model.build import write_random_checkpoint

    checkpoint = str(write_random_checkpoint("tiny", tmp_path / "ckpt"))
    gw = Running(engine="vllm", checkpoint=checkpoint, instances=2, ray=True,
                 ray_cpus_per_instance=0.5, vllm_python=as_vllm_python(tmp_path / "fake"),
                 profile="tiny@cpu", max_model_len=2048, policy="rr")
    control = gw.server.control
    try:
        servers = [i.process for i in control.instances.values()]
        assert all(isinstance(s, RayVLLMServer) for s in servers)
        node = ray.util.get_node_ip_address()
        assert all(s.url.startswith(f"http://{node}:") for s in servers)
        pids = [s.pid for s in servers]
        assert len(set(pids)) == 2 and os.getpid() not in pids
        texts = [gw.client.completions.create(model=gw.model, prompt=p, max_tokens=5,
                                              extra_body={"ignore_eos": True}).choices[0].text
                 for p in ("The cat", "HFX")]  # round robin: one on each server
        assert texts == [bytes(generate(list(p), 5)).decode() for p in (b"The cat", b"HFX")]
        os.kill(pids[0], signal.SIGKILL)
        deadline = time.monotonic() + 30
        while control.num_instance_failures < 1:
            assert time.monotonic() < deadline, "the killed server's instance did not fail"
            time.sleep(0.05)
        r = gw.client.completions.create(model=gw.model, prompt="after", max_tokens=3)
        assert r.usage.completion_tokens == 3  # served by the other
    finally:
        gw.close()
    deadline = time.monotonic() + 30
    while any(pid_alive(pid) for pid in pids):  # stopped by their actors with the gateway
        assert time.monotonic() < deadline, "a vLLM server outlived the gateway"
        time.sleep(0.1)


def test_a_ray_held_vllm_server_reports_its_death_without_blocking(local_ray, tmp_path):
    from helpers.fake_vllm import as_vllm_python

    from hfx.backends.vllm.process import VLLMLaunch
    from hfx.backends.vllm.ray_actor import RayVLLMServer

    launch = VLLMLaunch(as_vllm_python(tmp_path), "unused", "fake", 2048, 8, 4096, 32,
                        log_dir=tmp_path)
    server = RayVLLMServer(launch, 0, 1, {"num_cpus": 0.5}).start()
    try:
        server.wait_ready_blocking()
        assert httpx.get(f"{server.url}/health").status_code == 200
        assert server.alive()
        os.kill(server.pid, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while server.alive():  # each call reads the last answer and sends the next probe
            assert time.monotonic() < deadline, "the actor did not see its server die"
            time.sleep(0.05)
    finally:
        server.kill()
    assert not pid_alive(server.pid)
