"""The instance agent: wraps stages and subprocesses, follows files, spools events durably, delivers them to Kafka."""

from flightrec.producer.agent import Agent, Stage, SyncAgent, open_agent
from flightrec.producer.deliver import Deliverer
from flightrec.producer.facts import collect_facts
from flightrec.producer.lines import LineSplitter, Tail, decode_lines
from flightrec.producer.redact import Redactor
from flightrec.producer.run import StageResult, run_stage
from flightrec.producer.spool import Position, Spool, instance_dir

__all__ = [
    "Agent",
    "SyncAgent",
    "Stage",
    "open_agent",
    "run_stage",
    "StageResult",
    "Spool",
    "Position",
    "instance_dir",
    "Deliverer",
    "Redactor",
    "LineSplitter",
    "Tail",
    "decode_lines",
    "collect_facts",
]
