"""Where the time goes: run one benchmark worker under py-spy and summarise the samples.

    python -m bench.profile bench/results/tmp/cold_ours-r0.spec.json --name cold_ours
    python -m bench.profile SPEC.json --name load-ours --rate 200 --top 30

The spec files are the ones `bench.run` writes into its workdir. py-spy samples every thread (`--threads`
separates them) and writes collapsed stacks; this prints the functions with the largest inclusive share of
samples, and writes both the stacks and the summary to bench/results/profile-<name>.{txt,md}.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

from hunyuan_mt.config import PROJECT_ROOT

RESULTS = PROJECT_ROOT / "bench" / "results"


def summarize(collapsed: Path, top: int, focus: str | None = None) -> str:
    """Inclusive samples per frame (a frame counted once per stack), largest first."""
    inclusive: Counter[str] = Counter()
    threads: Counter[str] = Counter()
    total = 0
    for line in collapsed.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack:
            continue
        n = int(count)
        total += n
        frames = stack.split(";")
        threads[frames[0]] += n
        for frame in set(frames[1:]):
            if focus is None or focus in frame:
                inclusive[frame] += n
    lines = [f"{total} samples", "", "| share | frame |", "|---|---|"]
    for frame, n in inclusive.most_common(top):
        lines.append(f"| {100 * n / max(total, 1):.1f}% | `{frame[:140]}` |")
    lines += ["", "Samples per thread:", ""] + [f"- {t}: {100 * n / max(total, 1):.1f}%" for t, n in
                                                   threads.most_common(8)]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.profile", description=__doc__.split("\n")[0])
    p.add_argument("spec", type=Path, help="a worker spec JSON written by bench.run")
    p.add_argument("--name", required=True)
    p.add_argument("--rate", type=int, default=100, help="samples per second")
    p.add_argument("--top", type=int, default=30)
    p.add_argument("--focus", default=None, help="only frames whose text contains this (e.g. hunyuan_mt)")
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    py_spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    args.out.mkdir(parents=True, exist_ok=True)
    collapsed = args.out / f"profile-{args.name}.txt"
    out_json = args.out / "tmp" / f"profile-{args.name}.out.json"
    out_json.parent.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, PYTHONPATH=str(PROJECT_ROOT), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    cmd = [py_spy, "record", "--format", "raw", "--threads", "--rate", str(args.rate), "-o", str(collapsed), "--",
           sys.executable, "-m", "bench.worker", str(args.spec), str(out_json)]
    rc = subprocess.call(cmd, cwd=PROJECT_ROOT, env=env)
    if rc != 0 or not collapsed.is_file():
        print(f"py-spy failed with exit code {rc}", file=sys.stderr)
        return 1
    summary = summarize(collapsed, args.top, args.focus)
    (args.out / f"profile-{args.name}.md").write_text(f"# Profile: {args.name}\n\n`{' '.join(cmd[1:])}`\n\n{summary}")
    print(summary)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
