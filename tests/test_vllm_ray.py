"""``hfx serve --engine vllm --ray`` against real vLLM (marker ``vllm``): a server started by a
Ray actor on a local Ray instance serves HFX's requests, and goes with the gateway."""

from __future__ import annotations

import os

import pytest

pytestmark = pytest.mark.vllm

from helpers.vllm_tier import ARGS, PYTHON, vllm_metrics, wait_for  # noqa: E402

ray = pytest.importorskip("ray")

from helpers.live import Running, pid_alive  # noqa: E402

from hfx.backends.vllm.ray_actor import RayVLLMServer  # noqa: E402


def test_a_vllm_server_under_a_ray_actor_serves_slo_requests(mini_checkpoint):
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        gw = Running(engine="vllm", checkpoint=mini_checkpoint, instances=1, ray=True,
                     vllm_python=PYTHON, vllm_args=ARGS, kv_capacity_tokens=16384,
                     max_model_len=2048, profile="tiny@cpu")
        try:
            (inst,) = gw.server.control.instances.values()
            server = inst.process
            assert isinstance(server, RayVLLMServer) and server.pid != os.getpid()
            assert server.url.startswith(f"http://{ray.util.get_node_ip_address()}:")
            r = gw.client.completions.create(
                model=gw.model, prompt="The cat", max_tokens=8,
                extra_body={"slo": {"ttft_ms": 5000, "tpot_ms": 500}, "ignore_eos": True})
            assert r.usage.completion_tokens == 8
            assert vllm_metrics(server.url)["vllm:request_success_total"] == 1
            pid = server.pid
        finally:
            gw.close()
        wait_for(lambda: not pid_alive(pid), 30, "the server to stop with the gateway")
    finally:
        ray.shutdown()
