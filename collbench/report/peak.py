"""The fabric's point-to-point peak, the yardstick of the report's "% of peak" column.

Where it comes from, in order of preference (the report says which):
  --peak-from FILE   a `topo measure` bandwidth matrix (JSON or CSV): its fastest pair;
  --peak-gbps N      a number the user knows (GB/s = 10^9 bytes/s, as busbw is shown);
  (default)          measured now: a two-rank broadcast with the built-in engine through
                     `collbench once` (a 2-rank bcast is one rank sending to the other, so its
                     busbw is the point-to-point bandwidth); between two different hosts when
                     the config has two;
  --no-peak          none: the report shows busbw without a percentage.
"""

import csv
import io
import json
import math
import os
import tempfile
from dataclasses import dataclass, field

import yaml

from collbench.errors import UserError
from collbench.report.once_runs import run_once

PEAK_OPS = "bcast"
PEAK_SIZES = "256KB,1MB,4MB,16MB"
PEAK_ITERATIONS = "20"
MAX_MATRIX_BYTES = 64 << 20

# unit text (case matters: GB/s is bytes, Gb/s bits) -> bytes per second per unit
UNITS = {"B/s": 1.0, "bytes/s": 1.0, "bytes_per_s": 1.0, "bytes_per_second": 1.0,
         "KB/s": 1e3, "MB/s": 1e6, "MBps": 1e6, "GB/s": 1e9, "GBps": 1e9, "GBytes/s": 1e9,
         "Kb/s": 1e3 / 8, "Mb/s": 1e6 / 8, "Mbit/s": 1e6 / 8, "Mbps": 1e6 / 8,
         "Gb/s": 1e9 / 8, "Gbit/s": 1e9 / 8, "Gbps": 1e9 / 8}


@dataclass
class Peak:
    bytes_per_s: float            # None: no peak (the report shows no percentages)
    source: str                   # matrix, value, measured, none, failed
    text: str                     # one sentence for the report: where the number came from
    hosts: list = field(default_factory=list)
    transport: str = None
    engine: str = None
    mpi: str = None

    def as_dict(self):
        return {"bytes_per_s": self.bytes_per_s, "source": self.source, "text": self.text, "hosts": self.hosts,
                "transport": self.transport, "engine": self.engine, "mpi": self.mpi}


def peak_from_value(gbps):
    if not (isinstance(gbps, float) and math.isfinite(gbps) and gbps > 0):
        raise UserError(f"--peak-gbps {gbps}: expected a number of GB/s > 0")
    return Peak(gbps * 1e9, "value", f"given with --peak-gbps: {gbps:g} GB/s")


def no_peak():
    return Peak(None, "none", "no peak (--no-peak): busbw is shown without a percentage")


# ------------------------------------------------------------------ topo measure matrix

def _unit_scale(unit, key=""):
    if isinstance(unit, str) and unit.strip() in UNITS:
        return UNITS[unit.strip()], unit.strip()
    for suffix, scale, name in (("bytes_per_s", 1.0, "B/s"), ("bytes_per_second", 1.0, "B/s"),
                                ("GBps", 1e9, "GB/s"), ("gbytes", 1e9, "GB/s"), ("gbit", 1e9 / 8, "Gbit/s"),
                                ("MBps", 1e6, "MB/s")):
        if key.endswith(suffix) or f"_{suffix}_" in key:
            return scale, name
    return None, None


def _matrix(value, where):
    """A list of rows of numbers/nulls -> [[float or None]]; UserError naming where it is bad."""
    if not isinstance(value, list) or not value or not all(isinstance(r, list) for r in value):
        raise UserError(f"{where}: expected a matrix (a list of rows of numbers)")
    out = []
    for i, row in enumerate(value):
        cells = []
        for j, v in enumerate(row):
            if v is None or v == "":
                cells.append(None)
            elif isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0:
                cells.append(float(v))
            else:
                raise UserError(f"{where}[{i}][{j}]: expected a bandwidth >= 0 or null, got {str(v)[:40]!r}")
        out.append(cells)
    return out


