"""Unit tests of secret masking: by name, in URLs, by shape, split across lines, in base64."""

from __future__ import annotations

import base64
import pickle

import pytest
from flightrec.producer.redact import Carry, Redactor
from flightrec.producer.shapes import builtin_shapes
from hypothesis import given
from hypothesis import settings as hsettings
from hypothesis import strategies as st


def test_env_values_are_masked() -> None:
    r = Redactor(["API_TOKEN", "UNSET"], {"API_TOKEN": "tok-123456", "OTHER": "visible"})
    assert r.text("auth tok-123456 and again tok-123456; visible") == "auth *** and again ***; visible"


def test_longest_value_first() -> None:
    r = Redactor(["A", "B"], {"A": "abcd", "B": "abcdefgh"})
    assert r.text("x abcdefgh y abcd") == "x *** y ***"


def test_short_values_are_not_masked() -> None:
    r = Redactor(["N"], {"N": "1"})
    assert r.text("1 + 1") == "1 + 1"


def test_url_credentials_are_masked() -> None:
    r = Redactor()
    assert r.text("GET https://bob:hunter2@example.com/x ok") == "GET https://***:***@example.com/x ok"
    assert r.text("postgres://u:p@db:5432/x") == "postgres://***:***@db:5432/x"
    # a user alone may be a token (https://TOKEN@host): it is masked too
    assert (
        r.text("ssh://git@github.com/repo and http://example.com/a@b")
        == "ssh://***@github.com/repo and http://example.com/a@b"
    )


def test_lines_fast_path_returns_same_list() -> None:
    r = Redactor(["T"], {"T": "secret-value"})
    lines = ["a", "b"]
    assert r.lines(lines) is lines
    assert r.lines(["a", "has secret-value", "x://u:p@h"]) == ["a", "has ***", "x://***:***@h"]


def test_mapping() -> None:
    r = Redactor(["T"], {"T": "secret-value"})
    assert r.mapping({"url": "https://a:b@h", "k": "secret-value"}) == {"url": "https://***:***@h", "k": "***"}


# -- by shape (the built-in list, producer/secret_shapes.toml) ------------------------------------------

SHAPES = builtin_shapes()
R = Redactor(shapes=SHAPES)
AWS = "AKIA" + "IOSFODNN7EXAMPLE"


@pytest.mark.parametrize(
    "line,want",
    [
        (f"export AWS_ACCESS_KEY_ID={AWS}", "export AWS_ACCESS_KEY_ID=***"),
        (f"key{AWS}x", "key***x"),  # glued to other letters: still masked
        ('{"user": "bob", "password": "hunter2", "n": 1}', '{"user": "bob", "password": "***", "n": 1}'),
        ('{"note": "a \\"quoted\\" one", "secret": "a\\"b c"}', '{"note": "a \\"quoted\\" one", "secret": "***"}'),
        ("Authorization: Bearer abcdefgh12345678", "Authorization: Bearer ***"),
        ("{'Authorization': 'Basic dXNlcjpwYXNzd29yZA=='}", "{'Authorization': 'Basic ***'}"),
        ("-----BEGIN RSA PRIVATE KEY-----", "-----BEGIN RSA PRIVATE KEY-----"),
        (
            '"private_key": "-----BEGIN PRIVATE KEY-----\\nMIIEvQIBADANBg\\n-----END PRIVATE KEY-----\\n"',
            '"private_key": "***"',
        ),
        (
            "key -----BEGIN PRIVATE KEY-----\\nMIIEvQIBADANBg\\n-----END PRIVATE KEY-----\\n",
            "key -----BEGIN PRIVATE KEY-----***-----END PRIVATE KEY-----\\n",
        ),
        ("mysql --password hunter2 -h db", "mysql --password *** -h db"),
        ("token=abcdefgh12&user=x", "token=***&user=x"),
        ("PASSWORD: x", "PASSWORD: ***"),
        ("Server=db;Password=abc;User=sa", "Server=db;Password=***;User=sa"),
        ("url?user=bob&password=hunter2&x=1", "url?user=bob&password=***"),  # the rest of the query string too
    ],
)
def test_shapes_mask_the_secret_part(line: str, want: str) -> None:
    assert R.text(line) == want


