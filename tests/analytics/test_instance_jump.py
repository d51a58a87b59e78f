"""The Instance page of a sealed failed boot: "Jump to the failure" shows the decisive line the daemon wrote after
the stage's exit (late), and the entrypoint stage, started and never ended before the seal, is not `running`."""

from __future__ import annotations

from pathlib import Path

from dashdata import BASE_US, DAEMON_LOG, NO_KERNEL, Boot, commit
from flightrec.schemas import Lifecycle, LogBatch, ProcessExit

S = 1_000_000


def _late_daemon_boot() -> Boot:
    b = Boot("late-decisive")
    b.add(Lifecycle, BASE_US, stage="entrypoint", state="started")
    b.add(Lifecycle, BASE_US + S, stage="benchmark", state="started")
    b.lines("benchmark", "stdout", [f"warming up {i}" for i in range(5)], at_us=BASE_US + 2 * S)
    t = BASE_US + 10 * S
    b.add(
        ProcessExit,
        t,
        stage="benchmark",
        pid=42,
        argv=["bench.sh"],
        started_us=t - 8 * S,
        ended_us=t,
        exit_code=1,
        duration_s=8.0,
        stderr_tail=["benchmark exited with error"],
    )
    b.add(Lifecycle, t + 1000, stage="benchmark", state="failed", detail="benchmark exited with error")
    # the daemon the benchmark left running says why, a second later, only to its own log
    b.add(
        LogBatch,
        t + S,
        stage="benchmark",
        source=DAEMON_LOG,
        pid=43,
        line_no=[1],
        line_ts_us=[t + S],
        text=[NO_KERNEL],
        truncated=[False],
        invalid_utf8=[False],
        late=[True],
    )
    b.seal(t + 3 * S)
    return b


def test_jump_to_the_failure_shows_the_late_decisive_line_and_no_stage_runs_on(tmp_path: Path, open_page) -> None:
    db = tmp_path / "fleet.duckdb"
    b = _late_daemon_boot()
    commit(db, [b])
    at = open_page(db, "instance", instance=b.instance)
    stages = next(df.value for df in at.dataframe if "outcome" in df.value.columns)
    outcome = dict(zip(stages["stage"], stages["outcome"], strict=True))
    assert outcome["benchmark"] == "failed" and outcome["entrypoint"] != "running", outcome
    at.toggle(key=f"logs_jump_{b.instance}").set_value(True).run()
    lines = at.dataframe[-1].value
    assert NO_KERNEL in list(lines["text"]), list(lines["text"])
    assert set(lines["stage"]) == {"benchmark"}
