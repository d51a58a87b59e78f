"""The shipped rule table (db/rules.toml): classes from signals that generalize, a specific class before a generic
one, a rule id for every rule and a version for the table.

The lines are written from the general shapes a failing program prints (strerror's texts, the dynamic loader's
refusal, a shell's job report, NVIDIA's Xid lines, TLS libraries' errors, HTTP and gRPC statuses); none is quoted
from a corpus case. tests/db/test_corpus.py measures the table on real failures.
"""

from __future__ import annotations

import pytest
from flightrec.db.classify import FailureEvidence, load_rules, parse_rules, rules_version
from flightrec.db.decisive import decisive_line

from flightrec.errors import ConfigError

RULES = load_rules()

# The class vocabulary (CORPUS.md): the classes the corpus labels with, and only those.
CLASSES = {
    "gpu_arch_unsupported",
    "illegal_memory_access",
    "gpu_hardware_error",
    "nccl_error",
    "driver_mismatch",
    "cuda_init_failed",
    "cuda_out_of_memory",
    "disk_full",
    "too_many_open_files",
    "oom_killed",
    "params_download_failed",
    "protocol_mismatch",
    "timeout",
    "process_start_failed",
    "daemon_crashed",
    "below_min_rate",
    "missing_library",
    "illegal_instruction",
    "permission_denied",
    "network_error",
    "address_in_use",
    "tls_error",
    "rpc_rejected",
    "configuration_error",
    "corrupted_data",
    "io_error",
    "unknown",
}

