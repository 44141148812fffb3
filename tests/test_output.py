"""A run's terminal output: Flower's and Ray's known notices left to the log file, colour codes only on a terminal."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from experiments.run.output import for_terminal, known_notice, plain
from experiments.run.presets import preset
from experiments.run.runs import execute, plan

# As `flwr run --stream` printed them for a simulation run (Flower 1.42).
NOTICES = [
    "Flower configuration not found. Created default configuration at /tmp/pflower-superlink-9sv11fas/config.toml",
    "\x1b[93mWARNING \x1b[0m:   Since flwr 1.32, default simulated SuperNodes changed from 10 to 2.",
    "\x1b[92mINFO \x1b[0m:      To change federation size, use the following command:",
    "\x1b[92mINFO \x1b[0m:      \tflwr federation simulation-config @none/default <superlink> --num-supernodes <N>",
    "/x/site-packages/ray/_private/worker.py:2051: FutureWarning: Tip: In future versions of Ray, Ray will no longer",
    "  warnings.warn(",
]
KEPT = [
    "\x1b[92mINFO \x1b[0m:      Federation `@none/default` (6 simulated SuperNodes)",
    "\x1b[92mINFO \x1b[0m:      [round 1/2] train 3/3 used, loss 1.8099 | down 0.12 MB up 0.12 MB | 0.3s",
    "\x1b[91mERROR \x1b[0m:     mnist: expected train-images-idx3-ubyte.gz in /x/MNIST/raw",
    "Successfully started run 2139485453886394722",
    "UserWarning: the server's own warning stays",
]


def test_known_notices_are_left_to_the_log_and_everything_else_is_shown() -> None:
    assert [line for line in NOTICES + KEPT if not known_notice(line)] == KEPT
    assert all(for_terminal(line, True) is None for line in NOTICES)


def test_colour_codes_reach_a_terminal_only() -> None:
    line = KEPT[1]
    assert for_terminal(line, True) == line
    assert (
        for_terminal(line, False)
        == plain(line)
        == "INFO :      [round 1/2] train 3/3 used, loss 1.8099 | down 0.12 MB up 0.12 MB | 0.3s"
    )


def test_the_run_log_file_keeps_every_line_without_colour_codes(tmp_path: Path) -> None:
    from experiments.run.superlink import RunOutcome

    spec = plan("x", preset("smoke"), {}, [0])[0]
    shown: list[str] = []

    class Printing:
        name = "test"
        counts_its_cpu = False

        def run(self, config: object, clients: object, timeout: object, echo: Callable[[str], None], *a: object):
            for line in NOTICES + KEPT:
                echo(line)
            return RunOutcome(1, "", None, None)

    result = execute(Printing(), tmp_path / "app", spec, tmp_path, False, shown.append)  # type: ignore[arg-type]
    assert shown == NOTICES + KEPT  # the CLI's echo decides what the terminal shows
    assert result.log is not None
    assert result.log.read_text().splitlines()[1:] == [plain(line) for line in NOTICES + KEPT]
