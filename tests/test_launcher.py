"""The launcher's command lines, run for real where mpirun can run them."""

import os
import subprocess

import pytest

from collbench.config import build_config
from collbench.errors import UserError
from collbench.engines.launcher import TRANSPORT_PRESETS, build_command, mpi_version
from collbench.engines.mpi_flavour import version_line


def cfg_for(tmp_path, **data):
    return build_config(data, "<test>", str(tmp_path))


def test_local_default_shm_command(tmp_path):
    cfg = cfg_for(tmp_path, ranks=2)
    argv, env = build_command(cfg, ["prog", "arg"])
    assert argv[1:3] == ["-np", "2"]
    assert argv[-2:] == ["prog", "arg"]
    assert ("--allow-run-as-root" in argv) == (os.geteuid() == 0)
    assert "--oversubscribe" in argv  # the local default may oversubscribe
    i = argv.index("btl")
    assert argv[i - 1] == "--mca" and argv[i + 1] == "vader,self"
    assert "--host" not in argv and "--hostfile" not in argv


def test_hosts_list_and_ranks_per_node(tmp_path):
    cfg = cfg_for(tmp_path, hosts=["n1:2", {"host": "n2", "slots": 2}], ranks=4, ranks_per_node=2,
                  transport="ob1-tcp")
    argv, _ = build_command(cfg, ["prog"])
    assert argv[argv.index("--host") + 1] == "n1:2,n2:2"
    assert argv[argv.index("--map-by") + 1] == "ppr:2:node"
    assert "--oversubscribe" not in argv
    assert cfg.placement() == ["n1", "n2"] and cfg.nodes == 2


def test_hostfile_is_passed_through(tmp_path):
    hf = tmp_path / "hosts"
    hf.write_text("# comment\nnodeA slots=2\nnodeB slots=2 max_slots=4\n")
    cfg = cfg_for(tmp_path, hosts="hosts")
    argv, _ = build_command(cfg, ["prog"])
    assert argv[argv.index("--hostfile") + 1] == str(hf)
    assert cfg.ranks == 4 and cfg.host_names == ["nodeA", "nodeB"]


def test_ucx_preset_exports_its_variables_and_config_env_wins(tmp_path):
    cfg = cfg_for(tmp_path, ranks=2, transport="ucx", env={"UCX_NET_DEVICES": "mlx5_0:1", "FOO": 1})
    argv, env = build_command(cfg, ["prog"])
    assert env["UCX_TLS"] == TRANSPORT_PRESETS["ucx"]["env"]["UCX_TLS"]
    assert env["UCX_NET_DEVICES"] == "mlx5_0:1" and env["FOO"] == "1"
    exported = {argv[i + 1] for i, a in enumerate(argv) if a == "-x"}
    assert exported == {"UCX_TLS", "UCX_NET_DEVICES", "FOO", "COLLBENCH_ENGINE_STOP_GRACE"}
    assert ["--mca", "pml", "ucx"] == argv[argv.index("pml") - 1:argv.index("pml") + 2]


@pytest.mark.parametrize("stop_grace, env, expected", [(10, {}, "5"), (60, {}, "30"), (1, {}, "1"),
                                                       (60, {"COLLBENCH_ENGINE_STOP_GRACE": 2}, "2")])
def test_the_engines_stop_grace_is_half_the_daemons_unless_set(tmp_path, stop_grace, env, expected):
    cfg = cfg_for(tmp_path, ranks=2, transport="ob1-tcp", env=env, stress={"stop_grace": stop_grace})
    argv, full = build_command(cfg, ["prog"])
    assert full["COLLBENCH_ENGINE_STOP_GRACE"] == expected
    assert argv[argv.index("COLLBENCH_ENGINE_STOP_GRACE") - 1] == "-x"      # every rank gets it


def test_srun_uses_environment_for_mca(tmp_path):
    cfg = cfg_for(tmp_path, hosts=["a", "b"], launcher="srun", launcher_path="true",
                  transport="ob1-tcp", ranks_per_node=1, ranks=2)
    argv, env = build_command(cfg, ["prog"])
    assert argv[1:3] == ["-n", "2"] and "--ntasks-per-node" in argv
    assert argv[argv.index("--nodelist") + 1] == "a,b"
    assert env["OMPI_MCA_pml"] == "ob1" and env["OMPI_MCA_btl"] == "tcp,self"
    assert not any(a == "--mca" for a in argv)


def test_missing_launcher_is_a_user_error(tmp_path):
    cfg = cfg_for(tmp_path, ranks=2, launcher_path="/nonexistent/mpirun")
    with pytest.raises(UserError, match="/nonexistent/mpirun"):
        build_command(cfg, ["prog"])


