"""The decisive line of a failure: the line that says why, chosen by the shape of what failing programs print.

Every failure gets one, classified or not. A line's weight comes from its shape, not from a list of phrases:

- what a runtime prints as a failure's cause: a Rust panic's payload (on the panic line, or the line after a
  ``panicked at FILE:LINE:COL:`` header), C++'s ``what():``, Go's ``panic:`` and ``fatal error:``, the exception
  line that ends a Python traceback, a Java/Kotlin exception and its ``Caused by:`` (the deepest wins), the cause
  under a Rust ``Caused by:`` header;
- a log line's level (``ERROR``/``FATAL``/``WARN``... as a word in its header, glog's ``E0102``/``F0102``,
  logfmt's ``level=error``, zap/zerolog JSON ``"level":"error"``, ``[error]``, ``error:`` at its start);
- words of failure (error, failed, cannot, unable, refused, denied, invalid, mismatch...) and a cause's name: an
  errno's name or text (``ENOSPC``, ``No space left on device``, ``[Errno 28]``, ``(os error 28)``), a CUDA,
  cuBLAS, OpenCL, NCCL or NVML error code or CUDA's text for it, an Xid, a fatal signal, an HTTP or gRPC status,
  the dynamic loader's refusal, a TLS error;
- and what is never the cause: stack frames, source lines under them, banners, a JSON key that only opens an object
  (``"error": {``), advice (``note: run with RUST_BACKTRACE=1``, ``consider passing CUDA_LAUNCH_BLOCKING=1``) and
  wrappers (``exit status 1``, ``Aborted (core dumped)``, ``Traceback (most recent call last):``, ``terminate called
  recursively``, a command that "returned non-zero exit status").

The heaviest line wins; among lines of equal weight that look like errors the first (a cause is printed before
what follows from it), among lines that do not the last (a program's last words). When the class comes from a
rule that names a cause, the decisive line is the heaviest of the lines that rule matched. When no line looks like
an error and the exit says more (a signal, a timeout, a command that did not start, a benchmark below its
minimum), the exit's words are the decisive line (source ``exit`` or ``result``).

Pure and deterministic: the same evidence gives the same line, whatever the order its events arrived in.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from flightrec.db.classify import RATE_FIELD, SCAN_CHARS, Classification, FailureEvidence, Located, exit_signal
from flightrec.db.loglevel import Level, header_split, level_of

# Weights of a line's shape (the higher, the more a line says why).
NOISE = 0.0  # a stack frame, a banner, a wrapper, advice
QUIET = 0.5  # a line at INFO, DEBUG or TRACE level
QUIET_FAILING = 0.1  # added to a quiet line with words of failure: of a program's INFO lines, the one that names one
PLAIN = 1.0
WARNED = 2.0  # WARN level
FAILING = 3.0  # words of failure: what looks like an error starts here
ERROR = 4.0  # ERROR level, or `error:` at its start
FATAL = 5.0  # FATAL level, a panic, an uncaught exception, what():, a cause under `Caused by:`
CAUSE = 4.5  # added for a cause's name (an errno, an error code, a status): a named cause outweighs any shape
SIGNAL = 1.0  # added for a fatal signal's name (what a crash died of, not why)
WRAPPED = 1.0  # taken off a line that reports a command's exit status (the cause is in what the command printed)
DETAIL = 0.25  # taken off the details (the agent's summary repeats a line of the tails)
STDOUT = 0.1  # taken off stdout's lines: a program's progress goes there, its complaints to stderr
LOOKS_LIKE_AN_ERROR = FAILING

# --- shapes -----------------------------------------------------------------------------------------------------------
_FRAMES = [
    re.compile(r'^\s*File ".*", line \d+'),  # Python
    re.compile(r"^\s*at [\w$.<>/:-]+\(.*\)\s*$"),  # Java, Kotlin, JS
    re.compile(r"^\s*\.\.\. \d+ (?:more|common frames omitted)"),
    re.compile(r"^\s*\d+:\s+(?:0x[0-9a-f]+\s+-\s+)?[\w<>:.$]+"),  # Rust backtrace: "  3: foo::bar", "34: 0x7f - x"
    re.compile(r"^\s*at \S+:\d+(?::\d+)?\s*$"),  # Rust frame location
    re.compile(r"^\s*#\d+\s+0x[0-9a-f]+"),  # gdb, sanitizers
    re.compile(r"^\s*@\s+0x[0-9a-f]+"),  # glog
    re.compile(r"\(\S*\+0x[0-9a-f]+\)\s*\[0x[0-9a-f]+\]\s*$"),  # backtrace_symbols
    re.compile(r"^goroutine \d+ \["),
    re.compile(r"^\s*\S+\.(?:go|rs|py|c|cc|cpp|cu|cuh|h|hpp|java|kt|js|ts):\d+(?::\d+)?(?:\s+\+0x[0-9a-f]+)?\s*$"),
    re.compile(r"^\s*[\w./*$-]+(?:\(\*?\w+\)[\w./*$-]*)?\([^()\s,]*(?:,\s*[^()\s,]*)*\)\s*$"),  # a call: f(0xc0, 0x0)
    re.compile(r"^\s*\S*(?:/|::)\S*\s*$"),  # one token that is a path or a symbol
    re.compile(r"^\s+[\w$*()-]+(?:\.[\w$*()-]*)+\s*$"),  # an indented Go function: main.glob..func21
    re.compile(r"^\s*(?:\?\s*)?[\w.]+\+0x[0-9a-f]+/0x[0-9a-f]+"),  # kernel call trace
    re.compile(r"^\s*(?:PC|pc|rip|rax|rbx|rcx|rdx|rsp|rbp|r\d+)\s*[=:]\s*0x[0-9a-f]+", re.I),  # registers
]
_WRAPPERS = re.compile(
    r"exit(?:ed)?\s+(?:with\s+)?(?:status|code)\s*[:=]?\s*-?\d+\s*\.?$|^exit code -?\d+[;:]|^killed by signal \d+|"
    r"non-?zero exit (?:status|code)|exited with (?:an )?(?:error|failure)|^\s*Aborted\b|\bAborted \(core dumped\)|"
    r"^(?:\S+: )?line \d+:\s+\d+\s+Aborted|^\s*Traceback \(most recent call last\)|stack backtrace:|"
    r"^\s*runtime stack:|terminate called recursively|Check failure stack trace|^\s*Call Trace:|"
    r"During handling of the above exception|The above exception was the direct cause|^\s*compilation terminated|"
    r"signal arrived during (?:cgo|external code) execution|^\s*Stack trace|^\s*Backtrace:|^\s*Last error:\s*$|"
    r"^\s*the following errors occurred:?\s*$|^\s*Error executing job\b|"
    r"\b(?:failed|exited|returned|terminated|finished) with (?:return |exit |error )?(?:code|status) -?\d+\W*$",
    re.I,
)
_EXIT_REPORT = re.compile(r"\b(?:exit|return)(?:ed)? (?:status|code)\s*[:=]?\s*-?\d+", re.I)
_ADVICE = re.compile(
    r"^\s*(?:note|hint|help|tip)\s*:|^\s*(?:please|consider|try|if you)\b|^\s*for (?:more )?(?:information|"
    r"details|debugging)|^\s*https?://\S+\s*$|might be asynchronously reported|may be caused by prior calls",
    re.I,
)
_RUST_PANIC_INLINE = re.compile(r"panicked at (?:'.*'|\".*\"),\s*\S+")
_RUST_PANIC_HEADER = re.compile(r"panicked at \S*\s*$")
_PATH_TAIL = re.compile(r"^\s*\S*:\d+:\d+:?\s*$")
_CAUSED_BY_HEADER = re.compile(r"^\s*Caused by:\s*$")
_CAUSED_BY = re.compile(r"^\s*Caused by:\s*\S")
_PANICS = re.compile(
    r"^\s*(?:panic: |fatal error: |fatal: |thread .* panicked at )|\bwhat\(\):\s+\S|"
    r"^\s*memory allocation of \d+ bytes failed",  # Rust's allocation failure, before it aborts
    re.I,
)
_EXCEPTION = re.compile(
    r"^\s*(?:Exception in thread \"[^\"]*\" )?(?:[A-Za-z_][\w$]*\.)*[A-Za-z_][\w$]*"
    r"(?:Error|Exception|Exit|Interrupt|Failure|Fault|Panic)\b(?::|\s*$)"
)
_WARNING_CLASS = re.compile(r"^\s*(?:[\w./-]+:\d+:\s*)?[\w.]*Warning\b:?")
_TERMINATE = re.compile(r"terminate called after throwing an instance of")
# A shell's (or libc's) words for the signal a process died of, alone or in a job report ("line 3:  4242 Killed"),
# or at the end of a line: glued to a program's last output that had no newline, or a debugger's "Program terminated
# with signal SIGSEGV, Segmentation fault."
_SHELL_SIGNAL = re.compile(
    r"(?:^|:\s+\d+\s+|\s\d+\s+)(?:Segmentation fault|Bus error|Illegal instruction|illegal hardware instruction|"
    r"Floating point exception|Killed|Terminated|Trace/breakpoint trap|CPU time limit exceeded|"
    r"File size limit exceeded)\b|"
    r"(?:Segmentation fault|Bus error|Illegal instruction|Floating point exception)(?: \(core dumped\))?\.?\s*$"
)
# A JSON key that only opens an object or a list ('"error": {'): the structure, not what it holds.
_OPENING_KEY = re.compile(r'^\s*"[^"]*"\s*:\s*[\[{]\s*$')
_GO_SIGNAL = re.compile(r"^\s*\[signal SIG\w+|^\s*SIG[A-Z]+: \w")  # Go's report of the signal it died of
_FAILURE_WORDS = re.compile(
    r"\b(?:errors?|fail(?:s|ed|ure|ing)?|cannot|can't|couldn't|could not|unable|not found|invalid|refused|denied|"
    r"fatal|panic\w*|exception|abort(?:ed|ing)?|timed? ?out|unsupported|not supported|incompatible|not compatible|"
    r"mismatch|missing|no such|insufficient|exceeded|unrecoverable|illegal|corrupt\w*|violation|unexpected|crash\w*|"
    r"killed|segfault|oom|out of memory|not (?:available|permitted|allowed|initiali[sz]ed|responding)|lost|"
    r"unreachable|rejected|expired|doesn't match|does not match|bad)\b",
    re.I,
)

# --- a cause's name ---------------------------------------------------------------------------------------------------
# errno's names (<errno.h>), matched with their case.
_ERRNO_NAMES = (
    "EPERM|ENOENT|ESRCH|EINTR|EIO|ENXIO|E2BIG|ENOEXEC|EBADF|ECHILD|EAGAIN|ENOMEM|EACCES|EFAULT|EBUSY|EEXIST|EXDEV|"
    "ENODEV|ENOTDIR|EISDIR|EINVAL|ENFILE|EMFILE|ETXTBSY|EFBIG|ENOSPC|ESPIPE|EROFS|EMLINK|EPIPE|EDOM|ERANGE|EDEADLK|"
    "ENAMETOOLONG|ENOSYS|ENOTEMPTY|ELOOP|ENODATA|ETIME|EPROTO|EOVERFLOW|EBADMSG|ENOTSOCK|EADDRINUSE|EADDRNOTAVAIL|"
    "ENETDOWN|ENETUNREACH|ENETRESET|ECONNABORTED|ECONNRESET|ENOBUFS|EISCONN|ENOTCONN|ETIMEDOUT|ECONNREFUSED|"
    "EHOSTDOWN|EHOSTUNREACH|ESTALE|EDQUOT|ECANCELED|EUCLEAN|ENOTSUP|EOPNOTSUPP|EPROTONOSUPPORT|EAI_AGAIN|"
    "EAI_NONAME"
)
# strerror(3)'s texts of the errnos above that a failing program prints, and the resolver's.
_ERRNO_TEXTS = (
    "Operation not permitted|No such file or directory|Input/output error|Argument list too long|Exec format error|"
    "Bad file descriptor|Resource temporarily unavailable|Cannot allocate memory|Permission denied|Bad address|"
    "Device or resource busy|File exists|No such device|Not a directory|Is a directory|Invalid argument|"
    "Too many open files(?: in system)?|Text file busy|File too large|No space left on device|Read-only file system|"
    "Broken pipe|Function not implemented|Directory not empty|Address already in use|Cannot assign requested address|"
    "Network is down|Network is unreachable|Software caused connection abort|Connection reset by peer|"
    "Transport endpoint is not connected|Connection timed out|Connection refused|Host is down|No route to host|"
    "Stale file handle|Disk quota exceeded|Structure needs cleaning|Operation not supported|Protocol error|"
    "Value too large for defined data type|Name or service not known|Temporary failure in name resolution|"
    "No address associated with hostname"
)
# cudaGetErrorString's texts (the CUDA runtime's errno texts) that say why a program failed.
_CUDA_TEXTS = (
    "out of memory|initialization error|invalid device function|no kernel image is available for execution on the "
    "device|all CUDA-capable devices are busy or unavailable|CUDA-capable device\\(s\\) is/are busy or unavailable|"
    "no CUDA-capable device is detected|CUDA driver version is insufficient for CUDA runtime version|an illegal "
    "memory access was encountered|misaligned address|unspecified launch failure|uncorrectable ECC error "
    "encountered|the provided PTX was compiled with an unsupported toolchain|forward compatibility was attempted on "
    "non supported HW|system has unsupported display driver / cuda driver combination|operation not supported|"
    "device-side assert triggered|an illegal instruction was encountered|the launch timed out and was terminated|"
    "too many resources requested for launch|unknown error"
)
_CAUSE_NAMES = re.compile(
    r"(?-i:\b(?:" + _ERRNO_NAMES + r")\b)|\[Errno \d+\]|\(os error \d+\)|\berrno[ =:]+\d+|"
    r"\bcudaError\w+|\bCUDA_ERROR_\w+|\bCU(?:BLAS|DNN|FFT|RAND|SPARSE|SOLVER)_STATUS_"
    r"\w+|\bCL_[A-Z_]{4,}\b|\bnccl[A-Z]\w*Error\b|\bNVML_ERROR_\w+|\bXid\b|\bSIG(?:SEGV|BUS|ILL|FPE|ABRT|KILL)\b|"
    r"\b(?:HTTP/?[\d.]*\s+|status(?: code)?:?\s*)(?:4\d\d|50[234])\b|\b(?:4\d\d|50[234]) (?:Bad Request|Unauthorized|"
    r"Forbidden|Not Found|Too Many Requests|Bad Gateway|Service Unavailable|Gateway Timeout)\b|"
    r"\b(?:code|status)\s*=\s*(?:Unavailable|ResourceExhausted|PermissionDenied|Unauthenticated|DeadlineExceeded|"
    r"Internal|Unimplemented|FailedPrecondition|NotFound|InvalidArgument)\b|\bStatusCode\.[A-Z_]+\b|"
    r"error while loading shared libraries|cannot open shared object file|\bKilled process\b|\boom-kill|"
    r"memory allocation of \d+ bytes failed|\bbad_alloc\b|"
    r"\bx509:|certificate verify failed|\bSSL_ERROR_\w+|handshake failure|"
    r"\b(?:" + _ERRNO_TEXTS + r")\b|\b(?:" + _CUDA_TEXTS + r")\b",
    re.I,
)


@dataclass(frozen=True)
class Decisive:
    """The line that says why a stage failed, where it stands, and the shape that made it decisive."""

    line: str
    source: str  # stderr, stdout, a followed file's path, detail, exit (the exit's words), result (the benchmark's)
    line_no: int | None  # its 0-based place in that source's tail; None for the exit's and the result's words
    weight: float
    shape: str


def _banner(text: str) -> bool:
    """A line of mostly punctuation (#### OPENCL ERROR ####, ----, ^^^)."""
    s = text.strip()
    return bool(s) and sum(c.isalnum() for c in s) < len(s) / 2


def _framed(message: str, line: str) -> bool:
    return _banner(message) or any(p.search(message) for p in _FRAMES)


def _searched(pattern: re.Pattern[str], where: str = "message") -> Callable[[str, str], bool]:
    """A test of a line's message (or of the whole line) against one pattern."""
    if where == "line":
        return lambda message, line: bool(pattern.search(line))
    if where == "either":
        return lambda message, line: bool(pattern.search(message) or pattern.search(line))
    return lambda message, line: bool(pattern.search(message))


# The shapes that need no neighbour, tried in order: the first that holds names the line's shape and weight.
_SHAPES: list[tuple[Callable[[str, str], bool], float, str]] = [
    (_framed, NOISE, "frame or banner"),
    (_searched(_WRAPPERS, "either"), NOISE, "wrapper"),
    (_searched(_ADVICE), NOISE, "advice"),
    (_searched(_OPENING_KEY, "line"), NOISE, "an opening key"),
    (_searched(_RUST_PANIC_INLINE), FATAL, "rust panic"),
    (_searched(_RUST_PANIC_HEADER), PLAIN, "rust panic header"),
    (lambda message, line: bool(_CAUSED_BY.match(message)), FATAL, "caused by"),
    (_searched(_PANICS), FATAL, "panic or fatal error"),
    (lambda message, line: bool(_WARNING_CLASS.match(message)), WARNED, "warning"),
    (lambda message, line: bool(_EXCEPTION.match(message)), FATAL, "exception"),
    (_searched(_TERMINATE), PLAIN, "uncaught c++ exception"),
    (lambda message, line: bool(_GO_SIGNAL.match(line)), WARNED, "signal"),
    (_searched(_SHELL_SIGNAL), FAILING + SIGNAL, "a shell's word for a signal"),
]


def _context_free(message: str, line: str) -> tuple[float, str] | None:
    """The weight and name of a shape that needs no neighbour, or None for an ordinary line."""
    if not line.strip():
        return -1.0, "blank"
    for holds, weight, name in _SHAPES:
        if holds(message, line):
            return weight, name
    return None


_LEVEL_WEIGHTS = {Level.QUIET: QUIET, Level.WARN: WARNED, Level.ERROR: ERROR, Level.FATAL: FATAL}


def _ordinary(message: str, line: str) -> tuple[float, str]:
    """An ordinary line's weight: its level, else its words."""
    level = level_of(line)
    if level == Level.QUIET:
        return QUIET + (QUIET_FAILING if _FAILURE_WORDS.search(message) else 0.0), "quiet level"
    if level is not None and level >= Level.ERROR:
        return _LEVEL_WEIGHTS[level], "error level"
    if _FAILURE_WORDS.search(message):
        return FAILING, "words of failure"
    if level is not None:
        return _LEVEL_WEIGHTS[level], "warning level"
    return PLAIN, "plain"


@dataclass(frozen=True)
class Weighed:
    """One line's weight, the name of its shape, and the line it continues (None: none)."""

    weight: float
    shape: str
    continues: int | None = None


class _Reader:
    """Reads one source's lines in order, each with what the lines before it announced: a panic's payload after
    a ``panicked at FILE:LINE:COL:`` header, causes under ``Caused by:``, a message continued under a line that
    ends with ``:``, the source lines under Python's frames."""

    def __init__(self) -> None:
        self.payload_due = self.cause_due = self.in_frames = False
        self.depth = 0
        self.header: tuple[int, float, int] | None = None  # the last line ending with ':': index, weight, indent
        self.out: list[Weighed] = []

    def shape(self, message: str, line: str) -> tuple[float, str]:
        shape = _context_free(message, line)
        if shape is None and (self.payload_due or self.cause_due) and not _PATH_TAIL.match(message):
            return (FATAL, "rust panic payload") if self.payload_due else (FATAL, "caused by")
        if shape is not None and self.cause_due and shape[1] == "frame or banner" and message[:1] in (" ", "\t"):
            return FATAL, "caused by"  # anyhow's numbered causes look like frames
        if shape is None and self.in_frames and message[:1] in (" ", "\t"):
            return NOISE, "source line of a frame"
        return shape if shape is not None else _ordinary(message, line)

    def read(self, line: str) -> Weighed:
        line = line[:SCAN_CHARS]  # what is read of a line (a hostile one may be 64 KiB)
        message = header_split(line)[1]
        weight, name = self.shape(message, line)
        continues = None
        if name == "caused by":
            self.depth += 1
            weight += self.depth / 100  # the deepest cause wins
        if weight > NOISE and self.header is not None and _continues(_indent(message), self.header[2]):
            continues, weight = self.header[0], max(weight, self.header[1]) + 0.01  # the message a ':' announced
        if weight > NOISE and name != "quiet level":  # a cause a program names at INFO is one it got over
            weight += _cause_weight(line) - (WRAPPED if _EXIT_REPORT.search(message) else 0.0)
        here = Weighed(weight, name, continues)
        self.remember(message, here)
        return here

    def remember(self, message: str, here: Weighed) -> None:
        if here.shape == "blank":
            self.out.append(here)
            return
        tail = bool(_PATH_TAIL.match(message))
        self.payload_due = here.shape == "rust panic header" or (self.payload_due and tail)
        self.cause_due = bool(_CAUSED_BY_HEADER.match(message)) or (self.cause_due and here.shape == "caused by")
        self.in_frames = here.shape in ("frame or banner", "source line of a frame") and bool(
            _FRAMES[0].search(message) or self.in_frames and here.shape == "source line of a frame"
        )
        if here.weight > NOISE:
            ends = message.rstrip().endswith(":") and not self.payload_due and not self.cause_due
            self.header = (len(self.out), here.weight, _indent(message)) if ends else None
        self.out.append(here)


def _indent(message: str) -> int:
    """How far a message is indented (a bullet counts as indentation)."""
    return len(message) - len(message.lstrip(" \t-*"))


def _continues(indent: int, header_indent: int) -> bool:
    """Whether a line indented so continues a header indented so: deeper, or both at the margin (an exception's
    message on the next line); a sibling at the same depth (the next error of a list) does not."""
    return indent > header_indent or indent == header_indent == 0


def _cause_weight(line: str) -> float:
    """What a cause's name adds: an errno, an error code, a status, CUDA's text (CAUSE); a signal's (SIGNAL)."""
    found = _CAUSE_NAMES.findall(line)
    if not found:
        return 0.0
    return CAUSE if any(not f.upper().startswith("SIG") for f in found) else SIGNAL


def weigh(lines: Sequence[str]) -> list[Weighed]:
    """Each line's weight, the name of its shape and the line it continues, read with its neighbours (one
    source's lines, in order)."""
    reader = _Reader()
    for line in lines:
        reader.read(line)
    return reader.out


def _weighed(ev: FailureEvidence) -> list[tuple[Located, Weighed]]:
    """Every evidence line with its weight, in the order rules see them (files, stderr, stdout, details)."""
    out: list[tuple[Located, Weighed]] = []
    by_source: dict[str, list[Located]] = {}
    for at in ev.located():
        by_source.setdefault(at.source, []).append(at)
    for located in by_source.values():
        for at, w in zip(located, weigh([a.text for a in located]), strict=True):
            less = {"detail": DETAIL, "stdout": STDOUT}.get(at.source, 0.0)
            out.append((at, Weighed(w.weight - less, w.shape, w.continues) if less else w))
    return out


def _best(weighed: Iterable[tuple[Located, Weighed]]) -> tuple[Located, Weighed] | None:
    """The heaviest line: of equal weights, the first when they look like errors, else the last."""
    best: tuple[Located, Weighed] | None = None
    for item in weighed:
        w, b = item[1].weight, best[1].weight if best else 0.0
        if best is None or w > b or (w == b and w < LOOKS_LIKE_AN_ERROR):
            best = item
    return best


def _named(weighed: list[tuple[Located, Weighed]], matched: Iterable[Located]) -> list[tuple[Located, Weighed]]:
    """The lines a rule matched, and the lines that continue them (a message a line ending in ':' announced, and
    so on down)."""
    named = {(m.source, m.line_no) for m in matched}
    out = []
    for at, w in weighed:  # in order: a line's header comes before it
        if w.continues is not None and (at.source, w.continues) in named:
            named.add((at.source, at.line_no))
        if (at.source, at.line_no) in named:
            out.append((at, w))
    return out


def _exit_words(ev: FailureEvidence) -> Decisive | None:
    """The exit's own words when they say why: a command that did not start, a timeout, a signal."""
    if ev.start_error:
        return Decisive(f"could not start: {ev.start_error}", "exit", None, FATAL, "start error")
    if ev.timed_out:
        return Decisive("timed out: stopped at the stage's time limit", "exit", None, FAILING, "timeout")
    name = exit_signal(ev)
    if name:
        return Decisive(f"killed by {name}", "exit", None, FAILING, "signal")
    return None


def _result_words(ev: FailureEvidence) -> Decisive:
    """A benchmark that ran below its minimum: its result's detail, or its rate."""
    detail = next((d for d in reversed(ev.details) if d and "proofs" in d), None)
    line = detail or f"{RATE_FIELD}={ev.proofs_per_hour:g}"
    return Decisive(line, "result", None, FATAL, "below the minimum rate")


def decisive_line(ev: FailureEvidence, verdict: Classification | None = None) -> Decisive:
    """The line that says why this failure happened (see the module's doc). Pure."""
    if verdict is not None and verdict.rule_line and verdict.rule_line.startswith(f"{RATE_FIELD}="):
        return _result_words(ev)
    if ev.start_error:
        return Decisive(f"could not start: {ev.start_error}", "exit", None, FATAL, "start error")
    weighed = _weighed(ev)
    if verdict is not None and verdict.matched and not verdict.symptom:
        best = _best(_named(weighed, verdict.matched))
    else:
        best = _best(weighed)
    exit_words = _exit_words(ev)
    if exit_words is not None and (best is None or best[1].weight < LOOKS_LIKE_AN_ERROR):
        return exit_words
    if best is None:
        code = "none" if ev.exit_code is None else str(ev.exit_code)
        return Decisive(f"exit code {code}", "exit", None, PLAIN, "exit code")
    at, w = best
    return Decisive(at.text, at.source, at.line_no, w.weight, w.shape)