def _find_json_matrix(obj, path, depth=0):
    """(matrix value, its key path, unit text or None, hosts) of the first bandwidth matrix."""
    if not isinstance(obj, dict) or depth > 3:
        return None
    unit = obj.get("unit") or obj.get("units") or obj.get("bandwidth_unit")
    hosts = obj.get("hosts")
    for key, val in obj.items():
        low = str(key).lower()
        if "bandwidth" in low or low in ("bw", "bw_matrix"):
            if isinstance(val, list):
                return val, f"{path}.{key}", unit if isinstance(unit, str) else None, hosts, key
            if isinstance(val, dict):
                inner = val.get("matrix", val.get("values", val.get("data")))
                if isinstance(inner, list):
                    u = val.get("unit") or val.get("units") or unit
                    return inner, f"{path}.{key}", u if isinstance(u, str) else None, val.get("hosts", hosts), key
    for key, val in obj.items():
        found = _find_json_matrix(val, f"{path}.{key}", depth + 1)
        if found:
            return found
    return None


def _read_csv_matrix(text, path):
    rows = [r for r in csv.reader(io.StringIO(text)) if r and any(c.strip() for c in r)]
    if not rows:
        raise UserError(f"--peak-from {path}: empty file")
    unit, hosts = None, None

    def is_num(c):
        try:
            float(c)
            return True
        except ValueError:
            return c.strip() == ""

    header = rows.pop(0) if not all(is_num(c) for c in rows[0]) else None   # host names
    if rows and not is_num(rows[0][0]):               # first column: host names
        rows = [r[1:] for r in rows]
        if header:
            unit = header[0].strip() or None          # the corner cell may name the unit
            header = header[1:]
    hosts = [h.strip() for h in header] if header else None
    try:
        matrix = [[float(c) if c.strip() else None for c in r] for r in rows]
    except ValueError as e:
        raise UserError(f"--peak-from {path}: {e} (expected a CSV matrix of bandwidths)") from None
    return _matrix(matrix, f"--peak-from {path}"), unit, hosts


