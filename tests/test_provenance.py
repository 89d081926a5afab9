"""provenance: where a measurement ran, and the key that says which stored results are comparable."""

from __future__ import annotations

from course_utils import machine as hardware
from course_utils import results as provenance
from course_utils.results import shipped_results


def _env(**changes) -> provenance.Environment:
    fields = dict(device="X", device_type="cpu", total_memory_gib=1.0, bf16=False, compute_capability=None,
                  cuda=None, driver=None, versions={"torch": "2.0"})
    return provenance.Environment(**(fields | changes))


def test_environment_key_depends_on_device_and_versions():
    assert _env().key == _env().key
    assert len(_env().key) == 12
    assert _env(device="Y").key != _env().key
    assert _env(versions={"torch": "2.1"}).key != _env().key
    assert _env(total_memory_gib=2.0).key == _env().key  # not part of comparability


def test_the_key_rule_is_unchanged():
    """Stored results keep matching: a known environment's key is what hardware.Environment gave it, and
    the shipped reference runs' keys are those of their stored environments."""
    assert _env().key == "07670ffa021a"
    shipped = shipped_results()
    assert shipped and all(provenance.Environment(**m.env).key == m.env_key for m in shipped)


def test_environment_describes_this_machine():
    env = provenance.environment()
    assert isinstance(env, hardware.Machine)
    assert env.device == hardware.device_name()
    assert env.device_type == hardware.device_type()
    assert env.total_memory_gib > 0
    assert env.versions.items() >= hardware.versions().items()
    # what makes stored results stop matching when the course's own measuring changes
    assert {"course_utils", "measurement_method", "tiny_model"} <= set(env.versions)
    assert env.versions["measurement_method"] == str(provenance.MEASUREMENT_METHOD)
