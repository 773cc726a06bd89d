"""Where a worker keeps its tables: Faust's ``--datadir``, then AGENTS_STREAM_DATA_DIR, then one dir per app id."""

from __future__ import annotations

from agents_stream.settings import Settings, datadir_option

FAUST = "/venv/lib/python3.11/site-packages/faust/__main__.py"  # argv[0] of ``python -m faust``


def test_faust_datadir_option_is_read_in_each_of_its_forms() -> None:
    """``--datadir X``, ``--datadir=X`` and ``-D X`` before the subcommand, as Faust's own CLI takes them."""
    assert datadir_option([FAUST, "-A", "agents_stream.app", "--datadir", "/d1", "worker"]) == "/d1"
    assert datadir_option([FAUST, "-A", "agents_stream.app", "--datadir=/d2", "worker", "-l", "info"]) == "/d2"
    assert datadir_option(["/usr/local/bin/faust", "-D", "/d3", "-A", "agents_stream.app", "worker"]) == "/d3"
    assert datadir_option([FAUST, "-A", "agents_stream.app", "worker", "-l", "info"]) is None


def test_argv_of_another_program_is_not_faust_s() -> None:
    """Importing the app from another program (a test runner, a script) never takes its options for Faust's."""
    assert datadir_option(["/venv/bin/pytest", "-D", "/nope"]) is None
    assert datadir_option([]) is None


def test_the_data_dir_precedence() -> None:
    """--datadir wins; an explicit AGENTS_STREAM_DATA_DIR is used as is; the default is namespaced by app id."""
    explicit = Settings.from_env({"AGENTS_STREAM_DATA_DIR": "/data", "AGENTS_STREAM_APP_ID": "a1"})
    default = Settings.from_env({"AGENTS_STREAM_DATA_DIR": "", "AGENTS_STREAM_APP_ID": "a1"})
    assert explicit.worker_data_dir("/given") == "/given" == default.worker_data_dir("/given")
    assert explicit.worker_data_dir(None) == "/data"
    assert default.worker_data_dir(None) == ".data/worker/a1"
    assert Settings.from_env({"AGENTS_STREAM_APP_ID": "a2"}).worker_data_dir() == ".data/worker/a2"
