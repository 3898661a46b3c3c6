"""mpi-output.log: the raw output of the daemon's MPI jobs."""

from collbench.results.appender import RotatingAppender


class RawOutputLog:
    """The raw MPI output (mpi-output.log) as the file object MpiJob writes to: the results
    log's own writer (collbench.results.appender), one old file kept past max_bytes (it is for
    debugging). Reopening and failed rotations are reported through on_event(event, detail,
    **fields), called from the job's reader threads (the daemon queues them for the results log).
    """

    def __init__(self, path, max_bytes, on_event=None):
        self.path = path
        self._file = RotatingAppender(path, max_bytes, 1, on_event=on_event, what="MPI output log")

    def write(self, text):
        self._file.write(text.encode("utf-8", "replace"))

    def check(self):
        self._file.check()

    def flush(self):
        pass        # every write is a write(2) already

    def close(self):
        self._file.close()
