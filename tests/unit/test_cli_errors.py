"""Every ``corral`` command given bad input: one or two lines on stderr naming what was
wrong and the fix, exit 2 (1 for a failure at run time), no traceback unless asked for.
In-process: no command here starts a process."""

from __future__ import annotations

import os

import pytest

from corral.cli import main
from corral.errors import ConfigError
from corral.paths import logs_root

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SHIPPED = os.path.join(ROOT, "examples", "configs", "gsm8k.yaml")


@pytest.fixture
def fileroot(tmp_path, monkeypatch):
    monkeypatch.delenv("CORRAL_DEBUG", raising=False)
    root = tmp_path / "root"
    # one finished trial of another experiment, with logs
    other = os.path.join(logs_root(str(root)), "other", "t1")
    os.makedirs(other)
    with open(os.path.join(other, "merged.log"), "w") as fh:
        fh.write("[r/0] hello\n")
    bad = tmp_path / "bad.yaml"
    bad.write_text("experiment_name: x\nscheduler: [local\ntype: 1\n")
    return str(root), str(bad)


def _run(capsys, fileroot: str, *argv: str) -> tuple[int, str, str]:
    code = main(["--fileroot", fileroot, *argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


CASES = [  # (command line, exit code, text the message must hold)
    (["run", "{bad}", "--dry-run"], 2, "not valid YAML: "),
    (["run", "{root}/nosuch.yaml", "--dry-run"], 2, "the file does not exist"),
    (["run", SHIPPED, "a=[", "--dry-run"], 2, "quote it"),
    (["run", SHIPPED, "schedular.type=ray", "--dry-run"], 2, "did you mean 'scheduler'?"),
    (["run", SHIPPED, "scheduler.typ=ray", "--dry-run"], 2, "did you mean 'type'?"),
    (["run", "notayaml", "--dry-run"], 2, "give a YAML file or a dotted override"),
    (["demo", "scheduler.type=k8s"], 2, "use one of local, ray, slurm"),
    (["demo", "steps"], 2, "key=value"),
    (["logs", "--experiment", "nosuch"], 2, "trials with logs: other/t1"),
    (["logs", "--experiment", "other", "--trial", "t2"], 2, "trials with logs: other/t1"),
    (["logs", "--experiment", "other", "r/x"], 2, "ROLE/INDEX (a number)"),
    (["stop", "nc", "nosuch"], 2, "known: other/t1"),
    (["top", "nc", "nosuch", "--once"], 2, "known: other/t1"),
    (["top", "bad/name", "t", "--once"], 2, "experiment"),
    (["dashboard", "nc", "nosuch", "--port", "0"], 2, "known: other/t1"),
    (["dashboard", "--port", "99999"], 2, "port"),
    (["--etcd", "256.0.0.1:1", "ps"], 1, "NameResolveError"),
]


@pytest.mark.parametrize("argv,code,text", CASES, ids=[" ".join(c[0][:3]) for c in CASES])
def test_bad_input_gets_one_or_two_lines_and_its_exit_code(capsys, fileroot, argv, code, text):
    root, bad = fileroot
    argv = [a.format(root=root, bad=bad) for a in argv]
    got, out, err = _run(capsys, root, *argv)
    assert got == code, (out, err)
    lines = err.strip().splitlines()
    assert 1 <= len(lines) <= 2 and "Traceback" not in err, err
    assert lines[0].startswith(f"corral {argv[0] if argv[0] != '--etcd' else 'ps'}: "), err
    assert text in lines[0], err


def test_a_yaml_error_names_the_line_and_column(capsys, fileroot):
    root, bad = fileroot
    _, _, err = _run(capsys, root, "run", bad, "--dry-run")
    assert f"config file={bad!r}" in err and "at line 3, column" in err, err


def test_logs_names_the_trial_it_shows_and_keeps_to_the_experiment(capsys, fileroot):
    root, _ = fileroot
    code, out, err = _run(capsys, root, "logs")
    assert code == 0 and out == "[r/0] hello\n"
    assert err.startswith("corral logs: other/t1 merged ("), err


@pytest.mark.parametrize("how", ["flag", "env"])
def test_debug_shows_the_traceback(monkeypatch, fileroot, how):
    root, _ = fileroot
    argv = ["--fileroot", root, "run", "nosuch.yaml", "--dry-run"]
    if how == "flag":
        argv.insert(0, "--debug")
    else:
        monkeypatch.setenv("CORRAL_DEBUG", "1")
    with pytest.raises(ConfigError, match="does not exist"):
        main(argv)
