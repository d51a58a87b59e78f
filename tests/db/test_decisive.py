"""The decisive line (db/decisive.py): the line that says why, for every failure, chosen by the shape of what failing
programs print (tests/consumers/test_decisive_rows.py: as the failures rows store it).

The lines below are written from the general structure of each runtime's and log format's output (how Rust, C++, Go,
Python and the JVM report a failure; zap, zerolog, logfmt, glog and log4rs lines; the kernel's); none is quoted from a
corpus case.
"""

from __future__ import annotations

import pytest
from flightrec.db.classify import FailureEvidence, load_rules, parse_rules
from flightrec.db.decisive import decisive_line, weigh
from flightrec.db.loglevel import Level, header_split, level_of, quiet
from hypothesis import given, settings
from hypothesis import strategies as st

RULES = load_rules()
NO_RULE = parse_rules('[[rule]]\nid = "unknown"\nclass = "unknown"\nhint = "none"\n')

SHAPES = {
    "rust panic, payload on the next line": (
        [
            "thread 'main' panicked at src/prover.rs:88:9:",
            'called `Result::unwrap()` on an `Err` value: Io(Custom { kind: Other, error: "socket closed" })',
            "note: run with `RUST_BACKTRACE=1` environment variable to display a backtrace",
        ],
        1,
    ),
    "rust panic, payload on the panic line": (
        [
            "thread 'worker' panicked at 'index out of bounds: the len is 3 but the index is 7', src/lib.rs:10:5",
            "note: run with `RUST_BACKTRACE=1` environment variable to display a backtrace",
        ],
        0,
    ),
    "rust panic, its path wrapped onto the next line": (
        [
            "thread 'main' panicked at /home/u/.cargo/registry/src/index.crates.io-6f17d22bba15001f/some-crate-1.2.3",
            "/src/lib.rs:54:44:",
            "witness column 3 is not in the trace",
            "stack backtrace:",
            "   0: rust_begin_unwind",
        ],
        2,
    ),
    "rust anyhow chain: the deepest cause": (
        [
            "Error: failed to prove block 12",
            "",
            "Caused by:",
            "    0: loading witness",
            "    1: reading /data/w.bin",
            "    2: the witness file was written by a newer prover",
        ],
        5,
    ),
    "c++ what()": (
        [
            "terminate called after throwing an instance of 'std::runtime_error'",
            "  what():  the prover's setup file lacks the G2 points",
            "Aborted (core dumped)",
        ],
        1,
    ),
    "go panic": (
        [
            "panic: runtime error: index out of range [5] with length 3",
            "",
            "goroutine 1 [running]:",
            "main.main()",
            "\t/src/main.go:12 +0x1d",
            "exit status 2",
        ],
        0,
    ),
    "go fatal error": (["fatal error: concurrent map writes", "", "goroutine 7 [running]:"], 0),
    "python traceback: its last line": (
        [
            "Traceback (most recent call last):",
            '  File "/app/prove.py", line 10, in <module>',
            "    main()",
            '  File "/app/prove.py", line 7, in main',
            '    raise ValueError("witness has 3 columns, circuit expects 4")',
            "ValueError: witness has 3 columns, circuit expects 4",
        ],
        5,
    ),
    "java: the deepest Caused by": (
        [
            'Exception in thread "main" java.lang.RuntimeException: prover failed',
            "\tat com.example.Prover.run(Prover.java:42)",
            "Caused by: java.lang.IllegalStateException: verifier key not loaded",
            "\tat com.example.Keys.get(Keys.java:10)",
            "Caused by: java.lang.IllegalArgumentException: key format v3 unknown",
            "\t... 3 more",
        ],
        4,
    ),
    "zap json": (
        [
            '{"level":"info","ts":1700000000.1,"msg":"starting prover"}',
            '{"level":"error","ts":1700000001.2,"msg":"prove failed","error":"constraint 17 unsatisfied"}',
            '{"level":"info","ts":1700000001.3,"msg":"shutting down"}',
        ],
        1,
    ),
    "logfmt": (
        [
            'time=2024-01-01T00:00:00Z level=info msg="ready"',
            'time=2024-01-01T00:00:01Z level=error msg="submit proof" err="verifier said no"',
            "time=2024-01-01T00:00:02Z level=info msg=bye",
        ],
        1,
    ),
    "glog": (
        [
            "I0102 10:00:00.000000    42 main.cc:10] ready",
            "E0102 10:00:01.000000    42 main.cc:20] proof rejected by the verifier",
            "I0102 10:00:02.000000    42 main.cc:30] exiting",
        ],
        1,
    ),
    "zerolog console": (
        ["10:00:00 INF ready device=0", '10:00:01 ERR proof rejected error="bad pairing"', "10:00:02 INF bye"],
        1,
    ),
    "log4rs": (
        [
            "2024-01-01T00:00:00.000 INFO prover::gpu > using device 0",
            "2024-01-01T00:00:01.000 ERROR prover::gpu > kernel launch failed: too many resources requested for launch",
            "2024-01-01T00:00:02.000 INFO prover::gpu > releasing device 0",
        ],
        1,
    ),
    "kernel: the Xid line": (
        [
            "[  100.000001] NVRM: loading NVIDIA UNIX x86_64 Kernel Module  550.54.14",
            "[  200.000002] NVRM: Xid (PCI:0000:01:00): 79, pid=1234, name=prover, GPU has fallen off the bus.",
            "[  200.000003] NVRM: GPU 0000:01:00.0: GPU has fallen off the bus.",
        ],
        1,
    ),
    "an errno's text over the wrapper after it": (
        ["open /data/params.bin: permission denied", "Error: exit status 1"],
        0,
    ),
    "a message a line ending in ':' announced, under its frames": (
        [
            "Error: starting node:",
            "    main.run",
            "        /src/main.go:40",
            "  - opening store: lock held by another process",
        ],
        3,
    ),
    "a command's failure over the wrapper that reports it": (
        [
            "error: could not open /dev/nvidia-uvm",
            "subprocess.CalledProcessError: Command '['./prover']' returned non-zero exit status 1.",
        ],
        0,
    ),
    "banners and advice lose": (
        [
            "############ PROVER ERROR ############",
            "proof generation failed: the circuit has no witness for gate 12",
            "Please check the documentation at https://example.org/docs",
        ],
        1,
    ),
    "a shell's word for a signal": (["step 3 of 10", "./run.sh: line 4:  4242 Segmentation fault  ./prover"], 1),
    "the first of errors alike (the cause comes before what follows from it)": (
        ["ERROR shard 3: bad proof", "ERROR shard 4: bad proof", "ERROR giving up"],
        0,
    ),
    "last words when nothing looks like an error": (["loading", "step 3 of 10", ""], 1),
    "a JSON report: the reason, not the key that opens it": (
        [
            '{"job": "block-7",',
            ' "failed": {',
            '   "reason": "prover error: witness generation failed at step 3"',
            " }}",
        ],
        2,
    ),
    "of lines logged at INFO, the one that names a failure": (
        ["INFO peer 10.0.0.2: handshake version mismatch, 7 vs 8", "INFO peer 10.0.0.2: disconnecting"],
        0,
    ),
}