LINES = [
    (
        "./prover: error while loading shared libraries: libcudart.so.12: cannot open shared object file",
        "missing_library",
    ),
    ("ImportError: libcudnn.so.8: cannot open shared object file: No such file or directory", "missing_library"),
    (
        "./prover: /lib/x86_64-linux-gnu/libc.so.6: version `GLIBC_2.34' not found (required by ./prover)",
        "missing_library",
    ),
    ("python: symbol lookup error: ./ext.so: undefined symbol: _ZN3c104cuda9SetDeviceEi", "missing_library"),
    ("Illegal instruction (core dumped)", "illegal_instruction"),
    ("run.sh: line 12:  4242 Illegal instruction     ./prover", "illegal_instruction"),
    (
        "this binary was compiled to use AVX2 instructions, but these aren't available on this machine",
        "illegal_instruction",
    ),
    ("Error: Permission denied (os error 13)", "permission_denied"),
    ("PermissionError: [Errno 13] Permission denied: '/params/p.bin'", "permission_denied"),
    ("mkdir: cannot create directory '/data': Read-only file system", "permission_denied"),
    ("open /dev/nvidia0: operation not permitted", "permission_denied"),
    ("Error: Connection refused (os error 111)", "network_error"),
    ("dial tcp: lookup manager.example on 127.0.0.53:53: no such host", "network_error"),
    ("socket.gaierror: [Errno -3] Temporary failure in name resolution", "network_error"),
    ("read tcp 10.0.0.2:5555->10.0.0.1:443: read: connection reset by peer", "network_error"),
    ("connect: No route to host", "network_error"),
    ("OSError: [Errno 98] Address already in use", "address_in_use"),
    ("listen tcp 0.0.0.0:8080: bind: address already in use", "address_in_use"),
    ("[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed: unable to get local issuer certificate", "tls_error"),
    ('Get "https://m.example/": x509: certificate signed by unknown authority', "tls_error"),
    ("remote error: tls: handshake failure", "tls_error"),
    ("rpc error: code = Unauthenticated desc = invalid token", "rpc_rejected"),
    ("rpc error: code = ResourceExhausted desc = quota exceeded for jobs", "rpc_rejected"),
    ("Error: HTTP status client error (429 Too Many Requests) for url (https://api.example/v1/jobs)", "rpc_rejected"),
    ("requests.exceptions.HTTPError: 403 Client Error: Forbidden for url: https://api.example/submit", "rpc_rejected"),
    ("Error: missing required environment variable PROVER_KEY", "configuration_error"),
    ("PROVER_KEY is not set", "configuration_error"),
    ("prove.py: error: the following arguments are required: --params", "configuration_error"),
    ("error: unexpected argument '--gpu' found", "configuration_error"),
    ("Error: No such file or directory (os error 2)", "configuration_error"),
    ("FileNotFoundError: [Errno 2] No such file or directory: '/etc/prover/config.toml'", "configuration_error"),
    ("Error: checksum mismatch for /data/srs.bin", "corrupted_data"),
    ("Error: failed to fill whole buffer", "corrupted_data"),
    ("OSError: Unexpected end of file while reading the witness", "corrupted_data"),
    ("invalid magic number in /cache/circuit.bin", "corrupted_data"),
    ("OSError: [Errno 5] Input/output error", "io_error"),
    ("blk_update_request: I/O error, dev nvme0n1, sector 123456 op 0x0:(READ)", "io_error"),
    ("Error: protocol version 3 expected, got 2", "protocol_mismatch"),
    ("error: server speaks v1.4.0 which is incompatible with client v2.0.1", "protocol_mismatch"),
    ("memory allocation of 34359738368 bytes failed", "oom_killed"),
    ("java.lang.OutOfMemoryError: Java heap space", "oom_killed"),
    ("MemoryError", "oom_killed"),
    ("clCreateBuffer failed: CL_OUT_OF_HOST_MEMORY", "oom_killed"),
    ("RuntimeError: CUDA error: out of memory", "cuda_out_of_memory"),
    ("cudaMalloc failed: out of memory (requested 8589934592 bytes)", "cuda_out_of_memory"),
    ("NVRM: Xid (PCI:0000:3b:00): 31, pid=1234, name=prover, Ch 00000008, MMU Fault", "illegal_memory_access"),
    ("NVRM: Xid (PCI:0000:3b:00): 13, Graphics SM Warp Exception on (GPC 0, TPC 1)", "illegal_memory_access"),
    ("NVRM: Xid (PCI:0000:3b:00): 48, An uncorrectable double bit error (DBE) has been detected", "gpu_hardware_error"),
    ("NVRM: Xid (PCI:0000:3b:00): 119, pid=1234, Timeout waiting for RPC from GSP!", "gpu_hardware_error"),
    ("NVRM: Xid (PCI:0000:3b:00): 45, pid=1234, name=prover, Ch 00000008", "unknown"),  # a clean-up: says nothing
    ("download of https://h.example/params/p.bin failed: HTTP status 404", "params_download_failed"),
    ("ValueError: Bfloat16 is only supported on GPUs with compute capability of at least 8.0", "gpu_arch_unsupported"),
    ("RuntimeError: The NVIDIA driver on your system is too old (found version 10010).", "driver_mismatch"),
    ("RuntimeError: Found no NVIDIA driver on your system.", "cuda_init_failed"),
    ("ClientConnectorError: Cannot connect to host localhost:8555 ssl:default [Connect call failed]", "network_error"),
    ("java.net.UnknownHostException: manager.example", "network_error"),
    ("toomanyrequests: You have reached your pull rate limit.", "rpc_rejected"),
    ('FATAL:  password authentication failed for user "prover"', "rpc_rejected"),
    ('Error: Os { code: 28, kind: StorageFull, message: "No space left on device" }', "disk_full"),
    ("KeyError: 'PROVER_API_KEY'", "configuration_error"),
    ("fatal runtime error: stack overflow", "daemon_crashed"),
    (
        "./prover: relocation error: ./libgpu.so: symbol memcpy version GLIBC_2.14 not defined in file libc.so.6",
        "missing_library",
    ),
    ("Failed to initialize NVML: could not load NVML library", "missing_library"),
    # musl's loader says it in its own words
    ("Error loading shared library libcuda.so.1: No such file or directory (needed by ./prover)", "missing_library"),
    ("Error relocating ./prover: cuMemAlloc_v2: symbol not found", "missing_library"),
    # the child could not be executed: Python's subprocess names the program twice, Node's spawn its errno
    ("FileNotFoundError: [Errno 2] No such file or directory: 'nvidia-smi': 'nvidia-smi'", "process_start_failed"),
    ("Error: spawn nvidia-smi ENOENT", "process_start_failed"),
    ("ValueError: Invalid file /plots/plot-k32-0001.plot", "corrupted_data"),
    ("Error: invalid parameters file: /var/tmp/params/v28-stacked-proof.params", "corrupted_data"),
    ("OSError: invalid file descriptor 12", "unknown"),  # EBADF: a bug of the program, no damaged data
    ("Could not load library libcudnn_cnn_infer.so.8. Error: libcuda.so: cannot open", "missing_library"),
    ("Unable to load any of {libcudnn_graph.so.9.1.0, libcudnn_graph.so.9.1, libcudnn_graph.so.9}", "missing_library"),
    ("CUDA error: insufficient CUDA driver: 11020", "driver_mismatch"),
    ("cudaSetDevice failed: cudaErrorSystemNotReady: system not yet initialized", "cuda_init_failed"),
    ("RuntimeError: No CUDA GPUs are available", "cuda_init_failed"),
    ("RuntimeError: CUDA unknown error - this may be due to an incorrectly set up environment", "cuda_init_failed"),
    ("CUDA Runtime Error by: cudaMallocAsync(&buf, bytes, stream) at: msm.cu:88", "cuda_out_of_memory"),
    ("kernel failed: out of device memory", "cuda_out_of_memory"),
    (
        "XlaRuntimeError: RESOURCE_EXHAUSTED: Failed to allocate request for 2.00GiB on device ordinal 0",
        "cuda_out_of_memory",
    ),
    ("store: failed to allocate 1048576 bytes", "oom_killed"),
    (
        "Error: model downloads failed: HTTP status server error (502 Bad Gateway) for url (https://h.example/m.bin)",
        "params_download_failed",
    ),
    (
        "HTTPError: 404 Client Error: Not Found for url: https://h.example/weights/model.safetensors",
        "params_download_failed",
    ),
    ("2026-01-01 10:00:00 ERROR 404: Not Found.", "params_download_failed"),
    (
        "HTTPError: 404 Client Error: Not Found for url: https://h.example.pt/api/jobs",
        "unknown",  # no file: no download
    ),
    ("Error: incompatible server version: 2.1.0 (this client speaks 1.9)", "protocol_mismatch"),
    (
        "Error response from daemon: client version 1.44 is too new. Maximum supported API version is 1.41",
        "protocol_mismatch",
    ),
    ("Error: the verifying key does not match the proof's circuit", "protocol_mismatch"),
    ("caused by: Max retries exceeded HTTP error 503 with body: {}", "rpc_rejected"),
    ("openai.RateLimitError: You exceeded your current quota, please check your plan", "rpc_rejected"),
    ("Error: failed to verify the server's certificate", "tls_error"),
    ("ValueError: Invalid file header magic", "corrupted_data"),
    ("SafetensorError: Error while deserializing header: InvalidHeaderDeserialization", "corrupted_data"),
    ("sha256sum: WARNING: 1 computed checksum did NOT match", "corrupted_data"),
    ("Error: failed to read in node.toml: While parsing config: (12, 3): unexpected token", "configuration_error"),
    ("Fatal: ./prover.yaml, line 7: field 'gpus' is not defined in Config", "configuration_error"),
    ("error: the following required arguments were not provided: --params <PARAMS>", "configuration_error"),
    ("flag provided but not defined: -gpu", "configuration_error"),
    ("The job has exceeded the maximum execution time of 2h0m0s", "timeout"),
    ("prover result: Timeout (30.00s)", "timeout"),
    ("Error: time limit exceeded while proving block 9", "timeout"),
    # the C library's allocator refused, with the size asked for (host memory; CUDA's own allocators have their class)
    ("Error: Witness::build() failed calling malloc() of size 68719476736", "oom_killed"),
    ("fatal: malloc(4294967296) failed", "oom_killed"),
    ("posix_memalign() failed for 17179869184 bytes", "oom_killed"),
    ("cudaMalloc(&d_buf, 17179869184) failed: out of memory", "cuda_out_of_memory"),
    # no driver for CUDA to start on, in a program's own words
    ("prover: no NVIDIA driver was found on this host", "cuda_init_failed"),
    ("fatal: CUDA driver not found (is the NVIDIA driver installed?)", "cuda_init_failed"),
    # wget's (GnuTLS/OpenSSL) refusal of a certificate
    ("ERROR: cannot verify params.example.org's certificate, issued by 'CN=R3,O=Let's Encrypt,C=US':", "tls_error"),
    ("  Unable to locally verify the issuer's authority.", "tls_error"),
    ("Unable to establish SSL connection.", "tls_error"),
    # the program gave up waiting for a part of itself (a runner, a worker) to start or answer
    ("Error: timed out waiting for the prover worker to become ready", "timeout"),
    ("timeout waiting for witness generator 3 to finish", "timeout"),
    # a batch scheduler stopped the job at its time limit (Slurm's and PBS's words)
    ("slurmstepd: error: *** JOB 812 ON gpu-07 CANCELLED AT 2026-01-02T03:04:05 DUE TO TIME LIMIT ***", "timeout"),
    ("=>> PBS: job killed: walltime 7230 exceeded limit 7200", "timeout"),
    # sha256sum -c refusing a proving-parameter file: the parameters did not verify
    ("/root/.zcash-params/sapling-spend.params: FAILED", "params_download_failed"),
    ("params/v28-proving-key.key: FAILED", "params_download_failed"),
    ("free(): invalid pointer", "daemon_crashed"),
    ("*** stack smashing detected ***: terminated", "daemon_crashed"),
    ("thread 'prover' has overflowed its stack", "daemon_crashed"),
    ("2026-01-01T00:00:00Z panic: runtime error: index out of range [3] with length 3", "daemon_crashed"),
    # a prover's own check refused its result: a cause named, but no class of ours (no crash either)
    ("Error: proof verification failed for segment 4", "unknown"),
    ("assertion `left == right` failed: the trace width differs", "unknown"),
    ("pcieport 0000:00:1c.0: PCIe Bus Error: severity=Corrected, type=Physical Layer", "unknown"),  # no SIGBUS
    ("rate limiter configured: 100 requests/s", "unknown"),
    ("everything is on fire but no rule knows this one", "unknown"),
]


