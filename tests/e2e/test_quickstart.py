"""The README's quick start, done exactly as written (scripts/quickstart_check.sh) on a fresh clone of
this repository: `mindmotor up`, a completion, `mindmotor train --preset quick`, its checkpoint rolled
out as a canary of up's deployment and promoted.

What differs from a user's run is all outside the README's commands, to keep CI's cost down: the
install is skipped (.ci/run has just installed the same into .venv, which the clone links to);
training runs 2 steps on 200 kB of the corpus instead of the preset's 400 steps on 4 MB (about 2-3
minutes on 2 idle cores; the rest of the flow is the same whatever the step count); `up` runs one
worker and one coordinator replica instead of two each (`MINDMOTOR_MODELS`, `MINDMOTOR_COORDINATORS`),
in a state directory and on a free port of the test's own. The clone is of the last commit:
uncommitted changes are not in it (as on a user's fresh clone)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_the_readme_quick_start_works_on_a_fresh_clone(tmp_path):
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "--quiet", "--no-hardlinks", str(REPO), str(clone)], check=True, timeout=120)
    (clone / ".venv").symlink_to(Path(sys.prefix))            # the installed environment, as .ci/run made it
    env = {**os.environ,
           "PYTHONPATH": str(clone / "services"),              # the clone's code, not the editable install's
           "QUICKSTART_SKIP_INSTALL": "1",
           "QUICKSTART_TRAIN_ARGS": "--steps 2 --set max_corpus_bytes=200000 --set eval_batches=1",
           "MINDMOTOR_STATE_DIR": str(tmp_path / "state"), "MINDMOTOR_PORT": "0",
           "MINDMOTOR_COORDINATORS": "1", "MINDMOTOR_MODELS": '[{"workers": 1}]'}
    done = subprocess.run(["bash", "scripts/quickstart_check.sh"], cwd=clone, env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "quickstart check passed" in done.stdout
    assert (clone / "checkpoints" / "quick-step000002" / "config.json").exists()
    assert not (tmp_path / "state" / "up.json").exists()       # up stopped and cleaned up after itself
    shutil.rmtree(clone / "checkpoints")


def _commands(text: str) -> list[str]:
    """Shell lines with their continuations joined, comments and repeated blanks dropped."""
    joined = re.sub(r"\\\n\s*", " ", text)
    lines = [re.sub(r"\s+#\s.*$", "", line).strip() for line in joined.splitlines()]
    return [re.sub(r"\s+", " ", line) for line in lines if line and not line.startswith("#")]


def test_the_script_runs_the_readme_s_quick_start_commands_as_written():
    readme = (REPO / "README.md").read_text()
    section = readme.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```bash\n(.*?)```", section, re.S)
    wanted = [c for block in blocks for c in _commands(block)]
    assert any("mindmotor train --preset quick" in c for c in wanted) and len(wanted) == 6, wanted
    script = (REPO / "scripts" / "quickstart_check.sh").read_text().replace('curl -sf "$url"', "curl http://127.0.0.1:8000")
    ran = _commands(script)
    missing = [c for c in wanted if not any(line.startswith(c) for line in ran)]
    assert missing == [], "README quick-start commands the script does not run as written"