FALSE_POSITIVES = [
    "password reset email sent to bob@example.com",
    "token count: 512",
    "max_tokens=4096 tokens/s=5120.5 token: 512",
    "token_count=7",
    "passwords: 3 rotated, password_policy=strict, Enter password:",
    "password: null",
    "commit 9f86d081884c7d659a2feaa0c55ad015a3bf4f1b",
    "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
    "request 550e8400-e29b-41d4-a716-446655440000 done",
    '{"proof": "c29tZSBwcm9vZiBieXRlcyBoZXJl", "size": 4096}',
    "401: authorization required",
    "Authorization failed for user bob",
    "-----BEGIN CERTIFICATE-----",
    "-----BEGIN PUBLIC KEY-----",
    "the secret sauce is batching; secrets: 0",
    "tokenizer: bpe --token-file /etc/tok --password-stdin",
    "Asia/Tokyo AKIAFOO ghp_short glpat-short github_pat_x",
    "api_key_id=42",
    "git@github.com:org/repo.git",
    "https://example.com/a@b",
    "http://host:8080/path@x",
    "0000123 worker 3: batch done msm=ok ntt=ok elapsed_ms=12.5",
]


@pytest.mark.parametrize("line", FALSE_POSITIVES)
def test_ordinary_lines_are_not_masked(line: str) -> None:
    assert R.text(line) == line
    assert R.lines([line, line]) == [line, line]


def test_a_private_key_body_follows_its_header_up_to_the_end() -> None:
    lines = [
        "loading",
        "-----BEGIN EC PRIVATE KEY-----",
        "Proc-Type: 4,ENCRYPTED",
        "DEK-Info: AES-128-CBC,3F17F5",
        "",
        "MHcCAQEEIBkgWmG7ZZq+7vG2lA5Br3n/Lrwm5Fiv",
        "2024-01-01 INFO " + "QmFzZTY0" * 6,
        "AwEHoU==",
        "-----END EC PRIVATE KEY-----",
        "done",
    ]
    assert R.lines(lines) == [
        "loading",
        "-----BEGIN EC PRIVATE KEY-----",
        "Proc-Type: 4,ENCRYPTED",
        "DEK-Info: AES-128-CBC,3F17F5",
        "",
        "***",
        "2024-01-01 INFO ***",
        "***",
        "-----END EC PRIVATE KEY-----",
        "done",
    ]


def test_a_private_key_body_goes_on_in_the_next_read_with_the_carry() -> None:
    out, carry = R.stream(["x", "-----BEGIN RSA PRIVATE KEY-----"])
    assert out == ["x", "-----BEGIN RSA PRIVATE KEY-----"] and carry.follow == "private-key"
    assert R.may_need(b"", b"MIIEowIBAAKCAQEA\n", carry)  # the fast path is not taken inside a key
    out, carry = R.stream(["MIIEowIBAAKCAQEA", "-----END RSA PRIVATE KEY-----", "MIIEow"], carry=carry)
    assert out == ["***", "-----END RSA PRIVATE KEY-----", "MIIEow"] and carry.follow is None
    assert pickle.loads(pickle.dumps(carry)) == carry  # it travels to the late-output process


def test_a_cut_line_masks_a_shape_it_cut_short_and_a_cut_key_header_masks_the_body() -> None:
    assert R.cut("x " * 10 + "token: ghp_abc") == "x " * 10 + "token: ***"
    assert R.cut("deploy with ghp_abcdef") == "deploy with ***"
    out, carry = R.stream(["key: -----BEGIN RSA PRIV", "MIIEowIBAAKCAQEA"], truncated=[True, False])
    assert out[1] == "***"


SPLIT = "Zq8vXw4rKp2sWm7t"


