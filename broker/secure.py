"""SASL_SSL for the local broker: a CA and server certificate made on the spot, a SCRAM user, client settings."""

from __future__ import annotations

import dataclasses
import os
import secrets
import shlex
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from flightrec.errors import BrokerError
from flightrec.settings import Settings

SECURITIES = ("plaintext", "sasl_ssl")
MECHANISM = "SCRAM-SHA-512"
USER = "flightrec"


@dataclass(frozen=True)
class Secure:
    """Where one broker's TLS and SCRAM material lives (all inside its data folder)."""

    data: Path

    @property
    def tls(self) -> Path:
        return self.data / "tls"

    @property
    def ca(self) -> Path:
        return self.tls / "ca.pem"

    @property
    def keystore(self) -> Path:
        return self.tls / "server-keystore.pem"

    @property
    def password_file(self) -> Path:
        return self.data / "client.password"

    @property
    def env_file(self) -> Path:
        return self.data / "client.env"

    def password(self) -> str:
        """The SCRAM password, made once (URL-safe random text) and kept readable by the owner only."""
        try:
            return self.password_file.read_text().strip()
        except FileNotFoundError:
            pass
        self.data.mkdir(parents=True, exist_ok=True)
        pw = secrets.token_urlsafe(24)
        fd = os.open(self.password_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(pw + "\n")
        return pw

    def make_certificates(self) -> None:
        """A CA and a server certificate for localhost / 127.0.0.1 signed by it, once (openssl)."""
        if self.ca.exists() and self.keystore.exists():
            return
        openssl = shutil.which("openssl")
        if not openssl:
            raise BrokerError("openssl not found: it makes the local broker's TLS certificates; install openssl")
        self.tls.mkdir(parents=True, exist_ok=True)
        t = self.tls

        def run(*args: str) -> None:
            proc = subprocess.run([openssl, *args], cwd=t, capture_output=True, text=True)
            if proc.returncode != 0:
                raise BrokerError(
                    f"openssl {args[0]} failed making the broker's certificates in {t}: "
                    f"{proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else proc.returncode}"
                )

        run(
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "ca.key",
            "-out",
            "ca.tmp",
            "-days",
            "3650",
            "-subj",
            "/CN=flightrec local broker CA",
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign,cRLSign",
        )
        run(
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "server.key",
            "-out",
            "server.csr",
            "-subj",
            "/CN=localhost",
        )
        (t / "server.ext").write_text(
            "subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth,clientAuth\n"
        )
        run(
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.tmp",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            "server.pem",
            "-days",
            "3650",
            "-extfile",
            "server.ext",
        )
        (t / "server.key").chmod(0o600)
        (t / "ca.key").chmod(0o600)
        keystore = (t / "server.key").read_text() + (t / "server.pem").read_text() + (t / "ca.tmp").read_text()
        fd = os.open(self.keystore, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(keystore)
        os.replace(t / "ca.tmp", self.ca)

    def server_properties(self, port: int, cport: int) -> dict[str, str]:
        """The listener settings of a SASL_SSL broker (SCRAM-SHA-512 over TLS, inter-broker too)."""
        jaas = (
            f'org.apache.kafka.common.security.scram.ScramLoginModule required username="{USER}" '
            f'password="{self.password()}";'
        )
        return {
            "listeners": f"SASL_SSL://127.0.0.1:{port},CONTROLLER://127.0.0.1:{cport}",
            "advertised.listeners": f"SASL_SSL://localhost:{port}",
            "inter.broker.listener.name": "SASL_SSL",
            "listener.security.protocol.map": "SASL_SSL:SASL_SSL,CONTROLLER:PLAINTEXT",
            "sasl.enabled.mechanisms": MECHANISM,
            "sasl.mechanism.inter.broker.protocol": MECHANISM,
            f"listener.name.sasl_ssl.{MECHANISM.lower()}.sasl.jaas.config": jaas,
            "ssl.keystore.type": "PEM",
            "ssl.keystore.location": str(self.keystore),
            "ssl.truststore.type": "PEM",
            "ssl.truststore.location": str(self.ca),
        }

    def format_args(self) -> list[str]:
        """kafka-storage format arguments creating the SCRAM user in the cluster's first metadata."""
        return [f"--add-scram={MECHANISM}=[name={USER},password={self.password()}]"]

    def client_env(self, bootstrap: str) -> dict[str, str]:
        """The FLIGHTREC_* variables a client needs (the password stays in its file)."""
        return {
            "FLIGHTREC_BOOTSTRAP": bootstrap,
            "FLIGHTREC_SECURITY_PROTOCOL": "SASL_SSL",
            "FLIGHTREC_SASL_MECHANISM": MECHANISM,
            "FLIGHTREC_SASL_USERNAME": USER,
            "FLIGHTREC_SASL_PASSWORD_FILE": str(self.password_file),
            "FLIGHTREC_SSL_CAFILE": str(self.ca),
        }

    def write_env_file(self, bootstrap: str) -> Path:
        """``client.env`` in the data folder: `source` it to point flightrec at this broker."""
        lines = ["# flightrec client settings for the local SASL_SSL broker: `source` this file\n"]
        lines += [f"export {k}={shlex.quote(v)}\n" for k, v in self.client_env(bootstrap).items()]
        self.env_file.write_text("".join(lines))
        return self.env_file

    def client_settings(self, settings: Settings, bootstrap: str) -> Settings:
        """``settings`` pointed at this broker with its SASL_SSL client settings."""
        return dataclasses.replace(
            settings,
            bootstrap=bootstrap,
            security_protocol="SASL_SSL",
            sasl_mechanism=MECHANISM,
            sasl_username=USER,
            sasl_password=None,
            sasl_password_file=str(self.password_file),
            ssl_cafile=str(self.ca),
        )


def read_env_file(path: str | Path) -> dict[str, str]:
    """The variables a ``client.env`` file exports (for tests and tools that cannot `source`)."""
    out: dict[str, str] = {}
    for line in Path(path).read_text().splitlines():
        parts = shlex.split(line, comments=True)
        if len(parts) == 2 and parts[0] == "export" and "=" in parts[1]:
            k, _, v = parts[1].partition("=")
            out[k] = v
    return out
