"""What a Kafka credential may not do, in one line: the refusals (authorization, authentication) that end a command.

A broker that refuses a credential refuses it again on every try: a command that meets such a refusal stops at once
with one line naming the credential (its user and, for flightrec's own roles, the role: broker/roles.py) and what
it may not do, and which credential would. Pure; on the ground floor (the agent and the materializer use it).
"""

from __future__ import annotations

from collections.abc import Mapping

# aiokafka's error classes for a refusal that no retry changes (by name: the agent need not import them to judge)
AUTHORIZATION = (
    "TopicAuthorizationFailedError",
    "GroupAuthorizationFailedError",
    "ClusterAuthorizationFailedError",
    "TransactionalIdAuthorizationFailed",
    "DelegationTokenAuthorizationFailed",
)
AUTHENTICATION = ("SaslAuthenticationFailed", "AuthenticationFailedError", "UnsupportedSaslMechanismError")
# connection_cause's line for refused SASL credentials (flightrec/cluster.py) starts so
REFUSED_LOGIN = "refused the SASL credentials"

# Which credential does what (docs/security.md): named in the line's advice.
NEEDED = {
    "read": "reading the topics needs the operator's credential (client.env) or the reader's (reader.env)",
    "write": "writing events needs the agent's credential (agent.env) or the operator's (client.env)",
    "administer": "creating topics needs the operator's credential (client.env)",
}


def refusal_of(exc: BaseException | None) -> BaseException | None:
    """The authorization or authentication refusal in ``exc`` or the exceptions it was raised from, or None."""
    seen = 0
    while exc is not None and seen < 8:
        if type(exc).__name__ in AUTHORIZATION + AUTHENTICATION:
            return exc
        exc = exc.__cause__ or exc.__context__
        seen += 1
    return None


# The SCRAM users of flightrec's roles (broker/roles.py, where their grants live; tests/broker/test_roles_unit.py
# keeps the two the same): a refusal names the role as well as the user.
ROLE_OF_USER = {
    "flightrec": "admin",
    "flightrec-operator": "operator",
    "flightrec-reader": "reader",
    "flightrec-agent": "agent",
}
# What each role is for, in a few words (docs/security.md has the grants)
ROLE_PURPOSE = {
    "admin": "the broker's super user",
    "operator": "materializer, manager, replay: reads and writes the topics",
    "reader": "reads the topics, writes nothing",
    "agent": "what goes into instances: produces to the topics, nothing else",
}


def role_of(user: str | None) -> str:
    """'user 'flightrec-agent' (the agent role: …)' for flightrec's roles, else the user, else 'no SASL user'."""
    if not user:
        return "this client (no SASL user)"
    role = ROLE_OF_USER.get(user)
    if role is None:
        return f"user {user!r}"
    return f"user {user!r} (the {role} role: {ROLE_PURPOSE[role]})"


def _topics(exc: BaseException) -> str:
    names = ", ".join(str(a) for a in exc.args if isinstance(a, str) and a)
    return f" {names}" if names else ""


def what_is_refused(exc: BaseException, doing: str) -> str:
    """'may not read the topic flightrec.logs', 'may not use the consumer group G', ... for one refusal."""
    name = type(exc).__name__
    if name in AUTHENTICATION:
        return "was refused at login (wrong user or password, or a mechanism the broker does not offer)"
    if name == "TopicAuthorizationFailedError":
        return f"may not {doing} the topic{_topics(exc) or 's'}"
    if name == "GroupAuthorizationFailedError":
        return f"may not use the consumer group{_topics(exc) or ''}"
    if name == "ClusterAuthorizationFailedError":
        if doing == "write":
            return "may not write (an idempotent producer needs Write on the topics; the cluster refused it)"
        return f"may not {doing} here (the cluster refused it: ClusterAuthorization)"
    return f"may not {doing} ({name})"


def refusal_line(exc: BaseException, kafka_kwargs: Mapping[str, object], doing: str) -> str:
    """One line: whose credential, what it may not do (``doing``: read, write or administer), and what would."""
    who = role_of(_user(kafka_kwargs))
    where = kafka_kwargs.get("bootstrap_servers")
    return (
        f"the Kafka credential of {who} {what_is_refused(exc, doing)} at {where}; "
        f"{NEEDED.get(doing, 'see docs/security.md')} (docs/security.md)"
    )


def _user(kafka_kwargs: Mapping[str, object]) -> str | None:
    user = kafka_kwargs.get("sasl_plain_username")
    return str(user) if user else None
