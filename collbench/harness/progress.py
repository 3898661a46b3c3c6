"""Progress on stderr with the time left: a live line on a terminal, one line per finished step otherwise."""

import time

from collbench.ops import get_op
from collbench.sizes import format_size
from collbench.tables import format_us
from collbench.tables import format_duration


def step_weight(step):
    """A step's expected share of the run time, for the estimate: its calls times (a latency floor
    plus its bytes at 1 GB/s). Only ratios between steps matter."""
    calls = (getattr(step, "iterations", 1) or 1) + (getattr(step, "warmup", 0) or 0)
    return calls * (5e-6 + (getattr(step, "size_bytes", 0) or 0) / 1e9)


class Progress:
    """Counts finished units of work and prints "[done/total] text; ~T left".

    weights: each unit's expected share of the time (default equal); the time left is the
    elapsed time scaled by the weight still to run over the weight done.
    """

    def __init__(self, stream, total, quiet=False, weights=None):
        self.stream = stream
        self.total = total
        self.quiet = quiet
        self.live = not quiet and hasattr(stream, "isatty") and stream.isatty()
        self.done = 0
        self.started = time.monotonic()
        self.weights = list(weights) if weights is not None and len(weights) == total else None
        self._live_shown = False

    @property
    def elapsed(self):
        return time.monotonic() - self.started

    def seconds_left(self):
        """The estimate of the time left, or None before the first unit finished or after the last."""
        if self.done <= 0 or self.done >= self.total:
            return None
        if self.weights:
            done_w, left_w = sum(self.weights[:self.done]), sum(self.weights[self.done:])
        else:
            done_w, left_w = self.done, self.total - self.done
        if done_w <= 0:
            return None
        return self.elapsed * left_w / done_w

    def _left(self):
        left = self.seconds_left()
        return "" if left is None else f"; ~{format_duration(left, days=False)} left"

    def _write_live(self, text):
        self.stream.write("\r\033[K" + text)
        self.stream.flush()
        self._live_shown = True

    def running(self, text, index=None):
        """What runs now: shown on a terminal only, replaced by the next line."""
        if self.live:
            n = self.done + 1 if index is None else index + 1
            self._write_live(f"[{n}/{self.total}] {text} ... {self.elapsed:.0f}s{self._left()}")

    def finished(self, text, count=1):
        """`count` units finished: one line saying what, and the time left."""
        self.done += count
        if self.quiet:
            return
        line = f"[{min(self.done, self.total)}/{self.total}] {text}{self._left()}"
        if self.live:
            self._write_live(line)
        else:
            self.stream.write(line + "\n")
            self.stream.flush()

    def note(self, text):
        """A line of its own (clears a live line first)."""
        if self.quiet:
            return
        self.close()
        self.stream.write(text + "\n")
        self.stream.flush()

    def close(self):
        if self._live_shown:
            self.stream.write("\r\033[K")
            self.stream.flush()
            self._live_shown = False


def step_label(op_name, size_bytes):
    op = get_op(op_name)
    return f"{op.name} {format_size(size_bytes)}" if op.has_size and size_bytes else op.name


class StepProgress(Progress):
    """Progress of plan steps from the engine's records (once, sweep)."""

    def __init__(self, stream, steps, quiet=False):
        steps = list(steps)
        super().__init__(stream, len(steps), quiet=quiet, weights=[step_weight(s) for s in steps])

    def start(self, index, total, step):
        """The engine's on_progress: step `index` of `total` starts."""
        self.running(f"{step_label(step.op, step.size_bytes)} ({step.datatype}, {step.iterations} iterations)",
                     index=index)

    def record(self, rec):
        """A record from the engine: results and failures count as a finished step."""
        if rec.get("type") not in ("result", "failure"):
            return
        label = step_label(rec["op"], rec.get("size_bytes") or 0) if rec.get("op") else "job"
        if rec["type"] == "failure":
            error = str(rec.get("error"))
            # engines already start their errors with the step ("allreduce 4MB: ...")
            text = f"FAILED: {error}" if label in error.split(":")[0] else f"{label}: FAILED: {error}"
        else:
            text = f"{label}: avg {format_us(rec.get('latency_avg_us'))}"
            if rec.get("validation") == "fail":
                text += " VALIDATION FAILED"
            elif rec.get("verdict"):
                text += f" ({rec['verdict']})"
        self.finished(text)
