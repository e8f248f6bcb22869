"""The batch policy's latency targets: `serve` flags and environment
variables, the settings they fill, the scheduler config a loaded model gets,
and the step limits they set."""

from __future__ import annotations

import pytest

from localserve.cli.options import CliError, settings_from_args
from localserve.config import ServerSettings
from localserve.engine.engine import Engine
from localserve.engine.step.batch_policy import BatchPolicy
from localserve.engine.types import Capacity, SchedulerConfig
from localserve.models.registry.core import ModelRegistry


def test_flags_and_environment_set_the_targets() -> None:
    defaults = ServerSettings()
    assert (defaults.batch_itl_target, defaults.batch_ttft_target) == (1.2, 1.5)
    settings = settings_from_args(["serve", "--batch-itl-target", "1.1"], {"LOCALSERVE_BATCH_TTFT_TARGET": "2.5"})
    assert (settings.batch_itl_target, settings.batch_ttft_target) == (1.1, 2.5)
    flag_wins = settings_from_args(["--batch-ttft-target", "1"], {"LOCALSERVE_BATCH_TTFT_TARGET": "2.5"})
    assert flag_wins.batch_ttft_target == 1.0


@pytest.mark.parametrize("value", ["0.9", "-1", "nan", "inf", "fast"])
def test_a_target_below_idle_or_not_a_number_is_refused(value: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        settings_from_args(["--batch-itl-target", value], {})
    assert "--batch-itl-target" in capsys.readouterr().err
    with pytest.raises(CliError, match="LOCALSERVE_BATCH_TTFT_TARGET"):
        settings_from_args([], {"LOCALSERVE_BATCH_TTFT_TARGET": value})


def test_a_loaded_model_gets_the_targets() -> None:
    settings = ServerSettings(models=[], batch_itl_target=1.4, batch_ttft_target=3.0, aging_s=12.0)
    config = ModelRegistry(Engine(), settings)._engine_config(Capacity(4, 64, 1024, 256)).scheduler
    assert (config.itl_target, config.ttft_target, config.aging_s) == (1.4, 3.0, 12.0)


def test_a_loaded_model_gets_the_speculation_settings() -> None:
    settings = ServerSettings(models=[], speculative="draft", draft_max=5)
    registry = ModelRegistry(Engine(), settings)
    with_draft = registry._engine_config(Capacity(4, 64, 1024, 256, 32, has_draft_model=True)).scheduler
    assert (with_draft.speculative, with_draft.draft_max) == ("draft", 5)
    # A model that got no draft model (another vocabulary) speculates by prompt lookup instead.
    assert registry._engine_config(Capacity(4, 64, 1024, 256, 32)).scheduler.speculative == "ngram"


def test_prompt_lookup_speculation_is_on_by_default() -> None:
    """`--speculative ngram` is the default: it measures whether drafting pays
    (engine/step/speculation.py's DraftPayoff) and stays out where it does not."""
    registry = ModelRegistry(Engine(), ServerSettings(models=[]))
    assert registry._engine_config(Capacity(4, 64, 1024, 256, 32)).scheduler.speculative == "ngram"


def shared_policy(itl_target: float, ttft_target: float) -> BatchPolicy:
    """A policy beside other work, whose step model has learnt a + b*tokens + c*seqs."""
    policy = BatchPolicy(SchedulerConfig(itl_target=itl_target, ttft_target=ttft_target))
    for num_tokens, num_seqs in [(1, 1), (4, 4), (64, 1), (8, 8), (200, 2), (16, 16)] * 30:
        policy.observe_step(num_tokens, num_seqs, 0.010 + 0.0002 * num_tokens + 0.002 * num_seqs)
    policy.note_arrival(0.0)
    policy.note_prompt(64)
    policy.update_mode(others_present=True, now=0.0)
    return policy


def test_the_targets_set_the_step_limit_of_batch_work() -> None:
    decode_of_4 = 0.010 + 0.0002 * 4 + 0.002 * 4  # four interactive decodes: the step batch work joins
    prompt = 0.010 + 0.0002 * 64 + 0.002  # the typical interactive prompt's step alone
    for itl, ttft in [(1.2, 1.5), (2.0, 1.5), (1.2, 4.0), (1.0, 1.0)]:
        gate = shared_policy(itl, ttft).gate(4, 4, others_decoding=True)
        want = min(itl * decode_of_4, decode_of_4 + (ttft - 1.0) * prompt)
        assert gate.limit_s == pytest.approx(want, rel=0.02), (itl, ttft)
    # A looser target lets more batch decodes join the same step.
    tight = shared_policy(1.2, 1.5).gate(4, 4, others_decoding=True).num_decodes(4, 4, 16)
    loose = shared_policy(2.0, 3.0).gate(4, 4, others_decoding=True).num_decodes(4, 4, 16)
    assert 0 < tight < loose
    assert shared_policy(1.0, 1.0).gate(4, 4, others_decoding=True).num_decodes(4, 4, 16) == 0
