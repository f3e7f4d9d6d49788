"""CI: ``pip install ".[gpu]"`` resolves, on a fresh environment, to exactly one TensorFlow package
(with NVIDIA's CUDA libraries), never to two packages that both ship the ``tensorflow`` module.

    .venv/bin/python .ci/check_gpu_extra.py     # exit 0 and one line, or exit 1 and what is wrong
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TENSORFLOWS = {"tensorflow", "tensorflow-cpu", "tensorflow-gpu", "tensorflow-intel", "tf-nightly", "tf-nightly-cpu"}


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        done = subprocess.run(
            [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
             "--report", str(report), f"{ROOT}[gpu]"],
            capture_output=True, text=True,
        )
        if done.returncode != 0:
            print(f'pip install --dry-run ".[gpu]" failed:\n{done.stderr[-3000:]}')
            return 1
        names = {item["metadata"]["name"].lower().replace("_", "-") for item in json.loads(report.read_text())["install"]}
    tensorflows = sorted(names & TENSORFLOWS)
    cuda = sorted(n for n in names if n.startswith("nvidia-"))
    if tensorflows != ["tensorflow"] or not cuda:
        print(f'".[gpu]" resolves to TensorFlow packages {tensorflows} and CUDA libraries {cuda[:3]}: '
              "expected exactly tensorflow, with nvidia-* libraries")
        return 1
    print(f'".[gpu]" resolves to one TensorFlow package (tensorflow) and {len(cuda)} NVIDIA CUDA libraries')
    return 0


if __name__ == "__main__":
    sys.exit(main())
