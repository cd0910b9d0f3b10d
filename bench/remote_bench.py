#!/usr/bin/env python3
"""inspect --remote and scan against a local Hub (tests/hubserver.py, on 127.0.0.1 in this
process), against a local inspect of the same files in the same run.

1. A checkpoint of the 70B shape (bench/synth.build: 80 layers, 560 modules, 4-bit group 128,
   real-data codes; about 37 GB, built once into --keep DIR) served as one repo: `gptqfmt
   inspect DIR` and `gptqfmt inspect ORG/NAME --remote`, each in its own process, with the
   bytes and requests the server answered, the time, the peak RSS and whether the two JSON
   documents are the same (but for `path` and `remote`); then `doctor --remote --runtime vllm`
   against the local doctor (which reads every byte, as verify does).
2. `gptqfmt scan` over --repos repos: the shipped GPTQ fixtures under distinct names, and one in
   fifty missing (a 404 each), with the requests, the time and the peak RSS.

The server answers from the page cache with no network latency: the times are the client's
work, not a Hub's round trips (at 30 ms a round trip, 8 in flight, add requests / 8 x 30 ms).

    python bench/remote_bench.py [--layers 80] [--keep DIR] [--repos 300]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [str(HERE), str(ROOT)]

from convert_bench import RSS, child_env, measured  # noqa: E402
from synth import build  # noqa: E402

from tests.hubserver import HubServer, Repo  # noqa: E402

CKPT = ROOT / "fixtures" / "ckpt"


def run_json(argv: list[str], env: dict, out: Path, exits=(0, 1)) -> tuple[float, int, dict]:
    """(seconds, peak RSS KiB, the JSON document) of `gptqfmt ARGV --output json=OUT`."""
    argv = ["gptqfmt", *argv, "--output", f"json={out}", "-q"]
    cmd = [sys.executable, "-c", RSS.format(argv=argv, mod="gptqfmt")]
    secs, rss, _ = measured(cmd, env, exits)
    return secs, rss, json.loads(out.read_text())


def strip(doc: dict) -> dict:
    return {k: v for k, v in doc.items() if k not in ("path", "remote", "exit_code")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=80)
    ap.add_argument("--keep", type=Path, help="build the checkpoint here once, and reuse it")
    ap.add_argument("--repos", type=int, default=300)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="remote-bench-"))
    big = args.keep or tmp / "llama-70b"
    name = big.name
    if not (big / "model.safetensors.index.json").exists():
        big.mkdir(parents=True, exist_ok=True)
        t = time.perf_counter()
        build(big, args.layers)
        print(f"built {big} in {time.perf_counter() - t:.0f} s", file=sys.stderr)
    size = sum(p.stat().st_size for p in big.iterdir() if p.is_file())
    env = {**child_env(tmp), "HF_HOME": str(tmp / "hf-home")}
    env.pop("HF_TOKEN", None)
    rows = []

    # 1. one big repo: local inspect against --remote
    os.chdir(big.parent)   # the local copy named as the remote answer names it
    local_s, local_rss, local = run_json(["inspect", name], env, tmp / "local.json")
    t = time.perf_counter()
    repo = Repo(f"bench/{name}", big)
    print(f"hashed the repo's files for the server in {time.perf_counter() - t:.0f} s",
          file=sys.stderr)
    with HubServer([repo]) as hub:
        env["HF_ENDPOINT"] = hub.endpoint
        remote_s, remote_rss, remote = run_json(["inspect", f"bench/{name}", "--remote"], env,
                                                tmp / "remote.json")
        hub.wait_idle()
        served = [q for q in hub.requests if not q.path.startswith("/api/agent")]
        served_bytes = sum(q.body_bytes for q in served)
        hub.reset_counts()
        doc_s, doc_rss, doc = run_json(["doctor", f"bench/{name}", "--remote", "--runtime",
                                        "vllm"], env, tmp / "doctor.json")
        hub.wait_idle()
        doc_served = [q for q in hub.requests if not q.path.startswith("/api/agent")]
    full_s, full_rss, full = run_json(["doctor", name, "--runtime", "vllm"], env,
                                      tmp / "doctor-local.json")
    same = strip(remote) == strip(local)
    rec = remote["remote"]
    rows.append(("inspect, local copy", f"{local_s:.2f} s", f"{local_rss / 1024:.0f} MiB",
                 "-", "-", local["status"]))
    rows.append((f"inspect --remote ({len(local['modules'])} modules, {size / 1e9:.1f} GB)",
                 f"{remote_s:.2f} s", f"{remote_rss / 1024:.0f} MiB",
                 f"{served_bytes / 1e6:.1f} MB ({100 * served_bytes / size:.2f}%)",
                 f"{len(served)}", remote["status"] + (", same document" if same else
                                                      ", DIFFERENT document")))
    assert rec["bytes_read"] == served_bytes and rec["requests"] == len(served), rec
    db = sum(q.body_bytes for q in doc_served)
    same_answer = (doc["answer"], doc["headline"]) == (full["answer"], full["headline"])
    rows.append(("doctor, local copy (verify's reads: every byte)", f"{full_s:.2f} s",
                 f"{full_rss / 1024:.0f} MiB", "-", "-", full["answer"]))
    rows.append(("doctor --remote --runtime vllm", f"{doc_s:.2f} s", f"{doc_rss / 1024:.0f} MiB",
                 f"{db / 1e6:.1f} MB ({100 * db / size:.2f}%)", f"{len(doc_served)}",
                 doc["answer"] + (", same answer and plan" if same_answer and [
                     x["command"] for x in doc["plan"]["steps"][1:]] == [
                     x["command"] for x in full["plan"]["steps"]] else ", DIFFERENT answer")))

    # 2. scan over many repos
    fixtures = sorted(p for p in CKPT.iterdir()
                      if p.is_dir() and (p / "config.json").exists() and "gptq" in p.name)
    repos, names = [], []
    for i in range(args.repos):
        if i % 50 == 49:
            names.append(f"bench/missing-{i:04d}")
            continue
        fx = fixtures[i % len(fixtures)]
        repos.append(Repo(f"bench/r{i:04d}-{fx.name}", fx))
        names.append(repos[-1].repo_id)
    listing = tmp / "repos.txt"
    listing.write_text("\n".join(names) + "\n")
    with HubServer(repos) as hub:
        env["HF_ENDPOINT"] = hub.endpoint
        scan_s, scan_rss, scan = run_json(["scan", "--file", str(listing), "--jobs", "8",
                                           "--in-flight", "32"], env, tmp / "scan.json")
        hub.wait_idle()
        served = [q for q in hub.requests if not q.path.startswith("/api/agent")]
    t = scan["totals"]
    rows.append((f"scan, {t['repos']} repos ({t['ok']} ok, {t['fail']} fail, "
                 f"{t['unreadable']} missing)", f"{scan_s:.2f} s", f"{scan_rss / 1024:.0f} MiB",
                 f"{t['bytes_read'] / 1e6:.1f} MB", f"{len(served)}",
                 f"max {hub.max_active} requests at once"))

    print("| what | time | peak RSS | bytes served | requests | answer |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print("| " + " | ".join(r) + " |")
    shutil.rmtree(tmp, ignore_errors=True)   # the outputs, and the checkpoint unless --keep


if __name__ == "__main__":
    main()