@pytest.mark.mpi
@pytest.mark.parametrize("transport", ["shm", "ucx-tcp"])
def test_real_mpirun_runs_ranks_with_the_transport_env(tmp_path, transport):
    """The argv really launches: every rank sees the preset's variables (UCX_TLS for ucx-tcp)."""
    cfg = cfg_for(tmp_path, ranks=2, transport=transport, env={"COLLBENCH_PROBE": "x y"})
    argv, env = build_command(cfg, ["sh", "-c", 'echo "rank=$OMPI_COMM_WORLD_RANK tls=${UCX_TLS:-none} probe=$COLLBENCH_PROBE"'])
    out = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    lines = sorted(l for l in out.stdout.splitlines() if l.startswith("rank="))
    tls = TRANSPORT_PRESETS[transport]["env"].get("UCX_TLS", "none")
    assert lines == [f"rank=0 tls={tls} probe=x y", f"rank=1 tls={tls} probe=x y"]


def test_mpi_version_names_open_mpi(tmp_path):
    assert "Open MPI" in mpi_version(cfg_for(tmp_path, ranks=2))
    assert "Open MPI" in version_line("mpirun")
    assert version_line("/nonexistent/mpirun") == "unknown"


def test_configured_localhost_keeps_its_slots(tmp_path):
    cfg = cfg_for(tmp_path, hosts=["localhost:4"], ranks=4)
    argv, _ = build_command(cfg, ["prog"])
    assert argv[argv.index("--host") + 1] == "localhost:4"


def test_one_launch_asks_the_mpi_once(tmp_path, monkeypatch):
    """The launch is one pass: building commands (plain and with hosts_order), naming the MPI for
    the records and preflight's checks ask the launcher's --version once in a process, not once
    per part (the launcher, the algorithm catalogue, the flavour and the records each did)."""
    log = tmp_path / "asked"
    fake = tmp_path / "bin" / "mpirun"
    fake.parent.mkdir()
    fake.write_text(f'#!/bin/sh\necho "$@" >> {log}\necho "mpirun (Open MPI) 4.1.4"\n')
    fake.chmod(0o755)
    monkeypatch.setenv("COLLBENCH_CACHE_DIR", str(tmp_path / "cache"))
    cfg = cfg_for(tmp_path, launcher_path=str(fake), hosts=["a:2", "b:2"], ranks=4)
    ordered = cfg_for(tmp_path, launcher_path=str(fake), hosts=["a:2", "b:2"], ranks=4,
                      hosts_order=["b", "a", "b", "a"])
    argv, _ = build_command(cfg, ["prog"])
    assert argv[0] == str(fake) and "--mca" in argv            # Open MPI's syntax, from its --version
    argv, _ = build_command(ordered, ["prog"])
    rankfile = argv[argv.index("--rankfile") + 1]
    assert open(rankfile).read().splitlines()[1:] == ["rank 0=b slot=*:*", "rank 1=a slot=*:*",
                                                      "rank 2=b slot=*:*", "rank 3=a slot=*:*"]
    assert mpi_version(cfg) == mpi_version(ordered) == "mpirun (Open MPI) 4.1.4"
    assert log.read_text().splitlines() == ["--version"]


def test_mca_parameters_map_as_the_launcher_takes_them(tmp_path):
    """The one MCA mapping (compare's tuning files and pml monitoring pass settings through it):
    options on mpirun's command line, OMPI_MCA_ variables under srun, the same as build_command."""
    from collbench.engines.launcher import mca_arguments
    mca = [("coll_tuned_use_dynamic_rules", "1"), ("pml", "ob1")]
    mpirun = cfg_for(tmp_path, ranks=2)
    assert mca_arguments(mpirun, mca) == (["--mca", "coll_tuned_use_dynamic_rules", "1", "--mca", "pml", "ob1"], {})
    srun = cfg_for(tmp_path, hosts=["a", "b"], launcher="srun", launcher_path="true", ranks=2, transport="ob1-tcp")
    assert mca_arguments(srun, mca) == ([], {"OMPI_MCA_coll_tuned_use_dynamic_rules": "1", "OMPI_MCA_pml": "ob1"})
    argv, env = build_command(srun, ["prog"])
    assert {k: env[k] for k in mca_arguments(srun, TRANSPORT_PRESETS["ob1-tcp"]["mca"])[1]} == \
        {"OMPI_MCA_pml": "ob1", "OMPI_MCA_btl": "tcp,self"}