def test_a_named_secret_split_across_lines_is_masked_at_both_ends() -> None:
    r = Redactor(["T"], {"T": SPLIT})
    assert r.lines(["a Zq8vXw", "4rKp2sWm7t b"]) == ["a ***", "*** b"]
    assert r.lines(["a Zq", "8vXw4rKp2sWm7t b"]) == ["a Zq", "*** b"]  # 1-3 characters at a line's end stay
    assert r.lines(["a Zq8vXw4rKp2sWm7", "t b"]) == ["a ***", "*** b"]
    assert r.lines(["a Zq8v", "other"]) == ["a ***", "other"]  # a line that ends like the secret begins
    assert r.lines(["a Zq", "other", "vXw4rKp2sWm7t"]) == ["a Zq", "other", "vXw4rKp2sWm7t"]  # no pair, no mask
    assert r.lines([SPLIT[:5], SPLIT[5:]]) == ["***", "***"]


@pytest.mark.parametrize("at", range(1, len(SPLIT)))
def test_a_split_secret_across_two_reads_is_found_with_the_carry(at: int) -> None:
    r = Redactor(["T"], {"T": SPLIT})
    out, carry = r.stream([f"a {SPLIT[:at]}"])
    second = f"{SPLIT[at:]} b"
    assert r.may_need(b"", second.encode() + b"\n", carry)  # the fast path would have missed the pair
    assert r.stream([second], carry=carry)[0] == ["*** b"]
    assert out == [f"a {SPLIT[:at]}" if at < 4 else "a ***"]


def test_a_short_named_secret_split_is_found_too() -> None:
    r = Redactor(["T"], {"T": "k9#Q"})
    assert r.lines(["a k9", "#Q b"]) == ["a k9", "*** b"]
    assert r.may_need(b"", b"a k9\n#Q b\n") and r.may_need(b"a k9\r\n", b"#Q b\n")


@pytest.mark.parametrize("secret", ["correct-horse-battery", "Zq8vXw4rKp2sWm7t!?~>", "p\u00e4ss-w\u00f6rd-42"])
def test_the_base64_of_a_named_secret_is_masked_at_every_alignment(secret: str) -> None:
    r = Redactor(["T"], {"T": secret})
    for pre in (b"", b"u:", b"bob:", b"abcd:"):
        raw = pre + secret.encode()
        for enc in (base64.b64encode(raw), base64.urlsafe_b64encode(raw), base64.b64encode(raw).rstrip(b"=")):
            out = r.text(f"auth {enc.decode()} end")
            assert "***" in out and out.startswith("auth ") and out.endswith(" end")
            assert len(out) < len(enc) // 2 + 16  # all but a few characters at each edge are masked
    other = base64.b64encode(b"proof bytes, not a secret at all").decode()
    assert r.text(other) == other


def test_a_long_secrets_base64_wrapped_at_76_columns_is_masked_line_by_line() -> None:
    secret = "correct-horse-battery-staple-" + SPLIT * 4
    r = Redactor(["T"], {"T": secret})
    enc = base64.encodebytes(secret.encode()).decode().splitlines()  # 76 characters a line
    assert len(enc) >= 2
    assert all(line == "***" or len(line) < 16 for line in r.lines(enc))


@pytest.mark.parametrize(
    "url,want",
    [
        ("postgres://user:p@ss/word@host/db", "postgres://***:***@host/db"),
        ("mysql://root:a/b:c@d@db.internal:3306/x?y=1", "mysql://***:***@db.internal:3306/x?y=1"),
        ("https://u:pw@host.example/path@v2", "https://***:***@host.example/path@v2"),
        ("https://u:pw@postgres/path@v2", "https://***:***@v2"),  # no dot, no port: the safe reading masks more
        ("https://tok@registry.npmjs.org/@scope%2fpkg", "https://***@registry.npmjs.org/@scope%2fpkg"),
        ("https://example.com/a@b", "https://example.com/a@b"),
        ("http://host:8080/path@x", "http://host:8080/path@x"),
        ("https://user:00000000000/AAAA@host/path", "https://***:***@host/path"),  # 11 digits: no port, a password
        ("https://user:65536/AAAA@host/path", "https://***:***@host/path"),  # past the last port
        ("https://[::1]:8443/a@b", "https://[::1]:8443/a@b"),
        ('"https://user:p/w@host/x"', '"https://***:***@host/x"'),
    ],
)
def test_url_credentials_whatever_they_hold(url: str, want: str) -> None:
    assert Redactor().text(url) == want