@pytest.mark.parametrize("line, cls", LINES, ids=[f"{c}:{i}" for i, (_, c) in enumerate(LINES)])
def test_a_class_follows_from_signals_that_generalize(line, cls):
    ev = FailureEvidence(stage="benchmark", exit_code=1, stderr_tail=["starting", line])
    got = RULES.classify(ev)
    assert got.failure_class == cls, got.rule_id
    assert decisive_line(ev, got).line == line  # and the line that says so is the one shown


@pytest.mark.parametrize(
    "ev, cls",
    [
        (FailureEvidence(stage="s", exit_code=137), "oom_killed"),  # a shell's 128 + 9
        (FailureEvidence(stage="s", signal=9), "oom_killed"),
        (FailureEvidence(stage="s", exit_code=132), "illegal_instruction"),  # 128 + 4
        (FailureEvidence(stage="s", signal=4), "illegal_instruction"),
        (FailureEvidence(stage="s", exit_code=139), "daemon_crashed"),  # 128 + 11
        (FailureEvidence(stage="s", signal=6), "daemon_crashed"),
        (FailureEvidence(stage="s", exit_code=143), "unknown"),  # SIGTERM: stopped, not crashed; no wrong hint
        (FailureEvidence(stage="s", signal=2), "unknown"),
        (
            FailureEvidence(stage="s", exit_code=127, stderr_tail=["run.sh: line 3: prover: command not found"]),
            "process_start_failed",
        ),
        (
            FailureEvidence(stage="s", exit_code=126, stderr_tail=["run.sh: line 3: ./prover: Permission denied"]),
            "process_start_failed",
        ),
        (
            FailureEvidence(stage="s", exit_code=1, stderr_tail=["exec /usr/bin/prover: exec format error"]),
            "process_start_failed",
        ),
        (
            FailureEvidence(stage="s", exit_code=1, stderr_tail=["entrypoint.sh: line 9:  77 Killed  ./prover"]),
            "oom_killed",
        ),
    ],
)
def test_the_exit_status_means_what_a_shell_means_by_it(ev, cls):
    assert RULES.classify(ev).failure_class == cls


