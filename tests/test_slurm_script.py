"""The SLURM job-script generator: a pure function, tested without a scheduler.

The generated script is also *run by bash* here (its ``#SBATCH`` lines are
comments to bash), which proves that the environment and the worker argv
survive quoting byte for byte.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from ensio.workflow.backends.base import JobSpec
from ensio.workflow.backends.slurm import (
    SlurmBackend,
    format_time_limit,
    job_script,
    slurm_state,
)

NASTY = [
    "plain",
    "with space",
    "it's",
    'double "quoted"',
    "$HOME `id` $(id) ${x}",
    "back\\slash",
    "semi;colon && rm -rf / | cat > out",
    "new\nline",
    "#SBATCH --time=99",
    "",
    "-dash",
    "ünïcödé ★",
    "*?[glob]",
    "~",
]


def spec(tmp_path, **kw) -> JobSpec:
    base = dict(
        name="ensio-w01",
        argv=("/usr/bin/env", "true"),
        time_limit=1200.0,
        workdir=str(tmp_path),
    )
    base.update(kw)
    return JobSpec(**base)


def directives(script: str) -> list[str]:
    return [ln[len("#SBATCH ") :] for ln in script.splitlines() if ln.startswith("#SBATCH ")]


@pytest.mark.parametrize(
    ("seconds", "expected"),
    [
        (1, "0-00:01:00"),
        (59.5, "0-00:01:00"),
        (60, "0-00:01:00"),
        (60.001, "0-00:02:00"),
        (61, "0-00:02:00"),
        (1200, "0-00:20:00"),
        (3599, "0-01:00:00"),
        (3600, "0-01:00:00"),
        (86399, "1-00:00:00"),
        (86400, "1-00:00:00"),
        (93784, "1-02:04:00"),  # 1 d 2 h 3 min 4 s, rounded up
        (7 * 86400, "7-00:00:00"),
    ],
)
def test_time_limit_rounds_up_to_minutes(seconds, expected):
    assert format_time_limit(seconds) == expected


@pytest.mark.parametrize("bad", [0, -1, float("nan"), float("inf"), "10"])
def test_time_limit_rejects_nonsense(bad):
    with pytest.raises(ValueError, match="time limit"):
        format_time_limit(bad)


def test_script_directives(tmp_path):
    s = job_script(spec(tmp_path), signal_lead=90)
    assert s.startswith("#!/bin/bash\n")
    assert s.endswith("\n")
    d = directives(s)
    assert "--job-name=ensio-w01" in d
    assert "--time=0-00:20:00" in d
    assert "--signal=B:USR1@90" in d
    assert "--nodes=1" in d and "--ntasks=1" in d and "--cpus-per-task=1" in d
    assert f'--chdir="{tmp_path}"' in d
    assert f'--output="{tmp_path}/ensio-w01-%j.out"' in d
    assert f'--error="{tmp_path}/ensio-w01-%j.err"' in d
    assert not any(x.startswith(("--partition", "--account")) for x in d)
    # The worker is exec'ed: it is the batch shell and gets B:USR1 itself.
    assert s.splitlines()[-1] == "exec /usr/bin/env true"
    # All directives come before the first command (sbatch stops reading there).
    lines = s.splitlines()
    last_directive = max(i for i, ln in enumerate(lines) if ln.startswith("#SBATCH"))
    first_command = min(i for i, ln in enumerate(lines) if ln and not ln.startswith("#"))
    assert last_directive < first_command


def test_script_is_pure(tmp_path):
    sp = spec(tmp_path, env=(("A", "1"),))
    assert job_script(sp, partition="p", extra=["--mem=1G"]) == job_script(
        sp, partition="p", extra=["--mem=1G"]
    )


def test_partition_account_extra_cpus(tmp_path):
    s = job_script(
        spec(tmp_path),
        partition="compute,debug",
        account="proj-42",
        extra=["--mem=4G", "  --qos=normal  ", "--exclusive", "--gres gpu:1", '--comment="a b"'],
        cpus_per_task=4,
    )
    d = directives(s)
    assert "--partition=compute,debug" in d
    assert "--account=proj-42" in d
    assert "--cpus-per-task=4" in d
    # extra lines are verbatim (stripped), after ensio's own options
    assert d[-5:] == ["--mem=4G", "--qos=normal", "--exclusive", "--gres gpu:1", '--comment="a b"']


@pytest.mark.parametrize(
    "bad",
    [
        "-p debug",  # short option
        "mem=4G",  # no dashes
        "",
        "--",
        "--mem=4G\n#SBATCH --time=1",  # injection of a second directive
        "--mem=4G\rx",
        "--time=10",  # options ensio owns
        "--time 10",
        "--signal=B:USR2@10",
        "--job-name=x",
        "--output=/tmp/x",
        "--error=/tmp/x",
        "--chdir=/",
        "--parsable",
        "--wrap=ls",
        "--array=1-3",
        '--comment="unbalanced',
        "--comment=back\\slash",
        "--=4G",  # no option name
        "--mem=4\tG",  # a control character inside
    ],
)
def test_bad_extra_lines_are_refused(tmp_path, bad):
    with pytest.raises(ValueError, match="extra"):
        job_script(spec(tmp_path), extra=[bad])
    with pytest.raises(ValueError, match="extra"):
        SlurmBackend(extra=[bad])


@pytest.mark.parametrize("value", ["a b", 'x"y', "p#q", "a\\b", ""])
def test_bad_partition_account_are_refused(tmp_path, value):
    if value == "":  # empty means "not set"
        assert "--partition" not in job_script(spec(tmp_path), partition=value)
        return
    with pytest.raises(ValueError, match="partition"):
        job_script(spec(tmp_path), partition=value)
    with pytest.raises(ValueError, match="account"):
        SlurmBackend(account=value)


@pytest.mark.parametrize("name", ["a b", "x;y", "", "a/b", "n\nl", 'q"'])
def test_bad_job_names_are_refused(tmp_path, name):
    with pytest.raises(ValueError, match="job name"):
        job_script(spec(tmp_path, name=name))


@pytest.mark.parametrize(
    "workdir", ["relative/dir", '/tmp/q"uote', "/tmp/back\\slash", "/tmp/nl\n"]
)
def test_bad_workdirs_are_refused(workdir):
    with pytest.raises(ValueError, match="workdir"):
        job_script(JobSpec(name="w", argv=("true",), time_limit=60, workdir=workdir))


def test_workdir_with_blanks_and_percent(tmp_path):
    wd = tmp_path / "my runs" / "50%x"
    s = job_script(spec(tmp_path, workdir=str(wd)))
    d = directives(s)
    assert f'--chdir="{wd}"' in d  # sbatch honours double quotes on #SBATCH lines
    # '%' is a replacement character in log-file patterns: doubled
    assert f'--output="{tmp_path}/my runs/50%%x/ensio-w01-%j.out"' in d


@pytest.mark.parametrize(
    ("lead", "limit"),
    [(0, 600), (-5, 600), (60, 60), (120, 61 * 1), (70000, 10**6), (1.5, 600), (True, 600)],
)
def test_bad_signal_lead_is_refused(tmp_path, lead, limit):
    with pytest.raises(ValueError, match="signal_lead"):
        job_script(spec(tmp_path, time_limit=limit), signal_lead=lead)


def test_signal_lead_is_checked_against_rounded_limit(tmp_path):
    # 30 s is rounded up to one minute by SLURM, so a 50 s lead is fine.
    assert "--signal=B:USR1@50" in job_script(spec(tmp_path, time_limit=30), signal_lead=50)


@pytest.mark.parametrize("cpus", [0, -1, 1.0, True])
def test_bad_cpus_are_refused(tmp_path, cpus):
    with pytest.raises(ValueError, match="cpus_per_task"):
        job_script(spec(tmp_path), cpus_per_task=cpus)


@pytest.mark.parametrize("key", ["1A", "A-B", "A B", "", "A=B", "$X"])
def test_bad_env_names_are_refused(tmp_path, key):
    with pytest.raises(ValueError, match="environment"):
        job_script(spec(tmp_path, env=((key, "v"),)))


def test_empty_argv_is_refused(tmp_path):
    with pytest.raises(ValueError, match="argv"):
        job_script(spec(tmp_path, argv=()))


def test_nasty_argv_and_env_survive_bash(tmp_path):
    """Run the generated script with bash: argv and env arrive byte for byte."""
    wd = tmp_path / "work dir $x 'q'"
    wd.mkdir()
    probe = (
        "import json, os, sys; "
        "print(json.dumps([os.getcwd(), sys.argv[1:], "
        "[os.environ.get(f'E{i}') for i in range(int(os.environ['N']))]]))"
    )
    env = tuple((f"E{i}", v) for i, v in enumerate(NASTY)) + (("N", str(len(NASTY))),)
    s = job_script(
        spec(tmp_path, workdir=str(wd), argv=(sys.executable, "-c", probe, *NASTY), env=env)
    )
    path = tmp_path / "job.sh"
    path.write_text(s)
    proc = subprocess.run(
        ["bash", str(path)], capture_output=True, text=True, timeout=60, cwd="/", check=False
    )
    assert proc.returncode == 0, proc.stderr
    cwd, argv, envs = json.loads(proc.stdout)
    assert cwd == str(wd)  # the script cd's into the workdir itself
    assert argv == NASTY
    assert envs == NASTY


def test_script_fails_loudly_without_workdir(tmp_path):
    s = job_script(spec(tmp_path, workdir=str(tmp_path / "missing"), argv=("/bin/echo", "ran")))
    path = tmp_path / "job.sh"
    path.write_text(s)
    proc = subprocess.run(["bash", str(path)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1  # the script's own `cd … || exit 1`
    assert "ran" not in proc.stdout


def test_backend_script_uses_its_settings(tmp_path):
    b = SlurmBackend(partition="p1", account="a1", extra=["--mem=1G"], signal_lead=45,
                     cpus_per_task=2)
    sp = spec(tmp_path)
    assert b.script_for(sp) == job_script(
        sp, partition="p1", account="a1", extra=["--mem=1G"], signal_lead=45, cpus_per_task=2
    )
    # without options the back-end writes exactly the pure function's script
    # (a 1200 s limit keeps the default 60 s lead)
    assert SlurmBackend().script_for(sp) == job_script(sp)


@pytest.mark.parametrize(
    ("slurm", "ours"),
    [
        ("PENDING", "pending"),
        ("CONFIGURING", "pending"),
        ("REQUEUED", "pending"),
        ("RUNNING", "running"),
        ("COMPLETING", "running"),
        ("SUSPENDED", "running"),
        ("COMPLETED", "done"),
        ("FAILED", "failed"),
        ("TIMEOUT", "failed"),
        ("NODE_FAIL", "failed"),
        ("OUT_OF_MEMORY", "failed"),
        ("PREEMPTED", "failed"),
        ("CANCELLED", "cancelled"),
        ("CANCELLED+", "cancelled"),
        ("cancelled", "cancelled"),
        ("SOMETHING_NEW", "unknown"),
    ],
)
def test_state_mapping(slurm, ours):
    assert slurm_state(slurm) == ours


@pytest.mark.parametrize(
    ("limit", "lead"), [(30, 30), (60, 30), (90, 60), (119, 60), (1200, 60), (86400, 60)]
)
def test_backend_default_lead_fits_short_limits(tmp_path, limit, lead):
    s = SlurmBackend().script_for(spec(tmp_path, time_limit=limit))
    assert f"--signal=B:USR1@{lead}" in directives(s)


def test_backend_polls_job_states_sparingly():
    """squeue is an RPC to slurmctld: the pool may not ask more than about once a second."""
    assert SlurmBackend().min_poll >= 1.0
    assert SlurmBackend(min_poll=10).min_poll == 10.0
    with pytest.raises(ValueError, match="min_poll"):
        SlurmBackend(min_poll=0.05)


def test_adopt_keeps_only_live_jobs_with_the_recorded_name_and_workdir(monkeypatch, tmp_path):
    """A job id alone may name an unrelated job; the driver cancels what it adopts."""
    logs = str(tmp_path / "logs")
    calls: list[list[str]] = []
    answer = {"rc": 0, "out": "\n".join([
        f"11|ensio-c001|PENDING|{logs}",
        f"12|ensio-c001|RUNNING|{logs}/",  # the same directory, spelt differently
        f"13|ensio-c001|COMPLETED|{logs}",  # ended: nothing to adopt
        "14|ensio-c001|PENDING|/elsewhere",  # another experiment's job
        f"15|someone-else|PENDING|{logs}",  # an id reused by another job
        "junk line",
    ]), "err": ""}

    def fake_run(argv, **kw):
        calls.append(list(argv))
        return subprocess.CompletedProcess(argv, answer["rc"], answer["out"], answer["err"])

    b = SlurmBackend()
    monkeypatch.setattr(b, "call", fake_run)
    jobs = [{"id": str(i), "name": "ensio-c001", "workdir": logs} for i in range(11, 17)]
    jobs.append({"id": "local-1-1", "name": "ensio-c001", "workdir": logs})  # not SLURM's
    assert b.adopt(jobs) == {"11": "pending", "12": "running"}
    assert calls == [["squeue", "-h", "--states=all", "-o", "%i|%j|%T|%Z", "-j",
                      "11,12,13,14,15,16"]]
    # squeue failing (or a lone purged id): adopt nothing rather than guess
    answer.update(rc=1, out="", err="slurm_load_jobs error: Unable to contact slurm controller")
    assert b.adopt(jobs) == {}
    answer.update(err="slurm_load_jobs error: Invalid job id specified")
    assert b.adopt(jobs[:1]) == {}
    calls.clear()
    assert b.adopt([{"id": "x"}]) == {} and calls == []


def test_coupled_job_asks_for_its_ranks_on_any_nodes(tmp_path):
    d = directives(job_script(spec(tmp_path, name="ensio-online-c001"), ntasks=16))
    assert "--ntasks=16" in d and "--cpus-per-task=1" in d
    assert not any(x.startswith("--nodes") for x in d)  # the scheduler places 16 ranks


@pytest.mark.parametrize("ntasks", [0, -2, 2.0, True])
def test_bad_ntasks_are_refused(tmp_path, ntasks):
    with pytest.raises(ValueError, match="ntasks"):
        job_script(spec(tmp_path), ntasks=ntasks)
