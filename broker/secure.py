"""SASL_SSL for the local broker: a CA and server certificate made on the spot, one SCRAM user per role, client
settings."""

from __future__ import annotations

import dataclasses
import os
import secrets
import shlex
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from flightrec.broker.roles import ADMIN, OPERATOR, ROLES, Role

from flightrec.errors import BrokerError
from flightrec.settings import Settings

SECURITIES = ("plaintext", "sasl_ssl")
MECHANISM = "SCRAM-SHA-512"
USER = ADMIN.user  # the super user (inter-broker, `broker start` itself)

# The super user alone: the CONTROLLER listener (KRaft's quorum, on 127.0.0.1) authenticates too (SASL PLAIN
# with the super user's password: SCRAM users live in the metadata the controller serves, so it cannot use them),
# so no anonymous connection is a super user.
SUPER_USERS = f"User:{ADMIN.user}"
AUTHORIZER = "org.apache.kafka.metadata.authorizer.StandardAuthorizer"


def _write_private(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` readable by the owner only (0600 from the first byte)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    path.chmod(0o600)


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

    def password_path(self, role: Role) -> Path:
        return self.data / role.password_file

    @property
    def password_file(self) -> Path:
        """The operator's password file (the one client.env names)."""
        return self.password_path(OPERATOR)

    def env_path(self, role: Role) -> Path:
        if role.env_file is None:
            raise BrokerError(f"the {role.name} role's password goes into no env file")
        return self.data / role.env_file

    @property
    def env_file(self) -> Path:
        """``client.env``: the operator's settings (materializer, manager, replay, timeline, sql)."""
        return self.env_path(OPERATOR)

    @property
    def users_file(self) -> Path:
        """The SCRAM users this broker's metadata holds, one a line (written when they are created)."""
        return self.data / "users"

    def password(self, role: Role = ADMIN) -> str:
        """``role``'s SCRAM password, made once (URL-safe random text) and kept readable by the owner only."""
        path = self.password_path(role)
        self._adopt_legacy_admin_password()
        try:
            return path.read_text().strip()
        except FileNotFoundError:
            pass
        self.data.mkdir(parents=True, exist_ok=True)
        pw = secrets.token_urlsafe(24)
        _write_private(path, pw + "\n")
        return pw

    def _adopt_legacy_admin_password(self) -> None:
        """A folder formatted before the roles kept the super user's password in client.password: move it to
        admin.password, so that client.password becomes the operator's."""
        admin = self.password_path(ADMIN)
        if admin.exists() or self.users_file.exists() or not (self.data / "logs" / "meta.properties").exists():
            return
        legacy = self.password_path(OPERATOR)
        if legacy.exists():
            os.replace(legacy, admin)

    def missing_users(self) -> list[Role]:
        """The roles whose SCRAM user this broker's metadata does not hold yet (a folder formatted before them)."""
        try:
            have = set(self.users_file.read_text().split())
        except FileNotFoundError:
            have = {ADMIN.user}
        return [r for r in ROLES if r.user not in have]

    def record_users(self, roles: list[Role] | tuple[Role, ...] = ROLES) -> None:
        have = set() if not self.users_file.exists() else set(self.users_file.read_text().split())
        users = have | {ADMIN.user} | {r.user for r in roles}  # the super user exists from the first format
        self.users_file.write_text("".join(f"{u}\n" for u in sorted(users)))

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
            f'password="{self.password(ADMIN)}";'
        )
        return {
            "listeners": f"SASL_SSL://127.0.0.1:{port},CONTROLLER://127.0.0.1:{cport}",
            "advertised.listeners": f"SASL_SSL://localhost:{port}",
            "inter.broker.listener.name": "SASL_SSL",
            "listener.security.protocol.map": "SASL_SSL:SASL_SSL,CONTROLLER:SASL_PLAINTEXT",
            "sasl.mechanism.controller.protocol": "PLAIN",
            "listener.name.controller.sasl.enabled.mechanisms": "PLAIN",
            "listener.name.controller.plain.sasl.jaas.config": (
                f'org.apache.kafka.common.security.plain.PlainLoginModule required username="{USER}" '
                f'password="{self.password(ADMIN)}" user_{USER}="{self.password(ADMIN)}";'
            ),
            "sasl.enabled.mechanisms": MECHANISM,
            "sasl.mechanism.inter.broker.protocol": MECHANISM,
            f"listener.name.sasl_ssl.{MECHANISM.lower()}.sasl.jaas.config": jaas,
            "ssl.keystore.type": "PEM",
            "ssl.keystore.location": str(self.keystore),
            "ssl.truststore.type": "PEM",
            "ssl.truststore.location": str(self.ca),
            # Kafka's own authorizer: a principal may do only what an ACL grants it (broker/roles.py)
            "authorizer.class.name": AUTHORIZER,
            "super.users": SUPER_USERS,
            "allow.everyone.if.no.acl.found": "false",
        }

    def format_args(self) -> list[str]:
        """kafka-storage format arguments creating every role's SCRAM user in the cluster's first metadata."""
        return [f"--add-scram={MECHANISM}=[name={r.user},password={self.password(r)}]" for r in ROLES]

    def client_env(self, bootstrap: str, role: Role = OPERATOR) -> dict[str, str]:
        """The FLIGHTREC_* variables a client of ``role`` needs (the password stays in its file)."""
        return {
            "FLIGHTREC_BOOTSTRAP": bootstrap,
            "FLIGHTREC_SECURITY_PROTOCOL": "SASL_SSL",
            "FLIGHTREC_SASL_MECHANISM": MECHANISM,
            "FLIGHTREC_SASL_USERNAME": role.user,
            "FLIGHTREC_SASL_PASSWORD_FILE": str(self.password_path(role)),
            "FLIGHTREC_SSL_CAFILE": str(self.ca),
        }

    def write_env_files(self, bootstrap: str) -> list[Path]:
        """``client.env``, ``reader.env`` and ``agent.env`` in the data folder: `source` one to act in that role."""
        written = []
        for role in ROLES:
            if role.env_file is None:
                continue
            lines = [
                f"# flightrec client settings for the local SASL_SSL broker, role {role.name} "
                f"(user {role.user}): `source` this file\n",
                f"# {role.purpose}\n",
            ]
            lines += [f"export {k}={shlex.quote(v)}\n" for k, v in self.client_env(bootstrap, role).items()]
            path = self.env_path(role)
            path.write_text("".join(lines))
            written.append(path)
        return written

    def command_config(self, role: Role = ADMIN) -> Path:
        """A 0600 properties file with ``role``'s SASL_SSL client settings, for Kafka's own tools (--command-config)."""
        jaas = (
            f'org.apache.kafka.common.security.scram.ScramLoginModule required username="{role.user}" '
            f'password="{self.password(role)}";'
        )
        path = self.data / f"{role.name}.properties"
        _write_private(
            path,
            "security.protocol=SASL_SSL\n"
            f"sasl.mechanism={MECHANISM}\n"
            f"sasl.jaas.config={jaas}\n"
            "ssl.truststore.type=PEM\n"
            f"ssl.truststore.location={self.ca}\n",
        )
        return path

    def client_settings(self, settings: Settings, bootstrap: str, role: Role = OPERATOR) -> Settings:
        """``settings`` pointed at this broker with ``role``'s SASL_SSL client settings."""
        return dataclasses.replace(
            settings,
            bootstrap=bootstrap,
            security_protocol="SASL_SSL",
            sasl_mechanism=MECHANISM,
            sasl_username=role.user,
            sasl_password=None,
            sasl_password_file=str(self.password_path(role)),
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
