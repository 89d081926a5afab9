"""Where a measurement ran, and the rule that says which stored results are comparable: its environment
key. The results store (course_utils.results) keeps both with every measurement, as `env` and `env_key`.

The environment is the machine (course_utils.hardware.machine: device, memory, bf16, CUDA, the library
versions) and the course's own part: its version, how it measures, and the tiny model it trains.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass

from .hardware import Machine, machine

# Bump when measure/memtrack change what a stored number means: older stored results stop matching.
MEASUREMENT_METHOD = 3


@dataclass(frozen=True)
class Environment(Machine):
    """Where a measurement ran: the machine with the course's own versions, enough to say whether two
    results are comparable."""

    @property
    def key(self) -> str:
        """Results measured with the same key are comparable (device and library versions)."""
        blob = json.dumps([self.device, self.versions], sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:12]


def course_versions() -> dict[str, str]:
    """The course's part of an environment's versions: what makes stored results stop matching when the
    course's own measuring, or the tiny model it trains, changes."""
    from . import __version__
    from .models import tiny_fingerprint

    return {"course_utils": __version__, "measurement_method": str(MEASUREMENT_METHOD), "tiny_model": tiny_fingerprint()}


def environment() -> Environment:
    """Read the current environment."""
    here = machine()
    return Environment(**{**asdict(here), "versions": {**here.versions, **course_versions()}})


def environment_record() -> dict:
    """The current environment as every shipped record stores it (a Measurement's `env`; the scripts' lines)."""
    return asdict(environment())