@pytest.mark.parametrize(
    "lines, sig, cls",
    [
        # an errno over the abort it led to
        (["open /params/p.bin: Permission denied", "Aborted (core dumped)"], 6, "permission_denied"),
        (
            ["terminate called after throwing an instance of 'std::bad_alloc'", "  what():  std::bad_alloc"],
            6,
            "oom_killed",
        ),
        # a panic's payload names the cause: the panic is only how the program stopped
        (
            ["thread 'main' panicked at src/io.rs:9:5:", "failed to bind: Address already in use (os error 98)"],
            6,
            "address_in_use",
        ),
        (
            ["panic: dial tcp 10.0.0.1:9000: connect: connection refused", "", "goroutine 1 [running]:"],
            None,
            "network_error",
        ),
        # the GPU's own failure over the application's errors that follow it
        (
            ["NVRM: Xid (PCI:0000:01:00): 79, GPU has fallen off the bus.", "CUDA error: unspecified launch failure"],
            6,
            "gpu_hardware_error",
        ),
        # NCCL's network transport failing first: the CUDA errors that follow on the same rank are its fallout
        (
            [
                "n1:101:202 [0] transport/net_ib.cc:1700 NCCL WARN NET/IB : Got completion from peer 10.0.0.2<4000> "
                "with status=12 opcode=0 len=0 vendor err 129 (Recv)",
                "n1:101:101 [0] init.cc:300 NCCL WARN Cuda failure 'an illegal memory access was encountered'",
            ],
            None,
            "nccl_error",
        ),
        (
            ["n1:101:101 [0] enqueue.cc:90 NCCL WARN Cuda failure 'an illegal memory access was encountered'"],
            6,
            "illegal_memory_access",
        ),
        (["n1:101:101 [0] enqueue.cc:90 NCCL WARN Cuda failure 'out of memory'"], None, "cuda_out_of_memory"),
        # device memory before host memory, TLS before the download it broke
        (["CUDA error: out of memory", "std::bad_alloc"], 6, "cuda_out_of_memory"),
        (["fetching params: x509: certificate has expired or is not yet valid"], None, "tls_error"),
        # a panic whose payload is the prover's own check refusing its result is no crash of the daemon
        (
            ["thread 'main' panicked at src/main.rs:40:9:", "verification indicates proof is invalid"],
            6,
            "unknown",
        ),
        (["thread 'main' panicked at src/gen.rs:9:5:", "constraint 17 not satisfied"], None, "unknown"),
        # a connection refused inside a gRPC UNAVAILABLE is the network's
        (
            ["rpc error: code = Unavailable desc = connection error: dial tcp: connect: connection refused"],
            None,
            "network_error",
        ),
    ],
)
def test_a_specific_class_never_loses_to_a_generic_one(lines, sig, cls):
    ev = FailureEvidence(stage="benchmark", exit_code=None if sig else 1, signal=sig, stderr_tail=lines)
    assert RULES.classify(ev).failure_class == cls