def test_urls_are_found_in_linear_time_on_a_hostile_line() -> None:
    import time

    for unit in ("://", "a://b", "a://u:p/", "x://@", "a://u:p/@x"):
        line = (unit * 65536)[:65536]
        t0 = time.perf_counter()
        Redactor().lines([line, line + "@"])
        assert time.perf_counter() - t0 < 2.0, unit  # quadratic on 64 KiB: minutes


def test_a_cut_url_with_a_password_holding_a_slash_masks_what_is_left() -> None:
    assert Redactor().cut("see postgres://user:p@ss/wo") == "see postgres://***"


VOCAB = [
    b"plain ",
    b"ok\n",
    b"\n",
    b"token: 512 ",
    b"password=",
    b"hunter2 ",
    AWS.encode(),
    b"AKIA",
    b"ghp_",
    b"-----BEGIN RSA PRIVATE KEY-----",
    b"MIIEowIBAAKCAQEA",
    b"-----END RSA PRIVATE KEY-----",
    b"Authorization: ",
    b"Bearer abcdefgh1234 ",
    SPLIT[:6].encode(),
    SPLIT[6:].encode(),
    SPLIT.encode(),
    b"x://",
    b"u:p@h ",
]


@hsettings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(VOCAB), max_size=30), st.lists(st.sampled_from(VOCAB), max_size=8))
def test_a_read_the_fast_path_skips_holds_nothing_to_mask(before: list[bytes], parts: list[bytes]) -> None:
    # may_need False means: masking every line of the read (with the carry of the lines before it) changes nothing
    r = Redactor(["T"], {"T": SPLIT}, shapes=SHAPES)
    prior = b"".join(before).decode().split("\n")
    _, carry = r.stream(prior[:-1]) if len(prior) > 1 else ([], Carry())
    pending, data = prior[-1].encode(), b"".join(parts)
    lines = (pending + data).decode().split("\n")[:-1]
    if lines and not r.may_need(pending, data, carry):
        assert r.stream(lines, carry=carry)[0] == lines


PIECES = [
    "token=abcdefgh123",
    "tokens/s=512",
    "password: hunter2",
    "x",
    AWS,
    "Authorization: Bearer abcdefghijkl",
    "--token abcdef12345",
    '"secret": "s3cr3t value"',
    "secret_key=abc",
    "gh" + "p_" + "aB3" * 12,
    "passwords: 3",
    "url https://u:p@h/x",
    "api_key='abcdefgh12'",
    "token: 5",
    "TOKEN=ABCDEFGH99",
    "é token=ünïcode-42",
]
LINES = st.lists(st.sampled_from(PIECES), min_size=1, max_size=4).map(" ".join)


@hsettings(max_examples=200, deadline=None)
@given(st.lists(LINES, min_size=1, max_size=120))
def test_a_batch_of_lines_is_masked_as_each_line_alone(lines: list[str]) -> None:
    # the batch path (needles found in the joined lines, a shape found in many lines matched in one pass over
    # them) masks exactly what masking each line alone does
    assert R.lines(lines) == [R.text(t) for t in lines]


# -- the secrets a rented GPU host holds (issue 44) ------------------------------------------------------------------

