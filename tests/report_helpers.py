"""Helpers for the report and baseline tests: a real headless Chromium that proves a page loads
with no console message and no outside request, results files from real `collbench once`
runs, and stress-log-shaped files written by the daemon's own ResultsLog."""

import json
import os
import random
import re
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone

from conftest import REPO, require_tool

# Chromium's own background traffic (component updates, account checks) is not the page's:
# a request the page made carries an origin (the file:// page), the browser's say "not an origin".
_BROWSER_INITIATOR = "not an origin"
_LOCAL_SCHEMES = ("file:", "data:", "about:", "chrome:", "chrome-extension:", "devtools:", "blob:")
URL_RE = re.compile(rb"(?:https?|ftp|wss?)://|(?:src|href|action|poster|data)\s*=\s*[\"']?//|url\(\s*[\"']?//|@import",
                    re.IGNORECASE)


def chromium():
    return require_tool("chromium")


class Render:
    def __init__(self, screenshot, console, page_requests, stderr, seconds):
        self.screenshot = screenshot
        self.console = console                 # every console line the page produced
        self.page_requests = page_requests     # non-local URLs the page asked for
        self.stderr = stderr
        self.seconds = seconds


def render(html_path, out_png, width=1280, height=3000, timeout=180):
    """Load html_path in headless Chromium with every host unresolvable, a net log and console
    logging on; screenshot it. The page's console lines and outside requests are returned."""
    html_path = os.path.abspath(html_path)
    with tempfile.TemporaryDirectory(prefix="collbench-chromium-") as tmp:
        netlog = os.path.join(tmp, "net.json")
        argv = [chromium(), "--headless", "--no-sandbox", "--disable-gpu", f"--user-data-dir={tmp}/profile",
                "--hide-scrollbars", "--no-first-run", "--disable-background-networking",
                "--disable-component-update", "--disable-sync", "--disable-extensions",
                "--enable-logging=stderr", "--v=0", '--host-resolver-rules=MAP * ~NOTFOUND',
                f"--log-net-log={netlog}", "--net-log-capture-mode=Default",
                f"--screenshot={out_png}", f"--window-size={width},{height}", "file://" + html_path]
        started = time.monotonic()
        p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, errors="replace")
        seconds = time.monotonic() - started
        assert p.returncode == 0, f"chromium exit {p.returncode}: {p.stderr[-2000:]}"
        console = [ln for ln in p.stderr.splitlines() if ":CONSOLE" in ln]
        requests = page_requests(netlog)
    return Render(out_png, console, requests, p.stderr, seconds)


def page_requests(netlog_path):
    """URLs (not file:/data:) of requests made on behalf of a page, from a Chromium net log."""
    with open(netlog_path, encoding="utf-8", errors="replace") as f:
        text = f.read()
    try:
        log = json.loads(text)
    except ValueError:   # Chromium may leave the closing brackets off when it exits fast
        log = json.loads(text.rstrip().rstrip(",") + "]}")
    names = {v: k for k, v in log["constants"]["logEventTypes"].items()}
    out = []
    for e in log.get("events", []):
        if names.get(e.get("type")) != "URL_REQUEST_START_JOB":
            continue
        params = e.get("params") or {}
        url = str(params.get("url") or "")
        if not url or url.startswith(_LOCAL_SCHEMES):
            continue
        if params.get("initiator") == _BROWSER_INITIATOR and "file://" not in str(params.get("network_isolation_key")):
            continue
        out.append(url)
    return out


def non_blank_stats(png_path):
    """(distinct colours, share of pixels that are not the page background) of a screenshot."""
    import numpy
    from matplotlib.image import imread
    img = imread(png_path)[:, :, :3]
    px = (numpy.round(img * 255).astype(numpy.uint32) * numpy.array([1 << 16, 1 << 8, 1])).sum(axis=2).ravel()
    values, counts = numpy.unique(px, return_counts=True)
    return len(values), 1.0 - counts.max() / px.size


def external_urls(path):
    """Every place in a file that names or loads something outside it."""
    with open(path, "rb") as f:
        data = f.read()
    return [data[max(0, m.start() - 40):m.end() + 40] for m in URL_RE.finditer(data)]