def peak_from_matrix(path):
    """The fastest pair of a `topo measure` bandwidth matrix file (JSON or CSV)."""
    try:
        if os.path.getsize(path) > MAX_MATRIX_BYTES:
            raise UserError(f"--peak-from {path}: larger than {MAX_MATRIX_BYTES >> 20} MB, not a matrix file")
        with open(path, "rb") as f:
            text = f.read().decode("utf-8")
    except OSError as e:
        raise UserError(f"--peak-from {path}: cannot read: {e.strerror}") from None
    except UnicodeDecodeError:
        raise UserError(f"--peak-from {path}: not UTF-8 text") from None
    key = ""
    if text.lstrip().startswith(("{", "[")):
        try:
            obj = json.loads(text)
        except (ValueError, RecursionError) as e:
            raise UserError(f"--peak-from {path}: not valid JSON: {str(e)[:80]}") from None
        if isinstance(obj, list):
            obj = {"bandwidth": obj}
        found = _find_json_matrix(obj, "")
        if not found:
            raise UserError(f"--peak-from {path}: no bandwidth matrix found (expected a key such as "
                            "'bandwidth_bytes_per_s' or 'bandwidth' holding a list of rows)")
        value, where, unit, hosts, key = found
        matrix = _matrix(value, f"--peak-from {path}: {where.lstrip('.')}")
    else:
        matrix, unit, hosts = _read_csv_matrix(text, path)
    if not (isinstance(hosts, list) and all(isinstance(h, str) for h in hosts) and len(hosts) == len(matrix)):
        hosts = None
    pairs = [(v, i, j) for i, row in enumerate(matrix) for j, v in enumerate(row) if i != j and v]
    if not pairs:
        raise UserError(f"--peak-from {path}: the matrix has no pair with a bandwidth > 0")
    scale, unit_name = _unit_scale(unit, key)
    assumed = ""
    if scale is None:
        biggest = max(v for v, _, _ in pairs)
        scale, unit_name = (1.0, "B/s") if biggest > 1e5 else (1e9, "GB/s")
        assumed = f" (no unit given: read as {unit_name})"
    best, i, j = max(pairs, key=lambda p: p[0])    # the first of equal pairs: i < j when symmetric
    values = sorted(v for v, _, _ in pairs)
    med = values[len(values) // 2]
    name = (lambda k: hosts[k]) if hosts else (lambda k: f"#{k}")
    text_ = (f"from the topo measure matrix {os.path.basename(path)}: fastest pair {name(i)} → {name(j)} "
             f"{best * scale / 1e9:.3g} GB/s (median pair {med * scale / 1e9:.3g} GB/s, {len(matrix)} ranks)"
             f"{assumed}")
    return Peak(best * scale, "matrix", text_, hosts=[name(i), name(j)] if hosts else [])


# ------------------------------------------------------------------ measured now

def two_host_config(config_path, tmpdir):
    """A copy of the config whose two ranks run on two different hosts, or None when the config
    has one host (or already places 2 ranks on two). Relative paths are made absolute so the
    copy in tmpdir means what the original means."""
    from collbench.config import load_config
    cfg = load_config(config_path)
    names = list(dict.fromkeys(cfg.host_names))
    if cfg.implicit_hosts or len(names) < 2:
        return None
    cfg.ranks = 2
    if len(set(cfg.placement())) >= 2:
        return None
    with open(config_path, encoding="utf-8") as f:
        data = yaml.safe_load(f) or {}
    base = os.path.dirname(os.path.abspath(config_path))
    data["hosts"] = names[:2]
    data["ranks"] = 2
    for k in ("ranks_per_node", "plan", "stress", "exporter", "master", "alerts"):
        data.pop(k, None)
    for k in ("engine_path", "osu_path", "state_dir"):
        if isinstance(data.get(k), str):
            p = os.path.expanduser(data[k])
            data[k] = p if os.path.isabs(p) else os.path.normpath(os.path.join(base, p))
    out = os.path.join(tmpdir, "peak-config.yaml")
    with open(out, "w", encoding="utf-8") as f:
        yaml.safe_dump(data, f, sort_keys=False)
    return out


def measure_peak(config=None, timeout=600):
    """Measure the peak now (see the module doc); a Peak with source 'failed' if it could not."""
    with tempfile.TemporaryDirectory(prefix="collbench-peak-") as tmp:
        cfg_path = (two_host_config(config, tmp) if config else None) or config
        args = ["--np", "2", "--ops", PEAK_OPS, "--sizes", PEAK_SIZES, "--iterations", PEAK_ITERATIONS,
                "--engine", "builtin"]
        try:
            run = run_once(args, config=cfg_path, timeout=timeout)
        except UserError as e:
            return Peak(None, "failed", f"the two-rank peak test could not run: {e}")
        results = [r for r in run.records if r.get("type") == "result" and r.get("busbw_bytes_per_s")]
        if not results:
            failures = [r.get("error") for r in run.records if r.get("type") == "failure"]
            why = failures[0] if failures else (run.stderr.splitlines()[-1] if run.stderr else "no result")
            return Peak(None, "failed", f"the two-rank peak test failed: {why}")
        best = max(results, key=lambda r: r["busbw_bytes_per_s"])
        hosts = list(best.get("hosts") or [])
        where = (f"between {hosts[0]} and {hosts[1]}" if len(hosts) >= 2
                 else f"on {hosts[0]} (both ranks on one host: an intra-node peak)" if hosts else "")
        text = (f"measured for this report: a two-rank broadcast (one rank sends to the other) {where}, "
                f"transport {best.get('transport', '?')}, engine {best.get('engine', '?')}; best of "
                f"{PEAK_SIZES.replace(',', '/')} = {best['busbw_bytes_per_s'] / 1e9:.3g} GB/s "
                f"({best.get('size', '?')})")
        return Peak(best["busbw_bytes_per_s"], "measured", text, hosts=hosts, transport=best.get("transport"),
                    engine=best.get("engine"), mpi=best.get("mpi"))