@pytest.mark.parametrize("lines, at", list(SHAPES.values()), ids=list(SHAPES))
def test_the_decisive_line_is_chosen_by_the_shape_of_failing_output(lines, at):
    ev = FailureEvidence(stage="benchmark", exit_code=1, stderr_tail=lines)
    got = decisive_line(ev, NO_RULE.classify(ev))  # no rule: the shape alone decides
    assert (got.source, got.line_no, got.line) == ("stderr", at, lines[at]), [(w.weight, w.shape) for w in weigh(lines)]


# A process killed by a signal: a line that names the signal as the cause of death says more than the exit's words.
KILLED = {
    "a shell's word for a signal glued to an unfinished line": (
        ["step 3 of 10", "hashing block 12Segmentation fault"],
        1,
    ),
    "a debugger's word for the signal over its thread chatter": (
        [
            "[New Thread 0x7ffff0a3e640 (LWP 4243)]",
            "Program terminated with signal SIGSEGV, Segmentation fault.",
            "#0  0x0000555555556abc in hash_block (p=0x0) at src/hash.c:40",
        ],
        1,
    ),
}


@pytest.mark.parametrize("lines, at", list(KILLED.values()), ids=list(KILLED))
def test_a_line_that_says_what_the_process_died_of_beats_the_exit_s_words(lines, at):
    ev = FailureEvidence(stage="benchmark", signal=11, signal_name="SIGSEGV", stderr_tail=lines)
    got = decisive_line(ev, NO_RULE.classify(ev))
    assert (got.source, got.line_no, got.line) == ("stderr", at, lines[at]), [(w.weight, w.shape) for w in weigh(lines)]