HF = "hf" + "_" + "aBcDeFgHiJkLmNoPqRsTuVwXyZ01234567"
VAST = "3f2a" * 16  # Vast.ai's API keys: 64 hex digits
SLACK_BOT = "xo" + "xb-" + "123456789012-1234567890123-AbCdEfGhIjKlMnOpQrStUvWx"
SLACK_HOOK = "T00000000/B00000000/" + "X" * 24
STRIPE = "sk" + "_live_" + "4eC39HqLyjWDarjtT1zdp7dc"
OPENAI = "sk" + "-proj-" + "AbCdEfGhIjKlMnOpQrStUvWxYz0123456789_-abcdEFGH"
JWT = (
    "eyJ" + "hbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV_adQssw5c"
)
AZURE_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
AWS_SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCY" + "EXAMPLEKEY"

HOST_SECRETS = [
    (f"HF_TOKEN loaded: {HF}", HF),
    (f"huggingface-cli login --token {HF}", HF),
    (f"git clone https://huggingface.co/org/model (using {HF})", HF),
    (f"vastai set api-key {VAST}", VAST),
    (f"vastai set api-key {VAST[:40]}", VAST[:40]),  # whatever the key, the command names it
    (f"vast.ai api key {VAST} saved", VAST),
    (f"cat ~/.vast_api_key -> {VAST}", VAST),
    (f"SLACK_BOT {SLACK_BOT}", SLACK_BOT),
    (f"posting to https://hooks.slack.com/services/{SLACK_HOOK} failed", SLACK_HOOK),
    (f"stripe.api_key set ({STRIPE})", STRIPE),
    (f"client = OpenAI() # {OPENAI}", OPENAI),
    (f"session cookie {JWT} renewed", JWT),
    (
        "DefaultEndpointsProtocol=https;AccountName=acct;AccountKey=" + AZURE_KEY + ";EndpointSuffix=core.windows.net",
        AZURE_KEY,
    ),
    ("Endpoint=sb://ns.servicebus.windows.net/;SharedAccessKeyName=root;SharedAccessKey=" + AZURE_KEY, AZURE_KEY),
    ("GET https://acct.blob.core.windows.net/c/b?sv=2022-11-02&se=2026-01-01&sig=" + AZURE_KEY[:44] + " 200", "sig"),
    (f"{AWS} {AWS_SECRET}", AWS_SECRET),
    (f"credentials: {AWS},{AWS_SECRET}", AWS_SECRET),
    (f'aws keys "{AWS}" and "{AWS_SECRET}"', AWS_SECRET),
]


@pytest.mark.parametrize("line,secret", HOST_SECRETS, ids=[f"host{i}" for i in range(len(HOST_SECRETS))])
def test_the_secret_shapes_of_a_gpu_host_are_masked(line: str, secret: str) -> None:
    if secret == "sig":  # the SAS signature: what follows sig= up to the next parameter
        secret = AZURE_KEY[:44]
    for out in (R.text(line), R.lines([line, "next"])[0], R.lines(["x"] * 100 + [line] * 40)[-1]):
        assert secret not in out and "***" in out, out
        assert secret[:12] not in out, out


def test_a_yaml_password_on_the_next_line_is_masked_and_the_next_key_is_not() -> None:
    lines = ["db:", "  password:", "    correct-horse-battery", "  user: bob", "token: |", "  multi", "  line", "x: 1"]
    assert R.lines(lines) == ["db:", "  password:", "    ***", "  user: bob", "token: |", "  ***", "  ***", "x: 1"]
    # the carry takes it across reads: the value may come in the next read of the output
    first, carry = R.stream(["  password:"])
    assert R.stream(["    correct-horse-battery", "  user: bob"], None, carry)[0] == ["    ***", "  user: bob"]


HOST_FALSE_POSITIVES = [
    "sha256 e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855 ok",
    "root=0x" + "ab" * 32,
    "hf_hub_download: fetched config.json",
    "disk-sk-proj-01 mounted",
    "signal sig=15 received",
    "AccountKey is not set; see the docs",
    "the task sk_live_ mode",
    'eyJ is how base64 of {" starts',
]


@pytest.mark.parametrize("line", HOST_FALSE_POSITIVES)
def test_a_gpu_hosts_ordinary_lines_are_not_masked(line: str) -> None:
    assert R.text(line) == line
    assert R.lines([line, line]) == [line, line]
