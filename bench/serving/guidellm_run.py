"""guidellm, unmodified, against ``hfx serve --executor sim``.

guidellm builds its prompts with a Hugging Face tokenizer, which it would fetch from the hub by
the served model's name; with no network here, this script writes a local one that matches the
server's byte tokenizer id for id (GPT-2's byte-level alphabet, no merges: one token per UTF-8
byte, 256 = end of text) and hands it over with ``--tokenizer``. It starts the server, runs
guidellm's ``run`` command (constant rate, synthetic text), keeps guidellm's own JSON report
and writes the headline figures beside the server's own count of what it served.

guidellm lives in its own environment (its dependencies are not ours):

    python3 -m venv /tmp/gl && /tmp/gl/bin/pip install guidellm==0.8.1
    python bench/serving/guidellm_run.py --guidellm /tmp/gl/bin/guidellm \\
        --json docs/results/guidellm.json
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

from hfx.evaluation import write_json
from hfx.model.tokenizer import write_byte_tokenizer

# Run by path (python bench/FOLDER/NAME.py): the repository root, for the ``bench.*`` imports.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench.common import hfx_serve, scrape


def headline(report: dict) -> dict:
    b = report["benchmarks"][0]
    m = b["metrics"]

    def stat(name: str) -> dict:
        s = m[name]["successful"]
        return {"mean": s["mean"], "p50": s["median"], "p99": s["percentiles"]["p99"]}

    totals = m["request_totals"]
    return {"requests": totals, "duration_s": b["duration"],
            "requests_per_s": m["requests_per_second"]["successful"]["mean"],
            "ttft_ms": stat("time_to_first_token_ms"), "itl_ms": stat("inter_token_latency_ms"),
            "output_tokens_per_s": m["output_tokens_per_second"]["successful"]["mean"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--guidellm", default="guidellm", help="the guidellm executable")
    ap.add_argument("--rate", type=float, default=4.0, help="requests/s (constant profile)")
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--prompt-tokens", type=int, default=256)
    ap.add_argument("--output-tokens", type=int, default=64)
    ap.add_argument("--instances", type=int, default=2)
    ap.add_argument("--json", default=None, help="write the headline figures here; guidellm's "
                    "full report goes beside it (*.guidellm.json)")
    args = ap.parse_args()

    serve_args = ["--executor", "sim", "--instances", str(args.instances)]
    work = Path(tempfile.mkdtemp(prefix="hfx-guidellm-"))
    write_byte_tokenizer(work / "tokenizer", 4096)
    report_path = work / "report.json"
    with hfx_serve(*serve_args) as live:
        url = live.url
        cmd = [args.guidellm, "run",
               "--backend", f"kind=openai_http,target={url}",
               "--tokenizer", f"kind=huggingface_auto,model={work / 'tokenizer'}",
               "--data", f"kind=synthetic_text,prompt_tokens={args.prompt_tokens},"
                         f"output_tokens={args.output_tokens}",
               "--profile", f"kind=constant,rate={args.rate:g}",
               "--constraint", f"kind=max_duration,seconds={args.seconds:g}",
               "--output", f"kind=json,path={report_path}", "--disable-progress"]
        print("$", shlex.join(cmd), flush=True)
        done = subprocess.run(cmd, capture_output=True, text=True)
        print(done.stdout[-6000:])
        if done.returncode != 0:
            print(done.stderr[-4000:], file=sys.stderr)
            return done.returncode
        served = {dict(labels)["outcome"]: int(v) for (name, labels), v in scrape(url).items()
                  if name == "hfx_requests_total"}
    report = json.loads(report_path.read_text())
    result = {"command": "python bench/serving/guidellm_run.py " + shlex.join(sys.argv[1:]),
              "guidellm_command": shlex.join(cmd).replace(str(work), "$WORK").replace(
                  url, "http://127.0.0.1:$PORT"),
              "server_command": "hfx serve " + shlex.join(serve_args),
              "guidellm": headline(report), "server_outcomes": served}
    print(json.dumps(result, indent=2))
    if args.json:
        write_json(args.json, result)
        Path(args.json).with_suffix(".guidellm.json").write_text(
            json.dumps(report["benchmarks"][0]["metrics"], indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