def test_every_shipped_rule_has_its_own_id_a_hint_and_a_class_of_the_vocabulary():
    ids = [r.rule_id for r in RULES.rules]
    assert len(ids) == len(set(ids)) and all(ids)
    assert {r.failure_class for r in RULES.rules} == CLASSES
    assert all(len(r.hint) > 40 for r in RULES.rules)
    text = (load_rules.__globals__["resources"].files("flightrec.db") / "rules.toml").read_text()
    assert text.count("[[rule]]") == text.count("\nid = ") == len(RULES.rules)  # every id written, none derived


def test_the_table_s_version_is_its_text_s_digest_and_ids_are_unique():
    text = '[[rule]]\nclass = "a"\nhint = "h"\n'
    assert parse_rules(text).version == rules_version(text) != parse_rules(text + "\n").version
    assert parse_rules(text).rules[0].rule_id == "a-1"  # a file without ids (an operator's own) still loads
    with pytest.raises(ConfigError, match="ids used twice"):
        parse_rules('[[rule]]\nid = "x"\nclass = "a"\nhint = "h"\n[[rule]]\nid = "x"\nclass = "b"\nhint = "h"\n')


def test_a_line_the_program_logs_at_info_or_debug_is_no_evidence_of_a_class():
    """A healthy prover says at INFO that CUDA cannot serve (the loader's words inside) and at DEBUG that it retries
    a refused connection; when it then dies of something no rule knows, neither gives it a class, also where the
    agent's summary of the stage repeats its last stderr line."""
    info = "2026-01-01 10:00:00,125 INFO cuda.backend: CUDA cannot serve: libcuda.so.1: cannot open shared object file"
    debug = '{"level":"debug","msg":"connect: connection refused, retrying in 1s"}'
    ev = FailureEvidence(
        stage="benchmark",
        exit_code=1,
        stderr_tail=[debug, "proof 3 failed its self-check", info],
        details=[f"exit code 1; last stderr line: {info}"],
    )
    got = RULES.classify(ev)
    assert got.failure_class == "unknown"
    assert decisive_line(ev, got).line == "proof 3 failed its self-check"
    loud = FailureEvidence(stage="benchmark", exit_code=1, stderr_tail=[info.replace(" INFO ", " ERROR ")])
    assert RULES.classify(loud).failure_class == "missing_library"
