"""Progress of a run on stderr: a live line on a terminal, one line per finished step otherwise."""

import time

from collbench.once.report_table import format_latency
from collbench.ops import get_op
from collbench.sizes import format_size


class Progress:
    """Progress on stderr: a live line on a terminal, one line per finished step otherwise."""

    def __init__(self, stream, total, quiet=False):
        self.stream = stream
        self.total = total
        self.quiet = quiet
        self.live = not quiet and hasattr(stream, "isatty") and stream.isatty()
        self.done = 0
        self.started = time.monotonic()
        self._live_shown = False

    @staticmethod
    def _label(op_name, size_bytes):
        op = get_op(op_name)
        return f"{op.name} {format_size(size_bytes)}" if op.has_size and size_bytes else op.name

    def _live(self, text):
        self.stream.write("\r\033[K" + text)
        self.stream.flush()
        self._live_shown = True

    def start(self, index, total, step):
        if self.live:
            elapsed = time.monotonic() - self.started
            self._live(f"[{index + 1}/{total}] {self._label(step.op, step.size_bytes)} "
                       f"({step.datatype}, {step.iterations} iterations) ... {elapsed:.0f}s")

    def finished(self, rec):
        if self.quiet or rec.get("type") not in ("result", "failure"):
            return
        self.done += 1
        if rec.get("op"):
            label = self._label(rec["op"], rec.get("size_bytes") or 0)
        else:
            label = "job"
        if rec["type"] == "failure":
            error = str(rec.get("error"))
            # engines already start their errors with the step ("allreduce 4MB: ...")
            text = f"FAILED: {error}" if label in error.split(":")[0] else f"{label}: FAILED: {error}"
        else:
            text = f"{label}: avg {format_latency(rec.get('latency_avg_us'))}"
            if rec.get("validation") == "fail":
                text += " VALIDATION FAILED"
            elif rec.get("verdict"):
                text += f" ({rec['verdict']})"
        line = f"[{min(self.done, self.total)}/{self.total}] {text}"
        if self.live:
            self._live(line)
        else:
            self.stream.write(line + "\n")
            self.stream.flush()

    def close(self):
        if self._live_shown:
            self.stream.write("\r\033[K")
            self.stream.flush()
            self._live_shown = False