def test_headers_and_levels_are_read_from_common_log_formats():
    assert header_split("2024-01-01T00:00:01.000Z ERROR prover::gpu > launch failed")[1] == "launch failed"
    assert header_split("gpu-prover-1  | [ 12.5] NVRM: Xid 79")[1] == "NVRM: Xid 79"
    warn = Level.WARN
    assert level_of('{"level":"warn","msg":"slow"}') == level_of("W0102 10:00:00.000000 1 a.cc:1] slow") == warn
    assert level_of("time=1 level=error msg=x") == level_of("[error] x") == level_of("error: x") == Level.ERROR
    assert level_of("F0102 10:00:00.000000 1 a.cc:1] x") == level_of("FATAL x") == Level.FATAL
    assert level_of("10:00:00 DBG x") == level_of("INFO x") == Level.QUIET
    assert level_of("an error happened") is None  # a word in the message is not a level


@pytest.mark.parametrize(
    "line, is_quiet",
    [
        ("2026-01-01 10:00:00,125 INFO flightrec.cuda.backend: CUDA cannot serve: libcuda.so.1: cannot open", True),
        ('{"level":"debug","msg":"retrying after connection refused"}', True),
        ('time=1 level=info msg="dial tcp: connection refused, retrying"', True),
        ("I0102 10:00:00.000000    42 main.cc:10] no space left on /tmp, cleaning", True),
        ("10:00:00 DBG permission denied on /dev/mem, skipping", True),
        ("ERROR: permission denied for DEBUG port", False),  # the level is the header's; DEBUG is in the message
        ("open /x: permission denied", False),
        ('{"level":"error","msg":"permission denied"}', False),
        ("W0102 10:00:00.000000    42 main.cc:10] slow", False),
    ],
)
def test_a_line_the_program_itself_logs_as_info_or_debug_is_quiet(line, is_quiet):
    assert quiet(line) is is_quiet


def test_the_lines_of_a_rule_that_names_a_cause_hold_the_decisive_line():
    """The class came from a rule that names a cause: the decisive line is the one of its lines that says most, even
    where a line of a stronger shape stands beside it."""
    lines = [
        "CUDA Runtime Error by: cudaGetLastError at: ntt.cu:657",
        "no kernel image is available for execution on the device",
        "terminate called after throwing an instance of 'std::runtime_error'",
        "  what():  API fails with code UNKNOWN_ERROR",
    ]
    ev = FailureEvidence(stage="benchmark", signal=6, signal_name="SIGABRT", stderr_tail=lines)
    verdict = RULES.classify(ev)
    assert verdict.failure_class == "gpu_arch_unsupported" and not verdict.symptom
    assert decisive_line(ev, verdict).line_no == 1


def test_the_lines_of_every_rule_of_the_class_are_candidates():
    """A download's summary line decides the class; the curl error above it (matched by another rule of the same
    class) says why, and is the decisive line."""
    lines = [
        "curl: (22) The requested URL returned error: 404 Not Found: https://m/p.params",
        "parameter download failed",
    ]
    ev = FailureEvidence(stage="params", exit_code=22, stderr_tail=lines)
    verdict = RULES.classify(ev)
    assert (verdict.failure_class, verdict.rule_id) == ("params_download_failed", "params-lines")
    assert decisive_line(ev, verdict).line_no == 0


def test_a_symptom_rule_leaves_the_choice_to_the_shape():
    """A panic classes as a crash by its header; the decisive line is still the payload below it."""
    lines = ["thread 'main' panicked at src/main.rs:7:5:", "proof does not verify", "note: run with `RUST_BACKTRACE=1`"]
    ev = FailureEvidence(stage="benchmark", exit_code=101, stderr_tail=lines)
    verdict = RULES.classify(ev)
    assert verdict.failure_class == "daemon_crashed" and verdict.symptom and verdict.rule_id == "crash-words"
    assert decisive_line(ev, verdict).line == "proof does not verify"


@pytest.mark.parametrize(
    "ev, line, source",
    [
        (FailureEvidence(stage="s", signal=9, signal_name="SIGKILL"), "killed by SIGKILL", "exit"),
        (FailureEvidence(stage="s", exit_code=137, stderr_tail=["step 2"]), "killed by SIGKILL", "exit"),
        (FailureEvidence(stage="s", timed_out=True, signal=15, stderr_tail=["waiting"]), "timed out", "exit"),
        (FailureEvidence(stage="s", start_error="[Errno 2] No such file: './p'"), "could not start", "exit"),
        (FailureEvidence(stage="s", exit_code=3), "exit code 3", "exit"),
        (
            FailureEvidence(stage="b", verdict="fail", proofs_per_hour=3.0, details=["3 proofs: 3.0 proofs/hour"]),
            "3 proofs: 3.0 proofs/hour",
            "result",
        ),
    ],
)
def test_with_no_line_that_looks_like_an_error_the_exit_says_why(ev, line, source):
    got = decisive_line(ev, RULES.classify(ev))
    assert got.line.startswith(line) and got.source == source and got.line_no is None


