"""The failure tally of a run: failed steps, failed validations, planned steps that never ran."""

from dataclasses import dataclass, field


@dataclass
class Tally:
    failed: list = field(default_factory=list)
    bad_validation: list = field(default_factory=list)
    not_run: list = field(default_factory=list)
    total: int = 0

    @property
    def ok(self):
        return not (self.failed or self.bad_validation or self.not_run)

    @property
    def exit_code(self):
        return 0 if self.ok else 1

    def message(self):
        return (f"{len(self.failed)} failed, {len(self.bad_validation)} failed validation, "
                f"{len(self.not_run)} not run, of {self.total} steps")


def tally(records, steps):
    """What went wrong in a run of `steps` that gave `records` (results and failures)."""
    measured = {(r.get("op"), r.get("size_bytes") or 0) for r in records if r.get("op")}
    return Tally(failed=[r for r in records if r.get("type") == "failure"],
                 bad_validation=[r for r in records if r.get("type") == "result" and r.get("validation") == "fail"],
                 not_run=[s for s in steps if (s.op, s.size_bytes) not in measured],
                 total=len(steps))
