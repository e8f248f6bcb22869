"""llama.cpp's thread wait policy, applied when localserve is imported."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from localserve import thread_wait_env


def test_policies_map_to_libgomp_variables() -> None:
    assert thread_wait_env("passive") == {"OMP_WAIT_POLICY": "PASSIVE"}
    assert thread_wait_env("active") == {"OMP_WAIT_POLICY": "ACTIVE"}
    assert thread_wait_env("default") == {}
    assert thread_wait_env("spin:5000") == {"GOMP_SPINCOUNT": "5000"}
    with pytest.raises(ValueError, match="passive, active, default or spin:N"):
        thread_wait_env("spin:lots")


def _env_after_import(**env: str) -> dict[str, str | None]:
    clean = {
        k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "LOCALSERVE_THREAD_WAIT")
    }
    code = "import os, localserve; print(os.environ.get('OMP_WAIT_POLICY'), os.environ.get('GOMP_SPINCOUNT'))"
    out = subprocess.run([sys.executable, "-c", code], env={**clean, **env}, capture_output=True, text=True, check=True)
    policy, spin = out.stdout.split()
    return {"OMP_WAIT_POLICY": None if policy == "None" else policy, "GOMP_SPINCOUNT": None if spin == "None" else spin}


def test_the_default_is_a_short_bounded_spin_and_the_users_variables_win() -> None:
    assert _env_after_import() == {"OMP_WAIT_POLICY": None, "GOMP_SPINCOUNT": "30000"}
    assert _env_after_import(OMP_WAIT_POLICY="PASSIVE") == {"OMP_WAIT_POLICY": "PASSIVE", "GOMP_SPINCOUNT": None}
    assert _env_after_import(LOCALSERVE_THREAD_WAIT="passive") == {"OMP_WAIT_POLICY": "PASSIVE", "GOMP_SPINCOUNT": None}
