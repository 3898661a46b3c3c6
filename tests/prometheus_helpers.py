"""A real Prometheus (the Debian package) that a test starts, queries and stops: the one place the
e2e tests write its config, start it and read its query API; and the other daemons the monitoring
tests start beside it (exporters, Alertmanager) as a Service."""

import json
import subprocess
import urllib.parse
import urllib.request

import yaml

from conftest import require_tool, stop_process


class Service:
    """A daemon a test starts in its own session (in a network namespace when `netns` is given),
    its output in log_path; stopped by its pid."""

    def __init__(self, name, argv, log_path, cwd=None, netns=None):
        self.name, self.log_path = name, log_path
        self.log = open(log_path, "w")
        pre = ["ip", "netns", "exec", netns] if netns else []
        self.proc = subprocess.Popen(pre + argv, stdout=self.log, stderr=subprocess.STDOUT, cwd=cwd,
                                     start_new_session=True)

    def check_alive(self):
        if self.proc.poll() is not None:
            raise AssertionError(f"{self.name} exited {self.proc.returncode}:\n{self.tail()}")

    def tail(self):
        self.log.flush()
        with open(self.log_path) as f:
            return "".join(f.readlines()[-30:])

    def stop(self):
        stop_process(self.proc, timeout=15)
        self.log.close()


class Prometheus:
    """Prometheus on 127.0.0.1:`port` with `config` (a dict, written as prometheus.yml), its TSDB and
    log in `directory`; `flags` are extra command-line flags. stop() ends it (also as a context)."""

    name = "prometheus"

    def __init__(self, directory, config, port, *flags):
        binary = require_tool("prometheus")
        self.log_path = directory / "prometheus.log"
        (directory / "prometheus.yml").write_text(yaml.safe_dump(config))
        self.url = f"http://127.0.0.1:{port}"
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen([binary, f"--config.file={directory / 'prometheus.yml'}",
                                          f"--storage.tsdb.path={directory / 'prom-data'}",
                                          f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn", *flags],
                                         stdout=subprocess.DEVNULL, stderr=log, start_new_session=True)

    def log_tail(self, chars=3000):
        return self.log_path.read_text(errors="replace")[-chars:]

    tail = log_tail          # as the tests' other services (exporters, Alertmanager) name it

    def check_alive(self):
        if self.proc.poll() is not None:
            raise AssertionError(f"prometheus exited {self.proc.returncode}: {self.log_tail()}")

    def query(self, expr, timeout=10):
        """The instant query's result list (AssertionError if Prometheus exited or the query failed;
        OSError while it does not answer)."""
        self.check_alive()
        url = f"{self.url}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        with urllib.request.urlopen(url, timeout=timeout) as r:
            body = json.loads(r.read().decode())
        assert body["status"] == "success", body
        return body["data"]["result"]

    def try_query(self, expr):
        """query(), or None while Prometheus does not answer yet."""
        try:
            return self.query(expr)
        except OSError:
            return None

    def stop(self):
        stop_process(self.proc, timeout=15)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()