def collbench(*args, timeout=600, env=None):
    return subprocess.run([sys.executable, "-m", "collbench", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=REPO, env=env)


def once_results(path, *args):
    """Append the records of a real `collbench once` at 2 ranks to path; the process."""
    p = collbench("once", "--np", "2", "--quiet", "--results", str(path), *args, timeout=300)
    assert p.returncode == 0, p.stderr
    return p


def read_records(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def _stamp(ts):
    iso = datetime.fromtimestamp(ts, timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    return {"schema": 1, "time": iso, "ts": round(ts, 3)}


def write_stress_log(log_path, templates, iterations, rotate_bytes=0, rotate_keep=5, seed=1, jitter=0.05,
                     failure_every=0, run_id="20261123T000000-5f78e4e4", t0=1795400000.0, extra=None):
    """A stress-daemon-shaped log: `iterations` plan passes over the template result records,
    each with the daemon's fields (iteration, seq, t_start/t_end) and a latency jitter, a failure
    + backoff + relaunch every `failure_every` passes, written by the daemon's own ResultsLog
    (rotation included). Returns the number of records written."""
    from collbench.results.results_log import ResultsLog
    rng = random.Random(seed)
    n = 0
    ts = t0
    with ResultsLog(str(log_path), rotate_bytes, rotate_keep) as log:
        log.append(dict(_stamp(ts), type="event", event="start", pid=4242, detail="started",
                        run_id=run_id, mode="loop", steps=len(templates), config="/etc/collbench.yaml"))
        n += 1
        for it in range(1, iterations + 1):
            for tpl in templates:
                ts += 0.05
                rec = dict(tpl)
                scale = 1.0 + rng.uniform(-jitter, jitter)
                for k in ("latency_avg_us", "latency_min_us", "latency_max_us"):
                    if rec.get(k) is not None:
                        rec[k] = round(rec[k] * scale, 4)
                for k in ("algbw_bytes_per_s", "busbw_bytes_per_s"):
                    if rec.get(k) is not None:
                        rec[k] = round(rec[k] / scale, 1)
                rec.update(_stamp(ts))
                rec.update(run_id=run_id, iteration=it, t_start=round(ts - 0.04, 3), t_end=round(ts, 3))
                if extra:
                    rec.update(extra)
                log.append(rec)
                n += 1
            if failure_every and it % failure_every == 0:
                base = {k: templates[0][k] for k in ("hosts", "nodes", "ranks", "engine", "mpi", "transport")}
                log.append(dict(_stamp(ts), type="failure", run_id=run_id, status="failed", **base,
                                error=f"MPI job exited with code 137 during allreduce 1MB (iteration {it}): rank 1 "
                                      "killed (see https://www.open-mpi.org/faq/)",
                                stderr_tail="mpirun noticed that process rank 1 exited on signal 9 (Killed).",
                                op="allreduce", size_bytes=1048576, exit_code=137, iteration=it))
                log.append(dict(_stamp(ts), type="event", event="backoff", pid=4242, detail="relaunch in 5.0s",
                                run_id=run_id, delay_s=5.0, failures=1))
                log.append(dict(_stamp(ts), type="event", event="relaunch", pid=4242, detail="relaunched",
                                run_id=run_id, attempt=it // failure_every))
                n += 3
    return n



def signal_at_progress(args, progress, sig):
    """Run `collbench ARGS`, send it `sig` once its stderr shows a line starting with `progress`
    (the harness' "[1/4] ..."): (exit code, stderr, the processes that were below it then). The
    progress line is asserted: a run that shows none ends before it is signalled."""
    from collbench import proctree
    proc = subprocess.Popen([sys.executable, "-m", "collbench", *args], stderr=subprocess.PIPE,
                            stdout=subprocess.DEVNULL, text=True, cwd=REPO)
    lines = []
    try:
        for line in proc.stderr:
            lines.append(line)
            if line.startswith(progress):
                break
        assert lines and lines[-1].startswith(progress), "".join(lines)
        below = proctree.descendants(proc.pid)
        proc.send_signal(sig)
        err = "".join(lines) + proc.stderr.read()
        return proc.wait(timeout=60), err, below
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