def test_a_followed_file_s_line_is_found_by_its_path_and_place():
    ev = FailureEvidence(
        stage="benchmark",
        exit_code=1,
        file_tails=[("/var/log/a.log", ["ready"]), ("/var/log/daemon.log", ["ready", "FATAL: lost the GPU context"])],
        stderr_tail=["benchmark exited with error"],
    )
    got = decisive_line(ev, RULES.classify(ev))
    assert (got.source, got.line_no, got.line) == ("/var/log/daemon.log", 1, "FATAL: lost the GPU context")


LINE_BITS = st.sampled_from(
    [
        "ready",
        "ERROR x failed",
        "panic: boom",
        "  what():  bad",
        "thread 'm' panicked at a.rs:1:1:",
        "Caused by:",
        "    0: deeper",
        "Traceback (most recent call last):",
        '  File "a.py", line 1, in f',
        "ValueError: v",
        "Aborted (core dumped)",
        "",
        "Error: a:",
        "  - No space left on device",
        '{"level":"error","msg":"m"}',
        "x" * 300,
    ]
)


@given(
    st.lists(LINE_BITS, max_size=12),
    st.lists(LINE_BITS, max_size=6),
    st.sampled_from([None, 1, 137, 139]),
    st.sampled_from([None, 9, 11]),
)
@settings(max_examples=120, deadline=None)
def test_the_decisive_line_is_an_evidence_line_or_the_exit_s_words_and_the_same_each_time(err, log, code, sig):
    ev = FailureEvidence(stage="benchmark", exit_code=code, signal=sig, stderr_tail=err, file_tails=[("/l", log)])
    one, two = decisive_line(ev, RULES.classify(ev)), decisive_line(ev, RULES.classify(ev))
    assert one == two
    if one.source == "exit":
        assert one.line_no is None and one.line
    else:
        lines = {"stderr": err, "/l": log}[one.source]
        assert lines[one.line_no] == one.line


HOSTILE = {
    "spaces": " " * 65536 + "x",
    "go symbols": " " + "a." * 32768 + "!",
    "a call": "f(" + ",".join(["x"] * 32768) + " )!",
    "xid and spaces": "Xid" + " " * 65530 + "!",
    "colons": ":" * 65536,
    "versions": "v1.2.3 " * 9362,
    "json": '{"level":"' + "e" * 65500 + '"}',
    "one word repeated": "cudaMalloc" * 6554,  # `cudaMalloc\w*.*(fail|error)` took 11 minutes on its first 8192
    "a path word repeated": "proving" * 9363,  # `\S*(proving|...)[\w.-]*\.key` unanchored: 210 s on its first 8192
}


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize("line", list(HOSTILE.values()), ids=list(HOSTILE))
def test_a_hostile_line_of_64_kib_ends_the_weighing_and_the_rules(line):
    """Shapes that made a pattern backtrack without end (adjacent `\\s*`, nested repeats) end: rules and weights read
    a line's first SCAN_CHARS characters, and no pattern backtracks more than linearly there."""
    ev = FailureEvidence(stage="benchmark", exit_code=1, stderr_tail=[line] * 3)
    got = decisive_line(ev, RULES.classify(ev))
    assert got.line == line


def test_rules_read_a_line_s_first_scan_chars_characters():
    from flightrec.db.classify import SCAN_CHARS

    early = "No space left on device " + "x" * 70_000
    late = "x" * (SCAN_CHARS + 10) + " No space left on device"
    assert RULES.classify(FailureEvidence(stage="s", exit_code=1, stderr_tail=[early])).failure_class == "disk_full"
    assert RULES.classify(FailureEvidence(stage="s", exit_code=1, stderr_tail=[late])).failure_class == "unknown"


def test_of_plain_lines_stderr_s_last_words_win_over_stdout_s_progress():
    ev = FailureEvidence(stage="s", exit_code=2, stderr_tail=["loading", "gave up on the device"], stdout_tail=["50%"])
    got = decisive_line(ev, NO_RULE.classify(ev))
    assert (got.source, got.line) == ("stderr", "gave up on the device")
