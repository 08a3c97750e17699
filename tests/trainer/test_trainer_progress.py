"""The run's progress clock: mean step time (the first step left out once there are others), time
left at that pace, and how durations are written."""

from __future__ import annotations

import json
import subprocess
import sys

from mindmotor.trainer.progress import StepClock, format_duration


def test_the_clock_estimates_the_time_left_from_the_mean_step_time():
    clock = StepClock(total_steps=110, start_step=10, now=0.0)
    assert clock.eta_s is None
    clock.tick(11, now=5.0)                    # a slow first step (warm-up)
    assert clock.eta_s == 5.0 * 99
    for step, t in [(12, 6.0), (13, 7.0), (14, 8.0)]:
        clock.tick(step, now=t)
    assert clock.mean_step_s == 1.0
    assert clock.eta_s == 96.0
    assert clock.elapsed_s == 8.0


def test_durations_are_written_in_hours_minutes_and_seconds():
    assert [format_duration(s) for s in (7.2, 125, 3725)] == ["7s", "2m05s", "1h02m05s"]


def test_without_torch_train_says_what_to_install_in_one_line_and_exits_2(corpus_dir, tmp_path):
    code = ("import sys; sys.modules['torch'] = None\n"
            "from mindmotor.trainer.cli import main\n"
            f"sys.exit(main(['train', '--preset', 'tiny', '--corpus', {json.dumps(str(corpus_dir))}, "
            f"'--out', {json.dumps(str(tmp_path))}]))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "pip install 'torch==2.13.0'" in lines[0], done.stderr


def test_log_lines_written_while_the_bar_is_drawn_do_not_break_it_and_stay_redacted(monkeypatch):
    """A log line during training starts a line of its own (the bar is cleared first and drawn again
    below it), whole, with its secrets still masked; the console handler is back afterwards."""
    import io
    import logging

    from mindmotor.common.logging import setup_logging
    from mindmotor.common.redact import register_secret
    from mindmotor.trainer.progress import ProgressReporter

    terminal = io.StringIO()
    root = logging.getLogger()
    monkeypatch.setattr(root, "handlers", list(root.handlers))      # the suite's logging, back afterwards
    monkeypatch.setattr(root, "level", root.level)
    monkeypatch.setattr(sys, "stderr", terminal)
    setup_logging("trainer", "INFO", stream=terminal, log_format="text")
    register_secret("hunter2-progress-secret")
    (console,) = logging.getLogger().handlers
    reporter = ProgressReporter(show_bar=True)
    reporter.start(total_steps=4, start_step=0, run="r")
    reporter.step(step=1, loss=2.0, lr=1e-3, tokens_per_s=100.0, grad_norm=1.0)
    logging.getLogger("mindmotor.trainer").info("validation done token=hunter2-progress-secret")
    reporter.step(step=2, loss=1.5, lr=1e-3, tokens_per_s=100.0, grad_norm=1.0)
    reporter.close()
    assert logging.getLogger().handlers == [console]

    text = terminal.getvalue()
    assert "hunter2-progress-secret" not in text
    (line,) = [part for part in text.replace("\r", "\n").split("\n") if "validation done" in part]
    assert "INFO" in line and "train:" not in line and "|" not in line, repr(text)
    assert "2/4" in text.split("validation done", 1)[1]          # the bar is drawn again below it
