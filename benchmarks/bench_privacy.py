"""Redaction's cost (issue 58, docs/privacy.md): capture on with ten rules against no rules, side by
side in one run, on 1 KB JSON calls and the logprob stream (wrk at c=64, through sidecars in front
of `fast_upstream.py`), and metrics-only beside them.

    python benchmarks/bench_privacy.py [--rounds 3] [--seconds 4]

Prints a markdown table (medians, the run's spread) and the ratios; writes benchmarks/results/privacy.md.
Nothing is asserted: the machine is shared.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import bench_proxy as bench  # noqa: E402

#: Ten rules of the kinds users write: addresses, keys and tokens of several vendors, ids.
TEN_RULES = r"""rules:
  - {name: email, pattern: '[A-Za-z0-9._%+-]+@[A-Za-z0-9.-]+\.[A-Za-z]{2,}'}
  - {name: openai_key, pattern: 'sk-[A-Za-z0-9-]{20,}'}
  - {name: anthropic_key, pattern: 'sk-ant-[A-Za-z0-9_-]{20,}'}
  - {name: aws_key, pattern: 'AKIA[0-9A-Z]{16}'}
  - {name: github_token, pattern: 'gh[pousr]_[A-Za-z0-9]{36}'}
  - {name: slack_token, pattern: 'xox[baprs]-[A-Za-z0-9-]{10,}'}
  - {name: jwt, pattern: 'eyJ[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+'}
  - {name: ipv4, pattern: '\b(?:\d{1,3}\.){3}\d{1,3}\b'}
  - {name: credit_card, pattern: '\b(?:\d[ -]?){13,16}\b'}
  - {name: acme_id, pattern: 'ACME-\d{6}'}
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=int, default=4)
    args = parser.parse_args()
    bench.ensure_tools()
    workdir = tempfile.mkdtemp(prefix="mcc-privacy-")
    rules = os.path.join(workdir, "rules.yaml")
    with open(rules, "w", encoding="utf-8") as handle:
        handle.write(TEN_RULES)
    modes = {"capture on, no rules": (), "capture on, ten rules": ("--redact", rules),
             "capture on, metrics-only": ("--privacy", "metrics-only")}
    upstream = bench.start_upstream()
    try:
        figures = bench.interleaved_modes(upstream, modes, args.rounds, args.seconds, workdir)
    finally:
        upstream.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    lines, _ = bench.modes_table(figures, args.rounds, args.seconds, ("capture on, no rules", "no rules"))
    bench.publish("privacy", "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
